"""Oracle, regret and comparisons on a hand-made result set (every expected value worked out by hand)."""

import math
from pathlib import Path

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

    from splitlab import results

    df = results.one_per_point(results.load(Path(__file__).parent / "fixtures" / "sweeps"))
    rep = analysis.replay(df, "splitlab")
    r = analysis.regret(df, replayed=("splitlab",))
    ours = r[r["planner"] == "splitlab"]
    assert not r.duplicated([*analysis.SHAPE, "planner"]).any()
    assert set(ours["kernel"]) <= set(rep["kernel"])
    scored = rep[rep["reason"] == ""]
    got = ours.merge(scored, on=[c for c in analysis.SHAPE if c in ours.columns], suffixes=("", "_rep"))
    assert len(got) == len(scored) > 0 and (got["regret"] == got["regret_rep"]).all()
    assert (ours.loc[ours["regret"].isna(), "status"] == "not measured").all()


# --- devices: a shape is one call on one device (and SM count) -----------------------------------------------

def two_devices(df):
    """``df`` on the H200 (132 SMs) plus a B200 (148 SMs) copy whose times put the optimum elsewhere."""
    b200 = df.assign(device="b200", sm_count=148)
    b200["p50_us"] = [40.0, 12.0, 10.0, 5.0, 100.0, 120.0, 95.0]  # batch 1: 32 splits best; batch 16: 1 split
    return pd.concat([df.assign(sm_count=132), b200], ignore_index=True)


def test_oracle_regret_and_compare_key_shapes_by_device(df):
    two = two_devices(df)
    o = analysis.oracle(two).set_index(["device", "batch"])["num_splits"]
    assert o.to_dict() == {("h200-sxm", 1): 16, ("h200-sxm", 16): 2, ("b200", 1): 32, ("b200", 16): 1}
    r = analysis.regret(two).set_index(["device", "batch", "planner"])["regret"]
    assert r[("h200-sxm", 1, "splitlab")] == pytest.approx(1.1) and r[("b200", 1, "splitlab")] == 1.0
    assert r[("h200-sxm", 16, "modular")] == pytest.approx(100 / 90) and r[("b200", 16, "modular")] == 1.0
    assert len(r) == 2 * len(analysis.regret(df))
    c = analysis.compare(two, two, base_planner="splitlab", cand_planner="modular").set_index(["device", "batch"])
    assert c.loc[("h200-sxm", 1), "ratio"] == pytest.approx(40 / 11) and c.loc[("b200", 1), "ratio"] == 8.0
    assert c.loc[("b200", 16), "ratio"] == pytest.approx(100 / 120)


def test_one_preset_at_two_sm_counts_is_two_shapes(df):
    # devices.detect keeps a preset's name for a card with another SM count: the rows tell them apart.
    other = df.assign(sm_count=114)
    other["p50_us"] = [5.0, 12.0, 10.0, 11.0, 100.0, 90.0, 95.0]  # batch 1: 1 split best at 114 SMs
    both = pd.concat([df.assign(sm_count=132), other], ignore_index=True)
    o = analysis.oracle(both).set_index(["sm_count", "batch"])["num_splits"]
    assert o[(132, 1)] == 16 and o[(114, 1)] == 1 and len(o) == 4


def gqa_points(device, sm_count, batch, times):
    """``ok`` gqa_decode rows of one shape at the knobs the launcher resolves (its defaults) per split count."""
    from splitlab.planners.registry import Plan
    from splitlab.workloads import DecodeWorkload

    w = DecodeWorkload("gqa", batch, 32, 8, 128, 128, 8192, page_size=16)
    out = []
    for s, t in times.items():
        knobs = analysis.resolve_knobs("gqa_decode", w, Plan("x", s), "h200")
        out.append(SHAPE | knobs | dict(device=device, sm_count=sm_count, batch=batch, ctx_len=8192, p50_us=t,
                                        status="ok", planners="splitlab" if s == 4 else "", timing="graph"))
    return out


def test_replay_asks_each_shape_on_its_own_device():
    from splitlab.planners.registry import Plan

    seen = []

    def by_sms(w, dev):
        seen.append((dev.name, dev.sm_count))
        return Plan("by_sms", 8 if dev.sm_count == 132 else 16)

    df = pd.DataFrame(gqa_points("h200-sxm", 132, 2, {4: 30.0, 8: 20.0, 16: 25.0})
                      + gqa_points("b200", 148, 2, {4: 30.0, 8: 26.0, 16: 13.0})
                      + gqa_points("h200-sxm", 114, 2, {4: 30.0, 8: 28.0, 16: 14.0}))
    r = analysis.replay(df, by_sms).set_index(["device", "sm_count"])
    assert sorted(set(seen)) == [("b200", 148), ("h200-sxm", 114), ("h200-sxm", 132)]
    assert r.loc[("h200-sxm", 132), "num_splits"] == 8 and r.loc[("h200-sxm", 132), "regret"] == 1.0
    assert r.loc[("b200", 148), "num_splits"] == 16 and r.loc[("b200", 148), "regret"] == 1.0
    assert r.loc[("h200-sxm", 114), "num_splits"] == 16  # the preset at the SM count the rows record
    assert (r["reason"] == "").all()
    # One device named for all of them is still honoured.
    assert set(analysis.replay(df, by_sms, device="b200")["num_splits"]) == {16}


def test_a_device_that_is_not_a_preset_keeps_its_tags():
    df = pd.DataFrame(gqa_points("h200-sxm", 132, 2, {4: 30.0, 8: 20.0})
                      + gqa_points("NVIDIA Mystery GPU", 90, 2, {4: 15.0, 8: 20.0}))
    rep = analysis.replay(df, "splitlab").set_index("device")
    assert rep.loc["NVIDIA Mystery GPU", "reason"].startswith("planner: device=")
    assert math.isnan(rep.loc["NVIDIA Mystery GPU", "regret"])
    r = analysis.regret(df, replayed=("splitlab",)).set_index(["device", "planner"])
    assert r.loc[("NVIDIA Mystery GPU", "splitlab"), "regret"] == 1.0  # its tag: 4 splits, the optimum
    assert r.loc[("NVIDIA Mystery GPU", "splitlab"), "num_splits"] == 4
    assert ("h200-sxm", "splitlab") in r.index  # replayed there


def test_a_card_that_is_not_shipped_keeps_its_tags(df):
    # replay resolves launches only for the kernels in LAUNCH_FACTS; another card's kernel keeps the tags.
    mine = df.assign(kernel="my_gqa_card")
    r = analysis.regret(mine, replayed=("splitlab",)).set_index(["batch", "planner"])["regret"]
    assert r[(1, "splitlab")] == pytest.approx(1.1) and r[(16, "splitlab")] == 1.0
    c = analysis.compare(mine, mine, base_planner="flex", cand_planner="splitlab", replayed=("splitlab",))
    assert list(c["batch"]) == [1, 16] and c["ratio"].iloc[0] == pytest.approx(11 / 12)


def test_a_flashinfer_plan_resolves_to_the_kernels_own_tile():
    # FlashInfer's chunk length is Plan.kv_chunk, not a tile: the sweep's knobs come from the kernel's defaults.
    from dataclasses import replace

    from splitlab.planners import plan
    from splitlab.workloads import DecodeWorkload

    w = DecodeWorkload("gqa", 32, 32, 8, 128, 128, 8192, page_size=16)
    p = plan(w, "h100", "flashinfer")
    assert (p.num_splits, p.kv_chunk, p.block_n) == (1, 8192, None)
    knobs = analysis.resolve_knobs("gqa_decode", w, p, "h100")
    assert knobs["num_splits"] == 1 and knobs["block_n"] == 64  # gqa default_knobs: group 4, d 128
    with pytest.raises(SplitlabError, match="block_n"):  # what the chunk length did as a tile
        analysis.resolve_knobs("gqa_decode", w, replace(p, block_n=p.kv_chunk), "h100")


# --- the split_regressions notebook on mixed-device data and on a card that is not shipped ----------------------

FIXTURE = Path(__file__).parent / "fixtures" / "sweeps"


def copy_sweep(src: Path, dest: Path, tag: str, **columns) -> None:
    """A copy of the sweep folder ``src`` as another sweep (``tag`` in its ids) with ``columns`` overwritten in its
    rows and sidecar: e.g. the same points measured on another device, or by a card of another name."""
    import json

    from splitlab import results

    dest.mkdir(parents=True)
    rows = pd.read_parquet(src / "results.parquet")
    side = json.loads((src / "sweep.json").read_text())
    side["sweep_id"] = rows["sweep_id"].iloc[0] + tag
    rows = rows.assign(sweep_id=side["sweep_id"], point_id=rows["point_id"] + tag, **columns)
    if "device" in columns:
        side["device"] = {**side["device"], "name": columns["device"], "sm_count": columns["sm_count"]}
        side["env"]["device"] = {**side["env"]["device"], "name": columns["device"], "sm_count": columns["sm_count"]}
    if "kernel" in columns:
        side["kernel"] = columns["kernel"]
    results.write_parquet(rows, dest / "results.parquet")
    (dest / "sweep.json").write_text(json.dumps(side))


def run_split_regressions(data: Path, out: Path):
    pytest.importorskip("papermill")
    import nbformat

    from splitlab import datasets, notebook, report

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        mp.setenv("MPLBACKEND", "Agg")
        report.build_report(data, out, only=["split_regressions"], progress=False,
                            allow_fake=datasets.data_info(data).fake)
    nb = nbformat.read(out / "split_regressions.ipynb", as_version=4)
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [f"{o.ename}: {o.evalue}" for o in outs if o.output_type == "error"]
    return notebook.read_finding(nb)


def test_split_regressions_on_two_devices_and_on_an_unshipped_card(tmp_path):
    src = FIXTURE / "gqa_decode-default"
    mixed = tmp_path / "mixed"
    copy_sweep(src, mixed / "h200", ":h200")
    copy_sweep(src, mixed / "b200", ":b200", device="b200", sm_count=148)
    f = run_split_regressions(mixed, tmp_path / "out-mixed")
    assert "h200-sxm (132 SMs)" in f["finding"] and "b200 (148 SMs)" in f["finding"]
    assert f["shapes"] > 0
    card = tmp_path / "card"
    copy_sweep(src, card / "my_gqa", ":mine", kernel="my_gqa_card")
    f = run_split_regressions(card, tmp_path / "out-card")
    assert f["shapes"] > 0 and "share no correctly measured shape" not in f["finding"]


def test_the_report_names_each_devices_sm_count(tmp_path):
    from splitlab import datasets

    src = FIXTURE / "gqa_decode-default"
    mixed = tmp_path / "mixed"
    copy_sweep(src, mixed / "h200", ":h200")
    copy_sweep(src, mixed / "b200", ":b200", device="b200", sm_count=148)
    info = datasets.data_info(mixed)
    assert "b200: 148" in info.sms and ": 132" in info.sms and info.sms in info.label
    df, info = datasets.load_data(mixed, allow_fake=info.fake)
    assert set(df["device"]) == {"b200", "h200-sxm"} and len(df) == 2 * len(datasets.load_data(src, allow_fake=True)[0])
    assert datasets.data_info(src).sms == "132 SMs"


def test_a_release_that_chose_as_its_rule_is_shown_once(df):
    """``flashinfer-0.7.4`` beside ``flashinfer``: shown once where they chose the same point on every shape both
    were recorded on (a shape only one of them tags does not count); where they differ, both stay and the note
    says on how many shapes."""
    assert analysis.planner_versions(["flashinfer", "flashinfer-0.7.4", "flex", "splitlab-v0", "splitlab"]) == {
        "flashinfer-0.7.4": "flashinfer"}  # a version number after the dash, nothing else
    df["planners"] = df["planners"].replace({"modular": "modular,modular-2.0", "modular,flex": "modular,flex"})
    assert analysis.version_twins(df) == {"modular-2.0": ("modular", 1, 0)}  # batch 16: no modular-2.0 tag
    assert list(analysis.merged_versions(analysis.version_twins(df))) == ["modular-2.0"]
    df.loc[df["planners"] == "flex", "planners"] = "flex,modular-2.0"  # batch 1: 8 splits against modular's 1
    twins = analysis.version_twins(df)
    assert twins == {"modular-2.0": ("modular", 1, 1)} and analysis.merged_versions(twins) == {}
    assert "differently on 1 of the 1 shapes" in analysis.twins_note(twins)


def test_coverage_says_why_a_planner_has_fewer_shapes(df):
    reg = analysis.regret(df)
    cov = analysis.coverage(reg, df).set_index("planner")
    # sglang: chose on both shapes, one choice measured wrong; every other planner is scored on both
    assert list(cov.index) == ["sglang"] and (cov.loc["sglang", "shapes"], cov.loc["sglang", "scored"]) == (2, 1)
    assert "1 of its choices measured wrong" in cov.loc["sglang", "why"]
    df.loc[df["planners"] == "modular,flex", "planners"] = "flex"  # no modular choice recorded at batch 16
    cov = analysis.coverage(analysis.regret(df), df).set_index("planner")
    assert "the sweeps of 1 shape did not record its choice" in cov.loc["modular", "why"]
