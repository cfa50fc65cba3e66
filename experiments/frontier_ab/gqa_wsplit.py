"""Experiment (not shipped): the paged GQA partial kernel with the keys of a tile split over the warps.

The shipped kernel's 16-row tile runs ``tl.dot`` on [16, BLOCK_N] scores with its 4 warps side by side along the
keys, so every tile's row maximum and row sum cross the warps through shared memory (a CTA barrier each), and P is
re-laid-out through shared memory for the PV dot. Here a tile of ``NW * BLOCK_N`` keys is a batch of NW slices of
BLOCK_N keys: the dots are batched ([NW, G, D] x [NW, D, BLOCK_N]; Triton puts the warps on the batch), so each
warp runs its own slice's online softmax with its own running max, sum and [G, D] accumulator, and nothing crosses
the warps until the loop ends, where the NW states are merged once (the split-K merge's log-sum-exp, in the CTA).
The cost: NW accumulators instead of one (64 fp32 registers a thread at G 16, D 128 and 4 warps, against 16).

Everything else is ``splitlab.kernels.gqa``'s kernel: the split of each request's keys (tile-aligned, the tile
being NW * BLOCK_N keys), the table entries carried an iteration ahead and clamped, the pre-loop scan
(``paging.scan_pages``), masked loads (other=0), the epilogue and the shipped merge.

Bytes moved per program: K and V 2 * n * D * elt; the table one int32 a key (the repeats of a page hit L1; the
shipped kernel reads one a tile where a page holds whole tiles) plus the pre-loop scan's n / PAGE_SIZE * 4; q
G * D * elt; writes as the shipped kernel's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from partials import partials

from splitlab.kernels._launch import interpret_upcast
from splitlab.kernels.gqa import FLT_MAX, LN2, LOG2E, default_knobs
from splitlab.kernels.paging import any_bad, checked_len, poison, scan_pages


@triton.jit
def _slice_pages(bt_row, bt_stride_p, pos, end, num_pages, PAGE_SIZE: tl.constexpr):
    """The physical page (int64) of each key ``pos`` ([NW, BLOCK_N]), 0 past ``end``, clamped into the cache."""
    raw = tl.load(bt_row + (pos // PAGE_SIZE) * bt_stride_p, mask=pos < end, other=0).to(tl.uint32, bitcast=True)
    return tl.minimum(raw, tl.cast(num_pages - 1, tl.uint32)).to(tl.int64)


@triton.jit
def _gqa_wsplit_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    qk_scale, num_kv_heads, group, num_splits,
    seq_lens_stride, num_pages, max_keys,
    q_stride_b, q_stride_h, q_stride_d,
    k_stride_p, k_stride_s, k_stride_h, k_stride_d,
    v_stride_p, v_stride_s, v_stride_h, v_stride_d,
    bt_stride_b, bt_stride_p,
    out_stride_b, out_stride_h, out_stride_s, out_stride_d,
    lse_stride_b, lse_stride_h, lse_stride_s,
    PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, NW: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    TILE: tl.constexpr = NW * BLOCK_N
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // num_kv_heads
    kvh = pid_bh % num_kv_heads
    b64 = b.to(tl.int64)

    seq_len, bad_len = checked_len(tl.load(seq_lens_ptr + b64 * seq_lens_stride), max_keys)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), TILE) * TILE
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    # Key (w, j) of a tile: tile_start + w * BLOCK_N + j, warp w's slice.
    offs_wn = tl.arange(0, NW)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # [NW, BLOCK_N]
    mask_g = offs_g < group
    mask_d = offs_d < HEAD_DIM
    heads = kvh * group + offs_g

    # Q tile [BLOCK_G, BLOCK_D], G * D * elt bytes, broadcast to every slice: [NW, BLOCK_G, BLOCK_D].
    q = tl.load(q_ptr + b64 * q_stride_b + heads[:, None] * q_stride_h + offs_d[None, :] * q_stride_d,
                mask=mask_g[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    q = tl.broadcast_to(q[None, :, :], [NW, BLOCK_G, BLOCK_D])

    bt_row = bt_ptr + b64 * bt_stride_b
    k_head = k_ptr + kvh.to(tl.int64) * k_stride_h
    v_head = v_ptr + kvh.to(tl.int64) * v_stride_h
    dcol = offs_d[None, None, :]

    m_i = tl.full([NW, BLOCK_G], -FLT_MAX, tl.float32)
    l_i = tl.zeros([NW, BLOCK_G], tl.float32)
    acc = tl.zeros([NW, BLOCK_G, BLOCK_D], tl.float32)

    seen = scan_pages(bt_row, bt_stride_p, start, end, PAGE_SIZE)
    page_next = _slice_pages(bt_row, bt_stride_p, start + offs_wn, end, num_pages, PAGE_SIZE)
    for t in range(0, tl.maximum(tl.cdiv(end - start, TILE), 1)):
        pos = start + t * TILE + offs_wn
        live = pos < end
        page = page_next
        page_next = _slice_pages(bt_row, bt_stride_p, pos + TILE, end, num_pages, PAGE_SIZE)
        slot = pos % PAGE_SIZE
        kv_mask = live[:, :, None] & mask_d[None, None, :]

        # K tile [NW, BLOCK_N, BLOCK_D]: TILE * D * elt bytes.
        k = tl.load(k_head + (page * k_stride_p + slot * k_stride_s)[:, :, None] + dcol * k_stride_d, mask=kv_mask,
                    other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k, 0, 2, 1), input_precision=DOT_PRECISION) * qk_scale  # [NW, BLOCK_G, BLOCK_N]
        s = tl.where(live[:, None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=2))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, :, None])
        l_i = l_i * alpha + tl.sum(p, axis=2)

        # V tile [NW, BLOCK_N, BLOCK_D]: TILE * D * elt bytes.
        v = tl.load(v_head + (page * v_stride_p + slot * v_stride_s)[:, :, None] + dcol * v_stride_d, mask=kv_mask,
                    other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, :, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    # The slices' states merged once: each weighed by exp2(its max - the max); a slice that saw no key keeps
    # m = -FLT_MAX and l = 0 and weighs nothing (or 1 with l = 0, when no slice saw a key).
    m = tl.max(m_i, axis=0)
    w = tl.exp2(m_i - m[None, :])
    l_sum = tl.sum(l_i * w, axis=0)
    acc_sum = tl.sum(acc * w[:, :, None], axis=0)

    l_sum = poison(l_sum, bad_len | any_bad(seen, num_pages, True))
    empty = l_sum == 0.0
    out = acc_sum / tl.where(empty, 1.0, l_sum)[:, None]
    lse = tl.where(empty, float("-inf"), (m + tl.log2(tl.where(empty, 1.0, l_sum))) * LN2)
    tl.store(out_ptr + b64 * out_stride_b + split * out_stride_s + heads[:, None] * out_stride_h
             + offs_d[None, :] * out_stride_d, out.to(out_ptr.dtype.element_ty),
             mask=mask_g[:, None] & mask_d[None, :])
    tl.store(lse_ptr + b64 * lse_stride_b + split * lse_stride_s + heads * lse_stride_h, lse, mask=mask_g)


def gqa_wsplit(q, k_cache, v_cache, block_table, seq_lens, *, num_splits: int, block_n: int = 16,
               num_warps: int = 4, num_stages: int = 3, maxnreg: int | None = None, return_lse: bool = False):
    """``gqa_decode``'s arguments (any strides), no planner, no checks: each of the ``num_warps`` warps takes a
    slice of ``block_n`` keys of every tile of ``num_warps * block_n`` keys. ``maxnreg``: a cap on registers a
    thread (compiled for sm_90a at 16 keys, 4 warps, 3 stages it takes 178, two CTAs an SM; at 168, three, with 20
    bytes of spill stores)."""
    B, Hq, D = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n={block_n}: expected a power of two >= 16 (the PV dot's K)")
    S = num_splits
    dst = partials(q, S)
    upcast = interpret_upcast(q.dtype)
    knobs = default_knobs(group, D)
    _gqa_wsplit_kernel[(B * Hkv, S)](
        q, k_cache, v_cache, block_table, seq_lens, dst.out, dst.lse,
        D ** -0.5 * LOG2E, Hkv, group, S, seq_lens.stride(0), num_pages, block_table.shape[1] * page_size,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_table.stride(), *dst.out_strides, *dst.lse_strides,
        PAGE_SIZE=page_size, HEAD_DIM=D, BLOCK_G=knobs["block_g"], BLOCK_N=block_n, BLOCK_D=knobs["block_d"],
        NW=num_warps, UPCAST=upcast, DOT_PRECISION="ieee" if upcast or q.dtype == torch.float32 else None,
        num_warps=num_warps, num_stages=num_stages, **({} if maxnreg is None else dict(maxnreg=maxnreg)),
    )
    return dst.merged(q.dtype, return_lse)
