"""The MLA-128 head tile on Hopper, written in Gluon (Triton's explicit-layout dialect) to pipeline its loads.

Why a second kernel. ``mla._mla_decode_kernel`` at its fastest MLA-128 tile (BLOCK_H 64, BLOCK_N 64, 8 warps)
fits only two latent tiles beside the 72 KB Q tile in shared memory, and with two Triton's software pipeliner
issues tile i + 1's copy after tile i's PV wgmma has been waited: the load never overlaps the compute
(BENCHMARKS.md, "Kernel versions", third version, item 5). Here the schedule is written out:

    prologue: copy Q (group 0), copy tile 0 into buffer 0 (group 1)
    tile i:   barrier (both warpgroups are done with tile i - 1's buffer)
              copy tile i + 1 into buffer (i + 1) % 2, commit        <- in flight during tile i's math
              wait until tile i's group has landed (one group may stay outstanding)
              S = Q . K_i^T (two wgmma: the V columns and the rope columns), online softmax
              acc = acc * alpha + P @ V_i (one wgmma, P from registers)

so one latent tile (72 KB) is always in flight while the tensor cores work on the other. The math is
``mla.softmax_update``'s (base-2 online softmax, ``m_safe`` keeps an empty tile's -inf - -inf out), the split
and epilogue ``mla._mla_decode_kernel``'s, the addressing the same paged gather (one block-table entry per key,
read a tile ahead), issued as ``cp.async`` copies of 16 bytes with masked rows zero-filled.

Scope: 16-bit q and cache, BLOCK_H 64 and BLOCK_N 64 with 8 warps (two warpgroups: the QK wgmma splits the
keys between them, the PV wgmma the V columns), Dv 256 or 512 and Dqk - Dv in {0, 64}; on an sm_90 GPU with
Triton's Gluon Hopper API (triton 3.6). ``mla.mla_decode`` takes this path where ``use_sm90`` says so and
the ``tl`` kernel everywhere else (other tiles, fp8 caches, the interpreter, other GPUs or Triton versions).
"""

from __future__ import annotations

import torch

try:  # Gluon's Hopper API as of triton 3.6; absent or different elsewhere (then the tl kernel runs)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed triton
    HAVE_GLUON = False

BLOCK_H = 64
BLOCK_N = 64
NUM_WARPS = 8
HEAD_DIMS_V = (256, 512)
HEAD_DIMS_R = (0, 64)


if HAVE_GLUON:

    @gluon.jit
    def _tile_rows(bt_row, bt_stride_p, kv_ptr, kv_stride_p, kv_stride_s, n0, end,
                   PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr):
        """(row offsets [BLOCK_N] int64 from ``kv_ptr``, row mask) of the keys ``n0 + [0, BLOCK_N)`` in
        ``layout`` (a SliceLayout over rows); 4 bytes of block table per key (repeats hit L1)."""
        pos = n0 + gl.arange(0, BLOCK_N, layout=layout)
        valid = pos < end
        page = gl.load(bt_row + (pos // PAGE_SIZE) * bt_stride_p, mask=valid, other=0).to(gl.int64)
        return page * kv_stride_p + (pos % PAGE_SIZE).to(gl.int64) * kv_stride_s, valid

    @gluon.jit
    def _copy_rows(smem, base_ptr, row_off, row_mask, col0, stride_d, NCOLS: gl.constexpr,
                   layout: gl.constexpr):
        """cp.async of ``[rows, NCOLS]`` elements (columns ``col0 + [0, NCOLS)``) into ``smem``; masked rows
        are zero-filled. Bytes: rows * NCOLS * elt, 16 a copy."""
        cols = col0 + gl.arange(0, NCOLS, layout=gl.SliceLayout(0, layout))
        ptrs = base_ptr + row_off[:, None] + cols[None, :] * stride_d
        async_copy.async_copy_global_to_shared(smem, ptrs, mask=row_mask[:, None])

    @gluon.jit
    def _mla_sm90_kernel(
        q_ptr, kv_ptr, bt_ptr, seq_lens_ptr, out_ptr, lse_ptr,
        num_heads, num_head_tiles, num_splits, qk_scale,
        q_stride_b, q_stride_h, q_stride_d,
        kv_stride_p, kv_stride_s, kv_stride_d,
        bt_stride_b, bt_stride_p,
        out_stride_b, out_stride_h, out_stride_s, out_stride_d,
        lse_stride_b, lse_stride_h, lse_stride_s,
        PAGE_SIZE: gl.constexpr, HEAD_DIM_V: gl.constexpr, HEAD_DIM_R: gl.constexpr,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, num_warps: gl.constexpr,
    ):
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        # Register layouts. QK: [BLOCK_H, BLOCK_N] scores, warpgroup w computes keys [w * BLOCK_N / 2, ...);
        # PV: [BLOCK_H, Dv] accumulator, warpgroup w owns columns [w * Dv / 2, ...) (128 fp32 a thread at 512).
        QK_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, BLOCK_N // 2, 16])
        PV_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, HEAD_DIM_V // 2, 16])
        P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=PV_L, k_width=2)
        # Copy layouts: 8 elements (16 bytes) a thread; a warp covers a row of 256 (V part) or 4 rows of 64.
        CP_V: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
        CP_R: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        SM_L: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        RD: gl.constexpr = HEAD_DIM_R if HEAD_DIM_R > 0 else 16  # (an unused rope buffer when Dqk == Dv)

        pid = gl.program_id(0)
        head_tile = pid % num_head_tiles
        rest = pid // num_head_tiles
        split = rest % num_splits
        b = rest // num_splits
        seq_len = gl.load(seq_lens_ptr + b)
        split_size = gl.cdiv(gl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        start = split * split_size
        end = gl.minimum(start + split_size, seq_len)
        n_tiles = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)

        # Shared memory: Q (BLOCK_H x Dqk x 2 B: 72 KB at 64 x 576) and two latent tiles (72 KB each).
        q_v_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, HEAD_DIM_V], SM_L)
        q_r_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, RD], SM_L)
        kv_v_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HEAD_DIM_V], SM_L)
        kv_r_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, RD], SM_L)

        # Q: BLOCK_H rows x Dqk (group 0). Rows past num_heads read as 0 and are never stored.
        q_base = q_ptr + b.to(gl.int64) * q_stride_b
        h_v = head_tile * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, CP_V))
        _copy_rows(q_v_smem, q_base, h_v.to(gl.int64) * q_stride_h, h_v < num_heads, 0, q_stride_d, HEAD_DIM_V,
                   CP_V)
        if HEAD_DIM_R > 0:
            h_r = head_tile * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, CP_R))
            _copy_rows(q_r_smem, q_base, h_r.to(gl.int64) * q_stride_h, h_r < num_heads, HEAD_DIM_V, q_stride_d,
                       HEAD_DIM_R, CP_R)
        async_copy.commit_group()

        # Tile 0 into buffer 0 (group 1); the next tile's table entries are read a tile ahead.
        bt_row = bt_ptr + b.to(gl.int64) * bt_stride_b
        off_v, ok_v = _tile_rows(bt_row, bt_stride_p, kv_ptr, kv_stride_p, kv_stride_s, start, end,
                                 PAGE_SIZE, BLOCK_N, gl.SliceLayout(1, CP_V))
        off_r, ok_r = _tile_rows(bt_row, bt_stride_p, kv_ptr, kv_stride_p, kv_stride_s, start, end,
                                 PAGE_SIZE, BLOCK_N, gl.SliceLayout(1, CP_R))
        _copy_rows(kv_v_smem.index(0), kv_ptr, off_v, ok_v, 0, kv_stride_d, HEAD_DIM_V, CP_V)
        if HEAD_DIM_R > 0:
            _copy_rows(kv_r_smem.index(0), kv_ptr, off_r, ok_r, HEAD_DIM_V, kv_stride_d, HEAD_DIM_R, CP_R)
        async_copy.commit_group()
        off_v, ok_v = _tile_rows(bt_row, bt_stride_p, kv_ptr, kv_stride_p, kv_stride_s, start + BLOCK_N, end,
                                 PAGE_SIZE, BLOCK_N, gl.SliceLayout(1, CP_V))
        off_r, ok_r = _tile_rows(bt_row, bt_stride_p, kv_ptr, kv_stride_p, kv_stride_s, start + BLOCK_N, end,
                                 PAGE_SIZE, BLOCK_N, gl.SliceLayout(1, CP_R))

        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, QK_L))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, QK_L))
        acc = gl.zeros([BLOCK_H, HEAD_DIM_V], gl.float32, layout=PV_L)
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=QK_L)
        offs_key = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, QK_L))

        for i in range(n_tiles):
            n0 = start + i * BLOCK_N
            buf = i % 2
            # Both warpgroups are past tile i - 1's PV wgmma: its buffer may be overwritten by tile i + 1.
            gl.thread_barrier()
            nxt = 1 - buf
            _copy_rows(kv_v_smem.index(nxt), kv_ptr, off_v, ok_v, 0, kv_stride_d, HEAD_DIM_V, CP_V)
            if HEAD_DIM_R > 0:
                _copy_rows(kv_r_smem.index(nxt), kv_ptr, off_r, ok_r, HEAD_DIM_V, kv_stride_d, HEAD_DIM_R, CP_R)
            async_copy.commit_group()
            off_v, ok_v = _tile_rows(bt_row, bt_stride_p, kv_ptr, kv_stride_p, kv_stride_s, n0 + 2 * BLOCK_N, end,
                                     PAGE_SIZE, BLOCK_N, gl.SliceLayout(1, CP_V))
            off_r, ok_r = _tile_rows(bt_row, bt_stride_p, kv_ptr, kv_stride_p, kv_stride_s, n0 + 2 * BLOCK_N, end,
                                     PAGE_SIZE, BLOCK_N, gl.SliceLayout(1, CP_R))
            # Tile i (and Q) landed: every group but the one just committed.
            async_copy.wait_group(1)
            fence_async_shared()
            gl.thread_barrier()

            kv_v = kv_v_smem.index(buf)
            s = warpgroup_mma(q_v_smem, kv_v.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            if HEAD_DIM_R > 0:
                s = warpgroup_mma(q_r_smem, kv_r_smem.index(buf).permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(0, deps=[s])
            s = s * qk_scale
            s = gl.where((n0 + offs_key < end)[None, :], s, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_safe)
            p = gl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, PV_L))[:, None]
            acc = warpgroup_mma(gl.convert_layout(p.to(dtype), P_L), kv_v, acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
        async_copy.wait_group(0)

        # Epilogue (mla.store_head_tile): out = acc / l, lse = ln(sum exp); an empty split stores 0 and -inf.
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, PV_L))
        m_o = gl.convert_layout(m_i, gl.SliceLayout(1, PV_L))
        empty = l_o == 0.0
        l_safe = gl.where(empty, 1.0, l_o)
        out = acc / l_safe[:, None]
        lse = gl.where(empty, float("-inf"), (m_o + gl.log2(l_safe)) * 0.6931471805599453)
        offs_h = head_tile * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, PV_L))
        offs_d = gl.arange(0, HEAD_DIM_V, layout=gl.SliceLayout(0, PV_L))
        mask_h = offs_h < num_heads
        out_row = out_ptr + b.to(gl.int64) * out_stride_b + split * out_stride_s
        gl.store(out_row + offs_h[:, None] * out_stride_h + offs_d[None, :] * out_stride_d,
                 out.to(out_ptr.dtype.element_ty), mask=mask_h[:, None])
        lse_row = lse_ptr + b.to(gl.int64) * lse_stride_b + split * lse_stride_s
        gl.store(lse_row + offs_h * lse_stride_h, lse, mask=mask_h)


#: Off: ``mla_decode`` always launches the tl kernel (for A/B runs; tests/gpu compares the two paths).
ENABLED = True


def use_sm90(q: torch.Tensor, kv_dtype: torch.dtype, head_dim_qk: int, head_dim_v: int, block_h: int,
             block_n: int, num_warps: int, num_stages: int) -> bool:
    """Whether ``mla_decode`` launches the Gluon kernel: ``ENABLED`` and the scope of the module docstring
    (the tl kernel's default MLA-128 tile: BLOCK_H 64, BLOCK_N 64, 8 warps, 2 stages)."""
    from splitlab.kernels import _launch

    if not (ENABLED and HAVE_GLUON) or _launch.INTERPRET or not q.is_cuda:
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or kv_dtype != q.dtype:
        return False
    if (block_h, block_n, num_warps, num_stages) != (BLOCK_H, BLOCK_N, NUM_WARPS, 2):
        return False
    if head_dim_v not in HEAD_DIMS_V or head_dim_qk - head_dim_v not in HEAD_DIMS_R:
        return False
    return torch.cuda.get_device_capability(q.device)[0] == 9


def launch(grid: tuple[int], q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
           seq_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, num_splits: int, qk_scale: float,
           out_strides: tuple[int, ...], lse_strides: tuple[int, ...], head_dim_v: int) -> None:
    """Launch ``_mla_sm90_kernel`` with ``mla._mla_decode_kernel``'s outputs and split (``qk_scale`` in base 2)."""
    H = q.shape[1]
    _mla_sm90_kernel[grid](
        q, kv_cache, block_table, seq_lens, out, lse,
        H, -(-H // BLOCK_H), num_splits, qk_scale,
        *q.stride(), *kv_cache.stride(), *block_table.stride(), *out_strides, *lse_strides,
        PAGE_SIZE=kv_cache.shape[1], HEAD_DIM_V=head_dim_v, HEAD_DIM_R=q.shape[2] - head_dim_v,
        BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, num_warps=NUM_WARPS,
    )
