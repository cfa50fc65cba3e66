"""Experiment (not shipped): the paged GQA partial kernel reading K/V through TMA tensor descriptors.

A tile never crosses a page (``BLOCK_N <= PAGE_SIZE``), so each K or V tile is one box of one page: the cache
[pages, page, Hkv, D] (NHD, rows contiguous) is described as the 2-D tensor [pages * page, Hkv * D], and tile
t of a split is the box at row ``block_table[b, tile_start // PAGE_SIZE] * PAGE_SIZE + tile_start % PAGE_SIZE``,
column ``kvh * D``. The copy is one TMA instruction a tile (no per-key addresses in registers), so the loop can
keep more tiles in flight (``num_stages``).

With ``AHEAD`` (the default) a tile's table entry is loaded an iteration before its copies, as in the shipped
kernel. Compiled for sm_90a (triton 3.6), the loop then keeps ``num_stages - 1`` tiles in flight: 72 KiB of shared
memory at BLOCK_N 64 and 3 stages, 104 at 4, 137 at 5; at 16 keys a tile, 62 KiB at 8 stages, 95 at 12. Without
it, ``num_stages - 2`` (72 KiB at 5).

With ``wsplit`` a box's keys are split over the warps as in ``gqa_wsplit.py`` (one online softmax a warp, merged
once after the loop; at page 64, 64 keys a box, 4 warps: per 64 keys the loop has 5 CTA barriers and no shared
stores against 11 and 6 without, 128 registers, 64 KiB at 3 stages).

Full tiles run unmasked. The split's last, partial tile (if any) runs once after the loop with its rows past the
split masked (a score of -inf, a V row of 0: the box reads other slots of the page, whatever they hold).
Everything else is ``splitlab.kernels.gqa``'s kernel: the same split of each request's keys, the same block-table
checks (``scan_pages``), the same epilogue and the shipped merge.

Bytes moved per program: K and V 2 * n * D * elt; the block table n / BLOCK_N * 4 (one entry per tile) plus the
pre-loop scan's n / PAGE_SIZE * 4; q G * D * elt; writes as the shipped kernel's.
"""

from __future__ import annotations

import triton
import triton.language as tl
from partials import partials
from triton.tools.tensor_descriptor import TensorDescriptor

from splitlab.kernels.gqa import FLT_MAX, LN2, LOG2E, default_knobs
from splitlab.kernels.paging import any_bad, checked_len, poison, scan_pages


@triton.jit
def _row(bt_row, bt_stride_p, tile_start, end, num_pages, PAGE_SIZE: tl.constexpr):
    """The cache row of the tile at ``tile_start``: one table entry (4 bytes; none past ``end``: row 0), clamped
    into the cache (``scan_pages`` flags it for the epilogue)."""
    raw = tl.load(bt_row + (tile_start // PAGE_SIZE) * bt_stride_p, mask=tile_start < end, other=0)
    raw = raw.to(tl.uint32, bitcast=True)
    page = tl.minimum(raw, tl.cast(num_pages - 1, tl.uint32)).to(tl.int32)
    return page * PAGE_SIZE + tile_start % PAGE_SIZE


@triton.jit
def _tile(q, k_desc, v_desc, row, tile_start, end, col, m_i, l_i, acc, qk_scale,
          BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    # K tile [BLOCK_N, D]: BLOCK_N * D * elt bytes, one TMA box.
    k = k_desc.load([row, col])
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        live = (tile_start + tl.arange(0, BLOCK_N)) < end
        s = tl.where(live[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    # V tile [BLOCK_N, D]: BLOCK_N * D * elt bytes, one TMA box.
    v = v_desc.load([row, col])
    if MASKED:
        v = tl.where(live[:, None], v, 0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _loop(q, k_desc, v_desc, bt_row, bt_stride_p, start, end, full, col, num_pages, qk_scale, BLOCK_G: tl.constexpr,
          HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
          AHEAD: tl.constexpr):
    """The split's keys, one [BLOCK_G, BLOCK_N] online-softmax step a box: (m, l, acc)."""
    m_i = tl.full([BLOCK_G], -FLT_MAX, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    if AHEAD:
        # The next tile's row is loaded an iteration ahead and carried, so a tile's copies depend on no load of
        # their own iteration (the last iteration reads the tail's entry, or none).
        row_next = _row(bt_row, bt_stride_p, start, end, num_pages, PAGE_SIZE)
        for t in tl.range(0, full, num_stages=STAGES):
            row = row_next
            row_next = _row(bt_row, bt_stride_p, start + (t + 1) * BLOCK_N, end, num_pages, PAGE_SIZE)
            m_i, l_i, acc = _tile(q, k_desc, v_desc, row, start + t * BLOCK_N, end, col, m_i, l_i, acc, qk_scale,
                                  BLOCK_N, False)
    else:
        for t in tl.range(0, full, num_stages=STAGES):
            row = _row(bt_row, bt_stride_p, start + t * BLOCK_N, end, num_pages, PAGE_SIZE)
            m_i, l_i, acc = _tile(q, k_desc, v_desc, row, start + t * BLOCK_N, end, col, m_i, l_i, acc, qk_scale,
                                  BLOCK_N, False)
    tail = start + full * BLOCK_N
    if tail < end:
        row = _row(bt_row, bt_stride_p, tail, end, num_pages, PAGE_SIZE)
        m_i, l_i, acc = _tile(q, k_desc, v_desc, row, tail, end, col, m_i, l_i, acc, qk_scale, BLOCK_N, True)
    return m_i, l_i, acc


@triton.jit
def _tile_wsplit(q, k_desc, v_desc, row, tile_start, end, col, m_i, l_i, acc, qk_scale, NW: tl.constexpr,
                 SLICE: tl.constexpr, MASKED: tl.constexpr):
    """``_tile`` with the box's NW * SLICE keys as NW slices of SLICE, one a warp (``gqa_wsplit.py``'s tile):
    q [NW, G, D], state [NW, G] and [NW, G, D]."""
    D: tl.constexpr = q.shape[2]
    # K tile [NW * SLICE, D]: one TMA box, read by the batched dot as [NW, SLICE, D].
    k = k_desc.load([row, col]).reshape(NW, SLICE, D)
    s = tl.dot(q, tl.trans(k, 0, 2, 1)) * qk_scale
    if MASKED:
        live = (tile_start + tl.arange(0, NW)[:, None] * SLICE + tl.arange(0, SLICE)[None, :]) < end
        s = tl.where(live[:, None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=2))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, :, None])
    l_i = l_i * alpha + tl.sum(p, axis=2)
    # V tile [NW * SLICE, D]: one TMA box.
    v = v_desc.load([row, col]).reshape(NW, SLICE, D)
    if MASKED:
        v = tl.where(live[:, :, None], v, 0.0)
    acc = acc * alpha[:, :, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _loop_wsplit(q, k_desc, v_desc, bt_row, bt_stride_p, start, end, full, col, num_pages, qk_scale,
                 BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                 STAGES: tl.constexpr, NW: tl.constexpr):
    """``_loop`` (table entries an iteration ahead) with each box split over the NW warps, their states merged once
    after the loop (``gqa_wsplit.py``): (m, l, acc)."""
    q = tl.broadcast_to(q[None, :, :], [NW, BLOCK_G, HEAD_DIM])
    m_w = tl.full([NW, BLOCK_G], -FLT_MAX, tl.float32)
    l_w = tl.zeros([NW, BLOCK_G], tl.float32)
    acc_w = tl.zeros([NW, BLOCK_G, HEAD_DIM], tl.float32)
    row_next = _row(bt_row, bt_stride_p, start, end, num_pages, PAGE_SIZE)
    for t in tl.range(0, full, num_stages=STAGES):
        row = row_next
        row_next = _row(bt_row, bt_stride_p, start + (t + 1) * BLOCK_N, end, num_pages, PAGE_SIZE)
        m_w, l_w, acc_w = _tile_wsplit(q, k_desc, v_desc, row, start + t * BLOCK_N, end, col, m_w, l_w, acc_w,
                                       qk_scale, NW, BLOCK_N // NW, False)
    tail = start + full * BLOCK_N
    if tail < end:
        row = _row(bt_row, bt_stride_p, tail, end, num_pages, PAGE_SIZE)
        m_w, l_w, acc_w = _tile_wsplit(q, k_desc, v_desc, row, tail, end, col, m_w, l_w, acc_w, qk_scale, NW,
                                       BLOCK_N // NW, True)
    m_i = tl.max(m_w, axis=0)
    w = tl.exp2(m_w - m_i[None, :])
    return m_i, tl.sum(l_w * w, axis=0), tl.sum(acc_w * w[:, :, None], axis=0)


@triton.jit
def _gqa_tma_kernel(
    q_ptr, k_desc, v_desc, bt_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    qk_scale, num_kv_heads, group, num_splits, num_pages, max_keys,
    q_stride_b, q_stride_h,
    bt_stride_b, bt_stride_p,
    out_stride_b, out_stride_h, out_stride_s,
    lse_stride_b, lse_stride_h, lse_stride_s,
    PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr, AHEAD: tl.constexpr, NW: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // num_kv_heads
    kvh = pid_bh % num_kv_heads
    b64 = b.to(tl.int64)

    seq_len, bad_len = checked_len(tl.load(seq_lens_ptr + b64), max_keys)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    full = tl.maximum(end - start, 0) // BLOCK_N

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    mask_g = offs_g < group
    heads = kvh * group + offs_g
    q = tl.load(q_ptr + b64 * q_stride_b + heads[:, None] * q_stride_h + offs_d[None, :], mask=mask_g[:, None],
                other=0.0)
    bt_row = bt_ptr + b64 * bt_stride_b
    col = kvh * HEAD_DIM

    seen = scan_pages(bt_row, bt_stride_p, start, end, PAGE_SIZE)
    if NW > 1:
        m_i, l_i, acc = _loop_wsplit(q, k_desc, v_desc, bt_row, bt_stride_p, start, end, full, col, num_pages,
                                     qk_scale, BLOCK_G, HEAD_DIM, PAGE_SIZE, BLOCK_N, STAGES, NW)
    else:
        m_i, l_i, acc = _loop(q, k_desc, v_desc, bt_row, bt_stride_p, start, end, full, col, num_pages, qk_scale,
                              BLOCK_G, HEAD_DIM, PAGE_SIZE, BLOCK_N, STAGES, AHEAD)

    l_i = poison(l_i, bad_len | any_bad(seen, num_pages, True))
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)
    tl.store(out_ptr + b64 * out_stride_b + split * out_stride_s + heads[:, None] * out_stride_h + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask_g[:, None])
    tl.store(lse_ptr + b64 * lse_stride_b + split * lse_stride_s + heads * lse_stride_h, lse, mask=mask_g)


def page_rows(q, k_cache, v_cache, seq_lens, block_n: int) -> tuple[list[int], list[int]]:
    """The 2-D tensor (shape, strides) a cache's TMA descriptor reads, [pages * page, Hkv * D], for NHD pages with
    contiguous rows; a layout or tile it cannot describe is refused (ValueError)."""
    D = q.shape[2]
    num_pages, page_size, Hkv, _ = k_cache.shape
    if page_size % block_n or D & (D - 1):
        raise ValueError(f"block_n={block_n} must divide page_size={page_size}; D={D} a power of two")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.stride(3) != 1 or c.stride(2) != D or c.stride(1) != Hkv * D or c.stride(0) != page_size * Hkv * D:
            raise ValueError(f"{name} must be NHD pages with contiguous rows; strides {c.stride()}")
    if q.stride(2) != 1 or seq_lens.stride(0) != 1:
        raise ValueError("q's head dim and seq_lens must be contiguous")
    return [num_pages * page_size, Hkv * D], [Hkv * D, 1]


def gqa_tma(q, k_cache, v_cache, block_table, seq_lens, *, num_splits: int, block_n: int | None = None,
            num_warps: int = 4, num_stages: int = 3, ahead: bool = True, wsplit: bool = False,
            return_lse: bool = False):
    """``gqa_decode``'s arguments (NHD pages with contiguous rows; D a power of two), no planner, no checks
    beyond the layout the descriptors need. ``block_n`` defaults to min(64, page_size). ``wsplit``: each box's keys
    split over the ``num_warps`` warps (``_loop_wsplit``; its slices at least 16 keys)."""
    B, Hq, D = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    block_n = block_n or min(64, page_size)
    if wsplit and block_n // num_warps < 16:
        raise ValueError(f"block_n={block_n} gives each of num_warps={num_warps} warps fewer than 16 keys (wsplit)")
    shape, strides = page_rows(q, k_cache, v_cache, seq_lens, block_n)
    descs = [TensorDescriptor(c, shape, strides, [block_n, D]) for c in (k_cache, v_cache)]
    S = num_splits
    group = Hq // Hkv
    dst = partials(q, S)
    _gqa_tma_kernel[(B * Hkv, S)](
        q, *descs, block_table, seq_lens, dst.out, dst.lse,
        D ** -0.5 * LOG2E, Hkv, group, S, num_pages, block_table.shape[1] * page_size,
        q.stride(0), q.stride(1), *block_table.stride(), *dst.out_strides[:3], *dst.lse_strides,
        PAGE_SIZE=page_size, HEAD_DIM=D, BLOCK_G=default_knobs(group, D)["block_g"], BLOCK_N=block_n,
        STAGES=num_stages, AHEAD=ahead, NW=num_warps if wsplit else 1, num_warps=num_warps, num_stages=num_stages,
    )
    return dst.merged(q.dtype, return_lse)
