"""Oracle, regret and comparisons on a hand-made result set (every expected value worked out by hand)."""

import math

import pandas as pd
import pytest

from splitlab import analysis
from splitlab.errors import SplitlabError

SHAPE = dict(kernel="gqa_decode", device="h200-sxm", kind="gqa", num_q_heads=32, num_kv_heads=8, head_dim_qk=128,
             head_dim_v=128, page_size=16, topk=0, dtype="bf16")


def rows(batch, points):
    return [SHAPE | dict(batch=batch, ctx_len=8192, num_splits=s, p50_us=t, status=st, planners=p, timing="graph")
            for s, t, st, p in points]


@pytest.fixture
def df():
    return pd.DataFrame(
        rows(1, [(1, 40.0, "ok", "modular"), (8, 12.0, "ok", "flex"), (16, 10.0, "ok", ""),
                 (32, 11.0, "ok", "splitlab,sglang")])
        + rows(16, [(1, 100.0, "ok", "modular,flex"), (2, 90.0, "ok", "splitlab"), (4, 95.0, "wrong", "sglang")]))


def test_oracle_is_the_fastest_ok_point_per_shape(df):
    o = analysis.oracle(df).set_index("batch")
    assert o.loc[1, "num_splits"] == 16 and o.loc[1, "p50_us"] == 10.0
    assert o.loc[16, "num_splits"] == 2  # the 'wrong' point is never the optimum


def test_regret_per_planner(df):
    r = analysis.regret(df).set_index(["batch", "planner"])["regret"]
    assert r[(1, "modular")] == 4.0 and r[(1, "flex")] == 1.2 and r[(1, "splitlab")] == pytest.approx(1.1)
    assert r[(16, "splitlab")] == 1.0 and r[(16, "flex")] == pytest.approx(100 / 90)
    assert math.isnan(r[(16, "sglang")])  # its choice was measured wrong: no regret, status kept


def test_summary_geomean_and_worst(df):
    s = analysis.summary(analysis.regret(df)).set_index("planner")
    assert s.loc["modular", "geomean"] == pytest.approx(math.sqrt(4.0 * 100 / 90))
    assert s.loc["modular", "worst"] == 4.0 and s.loc["modular", "worst_shape"].startswith("gqa B=1 ")
    assert s.loc["sglang", "measured"] == 1 and s.loc["sglang", "shapes"] == 2
    assert list(s.index)[0] == "splitlab"  # sorted by geomean: splitlab's sqrt(1.1 * 1.0) is the lowest


def test_compare_two_planners_slowest_first(df):
    c = analysis.compare(df, df, base_planner="splitlab", cand_planner="modular")
    assert list(c["batch"]) == [1, 16] and c["ratio"].iloc[0] == pytest.approx(40 / 11)
    with pytest.raises(SplitlabError, match="planner='nobody'"):
        analysis.compare(df, df, cand_planner="nobody")


def test_fake_timings_are_refused(df):
    df.loc[0, "timing"] = "fake"
    with pytest.raises(SplitlabError, match="not measurements"):
        analysis.regret(df)
    assert len(analysis.oracle(df, allow_fake=True)) == 2


def test_a_rule_that_changed_between_sessions_counts_once_at_its_newest_choice(df):
    df["finished_at"] = "2026-11-29T10:00:00"
    # A resumed session measured a new version's choice for batch 1: 16 splits, tagged later.
    df.loc[2, ["planners", "finished_at"]] = ["splitlab", "2026-11-29T12:00:00"]
    r = analysis.regret(df)
    assert not r.duplicated(["batch", "planner"]).any()
    assert r.set_index(["batch", "planner"]).loc[(1, "splitlab"), "num_splits"] == 16
    assert r.set_index(["batch", "planner"]).loc[(1, "sglang"), "num_splits"] == 32  # untouched


def test_replayed_planners_are_scored_by_todays_rule():
    from pathlib import Path

    from splitlab import report, results

    df = report.one_per_point(results.load(Path(__file__).parent / "fixtures" / "sweeps"))
    rep = analysis.replay(df, "splitlab")
    r = analysis.regret(df, replayed=("splitlab",))
    ours = r[r["planner"] == "splitlab"]
    assert not r.duplicated([*analysis.SHAPE, "planner"]).any()
    assert set(ours["kernel"]) <= set(rep["kernel"])
    scored = rep[rep["reason"] == ""]
    got = ours.merge(scored, on=[c for c in analysis.SHAPE if c in ours.columns], suffixes=("", "_rep"))
    assert len(got) == len(scored) > 0 and (got["regret"] == got["regret_rep"]).all()
    assert (ours.loc[ours["regret"].isna(), "status"] == "not measured").all()
