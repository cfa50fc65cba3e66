"""Ragged batches: named length distributions drawn with a seed (``workloads.LENGTH_DISTS``), in cards and grids,
in the result rows (``length_dist``, ``length_seed``, ``ctx_mean``, ``ctx_max``), rebuilt by
``DecodeWorkload(**row)``, fed to the kernels as per-request ``seq_lens`` (sparse MLA: per-token valid top-k)."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
import sweep_fixtures
import torch
from sweep_fixtures import tiny_card

from splitlab import results
from splitlab.bench import cards, grid, sweep
from splitlab.bench.sweep import SweepOptions
from splitlab.bench.timing import FakeTimer
from splitlab.devices import get as get_device
from splitlab.errors import SplitlabError
from splitlab.kernels import reference
from splitlab.kernels.accuracy import assert_matches_reference
from splitlab.kernels.inputs import workload_inputs
from splitlab.workloads import LENGTH_DISTS, DecodeWorkload, draw_lengths

H200 = get_device("h200")


def gqa(**kw) -> DecodeWorkload:
    return DecodeWorkload(**{**dict(kind="gqa", batch=6, num_q_heads=4, num_kv_heads=2, head_dim_qk=16,
                                    head_dim_v=16, ctx_len=160), **kw})


# --- the workload ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dist", [d for d, n in LENGTH_DISTS.items() if n is not None])
@pytest.mark.parametrize("batch,longest", [(1, 7), (5, 160), (64, 100_000)])
def test_a_spread_is_reproducible_and_its_longest_is_exact(dist, batch, longest):
    lens = draw_lengths(dist, 3, batch, longest)
    assert lens == draw_lengths(dist, 3, batch, longest) and len(lens) == batch
    assert max(lens) == longest and min(lens) >= math.ceil(longest / LENGTH_DISTS[dist])
    if batch >= 5:
        assert len(set(lens)) > 1 and draw_lengths(dist, 4, batch, longest) != lens  # the seed matters


def test_uniform_is_the_default_and_keeps_every_field_it_had():
    w = gqa()
    assert w.length_dist == "uniform" and w.length_seed == 0 and not w.ragged
    assert w.lengths == (160,) * 6 and w.kv_bytes == 6 * 160 * 2 * 64
    assert gqa(length_seed=9) == w  # uniform lengths have no seed
    assert DecodeWorkload(**w.row()) == w


def test_a_ragged_workload_rebuilds_from_its_row():
    w = gqa(length_dist="spread16", length_seed=5)
    assert w.ragged and max(w.lengths) == w.keys_per_request == 160 and len(set(w.lengths)) > 1
    assert w.kv_bytes == sum(w.lengths) * 2 * 64 < gqa().kv_bytes
    back = DecodeWorkload(**w.row())
    assert back == w and back.lengths == w.lengths and hash(back) == hash(w)
    assert gqa(length_dist="spread16", length_seed=6) != w
    s = DecodeWorkload("sparse_mla", 5, 8, 1, 32, 32, 512, page_size=1, topk=64, length_dist="spread16",
                       length_seed=2)
    assert max(s.lengths) == 64 and min(s.lengths) >= 4 and len(s.lengths) == 5  # the valid top-k per token


@pytest.mark.parametrize("kw,word", [
    (dict(length_dist="spread3"), "length_dist='spread3' is not allowed"),
    (dict(length_dist="spread16", length_seed=-1), "length_seed"),
    (dict(length_dist="spread16", seq_lens=(160, 3, 3, 3, 3, 3)), "not allowed with seq_lens"),
])
def test_bad_length_fields_are_refused_in_one_line(kw, word):
    with pytest.raises(SplitlabError, match=word) as e:
        gqa(**kw)
    assert "\n" not in str(e.value)


def test_point_ids_of_uniform_batches_are_those_of_the_shipped_data():
    """The shipped rows' point_ids, recomputed from their workload and knob columns: adding the length fields
    changed none (they enter the id only where the batch is ragged)."""
    from pathlib import Path

    from splitlab.bench.impls import FACT_COLUMNS

    path = Path(__file__).resolve().parents[1] / "data" / "h200"
    files = sorted(path.glob("*/results.parquet"))[:3]
    assert files
    df = results.load(*files)
    assert (df["length_dist"] == "uniform").all() and (df["length_seed"] == 0).all()  # written before: uniform
    for _, r in df.head(200).iterrows():
        facts = {k: None if pd.isna(r[k]) else int(r[k]) for k in FACT_COLUMNS}
        assert grid.point_id(r["kernel"], r["impl"], results.workload(r), facts) == r["point_id"]
    w = gqa(length_dist="spread16", length_seed=1)
    assert grid.point_id("k", "i", w, {}) != grid.point_id("k", "i", gqa(), {})


# --- cards and grids ------------------------------------------------------------------------------------------

RAGGED_BLOCK = ("[[grids.ragged]]\nnum_q_heads = 4\nnum_kv_heads = 2\nhead_dim_qk = 16\nbatch = 5\n"
                "ctx_len = [64, 96]\nlengths = [\"uniform\", \"spread16\"]\nlength_seed = [0, 3]\n"
                "num_splits = [1, 2, 4]\nmin_keys_per_split = 1\n")


def ragged_card(tmp_path, impl="exact", block=RAGGED_BLOCK):
    p = tmp_path / f"{impl}.toml"
    p.write_text(tiny_card(f"t_{impl}", impl) + block)
    return cards.load(p)


def test_a_grid_names_distributions_and_seeds(tmp_path):
    shapes = ragged_card(tmp_path).grid("ragged")[0].shapes
    got = [(w.ctx_len, w.length_dist, w.length_seed) for w in shapes]
    assert got == [(64, "uniform", 0), (64, "spread16", 0), (64, "spread16", 3),
                   (96, "uniform", 0), (96, "spread16", 0), (96, "spread16", 3)]  # uniform once, not per seed


@pytest.mark.parametrize("line,word", [("lengths = [\"spread5\"]", "lengths"), ("length_seed = -2", "length_seed")])
def test_bad_length_keys_in_a_card_are_refused(tmp_path, line, word):
    block = RAGGED_BLOCK.replace("lengths = [\"uniform\", \"spread16\"]\nlength_seed = [0, 3]", line)
    with pytest.raises(cards.CardError, match=word) as e:
        ragged_card(tmp_path, block=block)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["gqa_decode", "mla_decode", "sparse_mla_decode"])
def test_the_shipped_cards_have_a_ragged_grid(name):
    exp = grid.expand(cards.load(name), "ragged", "h200")
    dists = {p.workload.length_dist for p in exp.points}
    assert dists == {"uniform", "spread16"} and exp.shapes >= 6
    for p in exp.points:
        assert p.row()["ctx_max"] == p.workload.keys_per_request


def test_a_ragged_sweep_end_to_end(tmp_path):
    """The fixture implementation (the fp64 reference) on a ragged grid, fake timer: every row records its
    distribution, the kernel was given those lengths, and each row rebuilds its batch."""
    sweep_fixtures.LENS.clear()
    card = dataclasses.replace(ragged_card(tmp_path), planner_knobs=())
    res = sweep.run(card, SweepOptions(out=tmp_path / "runs", device="h200", quiet=True, grid="ragged",
                                       timer="fake", isolate=False), timer=FakeTimer(H200))
    df = results.load(res.sweep_dir)
    assert len(df) == 6 * 3 and (df.status == "ok").all(), df[["status", "error"]]
    assert sorted(df.groupby(["length_dist", "length_seed"]).size().items()) == [
        (("spread16", 0), 6), (("spread16", 3), 6), (("uniform", 0), 6)]
    for _, r in df.iterrows():
        w = results.workload(r)
        assert w == DecodeWorkload(**{c: r[c] for c in (*results.WORKLOAD_COLUMNS, *results.LENGTH_COLUMNS)})
        assert w.length_dist == r["length_dist"] and w.lengths in sweep_fixtures.LENS
        assert r["ctx_max"] == max(w.lengths) == r["ctx_len"]
        assert r["ctx_mean"] == pytest.approx(sum(w.lengths) / w.batch) and r["kv_bytes"] == w.kv_bytes
        if w.ragged:
            assert r["ctx_mean"] < r["ctx_max"]
    # The same grid without the length keys: the uniform points keep their ids.
    (tmp_path / "plain").mkdir()
    plain = ragged_card(tmp_path / "plain", block=RAGGED_BLOCK.replace(
        "lengths = [\"uniform\", \"spread16\"]\nlength_seed = [0, 3]\n", ""))
    ids = {p.point_id for p in grid.expand(dataclasses.replace(plain, planner_knobs=()), "ragged", "h200").points}
    assert ids == set(df[df.length_dist == "uniform"].point_id) and not ids & set(df[df.length_dist != "uniform"]
                                                                                    .point_id)


# --- the kernels on ragged batches (TRITON_INTERPRET=1, tests/conftest.py) ----------------------------------------

@pytest.mark.parametrize("w,knobs", [
    (gqa(batch=5, ctx_len=150, length_dist="spread16", length_seed=1), dict(num_splits=3, block_n=16)),
    (DecodeWorkload("mla", 4, 5, 1, 48, 32, 130, page_size=16, length_dist="spread16", length_seed=2),
     dict(num_splits=3, block_n=16)),
    (DecodeWorkload("sparse_mla", 4, 5, 1, 48, 32, 300, page_size=1, topk=100, length_dist="spread16",
                    length_seed=3), dict(num_splits=3, block_k=16)),
])
def test_kernels_on_a_ragged_batch_match_the_fp64_reference(w, knobs):
    from splitlab.kernels.gqa import gqa_decode
    from splitlab.kernels.mla import mla_decode
    from splitlab.kernels.sparse_mla import sparse_mla_decode

    assert len(set(w.lengths)) > 1
    x = workload_inputs(w, seed=4)
    extra = {} if w.kind == "gqa" else dict(head_dim_v=w.head_dim_v)
    if w.kind == "sparse_mla":
        valid = (x["indices"] >= 0).sum(dim=1).tolist()
        assert tuple(valid) == w.lengths  # each token's valid top-k, the rest -1
    else:
        assert tuple(x["seq_lens"].tolist()) == w.lengths
    kernel, ref_fn = {"gqa": (gqa_decode, reference.gqa_decode), "mla": (mla_decode, reference.mla_decode),
                      "sparse_mla": (sparse_mla_decode, reference.sparse_mla_decode)}[w.kind]
    out, lse = kernel(**x, **extra, **knobs, return_lse=True)
    ref, ref_lse = ref_fn(**x, **extra, return_lse=True)
    assert_matches_reference(out, lse, ref, ref_lse, x["q"].dtype, [])
    if w.kind != "sparse_mla":  # the lengths matter: the uniform batch gives another answer
        x_uniform = dict(x, seq_lens=torch.full_like(x["seq_lens"], w.ctx_len))
        assert not torch.allclose(ref_fn(**x_uniform, **extra), ref)


def test_a_ragged_batch_and_a_uniform_one_are_two_shapes():
    """The oracle never compares a ragged batch's time with a uniform batch's of the same longest length, and rows
    from before ragged batches (no length columns) count as uniform, not as a shape of their own."""
    import pandas as pd

    from splitlab import analysis, results

    base = dict(schema_version=1, sweep_id="s", kernel="k", impl="i", kind="gqa", batch=4, num_q_heads=8,
                num_kv_heads=2, head_dim_qk=64, head_dim_v=64, ctx_len=1024, page_size=16, topk=0, dtype="bf16",
                device="h200-sxm", sm_count=132, timing="graph", status="ok", error="", p20_us=1.0, p80_us=1.0,
                n_samples=1, kv_bytes=1, gbps=1.0, rel_err=0.0, ctas=8, waves=0.1, num_splits=1, block_n=64,
                block_k=None, block_h=None, num_warps=4, num_stages=2)
    rows = [dict(base, point_id="a", p50_us=10.0), dict(base, point_id="b", p50_us=5.0, length_dist="spread16",
                                                         length_seed=0)]
    df = results.frame(rows)
    assert list(df["length_dist"]) == ["uniform", "spread16"] and list(df["length_seed"]) == [0, 0]
    best = analysis.oracle(df)
    assert len(best) == 2 and sorted(best["p50_us"]) == [5.0, 10.0]
    assert isinstance(df, pd.DataFrame)


def test_the_planner_schedules_ragged_launches_in_the_kernels_grid_order():
    """``planners.splitlab.REQUEST_MAJOR`` (the planner imports no torch) restates each kernel's ``GRID_ORDER``."""
    from splitlab.kernels import gqa, mla, mla_sm90, sparse_mla
    from splitlab.planners.splitlab import REQUEST_MAJOR

    orders = {"gqa": {gqa.GRID_ORDER}, "mla": {mla.GRID_ORDER, mla_sm90.GRID_ORDER},
              "sparse_mla": {sparse_mla.GRID_ORDER, mla_sm90.GRID_ORDER}}
    assert {k: v == {"request-major"} for k, v in orders.items()} == REQUEST_MAJOR
    assert all(len(v) == 1 for v in orders.values())


# --- the planner's cost per request ----------------------------------------------------------------------------------

def test_a_ragged_batch_takes_the_splits_its_longest_requests_need():
    """A server's batch (24 requests of 2 kv heads, up to 100K keys, lengths spread over 1/16 to 1 of the
    longest), which the H200 ran in 331 us at 64 splits and 543 us at 5 (the measurement that opened the per-request
    work), 5 being the split the rule took when it priced one length per batch. Priced per request, the rule takes
    64; the same batch at one length keeps 5 (its CTAs all stream as long, so fewer, longer splits fill the SMs as
    well)."""
    from splitlab.planners.splitlab import fitted_plan

    h200 = get_device("h200")
    for seed in range(3):
        w = DecodeWorkload("gqa", 24, 16, 2, 128, 128, 100_000, length_dist="spread16", length_seed=seed)
        assert fitted_plan(w, h200).num_splits == 64
        assert fitted_plan(w.with_(length_dist="uniform"), h200).num_splits == 5


def test_a_ragged_launch_costs_its_work_spread_over_the_slots_but_no_less_than_its_longest_cta():
    from splitlab.planners.splitlab import ragged_launch_time

    # 4 requests of 1 CTA: 3 short ones and a long one on 2 slots. Every CTA alone runs at full speed (cap 1).
    assert ragged_launch_time([10, 10, 10, 100], 1, 1, 2, 1.0, 0.0, 1.0) == pytest.approx(110.0)
    assert ragged_launch_time([100, 10, 10, 10], 1, 1, 2, 1.0, 0.0, 1.0) == pytest.approx(100.0)
    # with the slots to spare, the long CTA speeds up as the others end (cap 0.5: twice as fast alone)
    assert ragged_launch_time([10, 100], 1, 1, 4, 1.0, 0.0, 0.5) == pytest.approx(10 / 2 + 90 / 2)
    # rate and fixed: each CTA streams tiles * RATE after FIXED
    assert ragged_launch_time([4, 8], 1, 1, 2, 0.5, 1.0, 1.0) == pytest.approx(8 * 0.5 + 1.0)


def test_the_schedule_issues_ctas_in_the_kernels_grid_order():
    """Split-major (GQA): split 0 of every request, then split 1. Request-major (MLA): all of request 0's splits
    first. Two requests of 2 splits on 2 slots, request 1 long: request-major runs its two CTAs side by side."""
    from splitlab.planners.splitlab import ragged_launch_time

    request_major = ragged_launch_time([1, 50], 1, 2, 2, 1.0, 0.0, 1.0, request_major=True)
    split_major = ragged_launch_time([1, 50], 1, 2, 2, 1.0, 0.0, 1.0)
    assert request_major == pytest.approx(51.0)  # (1, 1), then (50, 50)
    assert split_major == pytest.approx(52.0)  # (1, 50), then split 1's 1 at 1 and its 50 at 2


def test_a_launch_of_many_waves_is_priced_in_closed_form_near_its_schedule(monkeypatch):
    from splitlab.planners import splitlab as rule

    tiles = [1 + (37 * i) % 97 for i in range(64)]  # 64 requests of 1-97 tiles
    args = (tiles, 8, 16, 396, 1.0, 0.5, 0.6)  # 8192 CTAs, 20 waves of 396 slots
    closed = rule.ragged_launch_time(*args)
    monkeypatch.setattr(rule, "SCHEDULE_WAVES", 10 ** 9)
    scheduled = rule.ragged_launch_time(*args)
    assert closed == pytest.approx(scheduled, rel=0.05) and closed != scheduled


def test_ragged_batches_are_priced_one_setting_at_a_time():
    import numpy as np

    from splitlab.planners.splitlab import ragged_launch_time

    with pytest.raises(SplitlabError, match="one setting"):
        ragged_launch_time([1, 2], 1, 1, 2, 1.0, np.array([0.0, 1.0]), 1.0)


def test_the_planner_knows_which_gqa_tiles_run_eight_warps():
    """``planners.splitlab.wide_tile`` (GQA: ``GQA_WIDE_ELEMENTS``) restates the GQA kernel's 8-warp tiles; the 4-warp
    ones of 32 or 64 rows are ``mid_tile``s."""
    from splitlab.kernels.gqa import gqa_launch_facts
    from splitlab.planners.splitlab import mid_tile, tile_rows, wide_tile

    for hq, hkv, d in [(32, 8, 128), (64, 2, 128), (128, 2, 128), (128, 1, 128), (64, 1, 256), (16, 1, 64)]:
        w = DecodeWorkload("gqa", 2, hq, hkv, d, d, 4096)
        rows = tile_rows(w)
        assert wide_tile(w, rows) == (gqa_launch_facts(w, num_splits=2).num_warps == 8), (hq, hkv, d)
        assert mid_tile(w, rows) == (not wide_tile(w, rows) and rows >= 32)


def test_a_sparse_workload_takes_each_tokens_walked_top_k():
    """Sparse MLA's ``seq_lens`` are each token's walked top-k positions (at most ``topk``), its ``lengths``; past
    ``topk`` is one line."""
    from splitlab.errors import SplitlabError
    from splitlab.workloads import DecodeWorkload

    w = DecodeWorkload("sparse_mla", 3, 64, 1, 512, 512, 65536, page_size=1, topk=2048, seq_lens=(2048, 7, 0))
    assert w.lengths == (2048, 7, 0) and w.ctx_len == 65536
    with pytest.raises(SplitlabError, match="at most topk=2048"):
        DecodeWorkload("sparse_mla", 2, 64, 1, 512, 512, 65536, page_size=1, topk=2048, seq_lens=(2049, 1))
