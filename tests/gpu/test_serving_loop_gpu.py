"""examples/serving_loop.py on the H200, with CUDA graphs: ``SPLITLAB_GPU_TESTS=1 pytest
tests/gpu/test_serving_loop_gpu.py -s``.

GQA (Llama-3-8B's attention) and MLA-16, the schedule planned on the device inside each bucket's graph and on the host
before each replay; the closed loop (one bucket) and Poisson arrivals (several buckets, padded slots of length 0, steps
with no request), every step and layer against fp64 within the bf16 tolerance, one graph captured per bucket used.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a GPU and SPLITLAB_GPU_TESTS=1")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def loop():
    spec = importlib.util.spec_from_file_location("serving_loop", REPO / "examples" / "serving_loop.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules[spec.name]


@pytest.mark.parametrize("kind", ["gqa", "mla"])
@pytest.mark.parametrize("plan", ["device", "host"])
@pytest.mark.parametrize("arrival", [[], ["--arrival", "poisson", "--rate", "0.5"]], ids=["full", "poisson"])
def test_the_loop_matches_fp64_in_graphs(loop, kind, plan, arrival):
    c = loop.parse(["--kind", kind, "--plan", plan, "--slots", "16", "--steps", "48", "--layers", "2",
                    "--max-len", "8192", *arrival])
    s = loop.serve(c)
    assert s["failures"] == 0 and s["worst"] <= s["tolerance"]
    assert s["graphs"] == len(s["buckets"]) >= 1
    if arrival:
        assert len(s["buckets"]) >= 2
