"""``experiments/short_launch/ab.py`` without a GPU: its dry run (tiny shapes under Triton's interpreter: every
implementation checked against fp64, nothing timed, the peers unavailable), a variant that computes something else
left untimed, the budget, the summary's arithmetic and its argument parsing. (``test_experiments.py`` byte-compiles
it and resolves its imports; the timing runs on the H200 only.)"""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from splitlab.kernels import worklist
from splitlab.kernels.accuracy import TOLERANCE

PATH = Path(__file__).resolve().parents[1] / "experiments" / "short_launch" / "ab.py"


@pytest.fixture(scope="module")
def ab():
    spec = importlib.util.spec_from_file_location("short_launch_ab", PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass resolves its annotations through its module
    spec.loader.exec_module(mod)  # imports only the standard library at module level
    yield mod
    del sys.modules[spec.name]


def rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_dry_run_checks_every_implementation_and_times_nothing(ab, tmp_path):
    assert ab.main(["run", "--dry-run", "--out", str(tmp_path)]) == 0
    got = rows(tmp_path / ab.CSV_NAME)
    impls = ["shipped"] + [v for _ in ab.SCHEDULES for v in ab.VARIANTS] + list(ab.PEERS)
    assert len(got) == len(ab.points(ab.DRY)) * len(impls)
    for r in got:
        assert r["us"] == "" and r["roofline"] == ""  # never a number without a GPU
        if r["impl"] in ab.PEERS:
            assert r["status"] == "unavailable"
        else:
            assert r["status"] == "checked", r
            assert float(r["rel_err"]) <= TOLERANCE[torch.bfloat16]
    split = [r for r in got if r["impl"] == "wl-fused" and int(r["splits"]) > 1]
    assert split, "no dry-run point splits a request: the fused merge would go untested"
    assert "no timed rows" in ab.summary(tmp_path / ab.CSV_NAME)


def test_a_variant_that_computes_something_else_is_wrong_and_untimed(ab, tmp_path, monkeypatch):
    real = worklist.gqa_decode_scheduled

    def broken(*a, **kw):
        out, lse = real(*a, **kw)
        if kw.get("fused_merge"):
            out[0, 0] += 1.0
        return out, lse

    monkeypatch.setattr(worklist, "gqa_decode_scheduled", broken)
    cfg = ab.Config(heads=((8, 2),), batches=(3,), keys=(130,), pages=(16,), head_dim=32, timed=False)
    got = rows(ab.run(tmp_path, cfg, 1e9, only="wl-fused"))
    assert {r["impl"] for r in got} == {"shipped", "wl-fused"}
    for r in got:
        assert r["status"] == ("wrong" if r["impl"] == "wl-fused" else "checked") and r["us"] == ""
        if r["impl"] == "wl-fused":
            assert "rel_err" in r["error"]


def test_counters_left_nonzero_are_wrong(ab):
    ref = torch.randn(2, 4, 8, dtype=torch.float64)
    lse = torch.zeros(2, 4)
    out = ref.to(torch.bfloat16)
    ok = ab.verdict(out, lse, ref, lse.double(), torch.bfloat16, torch.zeros(2, 1, dtype=torch.int32))
    assert ok[2] == "ok"
    bad = ab.verdict(out, lse, ref, lse.double(), torch.bfloat16, torch.ones(2, 1, dtype=torch.int32))
    assert bad[2] == "wrong" and "counters not 0" in bad[3]


def test_budget_stops_before_a_point(ab, tmp_path):
    got = rows(ab.run(tmp_path, ab.DRY, -1.0))
    assert [r["status"] for r in got] == ["budget"] and got[0]["error"].startswith(f"{len(ab.points(ab.DRY))} points")


def test_summary_ratios(ab, tmp_path):
    path = tmp_path / "s.csv"
    base = dict(hq=32, hkv=8, batch=16, keys=1024, page=16, status="ok", roofline=0.5)
    data = [dict(base, impl="sdpa-cudnn", schedule="dense", us=10.0), dict(base, impl="sdpa-flash", schedule="dense",
                                                                          us=8.0),
            dict(base, impl="wl-plain", schedule="uniform", us=12.5), dict(base, impl="wl-fused", schedule="uniform",
                                                                           us=10.0)]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ab.FIELDS, extrasaction="raise")
        w.writeheader()
        w.writerows(data)
    text = ab.summary(path)
    fused = next(ln for ln in text.splitlines() if ln.lstrip().startswith("wl-fused"))
    # cuDNN 10/10 = 1.0, best SDPA (flash) 8/10 = 0.8, wl-plain 12.5/10 = 1.25
    assert [float(v) for v in fused.split()[3:10]] == [1, 1.0, 1.0, 0.8, 0.8, 1.25, 0.5]


def test_parses_its_commands(ab):
    a = ab.parse(["run", "--out", "o", "--budget-s", "100"])
    assert (a.cmd, str(a.out), a.budget_s, a.dry_run) == ("run", "o", 100.0, False)
    with pytest.raises(SystemExit):
        ab.parse(["run"])
    with pytest.raises(SystemExit):
        ab.parse(["time", "--out", "o"])
