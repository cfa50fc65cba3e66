"""A plan's launch options on a GPU: ``SPLITLAB_GPU_TESTS=1 pytest tests/gpu/test_plan_launch_gpu.py``.

* ``pdl=True`` (the merge by programmatic dependent launch after the tl tile): GQA 32/8 and MLA-16 plans, eager and
  captured in a CUDA graph replayed over new lengths, every output (NaN-filled first) against fp64; a capacity launch
  whose schedule splits no request (the merge then reads no row, and its program (0, 0) alone waits for the partial
  kernel) followed at once by a read of the output on the same stream.
* The default launchers' call through a cached plan (``kernels.default_call``, ``SPLITLAB_DEFAULT_PLAN=1``): GQA and
  MLA eager against fp64, and a CUDA graph captured around ``gqa_decode(num_splits=None)`` itself, replayed over new
  lengths written into the same ``seq_lens`` tensor.
"""

import os
import random

import pytest
import torch

from splitlab.kernels import default_call, gqa_decode, mla_decode, reference
from splitlab.kernels.accuracy import assert_matches_reference
from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan
from splitlab.kernels.inputs import gqa_inputs, mla_inputs

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a GPU and SPLITLAB_GPU_TESTS=1")

MAX_KEYS = 8192


def new_lengths(rng: random.Random, B: int) -> list[int]:
    return [rng.choice([0, 1, 63, 64, 65, rng.randint(1, MAX_KEYS)]) for _ in range(B)]


def graph_of(fn) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def empty_rows(lens):
    return [b for b, n in enumerate(lens) if n == 0]


@pytest.mark.parametrize("kind", ["gqa", "mla"])
@pytest.mark.parametrize("graph", [False, True])
def test_pdl_plans_match_fp64(kind, graph):
    rng = random.Random(11)
    B = 16
    if kind == "gqa":
        x = gqa_inputs(B, 32, 8, 128, MAX_KEYS, page_size=16, dtype=torch.bfloat16, device="cuda", seed=3)
        p = GQADecodePlan(32, 8, 128, 16, dtype=torch.bfloat16, device="cuda", max_batch=B, use_cuda_graph=graph,
                          pdl=True)
        args = (x["q"], x["k_cache"], x["v_cache"], x["block_table"])
        dv = 128

        def ref(lens):
            return reference.gqa_decode(*args, torch.tensor(lens, device="cuda", dtype=torch.int32),
                                        return_lse=True)
    else:
        x = mla_inputs(B, 16, 576, MAX_KEYS, page_size=64, dtype=torch.bfloat16, device="cuda", seed=3)
        p = MLADecodePlan(16, 576, 512, 64, dtype=torch.bfloat16, device="cuda", max_batch=B, use_cuda_graph=graph,
                          pdl=True)
        args = (x["q"], x["kv_cache"], x["block_table"])
        dv = 512

        def ref(lens):
            return reference.mla_decode(*args, torch.tensor(lens, device="cuda", dtype=torch.int32),
                                        head_dim_v=512, return_lse=True)
    assert p.pdl and not p._ws
    out = torch.empty(B, p.num_heads, dv, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(B, p.num_heads, dtype=torch.float32, device="cuda")
    steps = [[MAX_KEYS] * B, [1] * B] + [new_lengths(rng, B) for _ in range(4)]  # [1] * B: no request split
    p.plan(steps[0])
    g = graph_of(lambda: p.run(*args, out=out, lse=lse)) if graph else None
    for lens in steps:
        p.plan(lens)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        if g is not None:
            g.replay()
        else:
            p.run(*args, out=out, lse=lse)
        seen = out.clone()  # read on the stream at once: the partial kernel's direct rows must be there
        torch.cuda.synchronize()
        want, want_lse = ref(lens)
        assert_matches_reference(seen, lse, want, want_lse, torch.bfloat16, empty_rows(lens))


def test_default_call_through_a_plan_matches_fp64_and_replays_in_a_graph(monkeypatch):
    monkeypatch.setattr(default_call, "VIA_PLAN", True)
    default_call.clear()
    rng = random.Random(12)
    B = 16
    x = gqa_inputs(B, 32, 8, 128, MAX_KEYS, page_size=16, dtype=torch.bfloat16, device="cuda", seed=5)
    m = mla_inputs(B, 128, 576, MAX_KEYS, page_size=64, dtype=torch.bfloat16, device="cuda", seed=5)
    for lens in ([MAX_KEYS] * B, new_lengths(rng, B)):
        t = torch.tensor(lens, dtype=torch.int32, device="cuda")
        out, lse = gqa_decode(**dict(x, seq_lens=t), return_lse=True)
        want, want_lse = reference.gqa_decode(**dict(x, seq_lens=t), return_lse=True)
        assert_matches_reference(out, lse, want, want_lse, torch.bfloat16, empty_rows(lens))
        out, lse = mla_decode(**dict(m, seq_lens=t), head_dim_v=512, return_lse=True)
        want, want_lse = reference.mla_decode(**dict(m, seq_lens=t), head_dim_v=512, return_lse=True)
        assert_matches_reference(out, lse, want, want_lse, torch.bfloat16, empty_rows(lens))
    lens_t = x["seq_lens"].clone()
    got = {}

    def step():
        got["out"], got["lse"] = gqa_decode(**dict(x, seq_lens=lens_t), return_lse=True)

    g = graph_of(step)  # the default call itself, captured: its plan made by the warm-up call
    for _ in range(5):
        lens = new_lengths(rng, B)
        lens_t.copy_(torch.tensor(lens, dtype=torch.int32))
        got["out"].fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        want, want_lse = reference.gqa_decode(**dict(x, seq_lens=lens_t), return_lse=True)
        assert_matches_reference(got["out"], got["lse"], want, want_lse, torch.bfloat16, empty_rows(lens))
    default_call.clear()
