"""``experiments/mla_ws/ab.py`` without a GPU: its argument parsing, the batches it times, its CSV rows, which
variants it times after the checks and the summary it prints. (``test_ab_harness.py`` has the harness it shares with
``experiments/mqa_ws/ab.py``, the verdict of a check among it; ``test_experiments.py`` byte-compiles the script and
resolves its imports; the GPU parts run on the H200 only.)"""

from __future__ import annotations

import pytest
from ab_scripts import assert_appends_rows, load

from splitlab.bench.csvrows import read_rows
from splitlab.kernels.mla_sm90_ws import PERSISTENT_VARIANTS, VARIANTS
from splitlab.planners import schedulers


@pytest.fixture(scope="module")
def ab():
    return load("mla_ws")


def test_parses_its_commands(ab):
    a = ab.parse_args(["all", "--out", "o", "--fmla", ".fmla", "--budget-s", "200"])
    assert (a.cmd, a.out, a.fmla, a.budget_s, a.variants) == ("all", "o", ".fmla", 200.0, list(VARIANTS))
    assert a.check_timeout_s > 0 and a.schedules == list(ab.SCHEDULES)
    a = ab.parse_args(["run", "--out", "o", "--variants", "seesaw,recompute", "--heads", "128", "--batches",
                       "16,64", "--keys", "8192", "--dists", "uniform"])
    assert (a.variants, a.heads, a.batches, a.keys, a.dists) == (["seesaw", "recompute"], [128], [16, 64], [8192],
                                                                ["uniform"])
    a = ab.parse_args(["check", "--out", "o", "--baseline"])
    assert a.baseline and not hasattr(a, "budget_s")
    assert ab.parse_args(["summary", "x.csv"]).csv == "x.csv"


@pytest.mark.parametrize("argv", [["run", "--out", "o", "--variants", "pingpong"],
                                  ["all", "--out", "o", "--schedules", "flashinfer"], ["run"], []])
def test_refuses_bad_arguments(ab, argv):
    with pytest.raises(SystemExit):
        ab.parse_args(argv)


def test_the_timed_batches(ab):
    s = ab.shapes()
    # MLA-128 and MLA-64 x batch 1/16/64/132 x 8K/32K/64K keys x uniform/longtail, less batch 1 long-tail
    assert len(s) == 2 * 4 * 3 * 2 - 2 * 3 and len(set(s)) == len(s)
    assert {h for h, *_ in s} == {64, 128} and {b for _, b, *_ in s} == {1, 16, 64, 132}
    assert {n for *_, n, _ in s} == {8192, 32768, 65536} and {d for *_, d in s} == {"uniform", "longtail"}
    assert s[0] == (128, 64, 32768, "uniform") and all(h == 128 for h, *_ in s[: len(s) // 2])
    assert (128, 1, 8192, "longtail") not in s


def test_writes_csv_rows(ab, tmp_path):
    got = assert_appends_rows(
        ab, tmp_path, dict(phase="check", impl="ws-seesaw", variant="seesaw", case="fp16", status="ok",
                           rel_err="1.00e-03"),
        dict(phase="time", impl="gluon-v6", heads=128, batch=16, longest=8192, dist="uniform", us=12.5, status="ok"))
    assert got[0]["case"] == "fp16" and got[0]["us"] == "" and got[1]["us"] == "12.5"


def test_only_variants_that_passed_every_check_are_timed(ab):
    rows = [dict(phase="check", variant="seesaw", status="ok"), dict(phase="check", variant="seesaw", status="ok"),
            dict(phase="check", variant="recompute", status="ok"),
            dict(phase="check", variant="recompute", status="wrong"),
            dict(phase="check", variant="seesaw-fine", status="timeout"),
            dict(phase="time", variant="recompute-fine", status="ok")]
    assert ab.passed_checks(rows, list(VARIANTS)) == ["seesaw"]


def test_summary(ab):
    # Made-up rows (test data, not measurements): the summary's arithmetic.
    def timed(impl, batch, us, roof):
        return dict(phase="time", impl=impl, heads="128", batch=str(batch), longest="8192", dist="uniform",
                    us=str(us), roofline=str(roof), status="ok", error="")

    rows = [timed("gluon-v6", 16, 100, 0.5), timed("flashmla", 16, 50, 1.0), timed("ws-seesaw@uniform", 16, 80, 0.6),
            timed("gluon-v6", 64, 400, 0.5), timed("flashmla", 64, 200, 1.0), timed("ws-seesaw@uniform", 64, 100, 0.8),
            dict(phase="check", impl="ws-seesaw", case="fp16", status="ok", rel_err="2.0e-03", error=""),
            dict(phase="check", impl="ws-recompute", case="nan-key", status="wrong", rel_err="inf", error="x"),
            dict(phase="time", impl="ws-recompute@uniform", heads="128", batch="16", longest="8192",
                 dist="uniform", status="wrong", error="")]
    text = "\n".join(ab.summary_lines(rows))
    # seesaw against gluon-v6: 100/80 = 1.25 and 400/100 = 4, geomean sqrt(5) = 2.236; against flashmla 0.625 and 2
    assert "ws-seesaw@uniform" in text and "vs gluon-v6 2.236 (worst 1.250)" in text
    assert "vs flashmla 1.118 (worst 0.625)" in text
    assert "check ws-seesaw: 1/1 ok" in text and "check ws-recompute: 0/1 ok" in text
    assert "time ws-recompute@uniform 128/16/8192/uniform: wrong" in text


def test_all_times_only_what_passed_its_check_process(ab, tmp_path, monkeypatch):
    # On this machine each check process fails (no GPU): its failure is a row, and nothing is timed but the baseline.
    timed = []
    monkeypatch.setattr(ab, "run", lambda args, t0=None: timed.append(list(args.variants)))
    ab.run_all(ab.parse_args(["all", "--out", str(tmp_path), "--variants", "seesaw", "--check-timeout-s", "120"]))
    rows = read_rows(tmp_path / ab.CSV_NAME)
    assert timed == [[]]
    assert {(r["impl"], r["status"]) for r in rows} == {("ws-seesaw", "error"), ("gluon-v6", "error")}
    assert all("exited with code" in r["error"] for r in rows)


def test_the_persistent_variant_is_timed_on_persistent_schedules(ab):
    a = ab.parse_args(["run", "--out", "o", "--variants", "seesaw,seesaw-persistent", "--schedules",
                       "uniform,stream_k,flashmla,splitlab-persistent"])
    assert a.variants == ["seesaw", "seesaw-persistent"] and "seesaw-persistent" in PERSISTENT_VARIANTS
    assert set(ab.PERSISTENT_SCHEDULES) < set(ab.SCHEDULES)
    got = ab.pairs(a.variants, a.schedules)
    # the one-item seesaw on the one-item schedule only; the persistent one on every schedule (its @uniform row: the
    # loop's cost where each slot has one item)
    assert got == [("seesaw", "uniform"), ("seesaw-persistent", "uniform"), ("seesaw-persistent", "stream_k"),
                   ("seesaw-persistent", "flashmla"), ("seesaw-persistent", "splitlab-persistent")]
    assert ab.pairs(["seesaw", "recompute"], list(ab.SCHEDULES)) == [
        (v, label) for label in ("uniform", "splitlab") for v in ("seesaw", "recompute")]


def test_the_timed_rows_it_skips(ab):
    lens = [300, 70]
    one, many = schedulers.uniform(lens, 2), schedulers.stream_k(lens, 3)
    assert ab.skip_reason("seesaw-persistent", "stream_k", many) == ""
    assert ab.skip_reason("seesaw-persistent", "uniform", one) == ""
    assert "persistent" in ab.skip_reason("seesaw", "stream_k", many)
    assert "@splitlab row" in ab.skip_reason("seesaw-persistent", "splitlab-persistent", one)
    assert ab.skip_reason("", "own", None) == ""


@pytest.mark.parametrize("name,heads,lens,page,dt,splits,twist", load("mla_ws").CHECKS)
def test_the_persistent_variant_is_checked_on_slots_of_several_items(ab, name, heads, lens, page, dt, splits, twist):
    got = ab.check_schedules("seesaw-persistent", lens, splits)
    assert [label for label, _ in got] == ["uniform", f"stream_k:{splits}", f"flashmla:{splits}"]
    for _, s in got:
        s.check()
        assert s.align % 64 == 0 and s.batch == len(lens)
    assert [label for label, _ in ab.check_schedules("seesaw", lens, splits)] == ["uniform"]
    if name == "empty-and-odd":  # one slot: three items, the empty request between the others
        assert [it[1:] for it in got[1][1].items] == [(0, 0, 1000), (1, 0, 0), (2, 0, 77)]
