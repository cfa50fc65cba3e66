"""splitlab.analysis.replay on a hand-made frame, the fit / held-out split, and the fitted planner's plans."""

import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitlab import analysis, devices, fit, planners, scoring, waves, workloads
from splitlab.planners import fitted
from splitlab.planners.registry import Plan
from splitlab.planners.splitlab import fitted_plan

#: The shipped H200 constants (what the ``splitlab`` planner takes on the H200), per family.
FITTED = fitted.load(fitted.SHIPPED_DIR / "h200-sxm.toml").families

MLA = dict(kernel="mla_decode", device="h200-sxm", kind="mla", num_q_heads=16, num_kv_heads=1, head_dim_qk=576,
           head_dim_v=512, page_size=64, topk=0, dtype="bf16", timing="graph", status="ok", planners="")
DEFAULT_TILE = dict(block_n=64, block_h=16, num_warps=4, num_stages=2)  # mla_launch_facts at 16 heads, bf16


def mla_rows(batch, ctx, points, tile=DEFAULT_TILE):
    return [MLA | tile | dict(batch=batch, ctx_len=ctx, num_splits=s, p50_us=t) for s, t in points]


@pytest.fixture
def df():
    return pd.DataFrame(
        mla_rows(1, 8192, [(1, 50.0), (4, 20.0), (8, 12.0), (16, 10.0)])
        + mla_rows(1, 8192, [(16, 9.0)], tile=dict(block_n=32, block_h=16, num_warps=4, num_stages=3))
        + mla_rows(64, 8192, [(1, 30.0), (2, 33.0)]))


def fixed(s, block_n=None):
    def rule(w, dev):
        return Plan("fixed", s, block_n=block_n)
    return rule


def test_replay_scores_the_plan_at_its_resolved_knobs(df):
    r = analysis.replay(df, fixed(8), name="eight").set_index("batch")
    assert r.loc[1, "regret"] == pytest.approx(12.0 / 9.0)  # oracle: the other tile at 16 splits
    assert r.loc[1, "block_n"] == 64 and r.loc[1, "num_stages"] == 2  # the kernel's defaults, resolved
    assert math.isnan(r.loc[64, "regret"]) and r.loc[64, "reason"].startswith("not measured: num_splits=8")
    assert (r["planner"] == "eight").all()


def test_replay_matches_a_plan_that_sets_the_tile(df):
    r = analysis.replay(df, fixed(16, block_n=32)).set_index("batch")
    assert r.loc[1, "regret"] == 1.0 and r.loc[1, "num_stages"] == 3
    r = analysis.replay(df, fixed(16)).set_index("batch")
    assert r.loc[1, "regret"] == pytest.approx(10.0 / 9.0)


def test_replay_of_a_registered_name_and_a_raising_planner(df):
    r = analysis.replay(df, "splitlab")
    assert len(r) == 2 and set(r["planner"]) == {"splitlab"}

    def boom(w, dev):
        from splitlab.errors import SplitlabError
        raise SplitlabError("no")
    r = analysis.replay(df, boom)
    assert r["regret"].isna().all() and r["reason"].str.startswith("planner:").all()


def test_held_out_rows_never_reach_the_fit(df):
    big = pd.concat([df, pd.DataFrame(mla_rows(2, 8192, [(1, 5.0)]) + mla_rows(1, 65536, [(1, 5.0)])
                                      + [r | dict(num_q_heads=32, block_h=32) for r in mla_rows(1, 8192, [(1, 1.0)])])])
    fit_rows, held = scoring.split(big)
    assert set(held["batch"]) | set(held["ctx_len"]) >= {2, 65536} and 32 in set(held["num_q_heads"])
    assert not scoring.held_out(fit_rows).any() and len(fit_rows) + len(held) == len(big)
    # Poisoning every held-out time changes nothing the fit returns.
    poisoned = pd.concat([fit_rows, held.assign(p50_us=1e-6)])
    a, _ = fit.fit_family(scoring.split(big)[0], "mla")
    b, _ = fit.fit_family(scoring.split(poisoned)[0], "mla")
    assert a == b


KIND_SHAPES = {
    "gqa": st.builds(lambda b, n, hkv, g: workloads.DecodeWorkload("gqa", b, hkv * g, hkv, 128, 128, n),
                     st.integers(1, 512), st.integers(1, 1 << 20), st.sampled_from([1, 2, 4, 8, 16]),
                     st.sampled_from([1, 2, 4, 8, 16, 128])),
    "mla": st.builds(lambda b, n, h: workloads.DecodeWorkload("mla", b, h, 1, 576, 512, n, page_size=64),
                     st.integers(1, 512), st.integers(1, 1 << 20), st.integers(1, 256)),
    "sparse_mla": st.builds(lambda b, k, h, d: workloads.DecodeWorkload("sparse_mla", b, h, 1, d, 512, 65536,
                                                                         page_size=1, topk=k),
                            st.integers(1, 1024), st.integers(1, 8192), st.integers(1, 256),
                            st.sampled_from([512, 576])),
}


@settings(max_examples=60, deadline=None)
@given(w=st.one_of(*KIND_SHAPES.values()), dev=st.sampled_from(["h200", "mi355x", "rtx5090", "gb10"]))
def test_the_planner_returns_valid_plans(w, dev):
    p = planners.plan(w, dev, "splitlab")
    sms = devices.get(dev).sm_count
    assert 1 <= p.num_splits <= FITTED[w.kind].max_splits
    # a power of two, a split count that fills whole waves of the launch, or one key tile a split (a 64-key tile,
    # or sparse MLA's 32-key one where the rule took it: 16 heads only)
    tile = 32 if p.block_k == 32 else 64
    limit = min(FITTED[w.kind].max_splits, math.ceil(w.keys_per_request / tile))
    assert p.num_splits & (p.num_splits - 1) == 0 or p.num_splits in waves.wave_fill_splits(
        w, sms, 1 << 20, block_h=p.block_h) or p.num_splits == limit
    # the narrow head tile for sparse MLA above 16 heads; the Gluon 64-row tile for MLA at 17-32 heads where it runs
    gluon = w.kind == "mla" and 17 <= w.num_q_heads <= 32 and devices.get(dev).arch == "sm_90"
    assert p.block_h in ((None, 16) if w.kind == "sparse_mla" and w.num_q_heads > 16 else (None, 64) if gluon else
                         (None,))
    assert p.num_splits <= max(1, limit)
    assert p.block_k in ((None,) if w.kind != "sparse_mla" or w.head_dim_qk > 512 else
                         (32, 64) if w.num_q_heads <= 16 else (64,))
    assert p == fitted_plan(w, devices.get(dev))


def test_the_registered_splitlab_is_the_fitted_rule():
    w = workloads.get("deepseek-v3-mla-tp8", batch=4, ctx_len=65536)
    assert planners.plan(w, "h200", "splitlab").num_splits == 64  # two waves of 4-CTA splits: 256 <= 264
    w = workloads.get("deepseek-v3-mla", batch=4, ctx_len=65536)
    assert planners.plan(w, "h200", "splitlab").num_splits == 16  # one wave: 8 CTAs x 16 = 128 <= 132


def test_the_sparse_rule_weighs_the_16_row_head_tile_against_the_program_it_would_replace():
    """A 16-row tile streams a key tile in ``narrow_tile`` of the tl kernel's 32/64-row tile, the Gluon 64-row tile
    (sm_90, 16-bit pool) in ``sm90_tile`` of it: fitted 0.8 and 0.6, so on the H200 the 16-row tile replaces
    32-row tiles (32 heads) and, on a GPU without the Gluon tile, 64-row ones, but not the Gluon tile."""
    h200, mi355x = devices.get("h200"), devices.get("mi355x")
    w = workloads.get("deepseek-v4-sparse-mla", batch=16, topk=512).with_(num_q_heads=128)
    assert fitted_plan(w, h200).block_h is None  # the Gluon tile
    assert fitted_plan(w, mi355x).block_h == 16  # the tl 64-row tile
    assert fitted_plan(w.with_(num_q_heads=32, batch=1), h200).block_h == 16  # the tl 32-row tile
    # 16 heads: the default tile is already 16 rows; dense kernels never set a head tile
    assert fitted_plan(w.with_(num_q_heads=16), h200).block_h is None
    assert fitted_plan(workloads.get("deepseek-v3-mla", batch=1), h200).block_h is None
    # an fp8 pool keeps the default tile (its 64-row tile computes QK in fp8; the fit's data are bf16)
    assert fitted_plan(w.with_(dtype="fp8_e4m3"), mi355x).block_h is None
    # narrow_tile 0: the 16-row tile is never weighed
    off = replace(FITTED["sparse_mla"], narrow_tile=0.0)
    assert fitted_plan(w.with_(num_q_heads=32, batch=1), h200, off).block_h is None


def test_the_gluon_tile_writes_16_bit_partials_and_streams_at_its_own_rate():
    """P counts the partial dtype's bytes (bf16 where the Gluon tile runs, fp32 elsewhere), and the Gluon tile's
    key tiles cost ``sm90_tile``: the same workload's cost on sm_90 against a GPU without that tile."""
    from splitlab.planners.splitlab import fitted_cost, partial_tiles

    w = workloads.get("deepseek-v4-sparse-mla", batch=16, topk=2048).with_(num_q_heads=128)
    assert partial_tiles(w, None, "sm_90") == pytest.approx(64 * (512 * 2 + 4) / (64 * 512 * 2))
    assert partial_tiles(w, None, "gfx950") == pytest.approx(64 * (512 * 4 + 4) / (64 * 512 * 2))
    c = replace(FITTED["sparse_mla"], partial=0.0, combine=0.0, combine_per_split=0.0, sm90_tile=0.5)
    assert fitted_cost(w, 1, 132, c, None, "sm_90") == pytest.approx(0.5 * fitted_cost(w, 1, 132, c, None, ""))


def test_partial_writes_are_counted_per_cta_on_the_busiest_sm():
    """Two narrow MLA CTAs sharing an SM in one wave write twice the partial rows of one: the write is priced per
    CTA on the busiest SM (``ceil(c0 * s / SMs)``), not per wave. One request of MLA-32 at 16K keys: 256 splits (two
    CTAs on most SMs) no longer undercut 128 (one each), which the H200 runs 1.11x faster (22.4 us against 24.8)."""
    from splitlab.planners.splitlab import fitted_cost, partial_tiles

    h200 = devices.get("h200")
    w = workloads.get("deepseek-v3-mla", batch=1, ctx_len=16384).with_(num_q_heads=32)  # c0 = 1 CTA of 32 rows
    c = replace(FITTED["mla"], combine_per_split=0.0, tile32=0.0)  # the default tile only, its key tile costs 1
    p = partial_tiles(w, None, h200.arch)
    # one wave of 2 tiles and one write; one wave of 1 tile and two writes
    assert fitted_cost(w, 128, 132, c) == pytest.approx(2 + c.fixed + c.partial * p)
    assert fitted_cost(w, 256, 132, c) == pytest.approx(1 + c.fixed + 2 * c.partial * p)
    assert fitted_plan(w, h200, c).num_splits == 128


def test_the_split_candidates_end_at_one_key_tile_a_split():
    from splitlab.planners.splitlab import split_candidates

    w = workloads.get("deepseek-v4-sparse-mla", batch=1, topk=384).with_(num_q_heads=128)  # 6 key tiles
    assert split_candidates(w, 64) == [1, 2, 4, 6]
    assert split_candidates(w.with_(topk=4096), 64) == [1, 2, 4, 8, 16, 32, 64]  # capped by max_splits


def test_the_sparse_rule_weighs_block_k_32_at_16_heads_only():
    """A 32-key tile costs ``small_key_tile`` of a 64-key one and moves the split limit to one 32-key tile a split:
    worth it only where doubling the splits adds no wave (few tokens), and weighed only at 16 heads, the one head
    count whose data time BLOCK_K 32 at every split."""
    from splitlab.planners.splitlab import key_tiles, sm90_tile_runs, split_candidates

    h200 = devices.get("h200")
    w = workloads.get("deepseek-v4-sparse-mla", batch=2, topk=512).with_(num_q_heads=16)
    assert split_candidates(w, 64, block_k=32) == [1, 2, 4, 8, 16]  # 16 tiles of 32 keys
    p = fitted_plan(w, h200)
    assert (p.block_k, p.num_splits) == (32, 16)  # 32 CTAs of one 32-key tile (8.3 us against 9.7 at 8 x 64)
    assert fitted_plan(w.with_(batch=256), h200).block_k == 64  # full waves: twice the tiles for the same keys
    assert fitted_plan(w, h200, replace(FITTED["sparse_mla"], small_key_tile=0.0)).block_k == 64  # never weighed
    assert key_tiles(w.with_(num_q_heads=128), FITTED["sparse_mla"]) == (64,)
    assert key_tiles(w.with_(head_dim_qk=576), FITTED["sparse_mla"]) == (None,)  # wider rows: the kernel's own
    wide = w.with_(num_q_heads=128)
    assert sm90_tile_runs(wide, 64, "sm_90", 64) and not sm90_tile_runs(wide, 64, "sm_90", 32)  # tl at BLOCK_K 32


def test_the_sparse_fit_holds_the_merge_costs_at_their_physical_values():
    assert {(s["partial"], s["combine_per_split"]) for s in fit._settings("sparse_mla")} == {(1.0, 1.0)}
    assert len({s["partial"] for s in fit._settings("mla")}) == len(fit.GRID["partial"])


def test_ties_go_to_the_middle_of_the_plateau():
    grid = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    band = {(r,) for r in (0.5, 0.6, 0.7, 0.8)}  # tied at the best score; 0.0, 0.9 and 1.0 worse
    depth = {r: fit._depth(band, (r,), ["r"], dict(r=grid)) for r, in band}
    assert depth == {0.5: (0, 3), 0.6: (1, 3), 0.7: (1, 3), 0.8: (0, 3)}  # the two middle ones, first in grid order
    # two fields: the nearest edge first, then the plateau's size around the setting
    wide = {(a, b) for a in (0.5, 0.6, 0.7) for b in (0.5, 0.6, 0.7, 0.8)} | {(0.8, 0.8)}
    centre = dict(a=grid, b=grid)
    assert fit._depth(wide, (0.6, 0.6), ["a", "b"], centre) == (1, 5)
    assert fit._depth(wide, (0.6, 0.7), ["a", "b"], centre) == (1, 5)
    assert fit._depth(wide, (0.7, 0.8), ["a", "b"], centre) == (0, 6)  # a bigger plateau around it, but at its edge


def test_layered_data_replace_a_kernel_s_older_rows():
    old = pd.DataFrame(dict(kernel=["gqa_decode", "mla_decode"], p50_us=[1.0, 2.0]))
    new = pd.DataFrame(dict(kernel=["mla_decode"], p50_us=[3.0]))
    out = fit.layered(old, new)
    assert sorted(zip(out["kernel"], out["p50_us"], strict=True)) == [("gqa_decode", 1.0), ("mla_decode", 3.0)]


def test_goal_compares_a_partial_planner_head_to_head():
    shapes = [dict(kernel="sparse_mla_decode", device="h200-sxm", kind="sparse_mla", batch=b, set="held-out")
              for b in (1, 2, 3, 4)]
    per_shape = pd.DataFrame(
        [s | dict(planner="splitlab", regret=r) for s, r in zip(shapes, (1.0, 1.0, 1.0, 1.2), strict=True)]
        + [s | dict(planner="flashmla", regret=r) for s, r in zip(shapes[2:], (1.05, 1.05), strict=True)])
    table = pd.DataFrame([dict(kernel="sparse_mla_decode", set="held-out", planner=p, shapes=n, measured=n,
                               geomean=analysis.geomean(per_shape.loc[per_shape["planner"] == p, "regret"]),
                               worst=per_shape.loc[per_shape["planner"] == p, "regret"].max())
                          for p, n in (("splitlab", 4), ("flashmla", 2))])
    assert scoring.goal(table).loc[0, "beats_ported"]  # 1.047 over all four shapes against 1.05
    table.attrs["per_shape"] = per_shape
    g = scoring.goal(table).loc[0]
    assert not g["beats_ported"] and "flashmla 1.050 vs 1.095 on 2" in g["h2h"]  # not on flashmla's two


def test_the_shootout_scores_uniform_and_ragged_batches_apart():
    """Every shootout row says its lengths, and the goal is a row per kernel and lengths: the rule, best on the
    uniform batches (FlashMLA 1.2x off), 1.5x off on a ragged one where FlashMLA is best (``lengths_rows``), meets
    the goal on the uniform batches and not on the ragged ones; mixed, one row would read 1.107 / 1.5."""
    from sweep_fixtures import lengths_rows

    rows = lengths_rows()
    table = scoring.shootout(rows)
    assert set(table["set"]) == {"held-out"} and list(dict.fromkeys(table["lengths"])) == ["uniform", "ragged"]
    t = table.set_index(["lengths", "planner"])
    assert t.loc[("uniform", "splitlab"), ["shapes", "geomean", "worst"]].tolist() == [2, 1.0, 1.0]
    assert t.loc[("ragged", "splitlab"), "geomean"] == pytest.approx(1.5 ** 0.5)
    assert t.loc[("ragged", "splitlab"), "worst"] == 1.5
    assert t.loc[("uniform", "flashmla"), "geomean"] == pytest.approx(1.2)
    assert t.loc[("ragged", "flashmla"), ["measured", "geomean"]].tolist() == [1, 1.0]
    g = scoring.goal(table).set_index("lengths")
    assert list(g.index) == ["uniform", "ragged"] and set(g["kernel"]) == {"mla_decode"}
    assert g.loc["uniform", "goal_met"] and "flashmla" not in g.loc["uniform", "h2h"]  # measured on both shapes
    assert not g.loc["ragged", "goal_met"] and g.loc["ragged", "best_ported"] == "flashmla 1.000"
    # head to head on FlashMLA's one ragged shape, not on the uniform ones too
    assert not g.loc["ragged", "beats_ported"] and "flashmla 1.000 vs 1.500 on 1" in g.loc["ragged", "h2h"]
    # a confirm part is scored apart the same way; data without the column are uniform
    conf = scoring.shootout(rows, part="fresh")
    assert scoring.goal(conf, part="fresh")["lengths"].tolist() == ["uniform", "ragged"]
    old = scoring.shootout(rows[rows["length_dist"] == "uniform"].drop(columns=["length_dist", "length_seed"]))
    assert set(old["lengths"]) == {"uniform"} and scoring.goal(old)["goal_met"].tolist() == [True]
    assert scoring.lengths_of(pd.DataFrame(dict(length_dist=["uniform", None, "spread4"]))).tolist() == [
        "uniform", "uniform", "ragged"]


def test_the_constants_file_records_ragged_scores_apart():
    """``record`` keeps ``held_out`` / ``confirm`` the uniform batches' scores and adds ``held_out_ragged`` /
    ``confirm_ragged`` where ragged batches were scored; the file reads back what was written."""
    from sweep_fixtures import lengths_rows

    rows = lengths_rows()
    table, conf = scoring.shootout(rows), scoring.shootout(rows, part="fresh")
    fc = fit.record(rows, {"mla": FITTED["mla"]}, (), table, [("fresh", conf)])
    uniform = dict(shapes=2, measured=2, geomean=1.0, worst=1.0)
    ragged = dict(shapes=2, measured=2, geomean=round(1.5 ** 0.5, fit.SCORE_DIGITS), worst=1.5)
    assert fc.held_out == {"mla": uniform} and fc.held_out_ragged == {"mla": ragged}
    assert fc.confirm == {"mla": {"fresh": uniform}} and fc.confirm_ragged == {"mla": {"fresh": ragged}}
    text = fitted.dumps(fc)
    for header in ("[mla.held_out]", "[mla.held_out_ragged]", "[mla.confirm.fresh]", "[mla.confirm_ragged.fresh]"):
        assert f"\n{header}\n" in text, header
    assert fitted.parse(text, fitted.SHIPPED_DIR / "x.toml") == fc
    # uniform data only: no ragged table (the shipped file's layout)
    only = rows[rows["length_dist"] == "uniform"]
    fc = fit.record(only, {"mla": FITTED["mla"]}, (), scoring.shootout(only))
    assert fc.held_out == {"mla": uniform} and not fc.held_out_ragged and "_ragged" not in fitted.dumps(fc)


def test_the_lone_floor_prices_a_narrow_launch_under_one_wave():
    """GQA 32/8 (16-row tiles, three CTAs per SM): a launch under one wave costs max(lone, fill) of a wave; lone
    < 0 keeps the old form (at least one wave); the wide MQA-128 tile ignores lone."""
    from splitlab.planners.splitlab import fitted_cost

    c = replace(FITTED["gqa"], fixed=0.0, partial=0.0, combine_per_split=0.0, lone=0.6)
    w = workloads.get("llama-3-8b", batch=6, ctx_len=32768)  # c0 = 48 CTAs; a wave is 396
    tiles = lambda s: math.ceil(math.ceil(32768 / s) / 64)  # noqa: E731
    assert fitted_cost(w, 5, 132, c) == pytest.approx(240 / 396 * tiles(5))  # fill 0.61 > 0.6
    assert fitted_cost(w, 4, 132, c) == pytest.approx(0.6 * tiles(4))  # fill 0.48: the floor
    assert fitted_cost(w, 4, 132, replace(c, lone=-1.0)) == pytest.approx(tiles(4))  # off: one whole wave
    mqa = workloads.get("mqa-128", batch=6, ctx_len=32768)
    assert fitted_cost(mqa, 4, 132, c) == fitted_cost(mqa, 4, 132, replace(c, lone=-1.0))
    assert fitted_plan(w, devices.get("h200-sxm")).num_splits in (5, 8)  # one wave, not 11 (1.33 real waves)


def test_a_narrow_launch_under_one_wave_costs_at_least_its_busiest_sm():
    """GQA 48/8 (16-row tiles, three CTAs per SM), 9 requests: 4 splits put three CTAs on 24 SMs (fill 0.73 of a
    wave), which stream at most 1 / DRAIN times their full-wave share: DRAIN x 3 / 3 of a wave, not the fill; drain
    < 0 (not fitted) keeps max(lone, fill); mid tiles keep it too."""
    from splitlab.planners.splitlab import fitted_cost

    c = replace(FITTED["gqa"], fixed=0.0, partial=0.0, combine_per_split=0.0, lone=0.6, drain=0.8)
    w = replace(workloads.get("llama-3-8b", batch=9, ctx_len=81920), num_q_heads=48)  # c0 = 72 CTAs; wave 396
    tiles = lambda s: math.ceil(math.ceil(81920 / s) / 64)  # noqa: E731
    assert fitted_cost(w, 4, 132, c) == pytest.approx(0.8 * tiles(4))  # 288 CTAs: three on the busiest SM
    assert fitted_cost(w, 4, 132, replace(c, drain=-1.0)) == pytest.approx(288 / 396 * tiles(4))  # the fill
    assert fitted_cost(w, 3, 132, c) == pytest.approx(0.6 * tiles(3))  # two a SM: 0.53 < the floor
    assert fitted_plan(w, devices.get("h200-sxm")).num_splits != 4  # 1.13x the best on the H200
    mid = replace(workloads.get("mqa-128", batch=20, ctx_len=20480), num_q_heads=96, num_kv_heads=3)  # 32 rows
    assert fitted_cost(mid, 4, 132, c) == fitted_cost(mid, 4, 132, replace(c, drain=-1.0))


def test_the_split_limits_are_the_cards_ranges():
    """``planners.splitlab.MAX_SPLITS`` is the split range the cards sweep (what the fit and the fitted rule search);
    the first rule keeps its own GQA cap, the card's range when it was written."""
    import tomllib
    from pathlib import Path

    from splitlab.planners import splitlab as rule

    cards = Path(__file__).resolve().parents[1] / "kernels"
    for kind, card in (("gqa", "gqa_decode"), ("mla", "mla_decode"), ("sparse_mla", "sparse_mla_decode")):
        knob = tomllib.loads((cards / f"{card}.toml").read_text())["knobs"]["num_splits"]
        assert (knob["min"], knob["max"]) == (1, rule.MAX_SPLITS[kind]), card
        assert FITTED[kind].max_splits == rule.MAX_SPLITS[kind]
    assert fit.MAX_SPLITS is rule.MAX_SPLITS  # one definition, imported
    assert rule.V0_MAX_SPLITS == rule.MAX_SPLITS | {"gqa": 64}
    w = workloads.get("mqa-128", batch=1, ctx_len=131072)  # one CTA: the most splits win in both rules
    assert rule.splitlab_num_splits(w, 132) == 64 and fitted_plan(w, devices.get("h200")).num_splits == 128


def test_splitlab_fit_on_the_catalog_writes_the_shipped_constants(tmp_path, capsys):
    """``splitlab fit --out FILE`` on the catalog's fit sets writes the shipped H200 file, byte for byte (the
    constants, the data, kernel versions, ranges, held-out and confirm scores), and prints every confirm set's
    table."""
    from splitlab import catalog
    from splitlab.cli import main

    out = tmp_path / "h200.toml"
    assert main(["fit", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.read_text() == (fitted.SHIPPED_DIR / "h200-sxm.toml").read_text()
    for kind, c in FITTED.items():
        assert f"{kind}: CostConstants({fit._fmt(c)})" in text, kind
    for name in catalog.names("confirm"):
        assert f"\n{name}:\n" in text
    assert text.count("goal_met") == 1 + len(catalog.names("confirm")) and f"wrote {out}" in text
    fc = fitted.load(out)
    assert fc.device == "h200-sxm" and fc.data == tuple(catalog.names("fit")) and fc.timing == "measured"
    assert fc.kernel_versions == tuple(str(catalog.get(n).kernel_version) for n in catalog.names("fit"))
    assert set(fc.held_out) == set(fc.ranges) == set(FITTED) and all(1 <= s["geomean"] <= s["worst"]
                                                                     for s in fc.held_out.values())


PLANS = Path(__file__).parent / "fixtures" / "splitlab_plans.csv"


def _recorded_workload(rec: dict) -> workloads.DecodeWorkload:
    from splitlab.results import LENGTH_COLUMNS, WORKLOAD_COLUMNS

    lengths = {k: rec[k] for k in LENGTH_COLUMNS if not pd.isna(rec.get(k))}
    return workloads.DecodeWorkload(**{k: rec[k] for k in WORKLOAD_COLUMNS}, **lengths)


def _plan_columns(rec: dict) -> tuple:
    p = planners.plan(_recorded_workload(rec), rec["device"], "splitlab")
    return p.num_splits, p.block_h, p.block_k


def record_plans(path: Path = PLANS) -> None:
    """Re-record the fixture's plans with the planner as it is (after a refit: the diff of the CSV is what the refit
    changed): ``python -c "import sys; sys.path.insert(0, 'tests'); import test_fit; test_fit.record_plans()"``."""
    df = pd.read_csv(path)
    plans = [_plan_columns(rec) for rec in df.to_dict("records")]
    df[["num_splits", "block_h", "block_k"]] = pd.DataFrame(plans, index=df.index).astype("Int64")
    df.to_csv(path, index=False)


def test_the_planner_reproduces_the_recorded_plans_from_the_shipped_file():
    """Every shape of the shipped sets (same-length and ragged), planned on the H200 and on a device without
    constants of its own (the fallback): the plans recorded in tests/fixtures/splitlab_plans.csv with the shipped
    constants. A refit that changes plans re-records them (``record_plans``), so the change is reviewed."""
    want = pd.read_csv(PLANS)
    assert len(want) > 2000 and set(want["device"]) == {"h200-sxm", "mi355x"}
    assert (want["length_dist"].fillna("uniform") != "uniform").sum() > 100  # ragged batches are recorded too
    changed = []
    for rec in want.to_dict("records"):
        expected = tuple(None if pd.isna(rec[k]) else int(rec[k]) for k in ("num_splits", "block_h", "block_k"))
        if (got := _plan_columns(rec)) != expected:
            changed.append((rec, got))
    assert not changed, changed[:3]


# --- constants files: chosen by device ----------------------------------------------------------------------------

GB10_CARD = """name = "gqa_decode"
kind = "gqa"
device = "gb10"
[impl]
import = "sweep_fixtures:exact"
reference = "splitlab.kernels.reference:gqa_decode"
launch_facts = "splitlab.kernels.gqa:gqa_launch_facts"
[knobs]
num_splits = { min = 1, max = 128 }
[[grids.quick]]
num_q_heads = 8
num_kv_heads = 2
head_dim_qk = 16
batch = [1, 2, 3, 6]
ctx_len = [1024, 4096, 8192]
num_splits = "pow2+waves"
min_keys_per_split = 64
[[grids.default]]
num_q_heads = 8
num_kv_heads = 2
head_dim_qk = 16
batch = 1
ctx_len = 1024
"""


@pytest.fixture(scope="module")
def gb10(tmp_path_factory):
    """A fake-timed sweep planned for the GB10 preset (48 SMs; the fp64 reference as the implementation and the
    fake timer: no GPU) of a card named as splitlab's GQA kernel, and the constants file ``splitlab fit
    --allow-fake --out`` fits on it: (the sweep folder, the file)."""
    from splitlab.bench import cards, sweep
    from splitlab.cli import main

    tmp = tmp_path_factory.mktemp("gb10")
    card = tmp / "gqa_decode.toml"
    card.write_text(GB10_CARD)
    res = sweep.run(cards.load(card), sweep.SweepOptions(grid="quick", out=tmp / "runs", timer="fake", device="gb10",
                                                         quiet=True, isolate=False))
    assert set(res.statuses) == {"ok"}
    out = tmp / "gb10.toml"
    assert main(["fit", str(res.sweep_dir), "--allow-fake", "--out", str(out)]) == 0
    return res.sweep_dir, out


def test_constants_fitted_for_another_device_serve_that_device_only(gb10, monkeypatch):
    """Constants fitted (on modelled rows) for the GB10 are the planner's on the GB10, through ``use_constants``
    or ``SPLITLAB_CONSTANTS``; the H200 keeps its own, and a device with none gets the fallback, each plan's note
    saying which."""
    from splitlab.planners import splitlab as rule

    sweep_dir, path = gb10
    fc = fitted.load(path)
    assert fc.device == "gb10" and fc.timing == "modelled" and set(fc.families) == {"gqa"}
    assert fc.families["gqa"] != FITTED["gqa"] and fc.data == (str(sweep_dir),)
    assert fc.ranges["gqa"]["batch"] == [1, 6] and fc.held_out["gqa"]["shapes"] > 0
    assert fc.kernel_versions and fc.kernel_versions[0].startswith("splitlab ")
    gb, h200 = devices.get("gb10"), devices.get("h200")
    shapes = [workloads.DecodeWorkload("gqa", b, 8, 2, 16, 16, n) for b in (1, 2, 3, 6, 12)
              for n in (1024, 8192, 65536)]
    monkeypatch.setattr(rule, "_given", {})
    assert planners.plan(shapes[0], gb, "splitlab").note.endswith("no constants fitted for gb10; the fallback "
                                                                   "h200-sxm (shipped)")
    for how in ("use_constants", "env"):
        if how == "use_constants":
            rule.use_constants(path)
        else:
            rule.use_constants(None)
            monkeypatch.setenv(rule.ENV_CONSTANTS, str(path))
        differ = 0
        for w in shapes:
            mine = planners.plan(w, gb, "splitlab")
            assert (mine.num_splits, mine.block_h) == (fitted_plan(w, gb, fc.families["gqa"]).num_splits, None)
            assert mine.note.endswith(("SPLITLAB_CONSTANTS=" if how == "env" else "") + str(path)), mine.note
            differ += mine.num_splits != fitted_plan(w, gb, FITTED["gqa"]).num_splits
            theirs = planners.plan(w, h200, "splitlab")
            assert replace(theirs, note="") == replace(fitted_plan(w, h200, FITTED["gqa"]), note="")
            assert theirs.note.endswith("h200-sxm (shipped)")
        assert differ, "the GB10's constants change no plan of these shapes: the test would show nothing"
    # a family the file lacks gives way to the fallback
    w = workloads.get("deepseek-v3-mla", batch=4, ctx_len=8192)
    assert rule.constants_for(gb, "mla").how == "fallback" and planners.plan(w, gb, "splitlab").note.endswith(
        "the fallback h200-sxm (shipped)")


def test_the_sweep_records_the_constants_its_splitlab_points_were_chosen_with(gb10):
    import json

    side = json.loads((gb10[0] / "sweep.json").read_text())
    expected = {"gb10": "no constants fitted for gb10; the fallback h200-sxm (shipped)"}
    assert side["planner_constants"] == expected
    assert [s["planner_constants"] for s in side["sessions"]] == [expected]


def test_plan_states_which_constants_it_used(gb10, capsys):
    from splitlab.cli import main

    assert main(["plan", "--workload", "llama-3-8b", "--device", "mi355x,h200", "--planner", "splitlab"]) == 0
    out = capsys.readouterr().out
    assert "# splitlab constants for mi355x (gqa): no constants fitted for mi355x; the fallback h200-sxm (shipped)" \
        in out and "# splitlab constants for h200-sxm (gqa): h200-sxm (shipped)" in out
    assert main(["plan", "--workload", "llama-3-8b", "--device", "gb10", "--constants", str(gb10[1]), "--json"]) == 0
    rows = __import__("json").loads(capsys.readouterr().out)
    assert [r["note"].split("constants: ")[1] for r in rows if r["planner"] == "splitlab"] == [str(gb10[1])]
    assert main(["plan", "--workload", "llama-3-8b", "--device", "h200", "--constants", str(gb10[1])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fitted for gb10; expected --device gb10" in err


def test_a_launcher_warns_once_when_it_plans_with_the_fallback(monkeypatch):
    import warnings

    from splitlab.planners import default_plan
    from splitlab.planners import splitlab as rule

    monkeypatch.setattr(rule, "_warned", set())
    w = workloads.get("llama-3-8b", batch=4, ctx_len=8192)
    with pytest.warns(UserWarning, match="no constants fitted for mi355x; the fallback h200-sxm"):
        default_plan(w, "mi355x")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        default_plan(w, "mi355x")  # once
        default_plan(w, "h200")  # its own constants: no warning


def test_a_constants_file_reads_back_what_was_written():
    fc = fitted.load(fitted.SHIPPED_DIR / "h200-sxm.toml")
    again = fitted.parse(fitted.dumps(fc), fc.path)
    assert again == fc and fitted.dumps(again) == (fitted.SHIPPED_DIR / "h200-sxm.toml").read_text()
    assert set(fitted.shipped()) == {"h200-sxm"}
    # ragged scores: their own tables, a confirm set's two side by side, and a set scored on ragged batches only
    score = dict(shapes=3, measured=3, geomean=1.05, worst=1.2)
    more = replace(fc, held_out_ragged={"gqa": score},
                   confirm_ragged={"gqa": {"h200-confirm": score, "ragged-only": score | dict(shapes=4)}})
    text = fitted.dumps(more)
    assert fitted.parse(text, fc.path) == more and fitted.dumps(fitted.parse(text, fc.path)) == text
    assert text.index("[gqa.confirm.h200-confirm]") < text.index("[gqa.confirm_ragged.h200-confirm]") < text.index(
        "[gqa.confirm_ragged.ragged-only]") < text.index("[mla]")


@pytest.mark.parametrize("text, needle", [
    ("format = 2\ndevice = 'x'\n[gqa]\n", "format=2 is not allowed"),
    ("format = 1\n[gqa]\nctas_per_sm = 1\n", "device=None is not allowed"),
    ("format = 1\ndevice = 'h200-sxm'\n", "no family table"),
    ("format = 1\ndevice = 'h200-sxm'\n[gqa]\nctas_per_sm = 1\n", "[gqa] lacks ctas_per_sm_narrow"),
    ("format = 1\ndevice = 'h200-sxm'\n[gqa]\nctas = 1\n", "key 'gqa.ctas' is not allowed"),
    ("format = 1\ndevice = 'h200-sxm'\n[gqa]\nctas_per_sm = 0\n",
     "gqa.ctas_per_sm=0 is not allowed; expected an integer in [1, 64]"),
    ("format = 1\ndevice = 'h200-sxm'\n[gqa]\nctas_per_sm_mid = -1\n",
     "gqa.ctas_per_sm_mid=-1 is not allowed; expected an integer in [0, 64]"),
    ("format = 1\ndevice = 'h200-sxm'\n[gqa]\nfixed = nan\n", "gqa.fixed=nan is not allowed"),
    ("format = 1\ndevice = 'h200-sxm'\nextra = 1\n", "key 'extra' is not allowed"),
    ("format = [\n", "not valid TOML"),
])
def test_a_malformed_constants_file_is_one_error_naming_it(tmp_path, text, needle, monkeypatch):
    from splitlab.errors import SplitlabError
    from splitlab.planners import splitlab as rule

    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(SplitlabError, match=None) as e:
        rule.use_constants(bad)
    assert needle in str(e.value) and str(bad) in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv(rule.ENV_CONSTANTS, str(tmp_path / "missing.toml"))
    with pytest.raises(SplitlabError, match="SPLITLAB_CONSTANTS='.*missing.toml' cannot be read"):
        planners.plan(workloads.get("llama-3-8b"), "h200", "splitlab")


@pytest.mark.parametrize("out, needle", [(".", "is a folder"), ("c.json", "ending in .toml"),
                                         ("/proc/c.toml", "is not allowed")])
def test_fit_out_is_checked_before_the_fit(capsys, out, needle):
    from splitlab.cli import main

    assert main(["fit", "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err
