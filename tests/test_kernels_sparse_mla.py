"""The sparse top-k MLA split-K decode kernel against the fp64 reference, under Triton's interpreter."""

from __future__ import annotations

import math

import pytest
import torch

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
    rel_err,
)
from splitlab.kernels.inputs import poison_, poison_unread_slots_, quantize_fp8, sparse_mla_inputs
from splitlab.kernels.sparse_mla import (
    sparse_block_k,
    sparse_mla_decode,
    sparse_mla_defaults,
    sparse_mla_launch_facts,
)
from splitlab.workloads import DecodeWorkload


def _check(inp, dtype, head_dim_v, sm_scale=None, kv_scale=None, ref_q=None, **knobs):
    out, lse = sparse_mla_decode(**inp, head_dim_v=head_dim_v, sm_scale=sm_scale, kv_scale=kv_scale,
                                 return_lse=True, **knobs)
    ref, ref_lse = reference.sparse_mla_decode(**dict(inp, q=inp["q"] if ref_q is None else ref_q),
                                               head_dim_v=head_dim_v, sm_scale=sm_scale, kv_scale=kv_scale,
                                               return_lse=True)
    empty = [t for t in range(inp["indices"].shape[0]) if (inp["indices"][t] < 0).all()]
    assert_matches_reference(out, lse, ref, ref_lse, dtype, empty)
    return out, lse


# (dtype, T, H, Dqk, Dv, topk, num_slots, empty_rows, num_splits, block_k, block_h)
CASES = [
    (torch.float32, 3, 5, 48, 32, 100, 300, 1, 3, 16, None),  # odd heads, rope 16, a fully -1 token
    (torch.float16, 3, 5, 48, 32, 100, 300, 1, 3, 32, None),
    (torch.bfloat16, 3, 5, 48, 32, 100, 300, 1, 3, None, None),
    (torch.float32, 2, 20, 32, 32, 40, 64, 0, 8, 16, 16),  # Dqk == Dv (seed 003's layout), 2 head tiles
    (torch.bfloat16, 2, 20, 32, 32, 40, 64, 1, 8, 64, 32),  # more splits than candidate tiles
    (torch.float16, 2, 4, 40, 24, 33, 50, 0, 1, 16, None),  # non-pow2 dims (masked), unsplit
    (torch.bfloat16, 2, 3, 40, 24, 50, 20, 0, 2, 16, None),  # topk > num_slots: repeated slots
    (torch.bfloat16, 2, 3, 576, 512, 64, 200, 1, 2, 32, None),  # DeepSeek-V3.2's 576/512
    (torch.bfloat16, 2, 4, 512, 512, 64, 200, 0, 1, None, None),  # seed 003's 512/512, unsplit
    (torch.float16, 2, 70, 48, 32, 100, 300, 1, 3, 32, 64),  # BLOCK_H 64, 8 warps: ISOLATE_QK, 2 head tiles
]


@pytest.mark.parametrize("dtype,T,H,Dqk,Dv,topk,slots,empty,S,block_k,block_h", CASES)
def test_matches_reference(allocs, dtype, T, H, Dqk, Dv, topk, slots, empty, S, block_k, block_h):
    inp = sparse_mla_inputs(T, H, Dqk, topk, num_slots=slots, invalid_frac=0.3, empty_rows=empty, dtype=dtype,
                            seed=H + Dqk + topk)
    _check(inp, dtype, Dv, num_splits=S, block_k=block_k, block_h=block_h)
    assert len(allocs) == (2 if S == 1 else 4)
    for t in allocs:  # every element written (a split that saw only -1 writes 0 and lse -inf)
        assert not torch.isnan(t).any()


@pytest.mark.parametrize("dtype,H,Dqk,Dv,S,block_h", [
    (torch.float16, 70, 48, 32, 3, 64),  # BLOCK_H 64, 8 warps (ISOLATE_QK), 2 head tiles, a fully -1 token
    (torch.bfloat16, 5, 576, 512, 1, None),  # DeepSeek-V3.2's 576/512, unsplit
])
def test_fp8_cache(dtype, H, Dqk, Dv, S, block_h):
    """An e4m3 pool holding K / kv_scale (see the MLA kernel's test)."""
    x = sparse_mla_inputs(3, H, Dqk, 100, num_slots=300, invalid_frac=0.3, empty_rows=1, dtype=dtype, seed=H)
    kv_scale = 2.5
    x8 = dict(x, kv_cache=quantize_fp8(x["kv_cache"], kv_scale))
    bh = sparse_mla_defaults(H, Dqk, "fp8_e4m3", block_h=block_h).block_h
    out, _ = _check(x8, dtype, Dv, kv_scale=kv_scale, ref_q=fp8_query(x["q"], bh), num_splits=S, block_h=block_h,
                    block_k=32)
    assert rel_err(out, reference.sparse_mla_decode(**x, head_dim_v=Dv)) <= FP8_QUANT_TOLERANCE


def test_whole_tiles_of_invalid_indices():
    """-1 tiles before, between and after valid ones, in one split: the running max must survive them."""
    inp = sparse_mla_inputs(4, 5, 48, 96, num_slots=200, invalid_frac=0.0, dtype=torch.float32, seed=9)
    idx = inp["indices"]
    idx[0, :16] = -1  # the first tile of token 0 is empty
    idx[1, 32:64] = -1  # two empty tiles in the middle
    idx[2, 16:] = -1  # only the first tile is valid
    idx[3, :-1] = -1  # a single valid candidate, in the last tile
    _check(inp, torch.float32, 32, num_splits=1, block_k=16)
    _check(inp, torch.float32, 32, num_splits=3, block_k=16)


def test_rows_no_index_names_are_never_read():
    """NaN in every pool row that no valid index names (an index of -1 included) changes nothing."""
    inp = sparse_mla_inputs(4, 5, 48, 70, num_slots=300, invalid_frac=0.3, empty_rows=1, dtype=torch.float32,
                            seed=13)
    ref = reference.sparse_mla_decode(**inp, head_dim_v=32)
    poison_unread_slots_(inp["kv_cache"], inp["indices"])
    assert torch.isnan(inp["kv_cache"]).any()
    assert torch.equal(reference.sparse_mla_decode(**inp, head_dim_v=32), ref)  # only unread rows poisoned
    for s in (1, 3):
        _check(inp, torch.float32, 32, num_splits=s, block_k=16)


def test_every_token_invalid():
    inp = sparse_mla_inputs(2, 5, 48, 20, num_slots=30, empty_rows=2, dtype=torch.float16)
    for s in (None, 1, 3):
        out, lse = sparse_mla_decode(**inp, head_dim_v=32, num_splits=s, return_lse=True)
        assert torch.all(out == 0) and torch.all(torch.isneginf(lse))


def test_default_plan_on_cpu_and_return_types():
    inp = sparse_mla_inputs(3, 5, 48, 70, num_slots=100, dtype=torch.bfloat16, seed=5)
    out = sparse_mla_decode(**inp, head_dim_v=32)  # num_splits=None: the h200 preset's plan
    assert isinstance(out, torch.Tensor) and out.shape == (3, 5, 32) and out.dtype == torch.bfloat16
    assert rel_err(out, reference.sparse_mla_decode(**inp, head_dim_v=32)) <= TOLERANCE[torch.bfloat16]
    res = sparse_mla_decode(**inp, head_dim_v=32, return_lse=True)
    assert isinstance(res, tuple) and len(res) == 2


def test_custom_scale_knobs_and_views():
    g = torch.Generator().manual_seed(6)
    inp = sparse_mla_inputs(2, 6, 48, 40, num_slots=60, dtype=torch.float32, seed=3)
    kv_wide = torch.randn(60, 64, generator=g)
    kv_wide[:, 4:52] = inp["kv_cache"]
    idx_wide = torch.full((2, 80), -7, dtype=torch.int32)
    idx_wide[:, ::2] = inp["indices"]
    views = dict(inp, kv_cache=kv_wide[:, 4:52], indices=idx_wide[:, ::2])
    assert not views["kv_cache"].is_contiguous() and not views["indices"].is_contiguous()
    _check(views, torch.float32, 32, sm_scale=0.2, num_splits=2, block_k=16, block_h=32, num_warps=2)


def test_nan_never_passes():
    inp = sparse_mla_inputs(2, 5, 48, 30, num_slots=50, dtype=torch.float32, seed=8)
    out, lse = sparse_mla_decode(**inp, head_dim_v=32, num_splits=2, return_lse=True)
    ref, ref_lse = reference.sparse_mla_decode(**inp, head_dim_v=32, return_lse=True)
    assert rel_err(out, ref) <= 1e-4
    bad = out.clone()
    bad[0, 4, 31] = float("nan")
    assert rel_err(bad, ref) == math.inf
    assert rel_err(poison_(out.clone()), ref) == math.inf
    bad_lse = lse.clone()
    bad_lse[1, 2] = float("nan")
    assert lse_err(bad_lse, ref_lse) == math.inf


# --- validation -------------------------------------------------------------------------------------


def _bad(**changes):
    inp = sparse_mla_inputs(2, 4, 48, 20, num_slots=30, dtype=torch.float32)
    kw = dict(head_dim_v=32, num_splits=2)
    for k, v in changes.items():
        (inp if k in inp else kw)[k] = v(inp[k]) if callable(v) else v
    return inp, kw


@pytest.mark.parametrize("name,changes", [
    ("q", dict(q=lambda t: t[0])),
    ("q", dict(q=lambda t: t.to(torch.int32))),
    ("kv_cache", dict(kv_cache=lambda t: t.half())),
    ("kv_cache", dict(kv_cache=lambda t: t[:, :40])),
    ("kv_cache", dict(kv_cache=lambda t: t[None])),
    ("kv_cache", dict(kv_cache=lambda t: t.to("meta"))),
    ("indices", dict(indices=lambda t: t.long())),
    ("indices", dict(indices=lambda t: t[:1])),
    ("indices", dict(indices=lambda t: t[:, :0])),
    ("indices", dict(indices=lambda t: torch.where(t == t.max(), 30, t))),  # == num_slots
    ("indices", dict(indices=lambda t: torch.where(t == t.max(), -2, t))),
    ("head_dim_v", dict(head_dim_v=49)),
    ("num_splits", dict(num_splits=0)),
    ("block_k", dict(block_k=24)),
    ("block_k", dict(block_k=8)),
    ("block_h", dict(block_h=8)),
    ("block_h", dict(block_h=128)),
    ("num_warps", dict(num_warps=6)),
    ("sm_scale", dict(sm_scale=float("inf"))),
    ("q", dict(kv_cache=lambda t: t.to(torch.float8_e4m3fn))),  # an fp8 pool wants a 16-bit q
    ("kv_scale", dict(kv_scale=0.5)),  # only for an fp8 pool
    ("kv_scale", dict(q=lambda t: t.bfloat16(), kv_cache=lambda t: t.to(torch.float8_e4m3fn),
                      kv_scale=float("nan"))),
])
def test_validation_names_the_argument(name, changes):
    inp, kw = _bad(**changes)
    with pytest.raises(SplitlabError, match=rf"^{name}\b"):
        sparse_mla_decode(**inp, **kw)


# --- defaults and launch facts ------------------------------------------------------------------------


def test_default_block_k():
    assert sparse_block_k(512) == 64 and sparse_block_k(576) == 64  # seed 003's and DeepSeek-V3.2's rows
    assert sparse_block_k(1024) == 32 and sparse_block_k(512, "fp32") == 16
    d = sparse_mla_defaults(64, 512)
    assert (d.block_h, d.block_n, d.num_warps, d.num_stages) == (64, 64, 8, 2)
    d = sparse_mla_defaults(128, 576)
    assert (d.block_n, d.num_stages) == (64, 2)  # 216 KB modelled: fits


@pytest.mark.parametrize("w", [
    workloads.get("deepseek-v4-sparse-mla", batch=1, ctx_len=65536),
    workloads.get("deepseek-v4-sparse-mla", batch=64, ctx_len=65536),
    workloads.get("deepseek-v3.2-sparse-mla", batch=4, ctx_len=65536),
    DecodeWorkload("sparse_mla", 3, 20, 1, 48, 32, 300, page_size=1, topk=100),
])
@pytest.mark.parametrize("knobs", [{}, dict(num_splits=3), dict(num_splits=1, block_h=16, block_k=128),
                                   dict(block_h=32, num_warps=4)])
def test_launch_facts_match_the_wave_model(w, knobs):
    f = sparse_mla_launch_facts(w, device="h200", **knobs)
    assert f.kernel == "sparse_mla_decode" and f.num_splits >= 1 and f.block_n is None
    assert f.ctas == waves.ctas(w, f.num_splits, block_h=f.block_h)
    assert (f.combine_grid is None) == (f.num_splits == 1)
    for k, v in knobs.items():
        assert getattr(f, k) == v
    from splitlab.planners import default_plan

    plan = default_plan(w, "h200")
    if "num_splits" not in knobs:
        assert f.num_splits == plan.num_splits
    if "block_k" not in knobs:  # the plan's BLOCK_K when it planned the splits, else the kernel's default
        planned = plan.block_k if "num_splits" not in knobs else None
        assert f.block_k == (planned or sparse_block_k(w.head_dim_qk, w.dtype))


def test_launch_facts_reject_other_kinds():
    with pytest.raises(SplitlabError, match="^w="):
        sparse_mla_launch_facts(workloads.get("deepseek-v3-mla"))


def test_the_launch_takes_the_planners_head_tile_when_it_plans_the_splits():
    from splitlab.kernels.sparse_mla import sparse_mla_launch_facts
    from splitlab.planners import plan

    w = workloads.get("deepseek-v4-sparse-mla", batch=1, topk=384).with_(num_q_heads=32)  # default tile: 32 rows
    p = plan(w, "h200", "splitlab")
    f = sparse_mla_launch_facts(w, device="h200")
    assert p.block_h == 16 and (f.block_h, f.num_splits) == (p.block_h, p.num_splits)
    assert f.ctas == waves.ctas(w, p.num_splits, block_h=16)
    assert sparse_mla_launch_facts(w, device="h200", block_h=32).block_h == 32  # a given tile wins
    assert sparse_mla_launch_facts(w, num_splits=2, device="h200").block_h == 32  # no plan: the default tile


# --- hostile inputs: NaN / inf in a row, indices out of range without the check ------------------------------


@pytest.mark.parametrize("value,col", [(math.nan, 3), (math.inf, 40)])
@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter: inf - inf
def test_nan_and_inf_in_a_row_reach_the_output(allocs, value, col, S):
    """A non-finite entry in one pool row that token 0 attends (and token 1 does not): NaN / finite exactly where
    the fp64 reference has it, split or not."""
    inp = sparse_mla_inputs(2, 5, 48, 64, num_slots=100, invalid_frac=0.2, dtype=torch.float32, seed=41)
    slot = int(inp["indices"][0][inp["indices"][0] >= 0][20])
    inp["indices"][1][inp["indices"][1] == slot] = -1
    inp["kv_cache"][slot, col] = value
    inp["q"][0, :, col] = torch.tensor([0.5, -0.5, 0.25, -1.0, 2.0])
    ref = reference.sparse_mla_decode(**inp, head_dim_v=32)
    assert not torch.isfinite(ref[0]).all() and torch.isfinite(ref[1]).all()
    assert_same_nonfinite(sparse_mla_decode(**inp, head_dim_v=32, num_splits=S, block_k=16), ref, torch.float32)


@pytest.mark.parametrize("bad_index", [30, 10**6, -2, -(10**6)])
def test_unchecked_indices_out_of_range_give_nan(bad_index, monkeypatch):
    """With the check off (``validate=False`` or ``SPLITLAB_VALIDATE=0``; what graph capture does by default) an
    index outside [-1, num_slots) is never gathered and its token comes out NaN, the others right; by default
    and with ``validate=True`` it is refused."""
    inp = sparse_mla_inputs(3, 4, 48, 20, num_slots=30, dtype=torch.float32, seed=42)
    ref = reference.sparse_mla_decode(**inp, head_dim_v=32)
    inp["indices"][1, 7] = bad_index
    for knobs in ({}, dict(validate=True)):
        with pytest.raises(SplitlabError, match=r"^indices has values in"):
            sparse_mla_decode(**inp, head_dim_v=32, num_splits=2, **knobs)
    out = sparse_mla_decode(**inp, head_dim_v=32, num_splits=2, validate=False)
    assert torch.isnan(out[1]).all() and rel_err(out[[0, 2]], ref[[0, 2]]) <= TOLERANCE[torch.float32]
    monkeypatch.setenv(VALIDATE_ENV, "0")
    assert torch.isnan(sparse_mla_decode(**inp, head_dim_v=32, num_splits=1)[1]).all()


def test_layouts_the_kernel_cannot_address_are_refused(monkeypatch):
    """A dimension indexed in 32 bits spanning 2^31 elements: refused before any launch (meta tensors)."""
    from splitlab.kernels import _launch

    monkeypatch.setattr(_launch, "check_launch_device", lambda *a: None)
    x = dict(q=torch.empty(2, 4, 48, device="meta"), kv_cache=torch.empty(30, 48, device="meta"),
             indices=torch.empty_strided((2, 20), (1, 2**27), dtype=torch.int32, device="meta"))
    with pytest.raises(SplitlabError, match=r"^indices has shape \(2, 20\) and strides .* dimension 1 spans"):
        sparse_mla_decode(**x, head_dim_v=32, num_splits=1, validate=False)
