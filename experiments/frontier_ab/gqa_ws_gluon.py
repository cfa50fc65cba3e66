"""Experiment (not shipped): the paged GQA partial kernel in Gluon (triton 3.6, sm_90a) with a copy warp.

One warp of its own (the loader) reads each tile's block-table entry and issues the tile's K and V as two TMA boxes of
one page into a ring of ``STAGES`` buffers; the 4 math warps wait on a buffer's "ready" barrier, compute, and free it
on its "empty" barrier. So the copies run ``STAGES`` tiles ahead of the math whatever the math is doing, the schedule
``gqa_tma.py``'s pipelined loop cannot give (Triton's own warp specialization does not split that loop: README.md).
The math is the shipped kernel's at 16 rows (``mma.sync``), the split of each request's keys and the epilogue too;
the block table is checked once before the loop (an entry out of the cache makes the request NaN, as
``paging.scan_pages``); the split's last, partial tile has its rows past the split masked (score -inf, V row 0).

Layout needs as ``gqa_tma.py``: NHD pages with contiguous rows, BLOCK_N dividing the page size, D a power of two.
Bytes moved per program: K and V 2 * n * D * elt (TMA); the table n / BLOCK_N * 4 (the loader) plus the scan's
n / PAGE_SIZE * 4; q G * D * elt; writes as the shipped kernel's.
"""

from __future__ import annotations

import torch
from gqa_tma import page_rows
from partials import partials
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from splitlab.kernels.gqa import LOG2E

FLT_MAX = gl.constexpr(3.4028234663852886e38)
SCAN = gl.constexpr(1024)  # block-table entries the scan reads a chunk


@gluon.jit
def _loader(k_desc, v_desc, k_bufs, v_bufs, ready, empty, bt_row, bt_stride_p, start, n_tiles, num_pages, col,
            PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    for t in range(n_tiles):
        idx = t % STAGES
        tile_start = start + t * BLOCK_N
        # One table entry a tile (4 bytes), read before the wait so its latency hides behind it; clamped into the
        # cache (the scan makes the request NaN).
        raw = gl.load(bt_row + (tile_start // PAGE_SIZE) * bt_stride_p).to(gl.uint32, bitcast=True)
        page = gl.minimum(raw, (num_pages - 1).to(gl.uint32)).to(gl.int32)
        row = page * PAGE_SIZE + tile_start % PAGE_SIZE
        # The buffer's last reader is done (barriers start with phase 1 complete: the first round passes).
        mbarrier.wait(empty.index(idx), (t // STAGES & 1) ^ 1)
        # K and V tiles [BLOCK_N, D]: 2 * BLOCK_N * D * elt bytes, two boxes, one barrier.
        mbarrier.expect(ready.index(idx), 2 * k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row, col], ready.index(idx), k_bufs.index(idx))
        tma.async_copy_global_to_shared(v_desc, [row, col], ready.index(idx), v_bufs.index(idx))


@gluon.jit
def _update(q, k_buf, v_buf, empty_bar, tile_start, end, m_i, l_i, acc, qk_scale, BLOCK_G: gl.constexpr,
            BLOCK_N: gl.constexpr,
            MASKED: gl.constexpr, MMA: gl.constexpr, BLK: gl.constexpr):
    """One tile's online-softmax step, from buffers that have landed; frees them for the loader."""
    DOT_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    DOT_B: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    k = k_buf.permute((1, 0)).load(DOT_B)  # K^T [D, BLOCK_N]
    if MASKED:
        v_raw = v_buf.load(BLK)
        rows_live = tile_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, BLK)) < end
        v = gl.convert_layout(gl.where(rows_live[:, None], v_raw, 0.0), DOT_B)
    else:
        v = v_buf.load(DOT_B)  # [BLOCK_N, D]
    # Both tiles are in registers: order the reads before the loader's next copy into the buffers, then free them.
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(empty_bar, count=1)

    s = mma_v2(q, k, gl.zeros([BLOCK_G, BLOCK_N], gl.float32, layout=MMA)) * qk_scale
    if MASKED:
        live = tile_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, MMA)) < end
        s = gl.where(live[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    acc = mma_v2(gl.convert_layout(p.to(v.dtype), DOT_A), v, acc * alpha[:, None])
    return m_new, l_i, acc


@gluon.jit
def _math(q, k_bufs, v_bufs, ready, empty, start, end, n_full, qk_scale, BLOCK_G: gl.constexpr,
          BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, MMA: gl.constexpr, BLK: gl.constexpr):
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    ROWS: gl.constexpr = gl.SliceLayout(1, MMA)
    m_i = gl.full([BLOCK_G], -FLT_MAX, gl.float32, layout=ROWS)
    l_i = gl.zeros([BLOCK_G], gl.float32, layout=ROWS)
    acc = gl.zeros([BLOCK_G, HEAD_DIM], gl.float32, layout=MMA)
    for t in range(n_full):
        idx = t % STAGES
        mbarrier.wait(ready.index(idx), t // STAGES & 1)
        m_i, l_i, acc = _update(q, k_bufs.index(idx), v_bufs.index(idx), empty.index(idx), start + t * BLOCK_N, end,
                                m_i, l_i, acc, qk_scale, BLOCK_G, BLOCK_N, False, MMA, BLK)
    tail = start + n_full * BLOCK_N
    if tail < end:
        idx = n_full % STAGES
        mbarrier.wait(ready.index(idx), n_full // STAGES & 1)
        m_i, l_i, acc = _update(q, k_bufs.index(idx), v_bufs.index(idx), empty.index(idx), tail, end,
                                m_i, l_i, acc, qk_scale, BLOCK_G, BLOCK_N, True, MMA, BLK)
    return m_i, l_i, acc


@gluon.jit
def _gqa_ws_kernel(
    q_ptr, k_desc, v_desc, bt_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    qk_scale, num_kv_heads, group, num_splits, num_pages, max_keys,
    q_stride_b, q_stride_h,
    bt_stride_b, bt_stride_p,
    out_stride_b, out_stride_h, out_stride_s,
    lse_stride_b, lse_stride_h, lse_stride_s,
    PAGE_SIZE: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_G: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, num_warps: gl.constexpr,
):
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, num_warps], instr_shape=[16, 8])
    DOT_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    BLK: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    LANES: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])

    pid = gl.program_id(0)
    split = gl.program_id(1)
    b = pid // num_kv_heads
    kvh = pid % num_kv_heads
    b64 = b.to(gl.int64)
    seq_len = gl.load(seq_lens_ptr + b64)
    bad = (seq_len < 0) | (seq_len > max_keys)
    seq_len = gl.where(bad, 0, seq_len)
    split_len = gl.cdiv(gl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = gl.minimum(start + split_len, seq_len)
    n_keys = gl.maximum(end - start, 0)
    n_full = n_keys // BLOCK_N
    n_tiles = gl.cdiv(n_keys, BLOCK_N)
    bt_row = bt_ptr + b64 * bt_stride_b

    # The split's table entries, once: one out of the cache makes the request NaN.
    offs = gl.arange(0, SCAN, layout=LANES)
    seen = gl.zeros([SCAN], gl.uint32, layout=LANES)
    for c in range(start // PAGE_SIZE, gl.cdiv(end, PAGE_SIZE), SCAN):
        entry = gl.load(bt_row + (c + offs) * bt_stride_p, mask=c + offs < gl.cdiv(end, PAGE_SIZE), other=0)
        seen = gl.maximum(seen, entry.to(gl.uint32, bitcast=True))
    bad = bad | (gl.max(seen, axis=0) >= num_pages.to(gl.uint32))

    # Q [BLOCK_G, D]: rows past the group zero-filled.
    g = gl.arange(0, BLOCK_G, layout=gl.SliceLayout(1, BLK))
    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, BLK))
    heads = kvh * group + g
    q = gl.load(q_ptr + b64 * q_stride_b + heads.to(gl.int64)[:, None] * q_stride_h + d[None, :],
                mask=(g < group)[:, None], other=0.0)
    q = gl.convert_layout(q, DOT_A)

    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)

    m_i, l_i, acc = gl.warp_specialize([
        (_math, (q, k_bufs, v_bufs, ready, empty, start, end, n_full, qk_scale, BLOCK_G, BLOCK_N, HEAD_DIM, MMA,
                 BLK)),
        (_loader, (k_desc, v_desc, k_bufs, v_bufs, ready, empty, bt_row, bt_stride_p, start, n_tiles, num_pages,
                   kvh * HEAD_DIM, PAGE_SIZE, BLOCK_N)),
    ], [1], [24])

    l_i = gl.where(bad, float("nan"), l_i)
    is_empty = l_i == 0.0
    l_safe = gl.where(is_empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = gl.where(is_empty, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
    rows = gl.arange(0, BLOCK_G, layout=gl.SliceLayout(1, MMA))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, MMA))
    h = kvh * group + rows
    gl.store(out_ptr + b64 * out_stride_b + split * out_stride_s + h.to(gl.int64)[:, None] * out_stride_h
             + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=(rows < group)[:, None])
    gl.store(lse_ptr + b64 * lse_stride_b + split * lse_stride_s + h * lse_stride_h, lse, mask=rows < group)


def gqa_ws(q, k_cache, v_cache, block_table, seq_lens, *, num_splits: int, block_n: int | None = None,
           num_stages: int = 4, maxnreg: int = 128, return_lse: bool = False):
    """``gqa_decode``'s arguments (NHD pages with contiguous rows; groups up to 16; D a power of two), no planner.
    ``num_stages``: K/V buffers in the ring; ``maxnreg``: registers a thread at launch (the CTA holds 8 warps: the
    4 math warps, the loader's warpgroup), which sets the CTAs an SM can hold beside shared memory."""
    B, Hq, D = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    block_n = block_n or min(64, page_size)
    if group > 16:
        raise ValueError(f"group={group}: this tile takes groups up to 16")
    shape, strides = page_rows(q, k_cache, v_cache, seq_lens, block_n)
    layout = gl.NVMMASharedLayout.get_default_for([block_n, D], gl.bfloat16 if q.dtype == torch.bfloat16 else
                                                  gl.float16)
    descs = [TensorDescriptor(c, shape, strides, [block_n, D], layout) for c in (k_cache, v_cache)]
    S = num_splits
    dst = partials(q, S)
    _gqa_ws_kernel[(B * Hkv, S)](
        q, *descs, block_table, seq_lens, dst.out, dst.lse,
        D ** -0.5 * LOG2E, Hkv, group, S, num_pages, block_table.shape[1] * page_size,
        q.stride(0), q.stride(1), *block_table.stride(), *dst.out_strides[:3], *dst.lse_strides,
        PAGE_SIZE=page_size, HEAD_DIM=D, BLOCK_G=16, BLOCK_N=block_n, STAGES=num_stages, num_warps=4,
        maxnreg=maxnreg,
    )
    return dst.merged(q.dtype, return_lse)
