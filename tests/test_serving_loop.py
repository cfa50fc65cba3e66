"""examples/serving_loop.py under Triton's interpreter (tiny shapes, no graphs): L layers x S steps of the simulated
server, every step's output checked against fp64, for GQA and MLA, the schedule planned on the device and on the host,
requests arriving by a Poisson process (several batch buckets, padded slots); and the check fails when a layer's
output is left unwritten."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def loop():
    spec = importlib.util.spec_from_file_location("serving_loop", REPO / "examples" / "serving_loop.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules[spec.name]


@pytest.mark.parametrize("argv", [
    ["--kind", "gqa", "--steps", "4"],
    ["--kind", "gqa", "--plan", "host", "--steps", "4"],
    ["--kind", "mla", "--steps", "2"],
], ids=["gqa-device", "gqa-host", "mla-device"])
def test_every_step_matches_the_reference(loop, argv, capsys):
    c = loop.parse(["--interpret", *argv])
    s = loop.serve(c)
    assert s["failures"] == 0 and s["worst"] <= s["tolerance"] and s["buckets"] == [c.slots]
    assert s["graphs"] == 0  # the CPU: no CUDA graphs
    assert capsys.readouterr().out.count("rel err") == c.steps


def test_poisson_arrivals_use_several_buckets(loop):
    c = loop.parse(["--interpret", "--arrival", "poisson", "--rate", "0.6", "--steps", "8", "--plan", "host",
                    "--seed", "3"])
    s = loop.serve(c)
    assert s["failures"] == 0 and len(s["buckets"]) >= 2


def test_an_unwritten_layer_fails_the_check(loop, monkeypatch):
    real = loop.Bucket.forward

    def skip_last_layer(self):
        layers, self.c.layers = self.c.layers, self.c.layers - 1
        try:
            real(self)
        finally:
            self.c.layers = layers

    monkeypatch.setattr(loop.Bucket, "forward", skip_last_layer)
    assert loop.main(["--interpret", "--steps", "2"]) == 1
    s = loop.serve(loop.parse(["--interpret", "--steps", "2"]))
    assert s["failures"] == 2  # the last layer of each step: NaN


def test_buckets_are_powers_of_two_and_the_slots(loop):
    assert loop.buckets_for(64) == [1, 2, 4, 8, 16, 32, 64]
    assert loop.buckets_for(6) == [1, 2, 4, 6]
    assert loop.buckets_for(1) == [1]


# --- experiments/serving_loop/bench.py: its CPU path and its summary ------------------------------------------------

@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("serving_loop_bench",
                                                  REPO / "experiments" / "serving_loop" / "bench.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules[spec.name]


def test_the_benchmark_runs_splitlabs_paths_on_the_cpu(bench, tmp_path):
    """--interpret: splitlab's host and device plans on the same steps, each checked against fp64; nothing timed
    (no summary)."""
    assert bench.main(["--interpret", "--out", str(tmp_path), "--kinds", "gqa", "--slots", "4", "--profiles",
                       "code", "--steps", "2", "--layers", "1"]) == 0
    with open(tmp_path / "serving_loop.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["impl"]) for r in rows] == [(s, i) for s in "01" for i in bench.SPLITLAB]
    assert all(r["ok"] == "True" and float(r["rel_err"]) <= 1e-4 for r in rows)
    assert all(r["gpu_us"] == r["host_us"] == "" for r in rows)
    assert rows[0]["keys"] == rows[1]["keys"] and not (tmp_path / "summary.csv").exists()


def test_the_summary_takes_the_geomean_against_the_best_peer_per_step(bench):
    def row(impl, step, us, ok=True):
        return dict(kind="gqa", slots=4, profile="chat", impl=impl, step=step, gpu_us=us if ok else "", ok=ok)

    rows = [row("splitlab-device", 0, 10.0), row("splitlab-device", 1, 40.0), row("flashinfer", 0, 20.0),
            row("flashinfer", 1, 20.0), row("flashmla", 0, 5.0, ok=False), row("flashmla", 1, 10.0)]
    got = {r["impl"]: r for r in bench.summarize(rows)}
    assert got["splitlab-device"]["geomean_us"] == 20.0
    # step 0: flashmla wrong (untimed), so that step is left out of the ratio; step 1: best peer 10 us over 40
    assert got["splitlab-device"]["vs_best_peer"] == 0.25
    assert got["flashmla"]["wrong"] == 1 and got["flashinfer"]["vs_best_peer"] == 0.5
