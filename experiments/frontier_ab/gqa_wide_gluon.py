"""An experiment, not a shipped kernel: GQA's 128-row tile (MQA-128) in Gluon (triton 3.6, sm_90a), one partition of 8
warps (two warpgroups of 64 rows), the next tile's QK wgmma in flight during this tile's softmax (FlashAttention-3's
intra-warpgroup overlap) and K/V in a ring of STAGES cp.async buffers, STAGES - 1 tiles ahead. The PV wgmma is waited
in its own iteration: an accumulator in flight across the loop's back edge made ptxas serialise every wgmma (C7514).
No block-table validation beyond clamping pages into the cache (the shipped kernels poison such requests)."""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

LOG2E = 1.4426950408889634


@gluon.jit
def _rows(bt_row, bt_stride_p, k_stride_p, k_stride_s, n0, end, num_pages, PAGE_SIZE: gl.constexpr,
          BLOCK_N: gl.constexpr, layout: gl.constexpr):
    pos = n0 + gl.arange(0, BLOCK_N, layout=layout)
    ok = pos < end
    page = gl.load(bt_row + (pos // PAGE_SIZE) * bt_stride_p, mask=ok, other=0)
    page = gl.minimum(gl.maximum(page, 0), num_pages - 1)
    return page.to(gl.int64) * k_stride_p + (pos % PAGE_SIZE).to(gl.int64) * k_stride_s, ok


@gluon.jit
def _issue(k_smem, v_smem, k_head, v_head, bt_row, bt_stride_p, k_stride_p, k_stride_s, v_stride_p, v_stride_s,
           n0, end, num_pages, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
           CP: gl.constexpr):
    rows_l: gl.constexpr = gl.SliceLayout(1, CP)
    cols = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, CP))
    koff, ok = _rows(bt_row, bt_stride_p, k_stride_p, k_stride_s, n0, end, num_pages, PAGE_SIZE, BLOCK_N, rows_l)
    async_copy.async_copy_global_to_shared(k_smem, k_head + koff[:, None] + cols[None, :], mask=ok[:, None])
    voff, ok = _rows(bt_row, bt_stride_p, v_stride_p, v_stride_s, n0, end, num_pages, PAGE_SIZE, BLOCK_N, rows_l)
    async_copy.async_copy_global_to_shared(v_smem, v_head + voff[:, None] + cols[None, :], mask=ok[:, None])
    async_copy.commit_group()


@gluon.jit
def _gqa_wide_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    qk_scale, num_kv_heads, group, num_splits, num_pages, max_keys,
    q_stride_b, q_stride_h,
    k_stride_p, k_stride_s, k_stride_h,
    v_stride_p, v_stride_s, v_stride_h,
    bt_stride_b, bt_stride_p,
    out_stride_b, out_stride_h, out_stride_s,
    lse_stride_b, lse_stride_h, lse_stride_s,
    PAGE_SIZE: gl.constexpr, BLOCK_G: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
    STAGES: gl.constexpr, num_warps: gl.constexpr,
):
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    SM_L: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    QK_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                   instr_shape=[16, BLOCK_N, 16])
    PV_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                   instr_shape=[16, BLOCK_D, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=PV_L, k_width=2)
    CP: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    KEYS: gl.constexpr = gl.SliceLayout(0, QK_L)
    ROWS: gl.constexpr = gl.SliceLayout(1, QK_L)

    pid = gl.program_id(0)
    split = gl.program_id(1)
    b = pid // num_kv_heads
    kvh = pid % num_kv_heads
    b64 = b.to(gl.int64)
    seq_len = gl.load(seq_lens_ptr + b64)
    bad_len = (seq_len < 0) | (seq_len > max_keys)
    seq_len = gl.where(bad_len, 0, seq_len)
    split_len = gl.cdiv(gl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = gl.minimum(start + split_len, seq_len)
    n_tiles = gl.maximum(gl.cdiv(gl.maximum(end - start, 0), BLOCK_N), 1)  # an empty split: one masked tile

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_G, BLOCK_D], SM_L)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_D], SM_L)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_D], SM_L)

    bt_row = bt_ptr + b64 * bt_stride_b
    k_head = k_ptr + kvh.to(gl.int64) * k_stride_h
    v_head = v_ptr + kvh.to(gl.int64) * v_stride_h
    # Q [BLOCK_G, D]: rows past the group zero-filled.
    g = gl.arange(0, BLOCK_G, layout=gl.SliceLayout(1, CP))
    d = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, CP))
    heads = kvh * group + g
    q_ptrs = q_ptr + b64 * q_stride_b + heads.to(gl.int64)[:, None] * q_stride_h + d[None, :]
    async_copy.async_copy_global_to_shared(q_smem, q_ptrs, mask=(g < group)[:, None])
    async_copy.commit_group()
    for j in gl.static_range(STAGES - 1):
        _issue(k_smem.index(j), v_smem.index(j), k_head, v_head, bt_row, bt_stride_p, k_stride_p, k_stride_s,
               v_stride_p, v_stride_s, start + j * BLOCK_N, end, num_pages, PAGE_SIZE, BLOCK_N, BLOCK_D, CP)
    async_copy.wait_group(STAGES - 2)  # Q and tile 0 (tiles 1 .. STAGES - 2 may fly on)
    fence_async_shared()
    gl.thread_barrier()

    m_i = gl.full([BLOCK_G], -3.4028234663852886e38, gl.float32, layout=ROWS)
    l_i = gl.zeros([BLOCK_G], gl.float32, layout=ROWS)
    acc = gl.zeros([BLOCK_G, BLOCK_D], gl.float32, layout=PV_L)
    s_zero = gl.zeros([BLOCK_G, BLOCK_N], gl.float32, layout=QK_L)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s])
    # Tile 0, peeled.
    async_copy.wait_group(STAGES - 3)  # tile 1 (tiles 2 .. STAGES - 2 may fly on)
    fence_async_shared()
    gl.thread_barrier()
    s_nx = warpgroup_mma(q_smem, k_smem.index(1 % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    key_ok = start + gl.arange(0, BLOCK_N, layout=KEYS) < end
    sc = gl.where(key_ok[None, :], s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(sc, axis=1))
    p = gl.exp2(sc - m_new[:, None])
    l_i = gl.sum(p, axis=1)
    m_i = m_new
    acc = warpgroup_mma(gl.convert_layout(p.to(dtype), P_L), v_smem.index(0), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])
    s = warpgroup_mma_wait(0, deps=[s_nx])
    _issue(k_smem.index((STAGES - 1) % STAGES), v_smem.index((STAGES - 1) % STAGES), k_head, v_head, bt_row,
           bt_stride_p, k_stride_p, k_stride_s, v_stride_p, v_stride_s, start + (STAGES - 1) * BLOCK_N, end,
           num_pages, PAGE_SIZE, BLOCK_N, BLOCK_D, CP)
    for t in range(1, n_tiles):
        # tile t + 1 landed (tiles t + 2 .. t + STAGES - 2 may fly on)
        async_copy.wait_group(STAGES - 3)
        fence_async_shared()
        gl.thread_barrier()
        s_nx = warpgroup_mma(q_smem, k_smem.index((t + 1) % STAGES).permute((1, 0)), s_zero, use_acc=False,
                             is_async=True)
        key_ok = start + t * BLOCK_N + gl.arange(0, BLOCK_N, layout=KEYS) < end
        sc = gl.where(key_ok[None, :], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(sc, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(sc - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        p16 = gl.convert_layout(p.to(dtype), P_L)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, PV_L))[:, None]
        acc = warpgroup_mma(p16, v_smem.index(t % STAGES), acc, is_async=True)
        # tile t - 1's buffer is free (its QK and PV were waited): tile t + STAGES - 1 into it, while PV(t) runs
        _issue(k_smem.index((t + STAGES - 1) % STAGES), v_smem.index((t + STAGES - 1) % STAGES), k_head, v_head,
               bt_row, bt_stride_p, k_stride_p, k_stride_s, v_stride_p, v_stride_s, start + (t + STAGES - 1) * BLOCK_N,
               end, num_pages, PAGE_SIZE, BLOCK_N, BLOCK_D, CP)
        acc = warpgroup_mma_wait(0, deps=[acc])
        s = warpgroup_mma_wait(0, deps=[s_nx])
    acc = warpgroup_mma_wait(0, deps=[acc])
    async_copy.wait_group(0)

    l_i = gl.where(bad_len, float("nan"), l_i)
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, PV_L))
    m_o = gl.convert_layout(m_i, gl.SliceLayout(1, PV_L))
    empty = l_o == 0.0
    l_safe = gl.where(empty, 1.0, l_o)
    out = acc / l_safe[:, None]
    lse = gl.where(empty, float("-inf"), (m_o + gl.log2(l_safe)) * 0.6931471805599453)
    rows = gl.arange(0, BLOCK_G, layout=gl.SliceLayout(1, PV_L))
    cols = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, PV_L))
    h = kvh * group + rows
    o_ptrs = (out_ptr + b64 * out_stride_b + split * out_stride_s + h.to(gl.int64)[:, None] * out_stride_h
              + cols[None, :])
    gl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=(rows < group)[:, None])
    gl.store(lse_ptr + b64 * lse_stride_b + split * lse_stride_s + h * lse_stride_h, lse, mask=rows < group)


def gqa_wide(q, k_cache, v_cache, block_table, seq_lens, num_splits, *, stages=4, block_n=64, block_g=128,
             num_warps=8):
    """The tile at ``block_g`` rows (64 or 128: one warpgroup a 64 rows, ``num_warps`` 4 or 8) for groups up to
    ``block_g``; ``kernel_ab.py`` runs it at 64 rows on GQA 32/8 and 64/8."""
    from splitlab.kernels.combine import launch_combine
    B, Hq, D = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    if group > block_g:
        raise ValueError(f"group {group} does not fit block_g={block_g}")
    scale = D ** -0.5 * LOG2E
    lse = torch.empty(B, Hq, dtype=torch.float32, device=q.device)
    if num_splits == 1:
        out = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)
        dst, dl = out, lse
        ds = (out.stride(0), out.stride(1), 0)
        ls = (lse.stride(0), lse.stride(1), 0)
    else:
        dst = torch.empty(B, Hq, num_splits, D, dtype=torch.float32, device=q.device)
        dl = torch.empty(B, Hq, num_splits, dtype=torch.float32, device=q.device)
        ds = (dst.stride(0), dst.stride(1), dst.stride(2))
        ls = tuple(dl.stride())
    _gqa_wide_kernel[(B * Hkv, num_splits)](
        q, k_cache, v_cache, block_table, seq_lens, dst, dl,
        scale, Hkv, group, num_splits, num_pages, block_table.shape[1] * page_size,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0), block_table.stride(1),
        *ds, *ls,
        PAGE_SIZE=page_size, BLOCK_G=block_g, BLOCK_N=block_n, BLOCK_D=D, STAGES=stages, num_warps=num_warps,
    )
    if num_splits > 1:
        out = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)
        launch_combine(dst, dl, out, lse)
    return out
