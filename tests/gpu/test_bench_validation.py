"""The validation benchmark (``tests/gpu/bench_validation.py``) runs: a CPU dry run of the whole script
(``--smoke``: the interpreter, tiny shapes, nothing measured), and its one-line refusal without a GPU."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("bench_validation.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop("SPLITLAB_VALIDATE", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU dry run under Triton's interpreter, which a GPU machine's "
                    "numpy may not support; on a GPU run the script itself (python tests/gpu/bench_validation.py)")
def test_smoke_run_writes_the_table(tmp_path):
    r = _run("--out", str(tmp_path / "out"), "--smoke", "--reps", "1")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rows = list(csv.DictReader((tmp_path / "out" / "validation_cost.csv").open()))
    assert {(row["kernel"], row["path"], row["mode"]) for row in rows} == {
        (k, p, m) for k, paths in (("gqa", ("explicit", "planned")), ("mla", ("explicit", "planned")),
                                   ("sparse_mla", ("explicit",))) for p in paths for m in ("off", "on")}
    assert all(row["same_output"] == "True" and float(row["p50_us"]) > 0 for row in rows)
    assert all(row["cost_p50_us"] != "" for row in rows if row["mode"] == "on")
    assert "cost us" in r.stdout and "validation_cost.csv" in r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_without_a_gpu_it_says_so(tmp_path):
    r = _run("--out", str(tmp_path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no CUDA GPU" in r.stderr
    assert not (tmp_path / "validation_cost.csv").exists()


def test_bad_arguments_are_refused(tmp_path):
    r = _run("--out", str(tmp_path), "--reps", "0", "--smoke")
    assert r.returncode == 2 and "--reps 0 is not allowed" in r.stderr
