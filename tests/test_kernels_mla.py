"""The absorbed-MLA split-K decode kernel against the fp64 reference, under Triton's interpreter."""

from __future__ import annotations

import math

import pytest
import torch

import splitlab.kernels.mla as mla
from splitlab import waves, workloads
from splitlab.errors import SplitlabError
from splitlab.kernels import reference
from splitlab.kernels._launch import VALIDATE_ENV
from splitlab.kernels.accuracy import (
    FP8_QUANT_TOLERANCE,
    TOLERANCE,
    assert_matches_reference,
    assert_same_nonfinite,
    fp8_query,
    lse_err,
    reference_inputs,
    rel_err,
)
from splitlab.kernels.inputs import (
    mla_inputs,
    poison_,
    poison_unread_pages_,
    quantize_fp8,
    set_key_,
    strided_lens,
    workload_inputs,
)
from splitlab.kernels.mla import mla_decode, mla_defaults, mla_launch_facts, smem_bytes
from splitlab.workloads import DecodeWorkload


def _check(inp, dtype, head_dim_v, sm_scale=None, kv_scale=None, ref_q=None, **knobs):
    out, lse = mla_decode(**inp, head_dim_v=head_dim_v, sm_scale=sm_scale, kv_scale=kv_scale, return_lse=True,
                          **knobs)
    ref, ref_lse = reference.mla_decode(**dict(inp, q=inp["q"] if ref_q is None else ref_q), head_dim_v=head_dim_v,
                                        sm_scale=sm_scale, kv_scale=kv_scale, return_lse=True)
    empty = [b for b, n in enumerate(inp["seq_lens"].tolist()) if n == 0]
    assert_matches_reference(out, lse, ref, ref_lse, dtype, empty)
    return out, lse


# (dtype, H, Dqk, Dv, seq_lens, page_size, num_splits, block_n, block_h)
CASES = [
    (torch.float32, 5, 48, 32, [37, 0, 100], 16, 3, 16, None),  # odd heads, rope 16, empty request
    (torch.float16, 5, 48, 32, [37, 0, 100], 16, 3, 32, None),
    (torch.bfloat16, 5, 48, 32, [37, 0, 100], 16, 3, None, None),
    (torch.float32, 20, 40, 24, [7, 65], 1, 8, 16, 16),  # non-pow2 dims (masked), page 1, 2 head tiles
    (torch.bfloat16, 20, 40, 24, [7, 65], 1, 8, 16, 32),  # more splits than key tiles for request 0
    (torch.float16, 16, 32, 32, [64, 1], 64, 1, 32, None),  # Dqk == Dv (no rope part), unsplit
    (torch.bfloat16, 3, 32, 32, [129, 50], 64, 1, 64, None),  # bf16 written by the partial kernel
    (torch.float32, 4, 48, 32, [70, 33], 64, 2, 64, None),  # tile inside a page (one table entry)
    (torch.float16, 4, 48, 32, [70, 33], 16, 2, 64, None),  # tile spans 4 pages
    (torch.bfloat16, 3, 576, 512, [40, 70], 64, 2, 32, None),  # DeepSeek's 576/512
    (torch.float16, 66, 48, 32, [37, 0, 90], 16, 3, 32, 64),  # BLOCK_H 64, 8 warps: ISOLATE_QK, 2 head tiles
]


@pytest.mark.parametrize("dtype,H,Dqk,Dv,lens,page_size,S,block_n,block_h", CASES)
def test_matches_reference(allocs, dtype, H, Dqk, Dv, lens, page_size, S, block_n, block_h):
    inp = mla_inputs(len(lens), H, Dqk, lens, page_size=page_size, dtype=dtype, seed=H + Dqk + page_size)
    _check(inp, dtype, Dv, num_splits=S, block_n=block_n, block_h=block_h)
    assert len(allocs) == (2 if S == 1 else 4)  # final out/lse, or partials + combine's out/lse
    for t in allocs:  # every element written (an empty split writes 0 and lse -inf)
        assert not torch.isnan(t).any()


@pytest.mark.parametrize("dtype,H,Dqk,Dv,lens,page_size,S,block_h", [
    (torch.float16, 5, 48, 32, [37, 0, 100], 16, 3, None),  # an empty request, splits over pages
    (torch.bfloat16, 66, 48, 32, [70, 33], 64, 2, 64),  # BLOCK_H 64, 8 warps (ISOLATE_QK), a tile per page
    (torch.bfloat16, 3, 576, 512, [40, 70], 1, 1, None),  # DeepSeek's 576/512, page size 1, unsplit
])
def test_fp8_cache(dtype, H, Dqk, Dv, lens, page_size, S, block_h):
    """An e4m3 cache holding K / kv_scale: q's dtype's tolerance against the reference on the same cache (and,
    on the fp8 x fp8 QK path of 64-row tiles, the same fp8-rounded q), FP8_QUANT_TOLERANCE against the
    reference on the cache and q before quantisation."""
    inp = mla_inputs(len(lens), H, Dqk, lens, page_size=page_size, dtype=dtype, seed=H + Dqk)
    kv_scale = 0.37
    inp8 = dict(inp, kv_cache=quantize_fp8(inp["kv_cache"], kv_scale))
    bh = mla_defaults(H, Dqk, "fp8_e4m3", block_h=block_h).block_h
    out, _ = _check(inp8, dtype, Dv, kv_scale=kv_scale, ref_q=fp8_query(inp["q"], bh), num_splits=S, block_h=block_h)
    assert rel_err(out, reference.mla_decode(**inp, head_dim_v=Dv)) <= FP8_QUANT_TOLERANCE


def test_fp8_query_rounds_each_head_row_like_the_kernel(monkeypatch):
    """``fp8_query`` (what the reference sees beside an fp8 cache on the fp8 x fp8 QK tiles; off under the
    interpreter, so forced on here): each (row, head) scaled by its largest magnitude / 448 and rounded to e4m3;
    other tiles and bf16 workloads keep q."""
    monkeypatch.setattr(mla, "fp8_qk_on", lambda kv_dtype, block_h: block_h >= 64)
    q = torch.randn(3, 5, 40, dtype=torch.bfloat16) * torch.tensor([1e-3, 1.0, 30.0, 0.0, 2.0])[None, :, None]
    q8 = fp8_query(q, 64)
    scale = q.float().abs().amax(-1, keepdim=True).clamp_min(1e-30) / 448
    on_grid = q8 / scale
    # e4m3 values times the row's scale (up to the fp32 rounding of the product and this quotient)
    assert torch.allclose(on_grid.to(torch.float8_e4m3fn).float(), on_grid, rtol=1e-6, atol=0)
    assert torch.all(q8[:, 3] == 0)
    assert torch.allclose(on_grid.abs().amax(-1)[:, [0, 1, 2, 4]], torch.tensor(448.0), rtol=1e-6)
    assert rel_err(q8, q) <= 2 ** -4
    assert fp8_query(q, 16) is q
    w = DecodeWorkload("mla", 3, 5, 1, 40, 32, 64, page_size=16)
    x = dict(q=q)
    assert reference_inputs(w, x, 64) is x  # a bf16 cache: q as it is
    assert reference_inputs(w.with_(dtype="fp8_e4m3"), x, 64)["q"] is not q
    assert reference_inputs(w.with_(dtype="fp8_e4m3"), x, 16) is x


def test_fp8_workload_inputs():
    """What the sweep harness and the bench draw for an ``fp8_e4m3`` workload: a bf16 q, an fp8 cache."""
    x = workload_inputs(DecodeWorkload("mla", 2, 5, 1, 48, 32, 40, page_size=16, dtype="fp8_e4m3"), seed=1)
    assert x["q"].dtype == torch.bfloat16 and x["kv_cache"].dtype == torch.float8_e4m3fn
    _check(x, torch.bfloat16, 32, num_splits=2)
    with pytest.raises(SplitlabError, match="^dtype="):
        workload_inputs(DecodeWorkload("gqa", 1, 4, 2, 16, 16, 10, dtype="fp8_e4m3"))


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_page_sizes_give_the_same_answer(page_size):
    inp = mla_inputs(3, 6, 48, [90, 0, 17], page_size=page_size, dtype=torch.float32, seed=11)
    _check(inp, torch.float32, 32, num_splits=2, block_n=16)


@pytest.mark.parametrize("page_size,block_n", [(16, 16), (16, 64), (64, 32)])
def test_rows_no_request_reads_are_never_read(page_size, block_n):
    """NaN in every cache row past a request's end and in every page no request uses changes nothing: the
    kernel masks its tails and follows the table (a tile that spans pages, one inside a page)."""
    lens = [37, 0, 90]
    inp = mla_inputs(3, 6, 48, lens, page_size=page_size, dtype=torch.float32, seed=12)
    ref = reference.mla_decode(**inp, head_dim_v=32)
    poison_unread_pages_(inp["kv_cache"], inp["block_table"], lens, page_size)
    assert torch.isnan(inp["kv_cache"]).any()
    assert torch.equal(reference.mla_decode(**inp, head_dim_v=32), ref)  # only unread rows were poisoned
    _check(inp, torch.float32, 32, num_splits=3, block_n=block_n)


def test_block_table_is_followed_not_assumed_contiguous():
    inp = mla_inputs(2, 4, 48, [40, 40], page_size=16, dtype=torch.float32, seed=2)
    out = mla_decode(**inp, head_dim_v=32, num_splits=2)
    swapped = dict(inp, block_table=inp["block_table"].flip(0))  # request 0 now reads request 1's pages
    out_swapped = mla_decode(**swapped, head_dim_v=32, num_splits=2)
    assert rel_err(out_swapped, reference.mla_decode(**swapped, head_dim_v=32)) <= 1e-4
    assert rel_err(out_swapped, out) > 1e-2


def test_every_request_empty(planned):
    inp = mla_inputs(2, 5, 48, [0, 0], page_size=16, dtype=torch.float16)
    for s in (None, 1, 4):
        out, lse = mla_decode(**inp, head_dim_v=32, num_splits=s, return_lse=True)
        assert torch.all(out == 0) and torch.all(torch.isneginf(lse))
    assert [w.lengths for w in planned] == [(1, 1)]  # no workload has only empty requests: planned as 1 key each


def test_many_empty_splits():
    inp = mla_inputs(1, 5, 48, [10], page_size=1, dtype=torch.float32, seed=4)
    _check(inp, torch.float32, 32, num_splits=16, block_n=16)  # 15 of 16 splits have no key


def test_default_plan_on_cpu_and_return_types():
    inp = mla_inputs(2, 5, 48, [100, 3], page_size=16, dtype=torch.bfloat16, seed=5)
    out = mla_decode(**inp, head_dim_v=32)  # num_splits=None: the h200 preset's plan
    assert isinstance(out, torch.Tensor) and out.shape == (2, 5, 32) and out.dtype == torch.bfloat16
    assert rel_err(out, reference.mla_decode(**inp, head_dim_v=32)) <= TOLERANCE[torch.bfloat16]
    res = mla_decode(**inp, head_dim_v=32, return_lse=True)
    assert isinstance(res, tuple) and len(res) == 2


def test_a_ragged_batch_is_planned_with_its_lengths(planned, monkeypatch):
    """num_splits=None: the planner sees every request's length (read in the launcher's one sync), and the launch
    is the plan for that workload."""
    grids = []
    kernel = mla._mla_decode_kernel

    class Spy:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(mla, "_mla_decode_kernel", Spy())
    lens = [0, 150, 20, 61]
    inp = mla_inputs(4, 5, 48, lens, page_size=16, dtype=torch.float32, seed=6)
    _check(inp, torch.float32, 32)
    [w] = planned
    assert (w.seq_lens, w.lengths, w.ctx_len, w.batch) == (tuple(lens), tuple(lens), 150, 4)
    assert w == DecodeWorkload("mla", 4, 5, 1, 48, 32, 150, page_size=16, dtype="fp32", seq_lens=tuple(lens))
    assert grids == [mla_launch_facts(w, device="h200").grid]


def test_the_plans_head_tile_is_launched(monkeypatch):
    """A plan that names a head tile (the fitted rule may weigh MLA's 32- and 64-row tiles) is the launch's, unless
    block_h is given; an explicit num_splits asks no planner."""
    import splitlab.planners as planners
    from splitlab.planners import Plan

    monkeypatch.setattr(planners, "default_plan", lambda w, device=None: Plan("fake", 2, block_h=32))
    w = DecodeWorkload("mla", 3, 5, 1, 48, 32, 90, page_size=16, dtype="fp32", seq_lens=(90, 0, 41))
    f = mla_launch_facts(w, device="h200")
    assert (f.num_splits, f.block_h, f.ctas) == (2, 32, waves.ctas(w, 2, block_h=32))
    assert mla_launch_facts(w, device="h200", block_h=16).block_h == 16
    assert mla_launch_facts(w, num_splits=2).block_h == mla_defaults(5, 48, "fp32").block_h == 16
    launched = []
    kernel = mla._mla_decode_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append((grid, kwargs["BLOCK_H"]))
                return kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(mla, "_mla_decode_kernel", Spy())
    inp = mla_inputs(3, 5, 48, [90, 0, 41], page_size=16, dtype=torch.float32, seed=9)
    _check(inp, torch.float32, 32)  # planned: 2 splits of the 32-row tile
    _check(inp, torch.float32, 32, block_h=16)  # the plan's split count, the given head tile
    assert launched == [((waves.ctas(w, 2, block_h=32),), 32), ((waves.ctas(w, 2, block_h=16),), 16)]


def test_a_uniform_batch_plans_as_its_one_length(planned):
    from splitlab.planners import plan

    inp = mla_inputs(3, 16, 48, 130, page_size=16, dtype=torch.bfloat16, seed=7)
    _check(inp, torch.bfloat16, 32)
    [w] = planned
    plain = DecodeWorkload("mla", 3, 16, 1, 48, 32, 130, page_size=16)
    assert w.lengths == plain.lengths and plan(w, "h200", "splitlab") == plan(plain, "h200", "splitlab")
    assert mla_launch_facts(w, device="h200") == mla_launch_facts(plain, device="h200")


def test_an_explicit_split_count_neither_reads_the_lengths_nor_plans(planned, monkeypatch):
    from splitlab.kernels import _launch

    def no_sync(*args, **kwargs):
        raise AssertionError("check_paged_values read seq_lens on the host")

    monkeypatch.setattr(_launch, "check_paged_values", no_sync)
    inp = mla_inputs(2, 5, 48, [0, 70], page_size=16, dtype=torch.float32, seed=8)
    _check(inp, torch.float32, 32, num_splits=2)
    assert planned == []


def test_custom_scale_knobs_and_views():
    g = torch.Generator().manual_seed(5)
    inp = mla_inputs(2, 6, 48, [40, 17], page_size=16, dtype=torch.float32, seed=3)
    # q and the cache as strided views of wider buffers: the kernel follows the strides
    q_wide = torch.randn(2, 6, 64, generator=g)
    q_wide[..., :48] = inp["q"]
    kv_wide = torch.randn(*inp["kv_cache"].shape[:2], 80, generator=g)
    kv_wide[..., 8:56] = inp["kv_cache"]
    views = dict(inp, q=q_wide[..., :48], kv_cache=kv_wide[..., 8:56])
    assert not views["q"].is_contiguous() and not views["kv_cache"].is_contiguous()
    _check(views, torch.float32, 32, sm_scale=0.3, num_splits=2, block_n=32, block_h=32, num_warps=2,
           num_stages=3)


def test_nan_never_passes():
    inp = mla_inputs(2, 5, 48, [30, 9], page_size=16, dtype=torch.float32, seed=8)
    out, lse = mla_decode(**inp, head_dim_v=32, num_splits=2, return_lse=True)
    ref, ref_lse = reference.mla_decode(**inp, head_dim_v=32, return_lse=True)
    assert rel_err(out, ref) <= 1e-4
    bad = out.clone()
    bad[1, 3, 7] = float("nan")
    assert rel_err(bad, ref) == math.inf
    assert rel_err(poison_(out.clone()), ref) == math.inf
    bad_lse = lse.clone()
    bad_lse[0, 0] = float("nan")
    assert lse_err(bad_lse, ref_lse) == math.inf


# --- validation -------------------------------------------------------------------------------------


def _bad(**changes):
    inp = mla_inputs(2, 4, 48, [20, 5], page_size=16, dtype=torch.float32)
    kw = dict(head_dim_v=32, num_splits=2)
    for k, v in changes.items():
        (inp if k in inp else kw)[k] = v(inp[k]) if callable(v) else v
    return inp, kw


@pytest.mark.parametrize("name,changes", [
    ("q", dict(q=lambda t: t[0])),
    ("q", dict(q=lambda t: t.to(torch.int32))),
    ("q", dict(q=lambda t: t[:, :0])),
    ("kv_cache", dict(kv_cache=lambda t: t.half())),
    ("kv_cache", dict(kv_cache=lambda t: t[..., :40])),
    ("kv_cache", dict(kv_cache=lambda t: t[0])),
    ("kv_cache", dict(kv_cache=lambda t: t.to("meta"))),
    ("block_table", dict(block_table=lambda t: t.long())),
    ("block_table", dict(block_table=lambda t: t[:1])),
    ("seq_lens", dict(seq_lens=lambda t: t.long())),
    ("seq_lens", dict(seq_lens=lambda t: t[:1])),
    ("seq_lens", dict(seq_lens=lambda t: t + 1000, num_splits=None)),  # beyond the block table
    ("seq_lens", dict(seq_lens=lambda t: t - 100, num_splits=None)),
    ("head_dim_v", dict(head_dim_v=49)),
    ("head_dim_v", dict(head_dim_v=0)),
    ("num_splits", dict(num_splits=0)),
    ("num_splits", dict(num_splits=1.5)),
    ("block_n", dict(block_n=24)),
    ("block_n", dict(block_n=8)),
    ("block_n", dict(block_n=512)),
    ("block_h", dict(block_h=8)),
    ("block_h", dict(block_h=48)),
    ("block_h", dict(block_h=128)),
    ("num_warps", dict(num_warps=3)),
    ("num_warps", dict(num_warps=32)),
    ("num_stages", dict(num_stages=0)),
    ("num_stages", dict(num_stages=9)),
    ("sm_scale", dict(sm_scale=-1.0)),
    ("q", dict(kv_cache=lambda t: t.to(torch.float8_e4m3fn))),  # an fp8 cache wants a 16-bit q
    ("kv_cache", dict(q=lambda t: t.half(), kv_cache=lambda t: t.to(torch.float8_e5m2))),
    ("kv_scale", dict(kv_scale=2.0)),  # only for an fp8 cache
    ("kv_scale", dict(q=lambda t: t.half(), kv_cache=lambda t: t.to(torch.float8_e4m3fn), kv_scale=0.0)),
])
def test_validation_names_the_argument(name, changes):
    inp, kw = _bad(**changes)
    with pytest.raises(SplitlabError, match=rf"^{name}\b"):
        mla_decode(**inp, **kw)


# --- defaults and launch facts ------------------------------------------------------------------------


def test_defaults_table():
    d = mla_defaults(128, 576)
    assert (d.block_h, d.block_n, d.num_warps, d.num_stages) == (64, 64, 8, 2)  # fastest on the H200, run 2
    assert smem_bytes(64, 32, 576, 512, 2, 2) == 144 * 1024  # Q 72 KB + 2 x 36 KB
    # fp8, 16-row tile: a 16-bit Q 18 KB + 2 x 18 KB + the dequantised 36 KB; 64 rows (fp8 x fp8 QK): an fp8 Q
    # 36 KB + 3 x 36 KB + the dequantised V part 64 KB
    assert smem_bytes(16, 32, 576, 512, 1, 2) == 90 * 1024
    assert smem_bytes(64, 64, 576, 512, 1, 3) == 208 * 1024
    assert mla_defaults(16, 576, "fp8_e4m3").block_n == 32 and mla_defaults(128, 576, "fp8_e4m3").block_n == 64
    assert mla_defaults(128, 576, "fp8_e4m3").num_stages == 3
    assert mla_defaults(16, 576).block_h == 16 and mla_defaults(5, 48).block_h == 16
    assert mla_defaults(128, 576, "fp32").block_n == 16
    for h in (1, 16, 20, 32, 64, 128):
        for dqk in (64, 576):
            for dt in ("bf16", "fp32"):
                d = mla_defaults(h, dqk, dt)
                smem = smem_bytes(d.block_h, d.block_n, dqk, min(dqk, 512), 4 if dt == "fp32" else 2,
                                  d.num_stages)
                assert smem <= mla.SMEM_BUDGET or d.num_stages == 1


def test_isolate_qk_only_where_two_warpgroups_share_a_wgmma_m():
    assert mla.isolate_qk(64, 8, torch.bfloat16) and mla.isolate_qk(64, 8, torch.float16)
    assert not mla.isolate_qk(64, 4, torch.bfloat16)  # one warpgroup: M = 64 = 16 x 4 warps
    assert not mla.isolate_qk(16, 4, torch.bfloat16) and not mla.isolate_qk(32, 8, torch.bfloat16)  # mma.sync
    assert not mla.isolate_qk(64, 8, torch.float32)  # fp32: ieee dots, no wgmma


@pytest.mark.parametrize("w", [
    workloads.get("deepseek-v3-mla", batch=8, ctx_len=8192),
    workloads.get("deepseek-v3-mla-tp8", batch=1, ctx_len=65536),
    DecodeWorkload("mla", 3, 20, 1, 48, 32, 100, page_size=16, seq_lens=(100, 0, 7)),
])
@pytest.mark.parametrize("knobs", [{}, dict(num_splits=3), dict(num_splits=1, block_h=16, block_n=64),
                                   dict(block_h=32, num_warps=4, num_stages=1)])
def test_launch_facts_match_the_wave_model(w, knobs):
    f = mla_launch_facts(w, device="h200", **knobs)
    assert f.kernel == "mla_decode" and f.num_splits >= 1
    assert f.ctas == waves.ctas(w, f.num_splits, block_h=f.block_h)
    assert (f.combine_grid is None) == (f.num_splits == 1)
    for k, v in knobs.items():
        assert getattr(f, k) == v
    if "num_splits" not in knobs:
        from splitlab.planners import default_plan

        assert f.num_splits == default_plan(w, "h200").num_splits


def test_launch_facts_reject_other_kinds_and_bad_knobs():
    with pytest.raises(SplitlabError, match="^w="):
        mla_launch_facts(workloads.get("llama-3-8b"))
    with pytest.raises(SplitlabError, match="^block_h="):
        mla_launch_facts(workloads.get("deepseek-v3-mla"), block_h=12)
    f = mla_launch_facts(workloads.get("deepseek-v3-mla", dtype="fp8_e4m3"))  # an fp8 cache: its own tiles
    assert f.block_h == 64 and f.block_n == 64
    with pytest.raises(SplitlabError, match="^dtype="):
        mla_defaults(128, 576, "fp8_e5m2")


# --- hostile inputs: strides, NaN / inf in a key, out-of-range table and lengths --------------------------------


@pytest.mark.parametrize("how", ["column", "every-other"])
@pytest.mark.parametrize("S", [None, 3])
def test_non_contiguous_seq_lens_are_honoured(how, S):
    """``seq_lens`` read through its stride (the neighbouring memory holds 2^30): it was read as if contiguous
    (rel err 1.12, or a segfault for a large neighbour)."""
    lens = [37, 0, 70]
    inp = mla_inputs(3, 5, 48, lens, page_size=16, dtype=torch.float32, seed=31)
    ref = reference.mla_decode(**inp, head_dim_v=32, return_lse=True)
    inp["seq_lens"] = strided_lens(lens, how)
    out, lse = mla_decode(**inp, head_dim_v=32, num_splits=S, block_n=16, return_lse=True)
    assert_matches_reference(out, lse, *ref, torch.float32, [1])


@pytest.mark.parametrize("value,col", [(math.nan, 7), (math.nan, 40), (math.inf, 40), (-math.inf, 44)])
@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter: inf - inf
def test_nan_and_inf_in_a_key_reach_the_output(allocs, value, col, S):
    """A non-finite entry in one latent row of request 0 (key 21 of 90; a V column, or a rope column): the output
    is NaN / finite exactly where the fp64 reference's is (heads with q[.., col] > 0 see +inf scores, < 0 drop
    the key), split or not; request 1 stays right."""
    inp = mla_inputs(2, 5, 48, [90, 33], page_size=16, dtype=torch.float32, seed=32)
    set_key_(inp["kv_cache"], inp["block_table"], 0, 21, value, col)
    inp["q"][0, :, col] = torch.tensor([0.5, -0.5, 0.25, -1.0, 2.0])
    ref = reference.mla_decode(**inp, head_dim_v=32)
    assert not torch.isfinite(ref[0]).all() and torch.isfinite(ref[1]).all()
    assert_same_nonfinite(mla_decode(**inp, head_dim_v=32, num_splits=S, block_n=16), ref, torch.float32)


def test_block_table_out_of_range(monkeypatch):
    """An entry a request reads outside [0, num_pages): refused on the planned path and with the switch; without
    it never read (this used to segfault), the request NaN and the others right."""
    inp = mla_inputs(3, 5, 48, [37, 70, 5], page_size=16, dtype=torch.float32, seed=33)
    ref = reference.mla_decode(**inp, head_dim_v=32)
    inp["block_table"][2, 1:] = 10**6  # never read (request 2 has one page): accepted
    assert rel_err(mla_decode(**inp, head_dim_v=32), ref) <= TOLERANCE[torch.float32]
    inp["block_table"][1, 4] = -(10**6)
    for knobs in ({}, dict(num_splits=2, validate=True)):
        with pytest.raises(SplitlabError, match=r"^block_table\[1, 4\] = -1000000 is outside \[0, num_pages"):
            mla_decode(**inp, head_dim_v=32, **knobs)
    monkeypatch.setenv(VALIDATE_ENV, "1")
    with pytest.raises(SplitlabError, match=r"^block_table\[1, 4\]"):
        mla_decode(**inp, head_dim_v=32, num_splits=2)
    monkeypatch.delenv(VALIDATE_ENV)
    for S in (1, 2):
        out = mla_decode(**inp, head_dim_v=32, num_splits=S, block_n=16)
        assert torch.isnan(out[1]).all() and rel_err(out[[0, 2]], ref[[0, 2]]) <= TOLERANCE[torch.float32]


def test_lengths_past_the_table_are_refused_or_nan():
    inp = mla_inputs(2, 5, 48, [37, 20], page_size=16, dtype=torch.float32, seed=34)
    ref = reference.mla_decode(**inp, head_dim_v=32)
    for bad_len in (3 * 16 + 1, 2**31 - 1, -1):
        x = dict(inp, seq_lens=inp["seq_lens"].clone())
        x["seq_lens"][0] = bad_len
        with pytest.raises(SplitlabError, match=r"^seq_lens has values in"):
            mla_decode(**x, head_dim_v=32, num_splits=2, validate=True)
        out = mla_decode(**x, head_dim_v=32, num_splits=2)
        assert torch.isnan(out[0]).all() and rel_err(out[1], ref[1]) <= TOLERANCE[torch.float32]


def test_an_empty_cache_reads_nothing():
    """A cache of 0 pages: empty requests are fine; a request with keys is refused (validated) or NaN."""
    inp = mla_inputs(2, 5, 48, [0, 0], page_size=16, dtype=torch.float32)
    inp["kv_cache"] = inp["kv_cache"][:0]
    out = mla_decode(**inp, head_dim_v=32, num_splits=2)
    assert torch.all(out == 0)
    inp["seq_lens"][1] = 3
    with pytest.raises(SplitlabError, match=r"^block_table\[1, 0\] = .* num_pages = 0\)"):
        mla_decode(**inp, head_dim_v=32)
    out = mla_decode(**inp, head_dim_v=32, num_splits=2)
    assert torch.all(out[0] == 0) and torch.isnan(out[1]).all()


def test_layouts_the_kernel_cannot_address_are_refused(monkeypatch):
    """A dimension indexed in 32 bits spanning 2^31 elements: refused before any launch (meta tensors)."""
    from splitlab.kernels import _launch

    monkeypatch.setattr(_launch, "check_launch_device", lambda *a: None)
    meta = dict(device="meta", dtype=torch.float32)
    x = dict(q=torch.empty(2, 4, 48, **meta), kv_cache=torch.empty_strided((3, 16, 48), (48, 2**28, 1), **meta),
             block_table=torch.empty(2, 1, dtype=torch.int32, device="meta"),
             seq_lens=torch.empty(2, dtype=torch.int32, device="meta"))
    with pytest.raises(SplitlabError, match=r"^kv_cache has shape \(3, 16, 48\) and strides .* dimension 1 spans"):
        mla_decode(**x, head_dim_v=32, num_splits=1)
