"""The 64-row MLA head tile on Hopper, warp-specialized in Gluon (Triton's explicit-layout dialect).

Why a second kernel. ``mla._mla_decode_kernel`` at its fastest 64-row tile (BLOCK_H 64, BLOCK_N 64, 8 warps)
fits only two latent tiles beside the 72 KB Q tile in shared memory, and with two Triton's software pipeliner
issues tile i + 1's copy after tile i's PV wgmma has been waited: the load never overlaps the compute
(BENCHMARKS.md, "Kernel versions", third version, item 5). Its two warpgroups also split every dot: the QK
wgmma runs as m64n32 per warpgroup, each re-reading the whole Q tile from shared memory, and the row maxima and
sums cross warpgroups through shared memory on every tile. Here each warpgroup has one job (three partitions,
``gl.warp_specialize``), and they hand tiles to each other through mbarriers:

    load (4 warps, 96 registers)   Q once, in flight with tile 0; then tile i into buffer i % 2 (cp.async
                                   gathers, 16 bytes a copy, rows past the split's end or with index -1
                                   zero-filled), once both warpgroups below have released that buffer (tile i - 2)
    softmax (4 warps, 248 regs.)   S = Q . K_i^T as one m64n64 wgmma chain (Q read once a tile), the online
                                   softmax (row reductions inside each warp), P and alpha to shared memory for
                                   the PV warpgroup, then acc[:, :Dv/2] = acc * alpha + P @ V_i[:, :Dv/2]
    pv (4 warps, 160 registers)    acc[:, Dv/2:] = acc * alpha + P @ V_i[:, Dv/2:]

so tile i + 1 loads while tile i computes, and the softmax warpgroup's QK of tile i + 1 runs on the tensor cores
beside the PV warpgroup's half of tile i. Shared memory (576/512, bf16): Q 72 KiB, two latent tiles 144 KiB, P
8 KiB, alpha and the final row sums 0.5 KiB, 7 mbarriers: 230256 of sm_90's 232448 opt-in bytes. The math is
``mla.softmax_update``'s (base-2 online softmax; ``m_safe`` keeps an empty tile's -inf - -inf out), the split and
the epilogue ``mla._mla_decode_kernel``'s (an empty split stores zeros and lse -inf), except that a 16-bit
output, the unsplit result or a split's partials (``PARTIALS_16BIT``), is staged through shared memory that the
key loop no longer needs (``_store_half``) and stored as whole rows.

Scope (``in_scope``): 16-bit q and cache, the tl kernels' default 64-row tile (BLOCK_H 64, BLOCK_N 64, 8 warps,
2 stages) in either launcher (paged MLA; sparse MLA, whose pool rows are pages of one row and whose index -1
masks a key), Dv 256 or 512, Dqk - Dv in {0, 64}; on an sm_90 GPU with Triton 3.6's Gluon Hopper API (the
experimental dialect's API changes between releases, so other Triton versions take the tl kernels).
Elsewhere (other tiles, fp8 caches, the interpreter, other GPUs or Triton versions) the tl kernels run, and
``ENABLED = False`` makes them run here too (A/B runs, tests/gpu).

Unvalidated input (``splitlab.kernels._launch``, "Validation of values"): ``seq_lens`` is read through its stride;
a length outside the block table reads nothing and stores NaN; the loader clamps a block-table entry outside
``[0, num_pages)`` into the cache and skips a sparse index outside ``[-1, num_slots)``, so no copy leaves its
buffer, but the result for that request is undefined (the softmax partition, which does not read the map on the
paged path, is left as fast as it was). Paged launches need ``num_pages >= 1`` (``mla.mla_decode`` takes the tl
kernel for an empty cache).
"""

from __future__ import annotations

import torch
import triton

from splitlab.kernels import _launch as launch_common  # (``_launch`` below is this module's launcher)

try:  # Gluon's Hopper API as of triton 3.6; absent or different elsewhere (then the tl kernel runs)
    if not triton.__version__.startswith("3.6."):
        raise ImportError(f"Gluon kernels are written for triton 3.6, not {triton.__version__}")
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed triton
    HAVE_GLUON = False

BLOCK_H = 64
BLOCK_N = 64
NUM_WARPS = 8  # the tl tile's warps, which this kernel stands in for; it runs 3 partitions of 4 warps (12)
HEAD_DIMS_V = (256, 512)
HEAD_DIMS_R = (0, 64)
PARTITION_WARPS = 4  # each of the 3 partitions (the default one runs the launch's num_warps)
if HAVE_GLUON:
    # Registers a thread: 168 at launch (12 warps x 168 = 64512 of the SM's 65536), then reallocated per partition
    # (setmaxnreg): the loader 96, PV 160 (its 64 x 256 fp32 half of acc is 128), softmax the rest, 248.
    MAXNREG = 168
    PV_REGS = gl.constexpr(160)
    LOADER_REGS = gl.constexpr(96)
    PART_WARPS = gl.constexpr(PARTITION_WARPS)

if HAVE_GLUON:

    @gluon.jit
    def _tile_rows(map_row, map_stride, kv_stride_p, kv_stride_s, n0, end, num_rows, SPARSE: gl.constexpr,
                   PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr, CHECK: gl.constexpr):
        """(row offsets [BLOCK_N] int64 from ``kv_ptr``, valid) of the keys ``n0 + [0, BLOCK_N)`` in ``layout``
        (a SliceLayout over rows). Paged: ``map_row`` is the request's block table, a key's row is
        ``page * kv_stride_p + (key % PAGE_SIZE) * kv_stride_s``, valid below ``end``; sparse (PAGE_SIZE 1):
        ``map_row`` is the token's top-k indices, a row is ``index * kv_stride_p``, and an index of -1 is not
        valid (its offset is never read). With ``CHECK`` (the loader's copies) an entry outside ``[0, num_rows)``
        (unvalidated input) is never followed: a slot is not valid (as -1), a page is clamped into the cache (a
        mask would cost the loader registers it does not have: 24 bytes of spill, sm_90a, triton 3.6), so the copy
        stays in bounds and the result is undefined. 4 bytes of map per key (a page's repeats hit L1)."""
        pos = n0 + gl.arange(0, BLOCK_N, layout=layout)
        if SPARSE:
            entry = gl.load(map_row + pos * map_stride, mask=pos < end, other=-1)
            if CHECK:
                entry = gl.where(entry < num_rows, entry, -1)
            return entry.to(gl.int64) * kv_stride_p, entry >= 0
        page = gl.load(map_row + (pos // PAGE_SIZE) * map_stride, mask=pos < end, other=0)
        if CHECK:
            page = gl.minimum(gl.maximum(page, 0), num_rows - 1)  # num_rows >= 1 on this kernel (mla.mla_decode)
        return page.to(gl.int64) * kv_stride_p + (pos % PAGE_SIZE).to(gl.int64) * kv_stride_s, pos < end

    @gluon.jit
    def _copy_rows(smem, base_ptr, row_off, row_ok, col0, stride_d, NCOLS: gl.constexpr, layout: gl.constexpr):
        """cp.async of ``[rows, NCOLS]`` elements (columns ``col0 + [0, NCOLS)``) into ``smem``; rows that are
        not ``row_ok`` are zero-filled, not read. Bytes: rows * NCOLS * elt, 16 a copy."""
        cols = col0 + gl.arange(0, NCOLS, layout=gl.SliceLayout(0, layout))
        ptrs = base_ptr + row_off[:, None] + cols[None, :] * stride_d
        async_copy.async_copy_global_to_shared(smem, ptrs, mask=row_ok[:, None])

    @gluon.jit
    def _tile_offsets(map_row, map_stride, kv_stride_p, kv_stride_s, n0, end, num_rows, SPARSE: gl.constexpr,
                      PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, ROWS_V: gl.constexpr, ROWS_R: gl.constexpr):
        """``_tile_rows`` (range-checked) in the V part's and the rope part's copy layouts: (off_v, ok_v, off_r,
        ok_r)."""
        off_v, ok_v = _tile_rows(map_row, map_stride, kv_stride_p, kv_stride_s, n0, end, num_rows, SPARSE, PAGE_SIZE,
                                 BLOCK_N, ROWS_V, True)
        off_r, ok_r = _tile_rows(map_row, map_stride, kv_stride_p, kv_stride_s, n0, end, num_rows, SPARSE, PAGE_SIZE,
                                 BLOCK_N, ROWS_R, True)
        return off_v, ok_v, off_r, ok_r

    @gluon.jit
    def _copy_tile(v_smem, r_smem, kv_ptr, off_v, ok_v, off_r, ok_r, kv_stride_d, HEAD_DIM_V: gl.constexpr,
                   HEAD_DIM_R: gl.constexpr, CP_V: gl.constexpr, CP_R: gl.constexpr):
        """One latent tile (BLOCK_N x Dqk x 2 bytes) into a buffer: the V part and the rope part."""
        _copy_rows(v_smem, kv_ptr, off_v, ok_v, 0, kv_stride_d, HEAD_DIM_V, CP_V)
        if HEAD_DIM_R > 0:
            _copy_rows(r_smem, kv_ptr, off_r, ok_r, HEAD_DIM_V, kv_stride_d, HEAD_DIM_R, CP_R)

    @gluon.jit
    def _part_softmax(bufs, bars, n_tiles, start, end, qk_scale, map_row, map_stride_k, out_row, lse_row, head_tile,
                      num_heads, out_stride_h, out_stride_d, lse_stride_h, bad_len,
                      SPARSE: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM_V: gl.constexpr,
                      HEAD_DIM_R: gl.constexpr):
        """The default partition (4 warps): QK, the online softmax, P for the PV partition, the left half of PV,
        the row sums and lse, and the left half of the output (NaN, both halves, for a length out of range:
        ``bad_len``)."""
        q_v_smem, q_r_smem, kv_v_smem, kv_r_smem, p_smem, alpha_smem, l_smem = bufs
        q_ready, kv_ready, kv_free, p_ready, p_free, epi = bars
        dtype: gl.constexpr = q_v_smem.dtype
        HALF: gl.constexpr = HEAD_DIM_V // 2
        QK_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
        PV_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
        P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=PV_L, k_width=2)
        KEYS: gl.constexpr = gl.SliceLayout(0, QK_L)
        ROWS: gl.constexpr = gl.SliceLayout(1, QK_L)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=ROWS)
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=ROWS)
        acc = gl.zeros([BLOCK_H, HALF], gl.float32, layout=PV_L)
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=QK_L)
        mbarrier.wait(q_ready, 0)
        for i in range(n_tiles):
            buf = i % 2
            n0 = start + i * BLOCK_N
            mbarrier.wait(kv_ready.index(buf), (i // 2) & 1)
            # S = Q . K^T: m64n64 wgmma over the V and the rope columns (2 x BLOCK_H x BLOCK_N x Dqk FLOPs).
            kv_v = kv_v_smem.index(buf)
            s = warpgroup_mma(q_v_smem, kv_v.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            if HEAD_DIM_R > 0:
                s = warpgroup_mma(q_r_smem, kv_r_smem.index(buf).permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(0, deps=[s])
            if SPARSE:  # an index of -1 scores -inf (its row was zero-filled, never read)
                _, key_ok = _tile_rows(map_row, map_stride_k, 0, 0, n0, end, 0, True, 1, BLOCK_N, KEYS, False)
            else:
                key_ok = n0 + gl.arange(0, BLOCK_N, layout=KEYS) < end
            s = gl.where(key_ok[None, :], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_safe)
            p_f32 = gl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + gl.sum(p_f32, axis=1)
            m_i = m_new
            p = p_f32.to(dtype)
            # P (BLOCK_H x BLOCK_N x 2 bytes) and alpha to the PV partition, once it is done with tile i - 1's.
            mbarrier.wait(p_free, (i & 1) ^ 1)
            p_smem.store(p)
            alpha_smem.store(alpha)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(p_ready)
            # acc = acc * alpha + P @ V[:, :Dv/2] (P from registers; BLOCK_H x BLOCK_N x Dv FLOPs), then the
            # buffer is released (the PV partition releases it too: kv_free counts 2).
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, PV_L))[:, None]
            acc = warpgroup_mma(gl.convert_layout(p, P_L), kv_v.slice(0, HALF, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            gl.thread_barrier()
            mbarrier.arrive(kv_free.index(buf))
        # The row sums for the PV partition's epilogue; this half of the output and the lse (mla.store_head_tile:
        # an empty split stores zeros and -inf; a bad length NaN, paging.poison). Bytes: BLOCK_H x (Dv / 2 x out
        # elt + 4).
        l_i = gl.where(bad_len, float("nan"), l_i)
        l_smem.store(l_i)
        gl.thread_barrier()
        mbarrier.arrive(epi)
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, PV_L))
        m_o = gl.convert_layout(m_i, gl.SliceLayout(1, PV_L))
        empty = l_o == 0.0
        l_safe = gl.where(empty, 1.0, l_o)
        lse = gl.where(empty, float("-inf"), (m_o + gl.log2(l_safe)) * 0.6931471805599453)
        # Staged in Q's buffer: the last QK has read it, and only this partition reads Q.
        _store_half(acc, l_safe, q_v_smem, out_row, head_tile, num_heads, out_stride_h, out_stride_d, 0, BLOCK_H,
                    PV_L)
        offs_h = head_tile * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, PV_L))
        gl.store(lse_row + offs_h * lse_stride_h, lse, mask=offs_h < num_heads)

    @gluon.jit
    def _store_half(acc, l_safe, stage, out_row, head_tile, num_heads, out_stride_h, out_stride_d, col0,
                    BLOCK_H: gl.constexpr, layout: gl.constexpr):
        """``acc / l`` into the output columns ``col0 + [0, acc.shape[1])`` of the tile's head rows. Bytes:
        BLOCK_H x NCOL x out elt. From the wgmma layout a warp's store writes 8 rows x 4 threads x 2 elements: 32
        bytes a row in fp32 (whole sectors), 16 in bf16 / fp16 (half sectors). A 16-bit output (the unsplit
        output; the partials, ``PARTIALS_16BIT``) is therefore staged through ``stage`` (64 KiB of shared memory no
        partition reads any more) and stored as whole rows, 16 bytes a thread: 0.88x the decode's time at MLA-128
        B=64 1K, one split, 0.94x at sparse 64 heads, 128 tokens; staging fp32 partials was 0.98-1.04x
        (``store_ab.csv``, data/archive/bench/h200-kernel-v6)."""
        out_dtype: gl.constexpr = out_row.dtype.element_ty
        NCOL: gl.constexpr = acc.shape[1]
        vals = (acc / l_safe[:, None]).to(out_dtype)
        if out_dtype.primitive_bitwidth == 32:
            offs_h = head_tile * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, layout))
            offs_d = col0 + gl.arange(0, NCOL, layout=gl.SliceLayout(0, layout))
        else:
            VEC: gl.constexpr = 128 // out_dtype.primitive_bitwidth
            buf = stage._reinterpret(out_dtype, [BLOCK_H, NCOL],
                                     gl.SwizzledSharedLayout(vec=VEC, per_phase=1, max_phase=8, order=[1, 0]))
            buf.store(vals)
            gl.thread_barrier()
            ROW_L: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [PART_WARPS, 1], [1, 0])
            vals = buf.load(ROW_L)
            offs_h = head_tile * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ROW_L))
            offs_d = col0 + gl.arange(0, NCOL, layout=gl.SliceLayout(0, ROW_L))
        gl.store(out_row + offs_h[:, None] * out_stride_h + offs_d[None, :] * out_stride_d, vals,
                 mask=(offs_h < num_heads)[:, None])

    # The two worker partitions share one signature (Gluon's rule): the tile's geometry and addresses as scalars.

    @gluon.jit
    def _part_pv(bufs, bars, n_tiles, start, end, q_base, q_stride_h, q_stride_d, map_row, map_stride_k, kv_ptr,
                 kv_stride_p, kv_stride_s, kv_stride_d, out_row, head_tile, num_heads, out_stride_h, out_stride_d,
                 num_rows, SPARSE: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                 HEAD_DIM_V: gl.constexpr, HEAD_DIM_R: gl.constexpr):
        """A worker partition (4 warps): the right half of PV, from the softmax partition's P, and of the output."""
        q_v_smem, q_r_smem, kv_v_smem, kv_r_smem, p_smem, alpha_smem, l_smem = bufs
        q_ready, kv_ready, kv_free, p_ready, p_free, epi = bars
        HALF: gl.constexpr = HEAD_DIM_V // 2
        PV_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
        acc = gl.zeros([BLOCK_H, HALF], gl.float32, layout=PV_L)
        for i in range(n_tiles):
            buf = i % 2
            mbarrier.wait(p_ready, i & 1)  # (P of tile i implies tile i's buffer landed)
            alpha = alpha_smem.load(gl.SliceLayout(1, PV_L))
            # acc = acc * alpha + P @ V[:, Dv/2:] (P from shared memory; BLOCK_H x BLOCK_N x Dv FLOPs)
            acc = acc * alpha[:, None]
            acc = warpgroup_mma(p_smem, kv_v_smem.index(buf).slice(HALF, HALF, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            gl.thread_barrier()
            mbarrier.arrive(p_free)
            mbarrier.arrive(kv_free.index(buf))
        mbarrier.wait(epi, 0)
        l_o = l_smem.load(gl.SliceLayout(1, PV_L))
        # Staged in the last tile's buffer (1 when there was none; the loader zero-fills buffer 0 for an empty
        # split): the softmax partition's last PV is done once ``epi`` has passed, and nothing loads after it.
        _store_half(acc, gl.where(l_o == 0.0, 1.0, l_o), kv_v_smem.index((n_tiles + 1) % 2), out_row, head_tile,
                    num_heads, out_stride_h, out_stride_d, HALF, BLOCK_H, PV_L)

    @gluon.jit
    def _part_load(bufs, bars, n_tiles, start, end, q_base, q_stride_h, q_stride_d, map_row, map_stride_k, kv_ptr,
                   kv_stride_p, kv_stride_s, kv_stride_d, out_row, head_tile, num_heads, out_stride_h, out_stride_d,
                   num_rows, SPARSE: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_H: gl.constexpr,
                   BLOCK_N: gl.constexpr, HEAD_DIM_V: gl.constexpr, HEAD_DIM_R: gl.constexpr):
        """A worker partition (4 warps): Q, then every latent tile into the buffer its predecessor but one left.
        Bytes: BLOCK_H x Dqk x 2 once, BLOCK_N x Dqk x 2 a tile (plus 4 of map per key)."""
        q_v_smem, q_r_smem, kv_v_smem, kv_r_smem, p_smem, alpha_smem, l_smem = bufs
        q_ready, kv_ready, kv_free, p_ready, p_free, epi = bars
        # 8 elements (16 bytes) a thread; a warp covers a row of 256 (V part) or 4 rows of 64 (rope part).
        CP_V: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
        CP_R: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        ROWS_V: gl.constexpr = gl.SliceLayout(1, CP_V)
        ROWS_R: gl.constexpr = gl.SliceLayout(1, CP_R)
        # Q (rows past num_heads read as 0 and are never stored) and tile 0 fly together: one memory latency before
        # the first QK, not two. Q is the older commit group, so waiting down to one group in flight lands it.
        h_v = head_tile * BLOCK_H + gl.arange(0, BLOCK_H, layout=ROWS_V)
        h_r = head_tile * BLOCK_H + gl.arange(0, BLOCK_H, layout=ROWS_R)
        off_v, ok_v, off_r, ok_r = _tile_offsets(map_row, map_stride_k, kv_stride_p, kv_stride_s, start, end, num_rows,
                                                 SPARSE, PAGE_SIZE, BLOCK_N, ROWS_V, ROWS_R)
        _copy_tile(q_v_smem, q_r_smem, q_base, h_v.to(gl.int64) * q_stride_h, h_v < num_heads,
                   h_r.to(gl.int64) * q_stride_h, h_r < num_heads, q_stride_d, HEAD_DIM_V, HEAD_DIM_R, CP_V, CP_R)
        async_copy.commit_group()
        _copy_tile(kv_v_smem.index(0), kv_r_smem.index(0), kv_ptr, off_v, ok_v, off_r, ok_r, kv_stride_d, HEAD_DIM_V,
                   HEAD_DIM_R, CP_V, CP_R)  # (an empty split: every row masked, nothing read)
        async_copy.commit_group()
        async_copy.wait_group(1)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(q_ready)
        off_v, ok_v, off_r, ok_r = _tile_offsets(map_row, map_stride_k, kv_stride_p, kv_stride_s, start + BLOCK_N, end,
                                                 num_rows, SPARSE, PAGE_SIZE, BLOCK_N, ROWS_V, ROWS_R)
        _landed(kv_ready.index(0))  # (an empty split's arrive is never waited on)
        for i in range(1, n_tiles):
            buf = i % 2
            mbarrier.wait(kv_free.index(buf), ((i // 2) & 1) ^ 1)  # (a fresh barrier passes parity 1)
            _copy_tile(kv_v_smem.index(buf), kv_r_smem.index(buf), kv_ptr, off_v, ok_v, off_r, ok_r, kv_stride_d,
                       HEAD_DIM_V, HEAD_DIM_R, CP_V, CP_R)
            # The next tile's map entries, read while this tile's copies fly.
            off_v, ok_v, off_r, ok_r = _tile_offsets(map_row, map_stride_k, kv_stride_p, kv_stride_s,
                                                     start + (i + 1) * BLOCK_N, end, num_rows, SPARSE, PAGE_SIZE,
                                                     BLOCK_N, ROWS_V, ROWS_R)
            _landed(kv_ready.index(buf))

    @gluon.jit
    def _landed(bar):
        """The loader's copies so far have landed: visible to the wgmma (async proxy) of the partition that waits
        on ``bar``, which this arrives on once every loader thread is past its own copies."""
        async_copy.commit_group()
        async_copy.wait_group(0)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(bar)

    @gluon.jit
    def _mla_sm90_kernel(
        q_ptr, kv_ptr, map_ptr, seq_lens_ptr, out_ptr, lse_ptr,
        num_heads, num_head_tiles, num_splits, num_keys, qk_scale,
        seq_lens_stride, num_rows, max_keys,  # num_rows: pages (paged) or pool slots (sparse)
        q_stride_b, q_stride_h, q_stride_d,
        kv_stride_p, kv_stride_s, kv_stride_d,
        map_stride_b, map_stride_k,
        out_stride_b, out_stride_h, out_stride_s, out_stride_d,
        lse_stride_b, lse_stride_h, lse_stride_s,
        SPARSE: gl.constexpr, PAGE_SIZE: gl.constexpr, HEAD_DIM_V: gl.constexpr, HEAD_DIM_R: gl.constexpr,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, num_warps: gl.constexpr,
    ):
        # One program per (request or token b, split, head tile), head tile fastest (as mla._mla_decode_kernel:
        # the head tiles of one split run side by side and share its latent tiles through L2).
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        SM_L: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        VEC_L: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        RD: gl.constexpr = HEAD_DIM_R if HEAD_DIM_R > 0 else 16  # (an unused rope buffer when Dqk == Dv)
        pid = gl.program_id(0)
        head_tile = pid % num_head_tiles
        rest = pid // num_head_tiles
        split = rest % num_splits
        b = rest // num_splits
        if SPARSE:
            seq_len = num_keys  # every token has top-k candidates
        else:
            seq_len = gl.load(seq_lens_ptr + b.to(gl.int64) * seq_lens_stride)
        # A length outside [0, max_keys] (the block table's columns x PAGE_SIZE) reads nothing and stores NaN.
        bad_len = (seq_len < 0) | (seq_len > max_keys)
        seq_len = gl.where(bad_len, 0, seq_len)
        split_size = gl.cdiv(gl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        start = split * split_size
        end = gl.minimum(start + split_size, seq_len)
        n_tiles = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)

        q_v_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, HEAD_DIM_V], SM_L)
        q_r_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, RD], SM_L)
        kv_v_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HEAD_DIM_V], SM_L)
        kv_r_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, RD], SM_L)
        p_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, BLOCK_N], SM_L)
        alpha_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], VEC_L)
        l_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], VEC_L)
        # Barriers: Q and each buffer landed (loader -> softmax), each buffer free (softmax and PV -> loader), P
        # ready and consumed (softmax <-> PV), the final row sums ready (softmax -> PV).
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        kv_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        epi = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        for j in gl.static_range(2):
            mbarrier.init(kv_ready.index(j), count=1)
            mbarrier.init(kv_free.index(j), count=2)
        mbarrier.init(p_ready, count=1)
        mbarrier.init(p_free, count=1)
        mbarrier.init(epi, count=1)

        q_base = q_ptr + b.to(gl.int64) * q_stride_b
        map_row = map_ptr + b.to(gl.int64) * map_stride_b
        out_row = out_ptr + b.to(gl.int64) * out_stride_b + split * out_stride_s
        lse_row = lse_ptr + b.to(gl.int64) * lse_stride_b + split * lse_stride_s
        bufs = (q_v_smem, q_r_smem, kv_v_smem, kv_r_smem, p_smem, alpha_smem, l_smem)
        bars = (q_ready, kv_ready, kv_free, p_ready, p_free, epi)
        gl.warp_specialize([
            (_part_softmax, (bufs, bars, n_tiles, start, end, qk_scale, map_row, map_stride_k, out_row, lse_row,
                             head_tile, num_heads, out_stride_h, out_stride_d, lse_stride_h, bad_len, SPARSE, BLOCK_H,
                             BLOCK_N, HEAD_DIM_V, HEAD_DIM_R)),
            (_part_pv, (bufs, bars, n_tiles, start, end, q_base, q_stride_h, q_stride_d, map_row, map_stride_k,
                        kv_ptr, kv_stride_p, kv_stride_s, kv_stride_d, out_row, head_tile, num_heads, out_stride_h,
                        out_stride_d, num_rows, SPARSE, PAGE_SIZE, BLOCK_H, BLOCK_N, HEAD_DIM_V, HEAD_DIM_R)),
            (_part_load, (bufs, bars, n_tiles, start, end, q_base, q_stride_h, q_stride_d, map_row, map_stride_k,
                          kv_ptr, kv_stride_p, kv_stride_s, kv_stride_d, out_row, head_tile, num_heads, out_stride_h,
                          out_stride_d, num_rows, SPARSE, PAGE_SIZE, BLOCK_H, BLOCK_N, HEAD_DIM_V, HEAD_DIM_R)),
        ], [PART_WARPS, PART_WARPS], [PV_REGS, LOADER_REGS])


#: Off: ``mla_decode`` always launches the tl kernel (for A/B runs; tests/gpu compares the two paths).
ENABLED = True
#: A split launch of this kernel stores its partial outputs in q's (16-bit) dtype, staged into whole rows by the
#: epilogue (``_store_half``); the combine reads them as fp32. An H200 A/B (``partials_ab.csv`` in
#: data/archive/bench/h200-kernel-v6, graph replay, alternating) at the 11 split shapes of this tile: 0.85-0.98x the
#: decode's time with fp32 partials (MLA-128 B=8 8K, 8 splits, 54.3 -> 51.2 us; sparse 64 heads, 8 tokens, 16
#: splits, 21.2 -> 18.0), relative error against fp64 1.7-2.4e-3 (fp32 partials: 1.7-2.0e-3). The tl kernels keep
#: fp32 partials: their 64-row tile spills with 16-bit ones, and their 16-row tile gained only 0.95-1.0x.
#: Off: fp32 partials here too (A/B runs).
PARTIALS_16BIT = True
#: The order its programs are issued in: head tile fastest, then split, then request or token, as ``mla`` and
#: ``sparse_mla`` issue theirs.
GRID_ORDER = "request-major"


def partial_dtype(dtype: torch.dtype, sm90: bool) -> torch.dtype:
    """The dtype of a split launch's partial outputs: q's on this kernel (``sm90``, ``PARTIALS_16BIT``), else
    fp32."""
    return dtype if sm90 and PARTIALS_16BIT else torch.float32


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
    if not (ENABLED and HAVE_GLUON) or launch_common.INTERPRET or not q.is_cuda:
        return False
    return (in_scope(q.dtype, kv_dtype, head_dim_qk, head_dim_v, block_h, block_n, num_warps, num_stages)
            and torch.cuda.get_device_capability(q.device)[0] == 9)


def launch_paged(grid: tuple[int], q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, num_splits: int, qk_scale: float,
                 out_strides: tuple[int, ...], lse_strides: tuple[int, ...], head_dim_v: int) -> None:
    """``mla.mla_decode``'s launch (its outputs and split; ``qk_scale`` in base 2) on the Gluon kernel; a length
    past the block table's columns x page size is out of range."""
    page_size = kv_cache.shape[1]
    _launch(grid, q, kv_cache, kv_cache.stride(), block_table, seq_lens, 0, out, lse, num_splits, qk_scale,
            out_strides, lse_strides, head_dim_v, sparse=False, page_size=page_size,
            seq_lens_stride=seq_lens.stride(0), num_rows=kv_cache.shape[0], max_keys=block_table.shape[1] * page_size)


def launch_sparse(grid: tuple[int], q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor, num_splits: int, qk_scale: float,
                  out_strides: tuple[int, ...], lse_strides: tuple[int, ...], head_dim_v: int) -> None:
    """``sparse_mla.sparse_mla_decode``'s launch on the Gluon kernel: a pool row is a page of one row."""
    stride_n, stride_d = kv_cache.stride()
    _launch(grid, q, kv_cache, (stride_n, 0, stride_d), indices, indices, indices.shape[1], out, lse, num_splits,
            qk_scale, out_strides, lse_strides, head_dim_v, sparse=True, page_size=1, seq_lens_stride=0,
            num_rows=kv_cache.shape[0], max_keys=indices.shape[1])


def _launch(grid, q, kv_cache, kv_strides, key_map, seq_lens, num_keys, out, lse, num_splits, qk_scale,
            out_strides, lse_strides, head_dim_v, *, sparse, page_size, seq_lens_stride, num_rows, max_keys):
    H = q.shape[1]
    _mla_sm90_kernel[grid](
        q, kv_cache, key_map, seq_lens, out, lse,
        H, -(-H // BLOCK_H), num_splits, num_keys, qk_scale,
        seq_lens_stride, num_rows, max_keys,
        *q.stride(), *kv_strides, *key_map.stride(), *out_strides, *lse_strides,
        SPARSE=sparse, PAGE_SIZE=page_size, HEAD_DIM_V=head_dim_v, HEAD_DIM_R=q.shape[2] - head_dim_v,
        BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, num_warps=PARTITION_WARPS, maxnreg=MAXNREG,
    )
