"""Absorbed MLA decode over a paged latent cache: a Triton split-K kernel and its launcher.

Layout. ``q [B, H, Dqk]``; ``kv_cache [num_pages, page_size, Dqk]``, one latent row per key; K is the
whole row (``Dqk`` columns, DeepSeek 576 = 512 latent + 64 rope) and V its first ``Dv = head_dim_v``
columns (512). ``block_table [B, max_pages]`` int32 maps a request's logical page to a physical page;
``seq_lens [B]`` int32 (ragged, zeros allowed).

Kernel. One program per (request, head tile of ``BLOCK_H`` query heads, split). Each request cuts its own
keys into ``num_splits`` splits of ``cdiv(cdiv(seq_len_b, S), BLOCK_N) * BLOCK_N`` keys in-kernel, so the
host never reads ``seq_lens`` to launch and a ragged batch balances per request (a short request's
splits are short; surplus splits are empty and write ``lse = -inf``). The key dimension is cut into the
V part (columns ``[0, Dv)``) and the rest (``[Dv, Dqk)``, the rope columns; absent when ``Dqk == Dv``);
each latent tile is loaded once and serves as K (both parts, ``q . k``) and as V (the V part, ``p @ v``):
the unique bytes read are one latent row per key. QK and PV are ``tl.dot``; the softmax is online, in
base 2 (``exp2``), accumulating ``[BLOCK_H, Dv]`` in fp32. ``num_splits == 1`` writes the final output
and lse directly (no combine launch); otherwise partials ``[B, H, S, Dv]`` (fp32; bf16 / fp16 from the Gluon
tile, ``mla_sm90.PARTIALS_16BIT``) and fp32 lse ``[B, H, S]`` are merged by ``splitlab.kernels.combine``.

The tile math (Q load, latent-row load, the online-softmax update of one tile, the epilogue) is in
``@triton.jit`` helpers that ``sparse_mla`` reuses; only the address of the rows differs (a paged
gather here, a top-k index gather there).

Host syncs and validation. ``num_splits=None`` asks the default planner about the batch as it is (every
request's length, ``DecodeWorkload.seq_lens``; a batch of only empty requests as requests of 1 key,
``_launch.planning_lengths``): one host sync over ``seq_lens``, which also checks ``0 <= seq_lens <= max_pages *
page_size`` and (validation on by default there) that every block-table entry a request reads is a page of the
cache. With an explicit ``num_splits`` the launcher does not sync unless asked to validate (``validate=True`` or
``SPLITLAB_VALIDATE=1``; see ``_launch``). Unvalidated, a length outside the table makes its request NaN, and an
entry outside ``[0, num_pages)`` is never read: its request is NaN on this kernel, undefined on the Gluon tile
(``mla_sm90``).
Any strides are honoured, ``seq_lens`` and the block table's included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from splitlab.errors import SplitlabError, bad, check_int
from splitlab.intmath import cdiv, next_power_of_two
from splitlab.kernels import _launch, mla_sm90
from splitlab.kernels._launch import (
    FLOAT_DTYPES,
    FP8_KV_DTYPE,
    TORCH_DTYPE_NAMES,
    LaunchFacts,
    check_knob,
    check_kv_dtype,
    check_no_grad,
    check_paged_launch,
    check_pow2,
    check_result,
    check_spans,
    check_tensor,
    device_guard,
    dot_input_precision,
    gather_keys,
    interpret_upcast,
    launch_plan,
    planning_lengths,
    resolve_device,
    resolve_sm_scale,
    validate_setting,
)
from splitlab.kernels.combine import combine_grid, launch_combine
from splitlab.kernels.paging import any_bad, checked_len, num_tiles, poison, tile_pages
from splitlab.waves import MAX_BLOCK_H, ctas, default_block_h
from splitlab.workloads import DTYPE_BYTES, DecodeWorkload

LOG2E = math.log2(math.e)
MAX_SPLITS = 65535
#: The order the one-axis grid issues its programs in: head tile fastest, then split, then request, so all of a
#: request's CTAs go together (``planners.splitlab.REQUEST_MAJOR`` restates it for the planner's ragged schedule).
GRID_ORDER = "request-major"
NUM_WARPS = (1, 2, 4, 8, 16)
MIN_DOT = 16  # smallest M, N, K of a 16-bit tl.dot on NVIDIA; every tile dimension is padded to it

# =====================================================================================================
# Defaults: the one place to tune tiles. Keyed by the head tile (block_h, itself default_block_h(H)) and
# the width of the latent row (Dqk); fp32 inputs (a correctness path, not a performance target) get
# narrower key tiles. num_stages from the table is then clamped so the modelled shared memory fits.
# =====================================================================================================

#: block_h -> (block_n, num_warps, num_stages), 16-bit inputs. "wide": Dqk > 256 (DeepSeek 576/512,
#: seed 003's 512); "narrow": Dqk <= 256. BLOCK_H 64 needs 8 warps: its fp32 accumulator [64, 512] is
#: 128 registers per thread over two warpgroups (each a wgmma m64 over half of Dv).
#: Compiled ahead of time for sm_90a on a CPU box (triton 3.6.0, its ptxas 12.8), H=128 576/512 bf16, with
#: ``isolate_qk``: (64, 64, 8, 2) -> wgmma, 252 registers, no spill, 224 KB shared (the 216 KB modelled +
#: the probabilities' 8 KB); (64, 32, 8, 2) -> 218 registers, 148 KB. BLOCK_H 16/32 use mma.sync.
MLA_TILES: dict[str, dict[int, tuple[int, int, int]]] = {
    "wide": {16: (64, 4, 3), 32: (64, 4, 2), 64: (64, 8, 2)},
    "narrow": {16: (64, 4, 2), 32: (64, 4, 2), 64: (64, 8, 2)},
}
#: Modelled shared-memory budget per CTA. Measured on the H200 (a tile sweep at two split counts): BLOCK_H 64,
#: BLOCK_N 64, 8 warps, 2 stages (216 KB modelled) launches and is the fastest MLA-128 tile; BLOCK_H 16,
#: BLOCK_N 64, 3 stages is the fastest for 16 heads.
SMEM_BUDGET = 227 * 1024  # sm_90's opt-in limit per CTA (232448 bytes)


@dataclass(frozen=True)
class TileConfig:
    """Tile knobs of one launch. ``block_n``: keys per tile (MLA ``BLOCK_N``; sparse MLA ``BLOCK_K``)."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int


def padded_dims(head_dim_qk: int, head_dim_v: int) -> tuple[int, int]:
    """(BLOCK_DV, BLOCK_DR): the V part and the rest of the latent row, padded to powers of two >= 16
    (BLOCK_DR is 0 when ``Dqk == Dv``)."""
    dv = max(MIN_DOT, next_power_of_two(head_dim_v))
    dr = head_dim_qk - head_dim_v
    return dv, (max(MIN_DOT, next_power_of_two(dr)) if dr > 0 else 0)


def smem_bytes(block_h: int, block_n: int, head_dim_qk: int, head_dim_v: int, elt_bytes: int,
               num_stages: int) -> int:
    """Modelled shared memory of one CTA: the Q tile ``[block_h, Dqk]`` (a wgmma A operand, loaded once)
    plus ``num_stages`` latent tiles ``[block_n, Dqk]`` of ``elt_bytes`` (the cache's) in flight. An fp8
    cache (1 byte) adds its dequantised 16-bit tile: the whole row beside a 16-bit Q, the V part only on the
    fp8 x fp8 QK path (``fp8_qk``), where Q is fp8 too. E.g. H=128, bf16, 576/512, block_h 64, block_n 32,
    2 stages: 72 KB + 2 x 36 KB = 144 KB; fp8, block_n 64, 3 stages: 36 KB + 3 x 36 KB + 64 KB = 208 KB."""
    dv, dr = padded_dims(head_dim_qk, head_dim_v)
    if elt_bytes != 1:
        return (block_h + num_stages * block_n) * elt_bytes * (dv + dr)
    if fp8_qk(block_h):
        return (block_h + num_stages * block_n) * (dv + dr) + 2 * block_n * dv
    return (2 * block_h + num_stages * block_n + 2 * block_n) * (dv + dr)


def fit_stages(block_h: int, block_n: int, head_dim_qk: int, head_dim_v: int, elt_bytes: int,
               want: int) -> int:
    """The largest ``num_stages <= want`` whose modelled shared memory fits ``SMEM_BUDGET`` (at least 1)."""
    s = want
    while s > 1 and smem_bytes(block_h, block_n, head_dim_qk, head_dim_v, elt_bytes, s) > SMEM_BUDGET:
        s -= 1
    return s


def fp8_qk(block_h: int) -> bool:
    """Whether an fp8 cache's head tile computes QK as an fp8 x fp8 wgmma (q quantised in-kernel to e4m3 with
    one scale per head row, ``quantize_q_rows``): the 64-row (wgmma) tiles. On sm_90a (triton 3.6) the fp8 Q
    becomes the wgmma's register operand, K is read from shared memory as bytes, and with Q out of shared
    memory a third latent tile fits in flight; PV stays a 16-bit dot on the widened V part (an fp8 PV needs the
    tile in a second, K-major layout: measured 3-5x slower). The 16-row tiles (mma.sync, which Triton runs in
    16 bits for fp8 operands) keep the 16-bit dots on a widened tile."""
    return block_h >= 64


def isolate_qk(block_h: int, num_warps: int, dtype: torch.dtype) -> bool:
    """Whether ``softmax_update`` hides the PV dot from the QK dots' layout choice (``ISOLATE_QK``).

    Triton (3.4-3.6) lays a dot whose result feeds another dot with every warp along M, so that the
    softmax's row reductions stay inside a warp. With 16-bit inputs, BLOCK_H 64 and 8 warps (two
    warpgroups, each a wgmma of M = 64), both warpgroups then compute the same ``[64, BLOCK_N]`` scores:
    the QK dot, over half of the FLOPs, runs twice (sm_90a PTX of the MLA-128 tile: 72 wgmma m64n32k16
    per tile instead of 36). Isolated, the warpgroups split the keys (N) and the row reductions cross
    warpgroups through shared memory. Only where M < 16 x num_warps on the wgmma path (BLOCK_H >= 64);
    the mma.sync tiles (BLOCK_H 16, 32) compile worse with it (spills)."""
    return dtype != torch.float32 and block_h >= 64 and 16 * num_warps > block_h


def kernel_dtype_name(dtype: str | torch.dtype) -> str:
    """The latent cache's dtype name (a workload's ``dtype``): bf16, fp16, fp32, or fp8_e4m3."""
    name = TORCH_DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, torch.dtype) else dtype
    if name not in ("bf16", "fp16", "fp32", "fp8_e4m3"):
        raise bad("dtype", dtype, "one of bf16, fp16, fp32, fp8_e4m3 (the Triton MLA kernels' cache dtypes)")
    return name


def mla_defaults(num_heads: int, head_dim_qk: int, dtype: str | torch.dtype = "bf16", *,
                 head_dim_v: int | None = None, block_h: int | None = None,
                 block_n: int | None = None) -> TileConfig:
    """Default tiles of ``mla_decode`` for ``num_heads`` query heads and a ``head_dim_qk`` latent row.

    block_h = ``waves.default_block_h(H)`` (16..64) unless given; (block_n, num_warps, num_stages) from
    ``MLA_TILES`` for that head tile (block_n kept when given); fp32 inputs use block_n 16, an fp8 cache
    with fewer than 64 head rows block_n 32 (dequantising a 64-row tile of 576 in 4 warps spills 432 B,
    sm_90, triton 3.6), with 64 rows (``fp8_qk``) 3 stages where they fit; num_stages is clamped so that
    ``smem_bytes`` fits ``SMEM_BUDGET``.
    """
    name = kernel_dtype_name(dtype)
    dv = min(head_dim_qk, 512) if head_dim_v is None else head_dim_v  # the launchers' default Dv
    bh = default_block_h(num_heads) if block_h is None else block_h
    table_n, num_warps, num_stages = MLA_TILES["wide" if head_dim_qk > 256 else "narrow"][bh]
    if name == "fp8_e4m3" and bh < 64:
        table_n = min(table_n, 32)
    if name == "fp8_e4m3" and fp8_qk(bh):
        num_stages = max(num_stages, 3)  # Q out of shared memory leaves room for a third latent tile in flight
    bn = block_n if block_n is not None else (16 if name == "fp32" else table_n)
    return TileConfig(bh, bn, num_warps, fit_stages(bh, bn, head_dim_qk, dv, DTYPE_BYTES[name], num_stages))


# =====================================================================================================
# Shared @triton.jit tile helpers (also used by sparse_mla)
# =====================================================================================================


E4M3_MAX = tl.constexpr(448.0)


@triton.jit
def quantize_q_rows(q_v, q_r, HEAD_DIM_R: tl.constexpr):
    """q's head rows as fp8 e4m3 for the fp8 x fp8 QK dot (``fp8_qk``): one scale per row, its largest
    magnitude over both parts / 448 (1 for an all-zero row). Returns (q_v8, q_r8, row_scale [BLOCK_H]);
    the scores are ``dot(q8, k8) * row_scale``. Once per program."""
    amax = tl.max(tl.abs(q_v.to(tl.float32)), axis=1)
    if HEAD_DIM_R > 0:
        amax = tl.maximum(amax, tl.max(tl.abs(q_r.to(tl.float32)), axis=1))
    row_scale = tl.where(amax > 0.0, amax / E4M3_MAX, 1.0)
    q_v8 = (q_v.to(tl.float32) / row_scale[:, None]).to(tl.float8e4nv)
    q_r8 = (q_r.to(tl.float32) / row_scale[:, None]).to(tl.float8e4nv)
    return q_v8, q_r8, row_scale


@triton.jit
def load_q_tile(q_row_ptr, offs_h, mask_h, q_stride_h, q_stride_d,
                HEAD_DIM_V: tl.constexpr, HEAD_DIM_R: tl.constexpr,
                BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr, UPCAST: tl.constexpr, FP8_QK: tl.constexpr):
    """The query tile of one program: (q_v [BLOCK_H, BLOCK_DV], q_r [BLOCK_H, BLOCK_DR], row_scale [BLOCK_H]);
    q_r is q_v (unused) when there are no rope columns. With ``FP8_QK`` both parts are quantised to e4m3
    (``quantize_q_rows``) and row_scale is their scale per head row, else 1. Bytes: BLOCK_H * Dqk * elt, once
    per program."""
    offs_dv = tl.arange(0, BLOCK_DV)
    ptrs = q_row_ptr + offs_h[:, None] * q_stride_h + offs_dv[None, :] * q_stride_d
    if HEAD_DIM_V == BLOCK_DV:
        q_v = tl.load(ptrs, mask=mask_h[:, None], other=0.0)
    else:
        q_v = tl.load(ptrs, mask=mask_h[:, None] & (offs_dv < HEAD_DIM_V)[None, :], other=0.0)
    if UPCAST:
        q_v = q_v.to(tl.float32)
    q_r = q_v
    if HEAD_DIM_R > 0:
        offs_dr = tl.arange(0, BLOCK_DR)
        ptrs = q_row_ptr + offs_h[:, None] * q_stride_h + (HEAD_DIM_V + offs_dr)[None, :] * q_stride_d
        if HEAD_DIM_R == BLOCK_DR:
            q_r = tl.load(ptrs, mask=mask_h[:, None], other=0.0)
        else:
            q_r = tl.load(ptrs, mask=mask_h[:, None] & (offs_dr < HEAD_DIM_R)[None, :], other=0.0)
        if UPCAST:
            q_r = q_r.to(tl.float32)
    row_scale = tl.full([q_v.shape[0]], 1.0, tl.float32)
    if FP8_QK:
        q_v, q_r, row_scale = quantize_q_rows(q_v, q_r, HEAD_DIM_R)
    return q_v, q_r, row_scale


@triton.jit
def load_latent_rows(row_ptrs, row_mask, kv_stride_d,
                     HEAD_DIM_V: tl.constexpr, HEAD_DIM_R: tl.constexpr,
                     BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr, UPCAST: tl.constexpr):
    """One tile of latent rows: ``row_ptrs [BLOCK_N]`` point at each key's row (column 0); rows with
    ``row_mask`` false read as 0. Returns (kv_v [BLOCK_N, BLOCK_DV], kv_r [BLOCK_N, BLOCK_DR]); kv_v is
    both the K part and the V tile. Bytes: BLOCK_N * Dqk * elt, the only KV traffic of the kernel."""
    offs_dv = tl.arange(0, BLOCK_DV)
    ptrs = row_ptrs[:, None] + offs_dv[None, :] * kv_stride_d
    if HEAD_DIM_V == BLOCK_DV:
        kv_v = tl.load(ptrs, mask=row_mask[:, None], other=0.0)
    else:
        kv_v = tl.load(ptrs, mask=row_mask[:, None] & (offs_dv < HEAD_DIM_V)[None, :], other=0.0)
    if UPCAST:
        kv_v = kv_v.to(tl.float32)
    kv_r = kv_v
    if HEAD_DIM_R > 0:
        offs_dr = tl.arange(0, BLOCK_DR)
        ptrs = row_ptrs[:, None] + (HEAD_DIM_V + offs_dr)[None, :] * kv_stride_d
        if HEAD_DIM_R == BLOCK_DR:
            kv_r = tl.load(ptrs, mask=row_mask[:, None], other=0.0)
        else:
            kv_r = tl.load(ptrs, mask=row_mask[:, None] & (offs_dr < HEAD_DIM_R)[None, :], other=0.0)
        if UPCAST:
            kv_r = kv_r.to(tl.float32)
    return kv_v, kv_r


@triton.jit
def _widen(x, dtype, qk_scale):
    """An fp8 tile as ``dtype``, through fp32 times a runtime 1.0 (``qk_scale * 0 + 1``): without it Triton
    moves the cast after the shared-memory read of the dot operand, where fp8 is read a byte at a time (1.18x
    at MLA-128 B=64 8K on the H200, data/archive/bench/h200-kernel-v2-fp8/fp8_cast_ab.csv)."""
    return (x.to(tl.float32) * (qk_scale * 0.0 + 1.0)).to(dtype)


@triton.jit
def _scores_to_probs(q_v, q_r, kv_v, kv_r, valid, fill, m_i, l_i, qk_scale, q_row_scale, p_dtype_like,
                     HEAD_DIM_R: tl.constexpr, DOT_PRECISION: tl.constexpr, FP8_QK: tl.constexpr):
    """The QK half of ``softmax_update``: scaled scores, the new running max and sum, the rescale factor
    of the old state, and the probabilities in the PV dot's dtype (``p_dtype_like``'s)."""
    if FP8_QK:
        scale = (qk_scale * q_row_scale)[:, None]
    else:
        scale = qk_scale
    s = tl.dot(q_v, tl.trans(kv_v), input_precision=DOT_PRECISION) * scale
    if HEAD_DIM_R > 0:
        # A separate dot plus an add (not the first dot as the second's accumulator) keeps the rope
        # dot out of the first one's forward slice, so ISOLATE_QK can work.
        s += tl.dot(q_r, tl.trans(kv_r), input_precision=DOT_PRECISION) * scale
    s = tl.where(valid[None, :], s, fill)
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_new = l_i * alpha + tl.sum(p, axis=1)
    return m_new, l_new, alpha, p.to(p_dtype_like.dtype)


@triton.jit
def softmax_update(q_v, q_r, kv_v, kv_r, valid, fill, m_i, l_i, acc, qk_scale, q_row_scale,
                   HEAD_DIM_R: tl.constexpr, DOT_PRECISION: tl.constexpr, ISOLATE_QK: tl.constexpr,
                   KV_FP8: tl.constexpr, FP8_QK: tl.constexpr, PV_DTYPE: tl.constexpr):
    """Fold one key tile into the online softmax of a head tile (base 2: ``qk_scale = sm_scale *
    log2(e)``, ``m_i`` the running max of scaled scores, ``l_i`` the running sum, ``acc`` the unnormalised
    ``[BLOCK_H, BLOCK_DV]`` output). Keys with ``valid`` false score ``fill``: -inf (paged MLA), or per key
    -inf or NaN (sparse MLA, ``paging.key_masks``: an index out of range); a tile with no valid key and no NaN
    leaves the state unchanged (``m_safe`` keeps -inf - -inf out). FLOPs: 2*BLOCK_H*BLOCK_N*(Dqk + Dv).

    ``ISOLATE_QK`` (see ``isolate_qk``): the scores and the softmax are computed inside a branch that is
    always taken (``qk_scale > 0``), which hides the PV dot from the QK dots' layout choice.

    ``FP8_QK`` (``fp8_qk``; q_v / q_r are then fp8 from ``quantize_q_rows`` and ``q_row_scale`` their row
    scales): QK is an fp8 x fp8 dot on the fp8 tile itself, and only the V part is widened to ``PV_DTYPE`` (q's
    16-bit dtype) for the PV dot."""
    kv_pv = kv_v
    if FP8_QK:
        kv_pv = _widen(kv_v, PV_DTYPE, qk_scale)
    elif KV_FP8:
        # An fp8 cache's tile is widened in-kernel for 16-bit dots (the cache's scale is folded into qk_scale
        # and the epilogue's v_scale): the 16-row tiles, and the 64-row ones under the interpreter. Measured on
        # the H200 (data/archive/bench/h200-kernel-v2-fp8/fp8_cast_ab.csv): 16-row tiles are fastest computing
        # in fp16 (q too: one cvt.f16x2.e4m3x2 per two values, no fp32 round trip; 1.23x over a cast to q's
        # dtype at MLA-16 B=64 8K); 64-row tiles keep q's dtype (an fp16 q tile lives in registers and spills)
        # and are widened through ``_widen``.
        if q_v.shape[0] <= 16:
            kv_v = kv_v.to(tl.float16)
            kv_r = kv_r.to(tl.float16)
            q_v = q_v.to(tl.float16)
            q_r = q_r.to(tl.float16)
        else:
            kv_v = _widen(kv_v, q_v.dtype, qk_scale)
            kv_r = _widen(kv_r, q_r.dtype, qk_scale)
        kv_pv = kv_v
    if ISOLATE_QK:
        if qk_scale > 0.0:  # always (the launchers refuse sm_scale <= 0)
            m_new, l_new, alpha, p = _scores_to_probs(q_v, q_r, kv_v, kv_r, valid, fill, m_i, l_i, qk_scale,
                                                      q_row_scale, kv_pv, HEAD_DIM_R, DOT_PRECISION, FP8_QK)
        else:
            m_new, l_new = m_i, l_i
            alpha = tl.full(m_i.shape, 1.0, tl.float32)
            # Not a constant: a constant in the PV operand's layout would take its own shared memory.
            p = (tl.zeros([q_v.shape[0], kv_v.shape[0]], tl.float32) * qk_scale).to(kv_pv.dtype)
    else:
        m_new, l_new, alpha, p = _scores_to_probs(q_v, q_r, kv_v, kv_r, valid, fill, m_i, l_i, qk_scale,
                                                  q_row_scale, kv_pv, HEAD_DIM_R, DOT_PRECISION, FP8_QK)
    acc = acc * alpha[:, None]
    acc = tl.dot(p, kv_pv, acc, input_precision=DOT_PRECISION)
    return m_new, l_new, acc


@triton.jit
def store_head_tile(acc, m_i, l_i, v_scale, out_row_ptr, lse_row_ptr, offs_h, mask_h,
                    out_stride_h, out_stride_d, lse_stride_h,
                    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, KV_FP8: tl.constexpr):
    """Normalise and store one head tile: ``out = acc / l``, times ``v_scale`` for an fp8 cache (its
    dequantisation scale; cast to the output's dtype: the final output when unsplit, the partials
    otherwise) and ``lse = ln(sum exp)``; a tile that saw no key stores zeros and ``lse = -inf``. Bytes:
    BLOCK_H * (Dv * out elt + 4)."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    if KV_FP8:
        out = acc * (v_scale / l_safe)[:, None]
    else:
        out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * 0.6931471805599453)  # * ln(2)
    offs_dv = tl.arange(0, BLOCK_DV)
    ptrs = out_row_ptr + offs_h[:, None] * out_stride_h + offs_dv[None, :] * out_stride_d
    if HEAD_DIM_V == BLOCK_DV:
        tl.store(ptrs, out.to(out_row_ptr.dtype.element_ty), mask=mask_h[:, None])
    else:
        tl.store(ptrs, out.to(out_row_ptr.dtype.element_ty),
                 mask=mask_h[:, None] & (offs_dv < HEAD_DIM_V)[None, :])
    tl.store(lse_row_ptr + offs_h * lse_stride_h, lse, mask=mask_h)


# =====================================================================================================
# Kernel
# =====================================================================================================


@triton.jit
def _mla_decode_kernel(
    q_ptr, kv_ptr, bt_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    num_heads, num_head_tiles, num_splits, qk_scale, v_scale,
    seq_lens_stride, num_pages, max_keys,  # max_keys: block_table's columns * PAGE_SIZE
    q_stride_b, q_stride_h, q_stride_d,
    kv_stride_p, kv_stride_s, kv_stride_d,
    bt_stride_b, bt_stride_p,
    out_stride_b, out_stride_h, out_stride_s, out_stride_d,
    lse_stride_b, lse_stride_h, lse_stride_s,
    PAGE_SIZE: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_R: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, ISOLATE_QK: tl.constexpr, KV_FP8: tl.constexpr,
    FP8_QK: tl.constexpr,
):
    # 1-D grid, head tile fastest: the head tiles of one (request, split) run side by side and share its
    # latent tiles through L2 (H=128, BLOCK_H=64: DRAM reads each row once, L2 serves the second tile).
    pid = tl.program_id(0)
    head_tile = pid % num_head_tiles
    rest = pid // num_head_tiles
    split = rest % num_splits
    b = rest // num_splits

    # This request's split: whole BLOCK_N tiles, sized by its own length (ragged batches balance). A length
    # outside [0, max_keys] reads nothing and stores NaN (paging.checked_len).
    seq_len, bad_len = checked_len(tl.load(seq_lens_ptr + b.to(tl.int64) * seq_lens_stride), max_keys)
    split_size = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_size
    end = tl.minimum(start + split_size, seq_len)

    offs_h = head_tile * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    q_v, q_r, q_row_scale = load_q_tile(q_ptr + b.to(tl.int64) * q_stride_b, offs_h, mask_h, q_stride_h,
                                        q_stride_d, HEAD_DIM_V, HEAD_DIM_R, BLOCK_DV, BLOCK_DR, UPCAST, FP8_QK)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * bt_stride_b
    # Per tile: BLOCK_N latent rows (BLOCK_N * Dqk * elt bytes) plus 4 bytes of block table per page. The
    # next tile's pages are read one iteration ahead, so the row loads pipeline (splitlab.kernels.paging).
    offs_t = tl.arange(0, BLOCK_N)
    # An entry out of the cache is clamped into it; ``seen`` keeps the largest entry read (unsigned), and one out of
    # range makes the request NaN (paging.tile_pages, any_bad). At least one tile (paging.num_tiles): an empty
    # split runs one masked tile that reads nothing and leaves the state as it was.
    page_next, seen = tile_pages(bt_row, bt_stride_p, start, end, offs_t, num_pages, PAGE_SIZE, BLOCK_N)
    for t in range(0, num_tiles(start, end, BLOCK_N)):
        n0 = start + t * BLOCK_N
        offs_n = n0 + offs_t
        valid = offs_n < end
        page = page_next
        page_next, raw_next = tile_pages(bt_row, bt_stride_p, n0 + BLOCK_N, end, offs_t, num_pages, PAGE_SIZE,
                                         BLOCK_N)
        seen = tl.maximum(seen, raw_next)
        # A tile lies in one page when PAGE_SIZE % BLOCK_N == 0 (page is a scalar: contiguous rows).
        rows = kv_ptr + page * kv_stride_p + (offs_n % PAGE_SIZE) * kv_stride_s
        kv_v, kv_r = load_latent_rows(rows, valid, kv_stride_d, HEAD_DIM_V, HEAD_DIM_R, BLOCK_DV, BLOCK_DR,
                                      UPCAST)
        m_i, l_i, acc = softmax_update(q_v, q_r, kv_v, kv_r, valid, float("-inf"), m_i, l_i, acc, qk_scale,
                                       q_row_scale, HEAD_DIM_R, DOT_PRECISION, ISOLATE_QK, KV_FP8, FP8_QK,
                                       q_ptr.dtype.element_ty)

    # Final output (out_stride_s == 0 when unsplit) or this split's partial (fp32 from this kernel); NaN for a
    # length or a page out of range.
    store_head_tile(acc, m_i, poison(l_i, bad_len | any_bad(seen, num_pages, PAGE_SIZE % BLOCK_N != 0)), v_scale,
                    out_ptr + b.to(tl.int64) * out_stride_b + split * out_stride_s,
                    lse_ptr + b.to(tl.int64) * lse_stride_b + split * lse_stride_s,
                    offs_h, mask_h, out_stride_h, out_stride_d, lse_stride_h, HEAD_DIM_V, BLOCK_DV, KV_FP8)


# =====================================================================================================
# Launch facts and launcher
# =====================================================================================================


def fp8_qk_on(kv_dtype: torch.dtype, block_h: int) -> bool:
    """Whether a launch takes the fp8 x fp8 QK path: an fp8 cache, a ``fp8_qk`` head tile, on a GPU. Not under
    Triton's interpreter, whose fp32 -> e4m3 cast rounds wrongly (triton 3.6: 17 -> 18, 31 -> 16, 127 -> 64;
    the GPU's cvt.rn.satfinite is right), so there the fp8 cache's tile is widened for a 16-bit QK as before,
    and the fp8 x fp8 path is tested on the GPU (tests/gpu) and compiled for sm_90 in CI."""
    return kv_dtype == FP8_KV_DTYPE and fp8_qk(block_h) and not _launch.INTERPRET


def check_num_warps(num_warps: object) -> int:
    v = check_int("num_warps", num_warps)
    if v not in NUM_WARPS:
        raise bad("num_warps", num_warps, "one of " + ", ".join(map(str, NUM_WARPS)))
    return v


def plan_num_splits(w: DecodeWorkload, num_splits: object, device: object) -> int:
    """``num_splits`` checked, or the default planner's choice for ``w`` on ``device`` when None."""
    if num_splits is not None:
        return check_knob("num_splits", num_splits, lo=1, hi=MAX_SPLITS)
    return launch_plan(w, device).num_splits


def check_kind(w: DecodeWorkload, kind: str) -> None:
    if not isinstance(w, DecodeWorkload) or w.kind != kind:
        raise bad("w", w, f"a DecodeWorkload of kind={kind!r}")


def mla_launch_facts(w: DecodeWorkload, *, num_splits: int | None = None, block_n: int | None = None,
                     block_h: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                     device: object = None) -> LaunchFacts:
    """The launch ``mla_decode`` makes for ``w`` with these knobs (no launch): knobs checked, defaults
    resolved as the launcher resolves them (``mla_defaults``; ``num_splits=None`` asks the default
    planner on ``device``: a ``DeviceSpec``, a preset name, or None for the GPU torch sees, else the
    ``h200`` preset, for the split count and, unless ``block_h`` is given, the head tile: the kernel's default
    where the plan names none). ``facts.ctas == waves.ctas(w, facts.num_splits, block_h=facts.block_h)``."""
    check_kind(w, "mla")
    bh = None if block_h is None else check_pow2("block_h", block_h, lo=16, hi=MAX_BLOCK_H)
    bn = None if block_n is None else check_pow2("block_n", block_n, lo=16, hi=256)
    if num_splits is None:  # the default planner's split count, and its head tile unless given
        plan = launch_plan(w, device)
        s = plan.num_splits
        bh = plan.block_h if bh is None else bh
    else:
        s = plan_num_splits(w, num_splits, device)
    d = mla_defaults(w.num_q_heads, w.head_dim_qk, w.dtype, head_dim_v=w.head_dim_v, block_h=bh, block_n=bn)
    nw = d.num_warps if num_warps is None else check_num_warps(num_warps)
    ns = d.num_stages if num_stages is None else check_knob("num_stages", num_stages, lo=1, hi=8)
    return LaunchFacts(kernel="mla_decode", grid=(ctas(w, s, block_h=d.block_h),), num_splits=s,
                       num_warps=nw, num_stages=ns, block_n=d.block_n, block_h=d.block_h,
                       combine_grid=combine_grid(w.batch, w.num_q_heads, s, w.head_dim_v) if s > 1 else None)


def alloc_outputs(rows: int, heads: int, head_dim_v: int, num_splits: int, dtype: torch.dtype,
                  device: torch.device, *, sm90: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """What the partial kernel writes: the final (out, lse) when unsplit, else partials ``[rows, heads, S, Dv]``
    (each normalised by its own softmax sum; fp32, or 16-bit when the Gluon tile writes them, ``sm90``:
    ``mla_sm90.partial_dtype``) and fp32 lse ``[rows, heads, S]``; with (row, head, split, d) / (row, head,
    split) strides (split stride 0 when unsplit)."""
    if num_splits == 1:
        out = _launch.alloc(rows, heads, head_dim_v, dtype=dtype, device=device)
        lse = _launch.alloc(rows, heads, dtype=torch.float32, device=device)
        return out, lse, (out.stride(0), out.stride(1), 0, out.stride(2)), (lse.stride(0), lse.stride(1), 0)
    po = _launch.alloc(rows, heads, num_splits, head_dim_v, dtype=mla_sm90.partial_dtype(dtype, sm90),
                       device=device)
    check_spans(f"the partials of num_splits={num_splits}", po, (1, 2, 3))
    pl = _launch.alloc(rows, heads, num_splits, dtype=torch.float32, device=device)
    return po, pl, po.stride(), pl.stride()


def finish_outputs(o: torch.Tensor, l: torch.Tensor, num_splits: int, dtype: torch.dtype, return_lse: bool):
    """Merge partials when split (one ``combine`` launch); return ``out`` or ``(out, lse)``."""
    if num_splits == 1:
        out, lse = o, l
    else:
        rows, heads, _, dv = o.shape
        out, lse = launch_combine(o, l, _launch.alloc(rows, heads, dv, dtype=dtype, device=o.device),
                                  _launch.alloc(rows, heads, dtype=torch.float32, device=o.device))
    return (out, lse) if return_lse else out


def finish_checked(o: torch.Tensor, l: torch.Tensor, num_splits: int, q: torch.Tensor, return_lse: bool,
                   want: bool | None, what: str, has_keys, request, sm_scale: float, kv_scale: float):
    """``finish_outputs``, then, with validation asked for (``want``), ``_launch.check_result`` on the result:
    a row that overflowed fp32 where the inputs it attends are finite is refused. ``has_keys()``: which rows have
    keys (a bool tensor, made only then); ``request(r)``: request r's ``(q, k, v)`` as ``check_result`` takes them
    (``paged_request``, ``sparse_mla.slot_request``)."""
    out, lse = finish_outputs(o, l, num_splits, q.dtype, True)
    if want:
        check_result(what, out, lse, has_keys(), request, sm_scale, kv_scale=kv_scale, names=("kv_cache", "kv_cache"))
    return (out, lse) if return_lse else out


def paged_request(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                  head_dim_v: int, kv_scale: float):
    """``request(r)`` for ``check_result``: q's row ``[1, H, Dqk]``, the request's latent rows (dequantised) as K
    ``[n, 1, Dqk]`` and their first ``head_dim_v`` columns as V; only called on its error path."""
    def request(r: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kv = gather_keys(kv_cache, block_table[r], int(seq_lens[r]), kv_cache.shape[1]).double() * kv_scale
        return q[r][None], kv[:, None], kv[:, None, :head_dim_v]

    return request


def empty_result(rows: int, heads: int, head_dim_v: int, q: torch.Tensor, return_lse: bool):
    out = torch.zeros(rows, heads, head_dim_v, dtype=q.dtype, device=q.device)
    lse = torch.full((rows, heads), float("-inf"), dtype=torch.float32, device=q.device)
    return (out, lse) if return_lse else out


def check_inputs(q: object, kv_cache: object, block_table: object, seq_lens: object = None,
                 kv_scale: float | None = None) -> tuple[torch.Tensor, float]:
    """``(q, kv_scale)`` once the launch's tensors are checked, each refused in one line: dtypes, devices, shapes,
    the fp8 cache's scale, autograd, and the dimensions the kernels index in 32 bits (batch and page offsets are
    64-bit). ``seq_lens`` where the launch reads it (the work-list launcher takes the lengths from its schedule)."""
    q = check_tensor("q", q, 3, dtypes=FLOAT_DTYPES)
    dev = q.device
    _launch.check_launch_device("q", q)
    check_tensor("kv_cache", kv_cache, 3, dtypes=(*FLOAT_DTYPES, FP8_KV_DTYPE), device=dev)
    kv_scale = check_kv_dtype(q, kv_cache, kv_scale)
    check_tensor("block_table", block_table, 2, dtypes=(torch.int32,), device=dev)
    if seq_lens is not None:
        check_tensor("seq_lens", seq_lens, 1, dtypes=(torch.int32,), device=dev)
    check_no_grad(q=q, kv_cache=kv_cache)
    B, H, Dqk = q.shape
    _, page_size, kv_dim = kv_cache.shape
    if H < 1 or Dqk < 1:
        raise SplitlabError(f"q has shape {tuple(q.shape)}; expected [B, H >= 1, Dqk >= 1]")
    if kv_dim != Dqk or page_size < 1:
        raise SplitlabError(f"kv_cache has shape {tuple(kv_cache.shape)}; expected "
                            f"[num_pages, page_size >= 1, {Dqk}] (q's head_dim_qk)")
    if block_table.shape[0] != B:
        raise SplitlabError(f"block_table has shape {tuple(block_table.shape)}; expected [{B}, max_pages]")
    if seq_lens is not None and seq_lens.shape[0] != B:
        raise SplitlabError(f"seq_lens has shape {tuple(seq_lens.shape)}; expected [{B}]")
    for name, t, dims in (("q", q, (1, 2)), ("kv_cache", kv_cache, (1, 2)), ("block_table", block_table, (1,))):
        check_spans(name, t, dims)
    return q, kv_scale


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
               *, head_dim_v: int = 512, num_splits: int | None = None, block_n: int | None = None,
               block_h: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
               sm_scale: float | None = None, kv_scale: float | None = None, return_lse: bool = False,
               validate: bool | None = None):
    """Absorbed MLA decode (see the module docstring).

    q [B, H, Dqk]; kv_cache [num_pages, page_size, Dqk] (K = all columns, V = the first ``head_dim_v``);
    block_table [B, max_pages] int32; seq_lens [B] int32; any strides. Returns out [B, H, head_dim_v] in q's
    dtype, or ``(out, lse)`` with lse fp32 [B, H] (natural log; -inf for a request with no keys, whose row is 0;
    NaN where a key the request attends holds NaN, as the reference gives).

    ``validate`` (None: ``SPLITLAB_VALIDATE``, else on with ``num_splits=None``, off with an explicit
    ``num_splits``) refuses lengths outside ``[0, max_pages * page_size]`` and block-table entries a request
    reads outside ``[0, num_pages)`` (one host sync; refused under CUDA graph capture).

    Knobs (None = default): ``num_splits`` (None: the default planner on this GPU, or the ``h200``
    preset when q is on the CPU; one host sync over seq_lens), ``block_n`` (keys per tile, power of two
    16..256), ``block_h`` (query heads per program, power of two 16..64; None with ``num_splits=None``: the
    plan's head tile where it names one), ``num_warps``, ``num_stages``.
    ``sm_scale`` defaults to ``1/sqrt(Dqk)``. An fp8 cache (``torch.float8_e4m3fn``, beside a bf16/fp16
    q) holds ``K / kv_scale`` (``kv_scale`` default 1.0): 64-row head tiles compute QK as an fp8 x fp8 dot
    with q quantised in-kernel to e4m3 (one scale per head row, ``fp8_qk``) and PV on the V part widened to
    q's dtype; 16-row tiles widen the tile to fp16 and compute with q in fp16 (q's entries must then lie
    within fp16's +-65504). On an sm_90 GPU the default 64-row tile of a 16-bit cache (BLOCK_H 64, BLOCK_N 64, 8
    warps, 2 stages) runs on the warp-specialized Gluon kernel ``mla_sm90`` (same arguments, same results).

    fp32 range (``_launch``'s docstring): ``sm_scale * kv_scale * log2(e)`` must be a normal fp32 (``sm_scale`` in
    about [8.1e-39, 2.4e38] when ``kv_scale`` is 1; ``kv_scale`` itself a normal fp32), refused in one line
    otherwise; the kernels compute in fp32, so the scores ``sm_scale * q.k`` must stay within fp32 and the V
    columns (dequantised) within ``|v| <= 3.4e38 / (2 n)`` for ``n`` keys attended, else that row may come out inf
    or NaN (or zero with lse -inf when every score falls below -3.4e38). Validation asked for (``validate=True`` or
    ``SPLITLAB_VALIDATE=1``, not the default) reads the result back (a second sync, after the launch) and refuses
    such a row, where the inputs it attends are finite, naming the bound. Inputs that require grad are refused
    while autograd records (no backward).
    """
    q, kv_scale = check_inputs(q, kv_cache, block_table, seq_lens, kv_scale)
    dev = q.device
    B, H, Dqk = q.shape
    num_pages, page_size, _ = kv_cache.shape
    max_pages = block_table.shape[1]
    Dv = check_knob("head_dim_v", head_dim_v, lo=1, hi=Dqk)
    scale = resolve_sm_scale(sm_scale, Dqk, kv_scale=kv_scale)
    want = validate_setting(validate)
    if B == 0:
        return empty_result(0, H, Dv, q, return_lse)

    planned = _launch.planned_default() if num_splits is None else None
    if planned is not None:  # a cached plan, scheduled on the device: no sync (kernels.default_call)
        check_paged_launch(q, "mla_decode", block_table, seq_lens, num_pages, page_size, planning=False, want=want)
        out, lse = planned.mla(q, kv_cache, block_table, seq_lens, head_dim_v=Dv, block_n=block_n, block_h=block_h,
                               num_warps=num_warps, num_stages=num_stages, sm_scale=sm_scale, kv_scale=kv_scale,
                               return_lse=return_lse or want)
        if want:
            check_result("mla_decode", out, lse, seq_lens > 0,
                         paged_request(q, kv_cache, block_table, seq_lens, Dv, kv_scale), scale, kv_scale=kv_scale,
                         names=("kv_cache", "kv_cache"))
        return (out, lse) if return_lse else out

    # With num_splits=None, the one host sync: every request's length, for the planner, and the checks.
    lens = check_paged_launch(q, "mla_decode", block_table, seq_lens, num_pages, page_size,
                              planning=num_splits is None, want=want)
    if lens is None:  # num_splits given: ctx_len is an upper bound, unused by the facts
        shape = dict(ctx_len=max(max_pages * page_size, 1))
    else:
        lens = planning_lengths(lens)
        shape = dict(ctx_len=max(lens), seq_lens=lens)
    w = DecodeWorkload(kind="mla", batch=B, num_q_heads=H, num_kv_heads=1, head_dim_qk=Dqk, head_dim_v=Dv,
                       page_size=page_size, dtype=TORCH_DTYPE_NAMES[kv_cache.dtype], **shape)
    device = resolve_device(like=q) if num_splits is None else None
    f = mla_launch_facts(w, num_splits=num_splits, block_n=block_n, block_h=block_h, num_warps=num_warps,
                         num_stages=num_stages, device=device)

    S = f.num_splits
    block_dv, block_dr = padded_dims(Dqk, Dv)
    # (The Gluon tile clamps an unvalidated page into the cache, so it needs one: num_pages >= 1.)
    sm90 = num_pages > 0 and mla_sm90.use_sm90(q, kv_cache.dtype, Dqk, Dv, f.block_h, f.block_n, f.num_warps,
                                               f.num_stages)
    o, l, o_strides, l_strides = alloc_outputs(B, H, Dv, S, q.dtype, dev, sm90=sm90)
    with device_guard(q):
        if sm90:
            mla_sm90.launch_paged(f.grid, q, kv_cache, block_table, seq_lens, o, l, S, scale * LOG2E, o_strides,
                                  l_strides, Dv)
            return finish_checked(o, l, S, q, return_lse, want, "mla_decode", lambda: seq_lens > 0,
                                  paged_request(q, kv_cache, block_table, seq_lens, Dv, kv_scale), scale, kv_scale)
        _mla_decode_kernel[f.grid](
            q, kv_cache, block_table, seq_lens, o, l,
            H, cdiv(H, f.block_h), S, scale * kv_scale * LOG2E, kv_scale,
            seq_lens.stride(0), num_pages, max_pages * page_size if num_pages else 0,  # (no key of an empty cache)
            *q.stride(), *kv_cache.stride(), *block_table.stride(), *o_strides, *l_strides,
            PAGE_SIZE=page_size, HEAD_DIM_V=Dv, HEAD_DIM_R=Dqk - Dv,
            BLOCK_H=f.block_h, BLOCK_N=f.block_n, BLOCK_DV=block_dv, BLOCK_DR=max(block_dr, MIN_DOT),
            UPCAST=interpret_upcast(q.dtype), DOT_PRECISION=dot_input_precision(q.dtype),
            ISOLATE_QK=isolate_qk(f.block_h, f.num_warps, q.dtype), KV_FP8=kv_cache.dtype == FP8_KV_DTYPE,
            FP8_QK=fp8_qk_on(kv_cache.dtype, f.block_h),
            num_warps=f.num_warps, num_stages=f.num_stages,
        )
        return finish_checked(o, l, S, q, return_lse, want, "mla_decode", lambda: seq_lens > 0,
                              paged_request(q, kv_cache, block_table, seq_lens, Dv, kv_scale), scale, kv_scale)
