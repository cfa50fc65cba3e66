"""The 128-row GQA tile (MQA-128: 65-128 query heads on one kv head) on Hopper, warp-specialized in Gluon.

Why a second kernel. ``gqa._gqa_partial_kernel`` runs MQA-128 as one program of 8 warps over a [128, D] tile:
its two warpgroups each own 64 query rows, but they run in lockstep (one instruction stream), so every
tile's softmax leaves the tensor cores idle, and Triton's pipeliner keeps two K/V tiles in flight. Here
(``gl.warp_specialize``) the rows are two independent partitions, and the loads a third:

    load (4 warps, 96 registers)      Q once; then the K and V tiles of key tile i into buffer i % NUM_BUF
                                      (cp.async gathers, rows past the split's end zero-filled), up to
                                      NUM_BUF - 1 tiles ahead of the consumers, each signalled when it landed
    rows 0-63 (4 warps, 232 regs.)    S = Q[0:64] . K_i^T (m64n64 wgmma), the online softmax (row reductions
    rows 64-127 (4 warps, 176 regs.)  inside each warp), acc = acc * alpha + P @ V_i (P from registers); then
                                      both release the buffer

The two row partitions share nothing but the buffers, so one's softmax runs while the other's wgmma does.
Shared memory (D 128, bf16): Q 32 KB + NUM_BUF x (K + V: 32 KB) = 192 KB at 5 buffers. The math is
``gqa._gqa_partial_kernel``'s (base-2 online softmax; every tile has a live key, so the running max is
finite), and so are the split (each request cuts its own keys into tile-aligned splits) and the epilogue (an
empty split stores zeros and lse -inf).

Scope (``in_scope``): 16-bit q and caches, a group padded to 128 rows, D 64 or 128, the tl kernel's default tile
for it (BLOCK_N 64, 8 warps, 3 stages); any page size; on an sm_90 GPU with Triton's Gluon Hopper API (3.6).
``gqa.gqa_decode`` takes this path where ``use_sm90`` says so and the tl kernel everywhere else
(``ENABLED = False``: always).
"""

from __future__ import annotations

import torch

from splitlab.kernels import mla_sm90

HAVE_GLUON = mla_sm90.HAVE_GLUON
if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from splitlab.kernels.mla_sm90 import _copy_rows

BLOCK_G = 128
BLOCK_N = 64
HEAD_DIMS = (64, 128)
NUM_BUF = 5
PARTITION_WARPS = 4
MAXNREG = 168  # 12 warps x 168 = 64512 registers of the SM's 65536, reallocated per partition below
if HAVE_GLUON:
    ROWS_HI_REGS = gl.constexpr(176)
    LOADER_REGS = gl.constexpr(96)

#: Off: ``gqa_decode`` always launches the tl kernel (A/B runs; tests/gpu runs both).
ENABLED = True


if HAVE_GLUON:

    @gluon.jit
    def _rows(args, strides_d, PAGE_SIZE: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_G: gl.constexpr,
              BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, ROW0: gl.constexpr):
        """A row partition: query rows ``ROW0 + [0, 64)`` of the group, every key tile of the split."""
        (bufs, bars, n_tiles, start, end, qk_scale, b, kvh, group, split, q_base, q_stride_h, bt_row, bt_stride_p,
         k_head, k_stride_p, k_stride_s, v_head, v_stride_p, v_stride_s, out_ptr, out_stride_b, out_stride_h,
         out_stride_s, lse_ptr, lse_stride_b, lse_stride_h, lse_stride_s) = args
        q_stride_d, k_stride_d, v_stride_d, out_stride_d = strides_d
        q_smem, k_smem, v_smem = bufs
        q_ready, kv_ready, kv_free = bars
        M: gl.constexpr = 64
        QK_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
        PV_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
        P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=PV_L, k_width=2)
        dtype: gl.constexpr = q_smem.dtype
        q_rows = q_smem.slice(ROW0, M, dim=0)
        m_i = gl.full([M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, QK_L))
        l_i = gl.zeros([M], gl.float32, layout=gl.SliceLayout(1, QK_L))
        acc = gl.zeros([M, HEAD_DIM], gl.float32, layout=PV_L)
        s_zero = gl.zeros([M, BLOCK_N], gl.float32, layout=QK_L)
        mbarrier.wait(q_ready, 0)
        for i in range(n_tiles):
            buf = i % NUM_BUF
            n0 = start + i * BLOCK_N
            mbarrier.wait(kv_ready.index(buf), (i // NUM_BUF) & 1)
            # S = Q . K^T (2 x 64 x BLOCK_N x D FLOPs), log2 domain; keys past the split's end score -inf.
            s = warpgroup_mma(q_rows, k_smem.index(buf).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=[s])
            key_ok = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, QK_L)) < end
            s = gl.where(key_ok[None, :], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))  # finite: the tile has a live key
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            # acc = acc * alpha + P @ V (2 x 64 x BLOCK_N x D FLOPs; P from registers), then release the buffer.
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, PV_L))[:, None]
            acc = warpgroup_mma(gl.convert_layout(p.to(dtype), P_L), v_smem.index(buf), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            gl.thread_barrier()
            mbarrier.arrive(kv_free.index(buf))
        # Epilogue (gqa._gqa_partial_kernel's). Bytes: 64 x (D x out elt + 4).
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, PV_L))
        m_o = gl.convert_layout(m_i, gl.SliceLayout(1, PV_L))
        empty = l_o == 0.0
        l_safe = gl.where(empty, 1.0, l_o)
        lse = gl.where(empty, float("-inf"), (m_o + gl.log2(l_safe)) * 0.6931471805599453)
        r = ROW0 + gl.arange(0, M, layout=gl.SliceLayout(1, PV_L))
        heads = kvh * group + r
        offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, PV_L))
        out_row = out_ptr + b.to(gl.int64) * out_stride_b + split * out_stride_s
        gl.store(out_row + heads[:, None] * out_stride_h + offs_d[None, :] * out_stride_d,
                 (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=(r < group)[:, None])
        lse_row = lse_ptr + b.to(gl.int64) * lse_stride_b + split * lse_stride_s
        gl.store(lse_row + heads * lse_stride_h, lse, mask=r < group)

    @gluon.jit
    def _rows_lo(args, strides_d, PAGE_SIZE: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_G: gl.constexpr,
                 BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr):
        """The default partition: rows 0-63."""
        _rows(args, strides_d, PAGE_SIZE, HEAD_DIM, BLOCK_G, BLOCK_N, NUM_BUF, 0)

    @gluon.jit
    def _rows_hi(args, strides_d, PAGE_SIZE: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_G: gl.constexpr,
                 BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr):
        """A worker partition: rows 64-127."""
        _rows(args, strides_d, PAGE_SIZE, HEAD_DIM, BLOCK_G, BLOCK_N, NUM_BUF, 64)

    @gluon.jit
    def _load(args, strides_d, PAGE_SIZE: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_G: gl.constexpr,
              BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr):
        """A worker partition: Q, then every key tile's K and V (2 x BLOCK_N x D x elt bytes; 4 bytes of block
        table a key), up to NUM_BUF - 1 tiles ahead; a tile is signalled once its copies have landed."""
        (bufs, bars, n_tiles, start, end, qk_scale, b, kvh, group, split, q_base, q_stride_h, bt_row, bt_stride_p,
         k_head, k_stride_p, k_stride_s, v_head, v_stride_p, v_stride_s, out_ptr, out_stride_b, out_stride_h,
         out_stride_s, lse_ptr, lse_stride_b, lse_stride_h, lse_stride_s) = args
        q_stride_d, k_stride_d, v_stride_d, out_stride_d = strides_d
        q_smem, k_smem, v_smem = bufs
        q_ready, kv_ready, kv_free = bars
        TPW_D: gl.constexpr = HEAD_DIM // 8  # threads along a row: 8 elements (16 bytes) each
        CP: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPW_D, TPW_D], [4, 1], [1, 0])
        ROWS: gl.constexpr = gl.SliceLayout(1, CP)
        LAG: gl.constexpr = NUM_BUF - 1
        # Q: rows past the group read as 0 and are never stored (Bytes: 128 x D x elt).
        r = gl.arange(0, BLOCK_G, layout=ROWS)
        _copy_rows(q_smem, q_base, (kvh * group + r).to(gl.int64) * q_stride_h, r < group, 0, q_stride_d, HEAD_DIM,
                   CP)
        async_copy.commit_group()
        async_copy.wait_group(0)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(q_ready)
        # The block-table entries are read three tiles ahead and carried (a dependent load in front of each tile's
        # copies would put one memory latency on every tile).
        pg0 = _tile_pages(bt_row, bt_stride_p, start, end, PAGE_SIZE, BLOCK_N, ROWS)
        pg1 = _tile_pages(bt_row, bt_stride_p, start + BLOCK_N, end, PAGE_SIZE, BLOCK_N, ROWS)
        pg2 = _tile_pages(bt_row, bt_stride_p, start + 2 * BLOCK_N, end, PAGE_SIZE, BLOCK_N, ROWS)
        for i in range(n_tiles + LAG):
            if i < n_tiles:
                buf = i % NUM_BUF
                mbarrier.wait(kv_free.index(buf), ((i // NUM_BUF) & 1) ^ 1)  # (a fresh barrier passes parity 1)
                pos = start + i * BLOCK_N + gl.arange(0, BLOCK_N, layout=ROWS)
                ok = pos < end
                page = pg0.to(gl.int64)
                slot = (pos % PAGE_SIZE).to(gl.int64)
                _copy_rows(k_smem.index(buf), k_head, page * k_stride_p + slot * k_stride_s, ok, 0, k_stride_d,
                           HEAD_DIM, CP)
                _copy_rows(v_smem.index(buf), v_head, page * v_stride_p + slot * v_stride_s, ok, 0, v_stride_d,
                           HEAD_DIM, CP)
            pg0 = pg1
            pg1 = pg2
            pg2 = _tile_pages(bt_row, bt_stride_p, start + (i + 3) * BLOCK_N, end, PAGE_SIZE, BLOCK_N, ROWS)
            async_copy.commit_group()  # (empty past the last tile: keeps one group per iteration)
            j = i - LAG
            if j >= 0:  # tile j's group has landed once at most LAG newer ones are in flight
                async_copy.wait_group(LAG)
                fence_async_shared()
                gl.thread_barrier()
                mbarrier.arrive(kv_ready.index(j % NUM_BUF))

    @gluon.jit
    def _tile_pages(bt_row, bt_stride_p, n0, end, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr,
                    layout: gl.constexpr):
        """The page of each key ``n0 + [0, BLOCK_N)`` (int32, in ``layout``; 0 past ``end``)."""
        pos = n0 + gl.arange(0, BLOCK_N, layout=layout)
        return gl.load(bt_row + (pos // PAGE_SIZE) * bt_stride_p, mask=pos < end, other=0)

    @gluon.jit
    def _mqa_sm90_kernel(
        q_ptr, k_ptr, v_ptr, bt_ptr, seq_lens_ptr, out_ptr, lse_ptr,
        qk_scale, num_kv_heads, group, num_splits,
        q_stride_b, q_stride_h, q_stride_d,
        k_stride_p, k_stride_s, k_stride_h, k_stride_d,
        v_stride_p, v_stride_s, v_stride_h, v_stride_d,
        bt_stride_b, bt_stride_p,
        out_stride_b, out_stride_h, out_stride_s, out_stride_d,
        lse_stride_b, lse_stride_h, lse_stride_s,
        PAGE_SIZE: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_G: gl.constexpr, BLOCK_N: gl.constexpr,
        NUM_BUF: gl.constexpr, num_warps: gl.constexpr,
    ):
        # Grid (B * Hkv, S), as gqa._gqa_partial_kernel's.
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        SM_L: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        pid_bh = gl.program_id(0)
        split = gl.program_id(1)
        b = pid_bh // num_kv_heads
        kvh = pid_bh % num_kv_heads
        seq_len = gl.load(seq_lens_ptr + b)
        split_len = gl.cdiv(gl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        start = split * split_len
        end = gl.minimum(start + split_len, seq_len)
        n_tiles = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)

        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_G, HEAD_DIM], SM_L)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_N, HEAD_DIM], SM_L)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_N, HEAD_DIM], SM_L)
        # Barriers: Q landed, each buffer landed (loader -> rows), each buffer free (both row partitions -> loader).
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
        kv_free = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        for j in gl.static_range(NUM_BUF):
            mbarrier.init(kv_ready.index(j), count=1)
            mbarrier.init(kv_free.index(j), count=2)

        b64 = b.to(gl.int64)
        # (The unit strides go in a tuple built in the call itself, as the constexprs do: a tuple held in a
        # variable passes its members as runtime values, and the copies would lose their 16-byte vectors.)
        args = ((q_smem, k_smem, v_smem), (q_ready, kv_ready, kv_free), n_tiles, start, end, qk_scale, b, kvh, group,
                split, q_ptr + b64 * q_stride_b, q_stride_h, bt_ptr + b64 * bt_stride_b, bt_stride_p,
                k_ptr + kvh.to(gl.int64) * k_stride_h, k_stride_p, k_stride_s,
                v_ptr + kvh.to(gl.int64) * v_stride_h, v_stride_p, v_stride_s,
                out_ptr, out_stride_b, out_stride_h, out_stride_s, lse_ptr, lse_stride_b, lse_stride_h, lse_stride_s)
        gl.warp_specialize([
            (_rows_lo, (args, (q_stride_d, k_stride_d, v_stride_d, out_stride_d), PAGE_SIZE, HEAD_DIM, BLOCK_G, BLOCK_N,
                        NUM_BUF)),
            (_rows_hi, (args, (q_stride_d, k_stride_d, v_stride_d, out_stride_d), PAGE_SIZE, HEAD_DIM, BLOCK_G, BLOCK_N,
                        NUM_BUF)),
            (_load, (args, (q_stride_d, k_stride_d, v_stride_d, out_stride_d), PAGE_SIZE, HEAD_DIM, BLOCK_G, BLOCK_N,
                     NUM_BUF)),
        ], [4, 4], [ROWS_HI_REGS, LOADER_REGS])  # PARTITION_WARPS each


def in_scope(dtype: torch.dtype, group: int, head_dim: int, block_n: int, num_warps: int, num_stages: int) -> bool:
    """Whether a launch's dtype, group, head dim and tile are the Gluon kernel's (the module docstring)."""
    return (dtype in (torch.bfloat16, torch.float16) and 64 < group <= BLOCK_G and head_dim in HEAD_DIMS
            and (block_n, num_warps, num_stages) == (BLOCK_N, 8, 3))


def use_sm90(q: torch.Tensor, group: int, block_n: int, num_warps: int, num_stages: int) -> bool:
    """Whether ``gqa_decode`` launches the Gluon kernel: ``ENABLED``, Gluon's Hopper API, not under the
    interpreter, q on an sm_90 GPU, and ``in_scope``."""
    from splitlab.kernels import _launch

    if not (ENABLED and HAVE_GLUON) or _launch.INTERPRET or not q.is_cuda:
        return False
    return (in_scope(q.dtype, group, q.shape[2], block_n, num_warps, num_stages)
            and torch.cuda.get_device_capability(q.device)[0] == 9)


def launch(grid: tuple[int, int], q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           block_table: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
           qk_scale: float, group: int, num_splits: int, out_strides: tuple[int, ...],
           lse_strides: tuple[int, ...]) -> None:
    """``gqa.gqa_decode``'s partial launch (its outputs, grid and split; ``qk_scale`` in base 2) on the Gluon
    kernel."""
    _mqa_sm90_kernel[grid](
        q, k_cache, v_cache, block_table, seq_lens, out, lse,
        qk_scale, k_cache.shape[2], group, num_splits,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_table.stride(), *out_strides, *lse_strides,
        PAGE_SIZE=k_cache.shape[1], HEAD_DIM=q.shape[2], BLOCK_G=BLOCK_G, BLOCK_N=BLOCK_N, NUM_BUF=NUM_BUF,
        num_warps=PARTITION_WARPS, maxnreg=MAXNREG,
    )
