"""examples/serving_loop.py under Triton's interpreter (tiny shapes, no graphs): L layers x S steps of the simulated
server, every step's output checked against fp64, for GQA and MLA, the schedule planned on the device and on the host,
requests arriving by a Poisson process (several batch buckets, padded slots); and the check fails when a layer's
output is left unwritten."""

from __future__ import annotations

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
