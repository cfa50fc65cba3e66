"""Sparse top-k MLA decode over a token pool: a Triton split-K kernel and its launcher.

Layout. ``q [T, H, Dqk]`` (one query token per row); ``kv_cache [num_slots, Dqk]``, one latent row per
pooled token (K = the whole row, V = its first ``Dv = head_dim_v`` columns); ``indices [T, topk]`` int32,
the slots each token attends to, ``-1`` = invalid (skipped: its score is -inf and its row is never read).
DeepSeek-V3.2: 128 heads, 576/512, top-k 2048; seed 003 (DeepSeek-V4-style): 64 heads, Dqk = Dv = 512
(448 NoPE + 64 RoPE all inside the V part, so the "rest" part is empty).

Kernel. One program per (token, head tile of ``BLOCK_H`` heads, split); each token's ``topk`` candidates
are cut into ``num_splits`` splits of whole ``BLOCK_K`` tiles (the same split length for every token,
since every token has ``topk`` candidates). Per tile: ``BLOCK_K`` int32 indices, then ``BLOCK_K`` latent
rows gathered by index (int64 offsets; an invalid index's row is masked off, not read). The tile math is
``mla``'s shared helpers (``load_q_tile``, ``load_latent_rows``, ``softmax_update``, ``store_head_tile``):
one latent load serves QK and PV. A token whose indices are all -1 gets a zero row and ``lse = -inf``
(so does a split that only saw -1s; ``combine`` then ignores it).

Work lists. ``sparse_mla_decode_scheduled`` runs the same tile on any schedule's items (``planners.schedulers``
on the tokens' walked lengths: ``topk``, or a per-token valid prefix), one program per (CTA slot, head tile); an
item walks ``indices[t, begin:end]``, and ``kernels.worklist`` supplies the item prologue, partial buffers and merge.

Host syncs and validation. By default the launcher checks ``-1 <= indices < num_slots`` with one device
reduction (``min`` and ``max`` in one transfer); ``num_splits=None`` additionally asks the default planner (no
further sync). ``validate=False`` (or ``SPLITLAB_VALIDATE=0``) skips the check and the sync, as graph capture does
unless validation is asked for (then refused). Unchecked, an index outside ``[-1, num_slots)`` is never gathered:
its token comes out NaN on this kernel, undefined on the Gluon tile (``mla_sm90``). See ``_launch`` for the switch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from splitlab.errors import SplitlabError
from splitlab.intmath import cdiv
from splitlab.kernels import _launch, mla_sm90
from splitlab.kernels import timeline as tlog
from splitlab.kernels._launch import (
    FLOAT_DTYPES,
    FP8_KV_DTYPE,
    TORCH_DTYPE_NAMES,
    LaunchFacts,
    capturing,
    check_indices,
    check_knob,
    check_kv_dtype,
    check_no_grad,
    check_pow2,
    check_result,
    check_spans,
    check_tensor,
    device_guard,
    dot_input_precision,
    interpret_upcast,
    launch_plan,
    no_validation_under_capture,
    resolve_device,
    resolve_sm_scale,
    split_len,
    validate_setting,
)
from splitlab.kernels.combine import combine_grid
from splitlab.kernels.mla import (
    LOG2E,
    MIN_DOT,
    TileConfig,
    alloc_outputs,
    check_kind,
    check_num_warps,
    empty_result,
    finish_checked,
    fit_stages,
    fp8_qk,
    fp8_qk_on,
    isolate_qk,
    kernel_dtype_name,
    load_latent_rows,
    load_q_tile,
    padded_dims,
    plan_num_splits,
    softmax_update,
    store_head_tile,
)
from splitlab.kernels.paging import key_masks, poison
from splitlab.kernels.timeline import Timelines
from splitlab.kernels.worklist import (
    WorkList,
    alloc_partials,
    check_worklist,
    launch_merge,
    load_item,
    record_slot,
    timeline_args,
)
from splitlab.waves import MAX_BLOCK_H, ctas, default_block_h
from splitlab.workloads import DTYPE_BYTES, DecodeWorkload

# =====================================================================================================
# Defaults: the one place to tune tiles. block_h -> (num_warps, num_stages wanted) for 16-bit inputs.
# BLOCK_K is 64: on the H200 it was faster than 32 at every point measured (104 A/B points over H = 64/128,
# Dqk = 512/576, top-k 512/2048, 1-128 tokens, 1-32 splits, up to 62 waves of CTAs: 1.02-1.47x,
# data/archive/bench/h200-kernel-v2/ab_sparse_block_k.csv; and every sparse shape of the kernel bench), so seed
# 003's load rule (aiter on MI355X: 32 once the CTAs exceed the CUs; ``planners.aiter.pa_decode_sparse_block_k``)
# does not transfer to this kernel on this GPU.
# num_stages is clamped to mla.SMEM_BUDGET: H=64, Dqk=512, bf16, BLOCK_K 64 -> 2 stages (64 KB Q +
# 2 x 64 KB = 192 KB); H=128, Dqk=576 (DeepSeek-V3.2) -> 2 stages (72 KB + 2 x 72 KB = 216 KB modelled;
# 224 KB compiled, with the probabilities' 8 KB).
# =====================================================================================================

SPARSE_MLA_TILES: dict[int, tuple[int, int]] = {16: (4, 2), 32: (8, 2), 64: (8, 2)}
BLOCK_K_SMALL, BLOCK_K_LARGE = 32, 64
#: BLOCK_K 64 only for latent rows up to this width. At 576 (DeepSeek-V3.2) with BLOCK_H 64 it compiles
#: (sm_90a, triton 3.6: 255 registers, 224 KB shared at 2 stages) since ``mla.isolate_qk`` stopped the two
#: warpgroups computing the same scores; before that it spilled.
BLOCK_K_LARGE_MAX_DQK = 576
#: The order the one-axis grid issues its programs in: head tile fastest, then split, then token, so all of a
#: token's CTAs go together (``planners.splitlab.REQUEST_MAJOR`` restates it for the planner).
GRID_ORDER = "request-major"


def sparse_block_k(head_dim_qk: int, dtype: str = "bf16") -> int:
    """The default BLOCK_K: 64 (16-bit rows up to ``BLOCK_K_LARGE_MAX_DQK`` wide), 32 for wider rows, 16 for
    fp32 inputs."""
    if dtype == "fp32":
        return 16
    return BLOCK_K_LARGE if head_dim_qk <= BLOCK_K_LARGE_MAX_DQK else BLOCK_K_SMALL


def sparse_mla_defaults(num_heads: int, head_dim_qk: int, dtype: str | torch.dtype = "bf16", *,
                        head_dim_v: int | None = None, block_h: int | None = None,
                        block_k: int | None = None) -> TileConfig:
    """Default tiles of ``sparse_mla_decode`` (``TileConfig.block_n`` is ``BLOCK_K``).

    block_h = ``waves.default_block_h(H)`` unless given; BLOCK_K ``sparse_block_k(Dqk, dtype)`` unless given;
    (num_warps, num_stages) from ``SPARSE_MLA_TILES``, num_stages clamped to the shared-memory budget.
    """
    name = kernel_dtype_name(dtype)
    dv = min(head_dim_qk, 512) if head_dim_v is None else head_dim_v  # the launchers' default Dv
    bh = default_block_h(num_heads) if block_h is None else block_h
    num_warps, num_stages = SPARSE_MLA_TILES[bh]
    if name == "fp8_e4m3" and bh == 16:
        num_warps = 8  # the fp8 tile's cast to 16 bits spills at 4 warps (255 registers + 16 B, sm_90)
    if name == "fp8_e4m3" and fp8_qk(bh):
        # Q in fp8 leaves room for a third tile in flight: 0.96-0.99x the time of 2 stages on the H200
        # (data/archive/bench/h200-kernel-v3/sparse_fp8_stages_ab.csv), though it spills 8-24 B (sm_90, triton 3.6).
        num_stages = max(num_stages, 3)
    bk = sparse_block_k(head_dim_qk, name) if block_k is None else block_k
    return TileConfig(bh, bk, num_warps, fit_stages(bh, bk, head_dim_qk, dv, DTYPE_BYTES[name], num_stages))


@triton.jit
def _sparse_mla_decode_kernel(
    q_ptr, kv_ptr, idx_ptr, out_ptr, lse_ptr,
    num_heads, num_head_tiles, num_splits, topk, split_size, qk_scale, v_scale, num_slots,
    q_stride_t, q_stride_h, q_stride_d,
    kv_stride_n, kv_stride_d,
    idx_stride_t, idx_stride_k,
    out_stride_t, out_stride_h, out_stride_s, out_stride_d,
    lse_stride_t, lse_stride_h, lse_stride_s,
    HEAD_DIM_V: tl.constexpr, HEAD_DIM_R: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, ISOLATE_QK: tl.constexpr, KV_FP8: tl.constexpr,
    FP8_QK: tl.constexpr,
):
    # 1-D grid, head tile fastest: the head tiles of one (token, split) gather the same rows back to back,
    # so the second tile's gathers hit L2.
    pid = tl.program_id(0)
    head_tile = pid % num_head_tiles
    rest = pid // num_head_tiles
    split = rest % num_splits
    t = rest // num_splits

    start = split * split_size  # split_size is a whole number of BLOCK_K tiles
    end = tl.minimum(start + split_size, topk)

    offs_h = head_tile * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    q_v, q_r, q_row_scale = load_q_tile(q_ptr + t.to(tl.int64) * q_stride_t, offs_h, mask_h, q_stride_h,
                                        q_stride_d, HEAD_DIM_V, HEAD_DIM_R, BLOCK_DV, BLOCK_DR, UPCAST, FP8_QK)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    idx_row = idx_ptr + t.to(tl.int64) * idx_stride_t
    # Per tile: BLOCK_K * 4 bytes of indices, then up to BLOCK_K gathered rows of Dqk * elt bytes each
    # (an invalid index reads nothing).
    for k0 in range(start, end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        idx = tl.load(idx_row + offs_k * idx_stride_k, mask=offs_k < end, other=-1)
        # -1 (and the tail past topk) is no key; an index outside [-1, num_slots) (unchecked input) is never
        # gathered and scores NaN (paging.key_masks).
        valid, fill = key_masks(idx != -1, (idx >= 0) & (idx < num_slots))
        rows = kv_ptr + idx.to(tl.int64) * kv_stride_n
        kv_v, kv_r = load_latent_rows(rows, valid, kv_stride_d, HEAD_DIM_V, HEAD_DIM_R, BLOCK_DV, BLOCK_DR,
                                      UPCAST)
        m_i, l_i, acc = softmax_update(q_v, q_r, kv_v, kv_r, valid, fill[None, :], m_i, l_i, acc, qk_scale,
                                       q_row_scale, HEAD_DIM_R, DOT_PRECISION, ISOLATE_QK, KV_FP8, FP8_QK,
                                       q_ptr.dtype.element_ty)

    store_head_tile(acc, m_i, l_i, v_scale,
                    out_ptr + t.to(tl.int64) * out_stride_t + split * out_stride_s,
                    lse_ptr + t.to(tl.int64) * lse_stride_t + split * lse_stride_s,
                    offs_h, mask_h, out_stride_h, out_stride_d, lse_stride_h, HEAD_DIM_V, BLOCK_DV, KV_FP8)


def sparse_mla_launch_facts(w: DecodeWorkload, *, num_splits: int | None = None, block_k: int | None = None,
                            block_h: int | None = None, num_warps: int | None = None,
                            device: object = None) -> LaunchFacts:
    """The launch ``sparse_mla_decode`` makes for ``w`` (``batch`` = query tokens, ``topk`` candidates)
    with these knobs (no launch); ``num_splits=None`` asks the default planner on ``device`` (a
    ``DeviceSpec``, a preset name, or None for the GPU torch sees, else the ``h200`` preset) for the split
    count and, unless ``block_k`` / ``block_h`` are given, for BLOCK_K and the head tile (the kernel's defaults
    where the plan names none).
    ``facts.ctas == waves.ctas(w, num_splits, block_h=block_h)``."""
    check_kind(w, "sparse_mla")
    bh = None if block_h is None else check_pow2("block_h", block_h, lo=16, hi=MAX_BLOCK_H)
    bk = None if block_k is None else check_pow2("block_k", block_k, lo=16, hi=256)
    nw = None if num_warps is None else check_num_warps(num_warps)
    if num_splits is None:  # the default planner's split count, and its BLOCK_K / BLOCK_H unless given
        plan = launch_plan(w, device)
        s = plan.num_splits
        bk = plan.block_k if bk is None else bk
        bh = plan.block_h if bh is None else bh
    else:
        s = plan_num_splits(w, num_splits, device)
    bh = default_block_h(w.num_q_heads) if bh is None else bh
    n_ctas = ctas(w, s, block_h=bh)
    d = sparse_mla_defaults(w.num_q_heads, w.head_dim_qk, w.dtype, head_dim_v=w.head_dim_v, block_h=bh,
                            block_k=bk)
    return LaunchFacts(kernel="sparse_mla_decode", grid=(n_ctas,), num_splits=s,
                       num_warps=d.num_warps if nw is None else nw, num_stages=d.num_stages,
                       block_k=d.block_n, block_h=bh,
                       combine_grid=combine_grid(w.batch, w.num_q_heads, s, w.head_dim_v) if s > 1 else None)


def slot_request(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, head_dim_v: int, kv_scale: float):
    """``request(t)`` for ``_launch.check_result``: q's row ``[1, H, Dqk]``, the slots token t attends (every
    index >= 0, repeats included; dequantised) as K ``[n, 1, Dqk]`` and their first ``head_dim_v`` columns as V;
    only called on its error path. (The work-list launcher passes the walked prefix: ``walked_indices``.)"""
    def request(t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        idx = indices[t]
        kv = kv_cache[idx[idx >= 0].long()].double() * kv_scale
        return q[t][None], kv[:, None], kv[:, None, :head_dim_v]

    return request


def check_inputs(q: object, kv_cache: object, indices: object, head_dim_v: object, sm_scale: float | None,
                 kv_scale: float | None) -> tuple[torch.Tensor, float, int, float]:
    """``(q, kv_scale, head_dim_v, sm_scale)`` once the launch's tensors and numbers are checked, each refused in one
    line: dtypes, devices, shapes, the fp8 pool's scale, autograd, ``head_dim_v``, ``sm_scale`` (resolved) and the
    dimensions the kernels index in 32 bits (token and slot offsets are 64-bit). ``sparse_mla_decode``'s checks, and
    ``sparse_mla_decode_scheduled``'s."""
    q = check_tensor("q", q, 3, dtypes=FLOAT_DTYPES)
    dev = q.device
    _launch.check_launch_device("q", q)
    check_tensor("kv_cache", kv_cache, 2, dtypes=(*FLOAT_DTYPES, FP8_KV_DTYPE), device=dev)
    kv_scale = check_kv_dtype(q, kv_cache, kv_scale)
    check_tensor("indices", indices, 2, dtypes=(torch.int32,), device=dev)
    check_no_grad(q=q, kv_cache=kv_cache)
    T, H, Dqk = q.shape
    kv_dim = kv_cache.shape[1]
    if H < 1 or Dqk < 1:
        raise SplitlabError(f"q has shape {tuple(q.shape)}; expected [T, H >= 1, Dqk >= 1]")
    if kv_dim != Dqk:
        raise SplitlabError(f"kv_cache has shape {tuple(kv_cache.shape)}; expected [num_slots, {Dqk}] "
                            "(q's head_dim_qk)")
    if indices.shape[0] != T or indices.shape[1] < 1:
        raise SplitlabError(f"indices has shape {tuple(indices.shape)}; expected [{T}, topk >= 1]")
    Dv = check_knob("head_dim_v", head_dim_v, lo=1, hi=Dqk)
    scale = resolve_sm_scale(sm_scale, Dqk, kv_scale=kv_scale)
    # Dimensions the kernels index in 32 bits (token and slot offsets are 64-bit).
    for name, t, dims in (("q", q, (1, 2)), ("kv_cache", kv_cache, (1,)), ("indices", indices, (1,))):
        check_spans(name, t, dims)
    return q, kv_scale, Dv, scale


def sparse_mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, *,
                      head_dim_v: int = 512, num_splits: int | None = None, block_k: int | None = None,
                      block_h: int | None = None, num_warps: int | None = None, sm_scale: float | None = None,
                      kv_scale: float | None = None, return_lse: bool = False, validate: bool | None = None):
    """Sparse top-k MLA decode (see the module docstring).

    q [T, H, Dqk]; kv_cache [num_slots, Dqk] (K = all columns, V = the first ``head_dim_v``); indices
    [T, topk] int32 in ``[-1, num_slots)``, -1 = invalid; any strides. Returns out [T, H, head_dim_v] in q's
    dtype, or ``(out, lse)`` with lse fp32 [T, H] (natural log; -inf and a zero row for a token with no valid
    index; NaN where a row the token attends holds NaN, as the reference gives).

    Knobs (None = default): ``num_splits`` (None: the default planner on this GPU, or the ``h200`` preset
    when q is on the CPU), ``block_k`` (candidates per tile, power of two 16..256; default: the planner's
    when it plans the splits, else ``sparse_block_k``), ``block_h`` (heads per program, power of two
    16..64; default: the planner's when it plans the splits, else ``waves.default_block_h``), ``num_warps``.
    ``sm_scale`` defaults to ``1/sqrt(Dqk)``. An fp8 pool (``torch.float8_e4m3fn``, beside a bf16/fp16 q)
    holds ``K / kv_scale`` and is dequantised in-kernel (``kv_scale`` default 1.0; as in ``mla_decode``).
    ``validate`` (None: ``SPLITLAB_VALIDATE``, else on, except under CUDA graph capture) refuses indices outside
    ``[-1, num_slots)`` in one host sync. On an sm_90 GPU the 64-row tile of a 16-bit pool (BLOCK_H 64, BLOCK_K 64,
    8 warps) runs on the warp-specialized Gluon kernel ``mla_sm90``.

    fp32 range (``_launch``'s docstring): ``sm_scale * kv_scale * log2(e)`` must be a normal fp32 (``sm_scale`` in
    about [8.1e-39, 2.4e38] when ``kv_scale`` is 1; ``kv_scale`` itself a normal fp32), refused in one line
    otherwise; the kernels compute in fp32, so the scores ``sm_scale * q.k`` must stay within fp32 and the V
    columns (dequantised) within ``|v| <= 3.4e38 / (2 n)`` for ``n`` keys attended, else that row may come out inf
    or NaN (or zero with lse -inf when every score falls below -3.4e38). Validation asked for (``validate=True`` or
    ``SPLITLAB_VALIDATE=1``, not the default) reads the result back (a second sync, after the launch) and refuses
    such a row, where the inputs it attends are finite, naming the bound. Inputs that require grad are refused
    while autograd records (no backward).
    """
    q, kv_scale, Dv, scale = check_inputs(q, kv_cache, indices, head_dim_v, sm_scale, kv_scale)
    dev = q.device
    T, H, Dqk = q.shape
    num_slots = kv_cache.shape[0]
    topk = indices.shape[1]
    want = validate_setting(validate)
    if T == 0:
        return empty_result(0, H, Dv, q, return_lse)

    # The one host sync: every index must be -1 or a real slot. Under CUDA graph capture no sync may happen:
    # by default the check is skipped there (the kernel never gathers an out-of-range index).
    if want:
        no_validation_under_capture(q, "sparse_mla_decode")
    if want or (want is None and not capturing(q)):
        check_indices(indices, num_slots)

    w = DecodeWorkload(kind="sparse_mla", batch=T, num_q_heads=H, num_kv_heads=1, head_dim_qk=Dqk,
                       head_dim_v=Dv, ctx_len=max(num_slots, 1), page_size=1, topk=topk,
                       dtype=TORCH_DTYPE_NAMES[kv_cache.dtype])
    device = resolve_device(like=q) if num_splits is None else None
    f = sparse_mla_launch_facts(w, num_splits=num_splits, block_k=block_k, block_h=block_h,
                                num_warps=num_warps, device=device)

    S = f.num_splits
    block_dv, block_dr = padded_dims(Dqk, Dv)
    sm90 = mla_sm90.use_sm90(q, kv_cache.dtype, Dqk, Dv, f.block_h, f.block_k, f.num_warps, f.num_stages)
    o, l, o_strides, l_strides = alloc_outputs(T, H, Dv, S, q.dtype, dev, sm90=sm90)
    with device_guard(q):
        if sm90:
            mla_sm90.launch_sparse(f.grid, q, kv_cache, indices, o, l, S, scale * LOG2E, o_strides, l_strides, Dv)
            return finish_checked(o, l, S, q, return_lse, want, "sparse_mla_decode", lambda: (indices >= 0).any(dim=1),
                                  slot_request(q, kv_cache, indices, Dv, kv_scale), scale, kv_scale)
        _sparse_mla_decode_kernel[f.grid](
            q, kv_cache, indices, o, l,
            H, cdiv(H, f.block_h), S, topk, split_len(topk, S, f.block_k), scale * kv_scale * LOG2E, kv_scale,
            num_slots,
            *q.stride(), *kv_cache.stride(), *indices.stride(), *o_strides, *l_strides,
            HEAD_DIM_V=Dv, HEAD_DIM_R=Dqk - Dv,
            BLOCK_H=f.block_h, BLOCK_K=f.block_k, BLOCK_DV=block_dv, BLOCK_DR=max(block_dr, MIN_DOT),
            UPCAST=interpret_upcast(q.dtype), DOT_PRECISION=dot_input_precision(q.dtype),
            ISOLATE_QK=isolate_qk(f.block_h, f.num_warps, q.dtype), KV_FP8=kv_cache.dtype == FP8_KV_DTYPE,
            FP8_QK=fp8_qk_on(kv_cache.dtype, f.block_h),
            num_warps=f.num_warps, num_stages=f.num_stages,
        )
        return finish_checked(o, l, S, q, return_lse, want, "sparse_mla_decode", lambda: (indices >= 0).any(dim=1),
                              slot_request(q, kv_cache, indices, Dv, kv_scale), scale, kv_scale)


# =====================================================================================================
# Work lists: the same tile on any schedule's items (``kernels.worklist``, ``planners.schedulers``)
# =====================================================================================================


@triton.jit
def _sparse_item(it, q_ptr, kv_ptr, idx_ptr, items_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
                 qk_scale, v_scale, num_slots, topk, offs_h, mask_h, offs_t,
                 q_stride_t, q_stride_h, q_stride_d, kv_stride_n, kv_stride_d, idx_stride_t, idx_stride_k,
                 out_stride_t, out_stride_h, out_stride_d, lse_stride_t, lse_stride_h,
                 po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h,
                 HEAD_DIM_V: tl.constexpr, HEAD_DIM_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 ISOLATE_QK: tl.constexpr, KV_FP8: tl.constexpr, FP8_QK: tl.constexpr):
    """One work item of one head tile: token ``t``'s index positions ``[begin, end)`` walked as
    ``_sparse_mla_decode_kernel`` walks a split's, its row stored (the token's output when it has one item, else its
    partial row). An item outside ``[0, topk]`` reads nothing and makes the token NaN (``worklist.load_item``)."""
    t64, start, end, row, bad = load_item(items_ptr, it, topk)
    q_v, q_r, q_row_scale = load_q_tile(q_ptr + t64 * q_stride_t, offs_h, mask_h, q_stride_h, q_stride_d,
                                        HEAD_DIM_V, HEAD_DIM_R, BLOCK_DV, BLOCK_DR, UPCAST, FP8_QK)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    idx_row = idx_ptr + t64 * idx_stride_t
    # Per tile: BLOCK_K * 4 bytes of indices, then up to BLOCK_K gathered rows of Dqk * elt bytes each (an invalid
    # index reads nothing), as the split-count kernel.
    for k0 in range(start, end, BLOCK_K):
        offs_k = k0 + offs_t
        idx = tl.load(idx_row + offs_k * idx_stride_k, mask=offs_k < end, other=-1)
        valid, fill = key_masks(idx != -1, (idx >= 0) & (idx < num_slots))
        rows = kv_ptr + idx.to(tl.int64) * kv_stride_n
        kv_v, kv_r = load_latent_rows(rows, valid, kv_stride_d, HEAD_DIM_V, HEAD_DIM_R, BLOCK_DV, BLOCK_DR,
                                      UPCAST)
        m_i, l_i, acc = softmax_update(q_v, q_r, kv_v, kv_r, valid, fill[None, :], m_i, l_i, acc, qk_scale,
                                       q_row_scale, HEAD_DIM_R, DOT_PRECISION, ISOLATE_QK, KV_FP8, FP8_QK,
                                       q_ptr.dtype.element_ty)
    l_i = poison(l_i, bad)
    if row < 0:
        store_head_tile(acc, m_i, l_i, v_scale, out_ptr + t64 * out_stride_t, lse_ptr + t64 * lse_stride_t,
                        offs_h, mask_h, out_stride_h, out_stride_d, lse_stride_h, HEAD_DIM_V, BLOCK_DV, KV_FP8)
    else:
        r64 = row.to(tl.int64)
        store_head_tile(acc, m_i, l_i, v_scale, po_ptr + r64 * po_stride_r, pl_ptr + r64 * pl_stride_r,
                        offs_h, mask_h, po_stride_h, po_stride_d, pl_stride_h, HEAD_DIM_V, BLOCK_DV, KV_FP8)


@triton.jit
def _sparse_mla_worklist_kernel(
    q_ptr, kv_ptr, idx_ptr, items_ptr, cta_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
    num_heads, num_head_tiles, qk_scale, v_scale, num_slots, topk,
    q_stride_t, q_stride_h, q_stride_d,
    kv_stride_n, kv_stride_d,
    idx_stride_t, idx_stride_k,
    out_stride_t, out_stride_h, out_stride_d,
    lse_stride_t, lse_stride_h,
    po_stride_r, po_stride_h, po_stride_d,
    pl_stride_r, pl_stride_h,
    HEAD_DIM_V: tl.constexpr, HEAD_DIM_R: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, ISOLATE_QK: tl.constexpr, KV_FP8: tl.constexpr,
    FP8_QK: tl.constexpr, PERSISTENT: tl.constexpr, num_ctas_ptr=None, BOUNDED: tl.constexpr = False,
    timeline_ptr=None, TIMELINE: tl.constexpr = False, CLOCK: tl.constexpr = True,
):
    # 1-D grid, head tile fastest (as the split-count grid): the head tiles of one slot gather the same rows back
    # to back, the second's from L2. A non-persistent slot runs the item of its own index; a persistent one walks
    # its items in order (CSR offsets ``cta_ptr``). BOUNDED (a capacity grid, ``kernels.decode_plan``): a slot past
    # the 4-byte count at ``num_ctas_ptr`` exits at once. TIMELINE: each program writes its 64-byte record
    # (``kernels.timeline``), as ``worklist``'s kernels do.
    pid = tl.program_id(0)
    head_tile = pid % num_head_tiles
    cta = pid // num_head_tiles
    if BOUNDED:
        if cta >= tl.load(num_ctas_ptr):
            if TIMELINE:
                tlog.absent_record(timeline_ptr, pid)
            return
    if TIMELINE:
        t_start = tlog.start_record(timeline_ptr, pid, CLOCK, TIMELINE)
    offs_h = head_tile * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_t = tl.arange(0, BLOCK_K)
    if PERSISTENT:
        for it in tl.range(tl.load(cta_ptr + cta), tl.load(cta_ptr + cta + 1), num_stages=1):
            _sparse_item(it, q_ptr, kv_ptr, idx_ptr, items_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
                         qk_scale, v_scale, num_slots, topk, offs_h, mask_h, offs_t,
                         q_stride_t, q_stride_h, q_stride_d, kv_stride_n, kv_stride_d, idx_stride_t, idx_stride_k,
                         out_stride_t, out_stride_h, out_stride_d, lse_stride_t, lse_stride_h,
                         po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h,
                         HEAD_DIM_V, HEAD_DIM_R, BLOCK_H, BLOCK_K, BLOCK_DV, BLOCK_DR, UPCAST, DOT_PRECISION,
                         ISOLATE_QK, KV_FP8, FP8_QK)
    else:
        _sparse_item(cta, q_ptr, kv_ptr, idx_ptr, items_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
                     qk_scale, v_scale, num_slots, topk, offs_h, mask_h, offs_t,
                     q_stride_t, q_stride_h, q_stride_d, kv_stride_n, kv_stride_d, idx_stride_t, idx_stride_k,
                     out_stride_t, out_stride_h, out_stride_d, lse_stride_t, lse_stride_h,
                     po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h,
                     HEAD_DIM_V, HEAD_DIM_R, BLOCK_H, BLOCK_K, BLOCK_DV, BLOCK_DR, UPCAST, DOT_PRECISION,
                     ISOLATE_QK, KV_FP8, FP8_QK)
    if TIMELINE:
        record_slot(timeline_ptr, pid, cta, head_tile, cta_ptr, PERSISTENT, CLOCK, t_start, TIMELINE)


def worklist_meta(num_heads: int, head_dim_qk: int, head_dim_v: int, dtype: torch.dtype, kv_dtype: torch.dtype, *,
                  block_h: int | None, block_k: int | None, num_warps: int | None,
                  persistent: bool) -> tuple[TileConfig, dict]:
    """The work-list kernel's tiles (``sparse_mla_defaults``, knobs checked, each refusal one line) and its
    constexpr / launch keywords for q of ``dtype`` over a pool of ``kv_dtype``: what ``sparse_mla_decode_scheduled``
    and ``decode_plan.SparseMLADecodePlan`` launch."""
    bh = None if block_h is None else check_pow2("block_h", block_h, lo=16, hi=MAX_BLOCK_H)
    bk = None if block_k is None else check_pow2("block_k", block_k, lo=16, hi=256)
    d = sparse_mla_defaults(num_heads, head_dim_qk, kv_dtype, head_dim_v=head_dim_v, block_h=bh, block_k=bk)
    nw = d.num_warps if num_warps is None else check_num_warps(num_warps)
    block_dv, block_dr = padded_dims(head_dim_qk, head_dim_v)
    meta = dict(
        HEAD_DIM_V=head_dim_v, HEAD_DIM_R=head_dim_qk - head_dim_v,
        BLOCK_H=d.block_h, BLOCK_K=d.block_n, BLOCK_DV=block_dv, BLOCK_DR=max(block_dr, MIN_DOT),
        UPCAST=interpret_upcast(dtype), DOT_PRECISION=dot_input_precision(dtype),
        ISOLATE_QK=isolate_qk(d.block_h, nw, dtype), KV_FP8=kv_dtype == FP8_KV_DTYPE,
        FP8_QK=fp8_qk_on(kv_dtype, d.block_h), PERSISTENT=persistent, num_warps=nw, num_stages=d.num_stages)
    return d, meta


def walked_indices(indices: torch.Tensor, lengths: tuple[int, ...]) -> torch.Tensor:
    """``indices`` as the work-list kernel reads them: token t's positions from ``lengths[t]`` on set to -1 (never
    walked); ``indices`` itself when every token walks its whole top-k."""
    topk = indices.shape[1]
    if all(n == topk for n in lengths):
        return indices
    lens = torch.tensor(lengths, dtype=torch.int32, device=indices.device)
    return torch.where(torch.arange(topk, device=indices.device)[None, :] < lens[:, None], indices, -1)


def sparse_mla_decode_scheduled(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, work: WorkList, *,
                                head_dim_v: int = 512, block_k: int | None = None, block_h: int | None = None,
                                num_warps: int | None = None, sm_scale: float | None = None,
                                kv_scale: float | None = None, return_lse: bool = False,
                                validate: bool | None = None, timelines: Timelines | None = None):
    """Sparse top-k MLA decode over a schedule's work list (``WorkList.from_schedule``): ``sparse_mla_decode``'s
    inputs, checks and outputs, the walk of each token's top-k list taken from ``work`` instead of a split count.

    A request is a query token; its keys are the positions of its index row. The schedule's lengths are how many
    positions each token walks: ``topk`` for every token (a schedule of ``[topk] * T``, ``schedulers.schedule`` on
    a sparse workload of uniform lengths), or each token's valid prefix (``topk_lens``, as FlashMLA's sparse decode
    takes ``topk_length``; a workload's ``w.lengths`` when it carries a ragged top-k): positions past it are never
    read, as if -1. An item (token, begin, end) walks ``indices[token, begin:end]`` (-1 skipped); a token with one
    item writes its output directly, the others' partial rows are merged per token (``worklist.launch_merge``). A
    schedule reading past ``topk`` or made for another batch is refused in one line (``worklist.check_worklist``).
    Tiles: ``sparse_mla_defaults`` (the split-count launch's with an explicit split count); the tl tile only (the
    Gluon tile does not take work lists). ``validate`` as ``sparse_mla_decode``'s, over the walked positions.
    ``timelines`` (``kernels.timeline``) as ``worklist.gqa_decode_scheduled``'s: each program of the partial kernel
    and the merge records its SM, start, end and work; without it, the plain launch."""
    q, kv_scale, Dv, scale = check_inputs(q, kv_cache, indices, head_dim_v, sm_scale, kv_scale)
    T, H, Dqk = q.shape
    num_slots, topk = kv_cache.shape[0], indices.shape[1]
    what = "sparse_mla_decode_scheduled"
    if isinstance(work, WorkList) and max(work.schedule.lengths) > topk:
        raise SplitlabError(f"{what}: the work list walks up to position {max(work.schedule.lengths)} of a token's "
                            f"top-k list; indices has {topk} columns (items past topk are not allowed)")
    check_worklist(work, T, topk, q.device, what)
    d, meta = worklist_meta(H, Dqk, Dv, q.dtype, kv_cache.dtype, block_h=block_h, block_k=block_k,
                            num_warps=num_warps, persistent=work.schedule.persistent)
    want = validate_setting(validate)
    if want:
        no_validation_under_capture(q, what)
    # The walked positions are built only to check them (a ragged top-k's build copies the lengths to the device,
    # which a CUDA graph capture refuses).
    walked = None
    if want or (want is None and not capturing(q)):
        walked = walked_indices(indices, work.schedule.lengths)
        check_indices(walked, num_slots)

    out = _launch.alloc(T, H, Dv, dtype=q.dtype, device=q.device)
    lse = _launch.alloc(T, H, dtype=torch.float32, device=q.device)
    po, pl = alloc_partials(work, H, Dv, q.device)
    tiles = cdiv(H, d.block_h)
    extra = timeline_args(timelines, work.ctas * tiles, q.device, what)
    with device_guard(q):
        _sparse_mla_worklist_kernel[(work.ctas * tiles,)](
            q, kv_cache, indices, work.items, work.cta_offsets, out, lse, po, pl,
            H, tiles, scale * kv_scale * LOG2E, kv_scale, num_slots, topk,
            *q.stride(), *kv_cache.stride(), *indices.stride(), *out.stride(), *lse.stride(),
            *po.stride(), *pl.stride(), **meta, **extra,
        )
        launch_merge(work, po, pl, out, lse, timelines)
    if want:
        check_result(what, out, lse, (walked >= 0).any(dim=1), slot_request(q, kv_cache, walked, Dv, kv_scale), scale,
                     kv_scale=kv_scale, names=("kv_cache", "kv_cache"))
    return (out, lse) if return_lse else out
