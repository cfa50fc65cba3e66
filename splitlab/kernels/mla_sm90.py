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
    def _tile_rows(map_row, map_stride, kv_stride_p, kv_stride_s, n0, end, SPARSE: gl.constexpr,
                   PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr):
        """(row offsets [BLOCK_N] int64 from ``kv_ptr``, valid) of the keys ``n0 + [0, BLOCK_N)`` in ``layout``
        (a SliceLayout over rows). Paged: ``map_row`` is the request's block table, a key's row is
        ``page * kv_stride_p + (key % PAGE_SIZE) * kv_stride_s``, valid below ``end``; sparse (PAGE_SIZE 1):
        ``map_row`` is the token's top-k indices, a row is ``index * kv_stride_p``, and an index of -1 is not
        valid (its offset is never read). 4 bytes of map per key (a page's repeats hit L1)."""
        pos = n0 + gl.arange(0, BLOCK_N, layout=layout)
        if SPARSE:
            entry = gl.load(map_row + pos * map_stride, mask=pos < end, other=-1)
            return entry.to(gl.int64) * kv_stride_p, entry >= 0
        page = gl.load(map_row + (pos // PAGE_SIZE) * map_stride, mask=pos < end, other=0)
        return page.to(gl.int64) * kv_stride_p + (pos % PAGE_SIZE).to(gl.int64) * kv_stride_s, pos < end

    @gluon.jit
    def _copy_rows(smem, base_ptr, row_off, row_ok, col0, stride_d, NCOLS: gl.constexpr, layout: gl.constexpr):
        """cp.async of ``[rows, NCOLS]`` elements (columns ``col0 + [0, NCOLS)``) into ``smem``; rows that are
        not ``row_ok`` are zero-filled, not read. Bytes: rows * NCOLS * elt, 16 a copy."""
        cols = col0 + gl.arange(0, NCOLS, layout=gl.SliceLayout(0, layout))
        ptrs = base_ptr + row_off[:, None] + cols[None, :] * stride_d
        async_copy.async_copy_global_to_shared(smem, ptrs, mask=row_ok[:, None])

    @gluon.jit
    def _tile_offsets(map_row, map_stride, kv_stride_p, kv_stride_s, n0, end, SPARSE: gl.constexpr,
                      PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, ROWS_V: gl.constexpr, ROWS_R: gl.constexpr):
        """``_tile_rows`` in the V part's and the rope part's copy layouts: (off_v, ok_v, off_r, ok_r)."""
        off_v, ok_v = _tile_rows(map_row, map_stride, kv_stride_p, kv_stride_s, n0, end, SPARSE, PAGE_SIZE, BLOCK_N,
                                 ROWS_V)
        off_r, ok_r = _tile_rows(map_row, map_stride, kv_stride_p, kv_stride_s, n0, end, SPARSE, PAGE_SIZE, BLOCK_N,
                                 ROWS_R)
        return off_v, ok_v, off_r, ok_r

    @gluon.jit
    def _copy_tile(v_smem, r_smem, kv_ptr, off_v, ok_v, off_r, ok_r, kv_stride_d, HEAD_DIM_V: gl.constexpr,
                   HEAD_DIM_R: gl.constexpr, CP_V: gl.constexpr, CP_R: gl.constexpr):
        """One latent tile (BLOCK_N x Dqk x 2 bytes) into a buffer: the V part and the rope part."""
        _copy_rows(v_smem, kv_ptr, off_v, ok_v, 0, kv_stride_d, HEAD_DIM_V, CP_V)
        if HEAD_DIM_R > 0:
            _copy_rows(r_smem, kv_ptr, off_r, ok_r, HEAD_DIM_V, kv_stride_d, HEAD_DIM_R, CP_R)

    @gluon.jit
    def _mla_sm90_kernel(
        q_ptr, kv_ptr, map_ptr, seq_lens_ptr, out_ptr, lse_ptr,
        num_heads, num_head_tiles, num_splits, num_keys, qk_scale,
        q_stride_b, q_stride_h, q_stride_d,
        kv_stride_p, kv_stride_s, kv_stride_d,
        map_stride_b, map_stride_k,
        out_stride_b, out_stride_h, out_stride_s, out_stride_d,
        lse_stride_b, lse_stride_h, lse_stride_s,
        SPARSE: gl.constexpr, PAGE_SIZE: gl.constexpr, HEAD_DIM_V: gl.constexpr, HEAD_DIM_R: gl.constexpr,
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
        ROWS_V: gl.constexpr = gl.SliceLayout(1, CP_V)
        ROWS_R: gl.constexpr = gl.SliceLayout(1, CP_R)
        KEYS: gl.constexpr = gl.SliceLayout(0, QK_L)

        # One program per (request or token b, split, head tile), head tile fastest (as mla._mla_decode_kernel).
        pid = gl.program_id(0)
        head_tile = pid % num_head_tiles
        rest = pid // num_head_tiles
        split = rest % num_splits
        b = rest // num_splits
        if SPARSE:
            seq_len = num_keys  # every token has top-k candidates
        else:
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

        # Q: BLOCK_H rows x Dqk (copy group 0). Rows past num_heads read as 0 and are never stored.
        q_base = q_ptr + b.to(gl.int64) * q_stride_b
        h_v = head_tile * BLOCK_H + gl.arange(0, BLOCK_H, layout=ROWS_V)
        _copy_rows(q_v_smem, q_base, h_v.to(gl.int64) * q_stride_h, h_v < num_heads, 0, q_stride_d, HEAD_DIM_V, CP_V)
        if HEAD_DIM_R > 0:
            h_r = head_tile * BLOCK_H + gl.arange(0, BLOCK_H, layout=ROWS_R)
            _copy_rows(q_r_smem, q_base, h_r.to(gl.int64) * q_stride_h, h_r < num_heads, HEAD_DIM_V, q_stride_d,
                       HEAD_DIM_R, CP_R)
        async_copy.commit_group()

        # Tile 0 into buffer 0 (group 1). The next tile's map entries are always read a tile ahead.
        map_row = map_ptr + b.to(gl.int64) * map_stride_b
        off_v, ok_v, off_r, ok_r = _tile_offsets(map_row, map_stride_k, kv_stride_p, kv_stride_s, start, end, SPARSE,
                                                 PAGE_SIZE, BLOCK_N, ROWS_V, ROWS_R)
        _copy_tile(kv_v_smem.index(0), kv_r_smem.index(0), kv_ptr, off_v, ok_v, off_r, ok_r, kv_stride_d, HEAD_DIM_V,
                   HEAD_DIM_R, CP_V, CP_R)
        async_copy.commit_group()
        off_v, ok_v, off_r, ok_r = _tile_offsets(map_row, map_stride_k, kv_stride_p, kv_stride_s, start + BLOCK_N, end,
                                                 SPARSE, PAGE_SIZE, BLOCK_N, ROWS_V, ROWS_R)

        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, QK_L))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, QK_L))
        acc = gl.zeros([BLOCK_H, HEAD_DIM_V], gl.float32, layout=PV_L)
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=QK_L)

        for i in range(n_tiles):
            n0 = start + i * BLOCK_N
            buf = i % 2
            # Both warpgroups are past tile i - 1's PV wgmma: its buffer may take tile i + 1 (BLOCK_N x Dqk x 2 B
            # of cp.async, in flight during tile i's math; zero-filled past the split's end).
            gl.thread_barrier()
            _copy_tile(kv_v_smem.index(1 - buf), kv_r_smem.index(1 - buf), kv_ptr, off_v, ok_v, off_r, ok_r,
                       kv_stride_d, HEAD_DIM_V, HEAD_DIM_R, CP_V, CP_R)
            async_copy.commit_group()
            off_v, ok_v, off_r, ok_r = _tile_offsets(map_row, map_stride_k, kv_stride_p, kv_stride_s, n0 + 2 * BLOCK_N,
                                                     end, SPARSE, PAGE_SIZE, BLOCK_N, ROWS_V, ROWS_R)
            # Tile i (and Q) landed: every copy group but the one just committed; then visible to the wgmma.
            async_copy.wait_group(1)
            fence_async_shared()
            gl.thread_barrier()

            # S = Q . K^T over the V and the rope columns (FLOPs 2 x BLOCK_H x BLOCK_N x Dqk), then the online
            # softmax in base 2 (mla.softmax_update).
            kv_v = kv_v_smem.index(buf)
            s = warpgroup_mma(q_v_smem, kv_v.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            if HEAD_DIM_R > 0:
                s = warpgroup_mma(q_r_smem, kv_r_smem.index(buf).permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(0, deps=[s])
            if SPARSE:  # an index of -1 scores -inf (its row was zero-filled, never read)
                _, key_ok = _tile_rows(map_row, map_stride_k, kv_stride_p, kv_stride_s, n0, end, True, 1, BLOCK_N,
                                       KEYS)
            else:
                key_ok = n0 + gl.arange(0, BLOCK_N, layout=KEYS) < end
            s = gl.where(key_ok[None, :], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_safe)
            p = gl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            # acc = acc * alpha + P @ V (FLOPs 2 x BLOCK_H x BLOCK_N x Dv; P from registers, V from the tile).
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, PV_L))[:, None]
            acc = warpgroup_mma(gl.convert_layout(p.to(dtype), P_L), kv_v, acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
        async_copy.wait_group(0)

        # Epilogue (mla.store_head_tile): out = acc / l, lse = ln(sum exp); an empty split stores 0 and -inf.
        # Bytes: BLOCK_H x (Dv x out elt + 4).
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


def in_scope(dtype: torch.dtype, kv_dtype: torch.dtype, head_dim_qk: int, head_dim_v: int, block_h: int, block_n: int,
             num_warps: int, num_stages: int) -> bool:
    """Whether a launch's dtypes, dims and tile are the Gluon kernel's (the scope in the module docstring: the
    tl kernel's default 64-row tile, BLOCK_H 64, BLOCK_N 64, 8 warps, 2 stages, on a 16-bit cache)."""
    return (dtype in (torch.bfloat16, torch.float16) and kv_dtype == dtype
            and (block_h, block_n, num_warps, num_stages) == (BLOCK_H, BLOCK_N, NUM_WARPS, 2)
            and head_dim_v in HEAD_DIMS_V and head_dim_qk - head_dim_v in HEAD_DIMS_R)


def use_sm90(q: torch.Tensor, kv_dtype: torch.dtype, head_dim_qk: int, head_dim_v: int, block_h: int, block_n: int,
             num_warps: int, num_stages: int) -> bool:
    """Whether ``mla_decode`` / ``sparse_mla_decode`` launch the Gluon kernel: ``ENABLED``, Gluon's Hopper API,
    not under the interpreter, q on an sm_90 GPU, and ``in_scope``."""
    from splitlab.kernels import _launch

    if not (ENABLED and HAVE_GLUON) or _launch.INTERPRET or not q.is_cuda:
        return False
    return (in_scope(q.dtype, kv_dtype, head_dim_qk, head_dim_v, block_h, block_n, num_warps, num_stages)
            and torch.cuda.get_device_capability(q.device)[0] == 9)


def launch_paged(grid: tuple[int], q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, num_splits: int, qk_scale: float,
                 out_strides: tuple[int, ...], lse_strides: tuple[int, ...], head_dim_v: int) -> None:
    """``mla.mla_decode``'s launch (its outputs and split; ``qk_scale`` in base 2) on the Gluon kernel."""
    _launch(grid, q, kv_cache, kv_cache.stride(), block_table, seq_lens, 0, out, lse, num_splits, qk_scale,
            out_strides, lse_strides, head_dim_v, sparse=False, page_size=kv_cache.shape[1])


def launch_sparse(grid: tuple[int], q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor, num_splits: int, qk_scale: float,
                  out_strides: tuple[int, ...], lse_strides: tuple[int, ...], head_dim_v: int) -> None:
    """``sparse_mla.sparse_mla_decode``'s launch on the Gluon kernel: a pool row is a page of one row."""
    stride_n, stride_d = kv_cache.stride()
    _launch(grid, q, kv_cache, (stride_n, 0, stride_d), indices, indices, indices.shape[1], out, lse, num_splits,
            qk_scale, out_strides, lse_strides, head_dim_v, sparse=True, page_size=1)


def _launch(grid, q, kv_cache, kv_strides, key_map, seq_lens, num_keys, out, lse, num_splits, qk_scale,
            out_strides, lse_strides, head_dim_v, *, sparse, page_size):
    H = q.shape[1]
    _mla_sm90_kernel[grid](
        q, kv_cache, key_map, seq_lens, out, lse,
        H, -(-H // BLOCK_H), num_splits, num_keys, qk_scale,
        *q.stride(), *kv_strides, *key_map.stride(), *out_strides, *lse_strides,
        SPARSE=sparse, PAGE_SIZE=page_size, HEAD_DIM_V=head_dim_v, HEAD_DIM_R=q.shape[2] - head_dim_v,
        BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, num_warps=NUM_WARPS,
    )
