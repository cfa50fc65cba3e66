"""Schedules as a sweep knob (issue 35): a card's ``scheduler`` (and ``sched_ctas``) knob expands to work-list
points, which run on the work-list kernels (under Triton's interpreter here), are priced by the fake timer from
their schedule, record what ran (``scheduler``, ``schedule_hash``, ``sched_ctas``, ``sched_items``,
``partial_rows``, ``busiest_keys``), resume like any point, and enter a shape's oracle beside the split counts."""

import dataclasses
from pathlib import Path

import pytest

from splitlab import analysis, results
from splitlab.bench import cards, grid, sweep
from splitlab.bench.cards import CardError
from splitlab.bench.impls import SCHEDULE_COLUMNS
from splitlab.bench.sweep import SweepOptions
from splitlab.bench.timing import FakeTimer
from splitlab.cli import main
from splitlab.devices import get as get_device
from splitlab.errors import SplitlabError

H200 = get_device("h200")
SHAPE = "num_q_heads = 4\nnum_kv_heads = 2\nhead_dim_qk = 16\nbatch = 3\nctx_len = 200\nlengths = \"spread4\"\n"
SCHEDULERS = ["uniform", "balanced", "stream_k", "flashinfer", "splitlab"]


def card_text(name="t_sched", *, knobs='scheduler = { values = ["uniform", "balanced", "stream_k", "flashinfer", '
              '"splitlab"] }\nsched_ctas = { min = 1, max = 64 }\n',
              block='scheduler = ["uniform", "balanced", "stream_k", "flashinfer", "splitlab"]\n'
                    'num_splits = [2]\nsched_ctas = [4]\n', kind="gqa", module="gqa"):
    """splitlab's GQA kernel on one tiny ragged batch: the grid's schedules (quick) and split counts (default)."""
    return (f'name = "{name}"\nkind = "{kind}"\n[impl]\nimport = "splitlab.kernels.{module}:{module}_decode"\n'
            f'reference = "splitlab.kernels.reference:{module}_decode"\n'
            f'launch_facts = "splitlab.kernels.{module}:{module}_launch_facts"\n'
            f"[knobs]\nnum_splits = {{ min = 1, max = 4 }}\n{knobs}"
            f"[[grids.quick]]\n{SHAPE}{block}min_keys_per_split = 1\n"
            f"[[grids.default]]\n{SHAPE}num_splits = [1, 2]\nmin_keys_per_split = 1\n")


def load(tmp_path, text, name="card.toml"):
    p = tmp_path / name
    p.write_text(text)
    return cards.load(p)


def test_a_card_with_the_scheduler_knob_expands_runs_records_and_resumes(tmp_path):
    card = dataclasses.replace(load(tmp_path, card_text()), planner_knobs=())  # the grid's points only
    assert card.knobs["scheduler"].values == tuple(SCHEDULERS)
    pts = grid.expand(card, "quick", H200).points
    # num_splits goes to uniform only, sched_ctas to balanced and stream_k only: one point per scheduler.
    assert [p.facts["scheduler"] for p in pts] == SCHEDULERS
    by = {p.facts["scheduler"]: p for p in pts}
    assert by["uniform"].facts["num_splits"] == 2 and by["uniform"].schedule.params["num_splits"] == 2
    assert by["balanced"].facts["sched_ctas"] <= 4 and by["stream_k"].facts["sched_ctas"] <= 4
    for p in pts:
        s = p.schedule
        assert p.facts["schedule_hash"] == s.digest and p.facts["sched_ctas"] == s.ctas
        assert p.facts["ctas"] == s.ctas * 2  # the slots x the kv heads
        assert p.facts["sched_items"] == len(s.items) and p.facts["partial_rows"] == s.partial_rows
        assert p.facts["busiest_keys"] == max(s.cta_keys)
    # A split-count point keeps its id (the card without the knob gives the same ids); a schedule's is its own.
    plain = load(tmp_path, card_text(knobs="", block="num_splits = [2]\n"), "plain.toml")
    ids = {p.point_id for p in grid.expand(dataclasses.replace(card, planner_knobs=()), "default", H200).points}
    assert ids == {p.point_id for p in grid.expand(dataclasses.replace(plain, planner_knobs=()), "default",
                                                   H200).points}
    assert not ids & {p.point_id for p in pts} and len({p.point_id for p in pts}) == 5

    # Run two points in this process, then resume the rest in a point worker (the schedule travels with its point).
    o = dict(out=tmp_path / "runs", device="h200", quiet=True, grid="quick", timer="fake")
    first = sweep.run(card, SweepOptions(**o, isolate=False, limit=2))
    assert first.stopped == "limit" and first.done == 2
    res = sweep.run(card, SweepOptions(**o, resume=True))
    assert res.done == res.total == 5 and res.statuses == {"ok": 3}
    df = results.load(res.sweep_dir)
    assert len(df) == 5 and (df.status == "ok").all() and (df.rel_err < 2e-2).all(), df[["scheduler", "error"]]
    assert set(SCHEDULE_COLUMNS) <= set(df.columns) and str(df.schedule_hash.dtype) == "string"
    fake = FakeTimer(H200)
    for _, r in df.iterrows():
        p = by[r.scheduler]
        assert r.point_id == p.point_id and r.schedule_hash == p.schedule.digest
        assert (r.sched_ctas, r.sched_items, r.partial_rows, r.busiest_keys, r.ctas) == \
            tuple(p.facts[k] for k in ("sched_ctas", "sched_items", "partial_rows", "busiest_keys", "ctas"))
        assert r.p50_us == pytest.approx(fake.modelled_us(p.workload, p.facts["num_splits"], p.schedule))
        assert r.timing == "fake" and "planners.schedulers" in r.timing_detail
    # The split-count grid of the same card: the columns are there, empty.
    res = sweep.run(card, SweepOptions(**{**o, "grid": "default"}, isolate=False))
    df = results.load(res.sweep_dir)
    assert len(df) == 2 and (df.scheduler == "").all() and df.schedule_hash.isna().all()
    assert df.sched_ctas.isna().all() and df.partial_rows.isna().all()


def test_the_mla_work_list_kernel_runs_a_schedule_under_the_interpreter(tmp_path):
    shape = "num_q_heads = 4\nhead_dim_qk = 40\nhead_dim_v = 32\nbatch = 2\nctx_len = 130\nlengths = \"spread4\"\n"
    text = card_text("t_mla", kind="mla", module="mla", knobs='scheduler = { values = ["flashmla", "uniform"] }\n',
                     block='scheduler = ["flashmla", "uniform"]\nnum_splits = [3]\n').replace(SHAPE, shape)
    card = dataclasses.replace(load(tmp_path, text), planner_knobs=())
    res = sweep.run(card, SweepOptions(out=tmp_path / "runs", device="h200", quiet=True, grid="quick", timer="fake",
                                       isolate=False))
    df = results.load(res.sweep_dir)
    assert list(df.scheduler) == ["flashmla", "uniform"] and (df.status == "ok").all(), df.error.tolist()
    assert (df.ctas == df.sched_ctas).all()  # 4 heads: one head tile


@pytest.mark.parametrize("edit, needles", [
    (lambda t: t.replace('"splitlab"] }', '"bogus"] }', 1), ["knobs.scheduler.values=", "bogus", "stream_k"]),
    (lambda t: t.replace('"splitlab"] }', '"flashmla"] }', 1), ["knobs.scheduler.values=", "'flashmla'",
                                                                 "schedulers of kind gqa: splitlab, uniform"]),
    (lambda t: t.replace('scheduler = { values', 'scheduler = { min = 1, values', 1), ["knobs.scheduler.min"]),
    (lambda t: t.replace('scheduler = ["uniform",', 'scheduler = ["uniform", "flashmla",'),
     ["grids.quick[0].scheduler=", "flashmla", "one of uniform, balanced"]),
    (lambda t: t.replace('scheduler = ["uniform",', 'scheduler = [1,'), ["grids.quick[0].scheduler=[1"]),
])
def test_a_bad_scheduler_is_one_line(tmp_path, edit, needles):
    with pytest.raises(CardError) as e:
        load(tmp_path, edit(card_text()))
    msg = str(e.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg


def test_schedule_knobs_where_they_do_not_apply_are_one_line(tmp_path, capsys):
    text = card_text()
    # sched_ctas without a scheduler: refused where the grid expands, naming the block.
    card = load(tmp_path, text.replace("[[grids.default]]\n", "[[grids.default]]\nsched_ctas = 4\n"))
    with pytest.raises(SplitlabError, match=r"grids.default\[0\]: sched_ctas=4 is not allowed without a scheduler"):
        grid.expand(card, "default", H200)
    # A kernel without a work-list launcher (the example plugin's) takes no scheduler knob.
    plugin = Path(__file__).resolve().parents[1] / "examples" / "my_kernel.py"
    plain = card_text("t_plain", knobs='scheduler = { values = ["uniform"] }\n', block="num_splits = [2]\n").replace(
        'import = "splitlab.kernels.gqa:gqa_decode"', 'import = "my_kernel:decode"').replace(
        'launch_facts = "splitlab.kernels.gqa:gqa_launch_facts"', 'launch_facts = "my_kernel:launch_facts"')
    p = tmp_path / "plain.toml"
    p.write_text(plain)
    assert main(["--plugin", str(plugin), "sweep", str(p), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "knobs.scheduler' is not allowed" in err, err


def test_the_sparse_work_list_kernel_runs_a_schedule_under_the_interpreter(tmp_path):
    """Sparse MLA: each token walks its valid top-k prefix (spread4) on the work-list kernel, checked against fp64."""
    shape = ("num_q_heads = 4\nhead_dim_qk = 32\nhead_dim_v = 32\nbatch = 3\nctx_len = 64\ntopk = 40\n"
             "lengths = \"spread4\"\n")
    text = card_text("t_sp", kind="sparse_mla", module="sparse_mla",
                     knobs='scheduler = { values = ["uniform", "stream_k", "balanced"] }\n',
                     block='scheduler = ["uniform", "stream_k", "balanced"]\nnum_splits = [2]\n'
                     ).replace(SHAPE, shape)
    card = dataclasses.replace(load(tmp_path, text), planner_knobs=())
    res = sweep.run(card, SweepOptions(out=tmp_path / "runs", device="h200", quiet=True, grid="quick", timer="fake",
                                       isolate=False))
    df = results.load(res.sweep_dir)
    assert list(df.scheduler) == ["uniform", "stream_k", "balanced"] and (df.status == "ok").all(), df.error.tolist()
    assert (df.ctas == df.sched_ctas).all() and (df.schedule_hash != "").all()  # 4 heads: one head tile


def test_the_sparse_cards_ragged_schedules_grid_dry_runs(capsys):
    """The shipped sparse card's schedules grid: every sparse scheduler on every shape, the schedule over each
    token's walked top-k (``w.lengths``), beside the planners' split counts."""
    exp = grid.expand(cards.load("sparse_mla_decode"), "ragged-schedules", H200)
    sched = [p for p in exp.points if p.schedule is not None]
    assert {p.facts["scheduler"] for p in sched} == {"uniform", "balanced", "stream_k", "splitlab"}
    assert len(sched) == 4 * exp.shapes == 32
    assert all(p.schedule.lengths == p.workload.lengths and max(p.workload.lengths) == p.workload.topk for p in sched)
    assert any(p.schedule is None for p in exp.points)  # the split counts stay
    assert main(["sweep", "sparse_mla_decode", "--grid", "ragged-schedules", "--dry-run"]) == 0
    assert "stream_k" in capsys.readouterr().out


def test_the_oracle_of_the_ragged_schedules_grid_is_taken_over_schedules_too():
    """The shipped grid, priced as ``--timer fake`` prices it: a shape's oracle is its fastest point whatever ran
    it (split count or schedule), the schedules do not make shapes of their own, and a replayed split-count rule is
    looked up among the split-count points only."""
    card = cards.load("gqa_decode")
    exp = grid.expand(card, "ragged-schedules", H200)
    sched = [p for p in exp.points if p.schedule is not None]
    assert {p.facts["scheduler"] for p in sched} == set(SCHEDULERS) and len(sched) == 5 * exp.shapes == 80
    assert {p.workload.length_dist for p in exp.points} == {"spread16", "longtail"}
    fake = FakeTimer(H200)
    rows = [{**dict.fromkeys(results.COLUMNS), **p.row(sm_count=H200.sm_count), "schema_version": 1, "sweep_id": "s",
             "device": H200.name, "sm_count": H200.sm_count, "status": "ok", "timing": "fake",
             "p50_us": fake.modelled_us(p.workload, p.facts["num_splits"], p.schedule)} for p in exp.points]
    df = results.frame(rows)
    best = analysis.oracle(df, allow_fake=True)
    assert len(best) == exp.shapes == 16
    keys = analysis.shape_cols(df)
    assert (best.set_index(keys)["p50_us"].sort_index() == df.groupby(keys)["p50_us"].min().sort_index()).all()
    assert (best.scheduler != "").any()  # schedules are among the shapes' best points here
    reg = analysis.regret(df, allow_fake=True)
    assert set(reg.planner) >= {"splitlab", "flashinfer"} and len(reg) == 16 * reg.planner.nunique()
    assert (reg.regret >= 1).all()
    assert (reg.merge(best[keys + ["p50_us"]], on=keys)["oracle_us"] == reg.merge(
        best[keys + ["p50_us"]], on=keys)["p50_us_y"]).all()
    # Replay: the oracle is the same one; the rule's plan is a split-count point, never a schedule's.
    rep = analysis.replay(df, "splitlab", allow_fake=True)
    assert len(rep) == 16 and (rep.reason == "").all()
    m = rep.merge(best[keys + ["p50_us"]], on=keys, suffixes=("", "_best"))
    assert (m.oracle_us == m.p50_us_best).all()
    tagged = reg[reg.planner == "splitlab"].merge(rep[keys + ["p50_us"]], on=keys, suffixes=("", "_rep"))
    assert (tagged.p50_us == tagged.p50_us_rep).all()
