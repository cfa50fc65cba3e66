"""Paged MQA decode (GQA with one kv head and 64 or 128 query heads, D = 128) on a work list, in Gluon for Hopper
(sm_90a): one CTA holds every query head of its item, two consumer warpgroups of 64 heads share each K and V tile
that a producer warp streams into shared memory by TMA.

The work-list launchers' MQA tile (kernel version 7): ``worklist.gqa_decode_scheduled`` and
``decode_plan.GQADecodePlan`` run it where ``use_ws`` and ``cache_ok`` say so; the split-count ``gqa.gqa_decode``
keeps its tile. Measured on the H200 against that tile and the peers in ``experiments/mqa_ws/`` (1.12-1.16x the tl
work-list tile).

Why: 128 query heads on one kv head is MLA's shape at D = 128. The tl work-list tile holds the
group in one program whose ``tl.dot`` pipeline serialises QK, softmax and PV; here the machinery of
``kernels.mla_sm90_ws`` (FlashMLA's warp specialization: a TMA producer warp, consumer warpgroups running wgmma)
carries it, without MLA's split output: each consumer owns 64 heads and its whole 64 x 128 fp32 output, so the two
run independent online softmaxes over the same tiles (no shared running max) and the warp schedulers interleave one
consumer's softmax with the other's GEMMs.

Per 64-key tile t, in buffer ``t % stages``:

    producer: K_t (once both consumers released K_{t-stages}), then V_t (once both released V_{t-stages})
    consumer w (heads 64w .. 64w + 63):  S = Q_w K_t^T (2 x m64n64k16 chains over D) -> release K_t
                                         m, alpha, P = online softmax of S (base 2, keys past the item's end -inf)
                                         O_w = O_w alpha + P V_t (m64n128k16, P from registers) -> release V_t

so K_{t+1} lands while the consumers still run tile t's softmax and PV. Bytes per tile: K and V 2 x 64 x 128 x elt
(32 KiB at 16 bits) read once per CTA for all 128 heads, the tile's page entries (4 bytes a box); Q 128 x 128 x elt
once an item; writes 128 x 128 x (elt or 4) + 128 x 4. FLOPs per tile: 2 x 2 x 128 x 64 x 128.

Pages. A tile is ``BLOCK_N`` (64) keys; it lands as boxes of ``BOX = min(page_size, 64)`` rows (one page each at
page 16 and 32, a part of one page at 64 and above), each box as two 64-column TMA copies (128 bytes a row, the
swizzle width). Boxes at or past the item's end are not copied; their rows (and the rows past the end of a box that
is) are masked: scores -inf, and each consumer zeroes those rows of V before its PV GEMM (0 x NaN would poison the
row; both consumers write the same zeros, so their overlap is benign).

Rules (those of ``worklist._gqa_worklist_kernel``, so that ``worklist.launch_merge`` completes a launch): an item of
a request with one item writes its output row and lse directly, any other its partial row (fp32) and lse; an item
outside ``[0, max_keys]`` or a block-table entry outside ``[0, num_pages)`` makes the request NaN (a TMA box outside
the cache reads zeros, never memory outside it); NaN keys propagate; an empty request writes zeros and lse -inf.

Shared memory (16-bit): Q 32 KiB, ``stages`` x (K 16 + V 16) KiB, two 32 KiB fp32 output stages (the epilogue
writes rows 16 at a time from them), barriers: 160 KiB at ``stages=2`` (the default), 192 KiB at 3
(``STAGE_CHOICES``, a constexpr, so that an A/B times both: more bytes in flight an SM, one CTA an SM either way).
Partitions and registers as ``mla_sm90_ws`` (imported: consumer 0 the default partition, consumer 1, the producer
warp); with 64 heads consumer 1 idles and the release barriers count one arrival.

Scope (``check_launch``, else one ``SplitlabError`` line): q ``[B, 64 or 128, 128]`` and K/V caches ``[pages,
page_size, 1, 128]`` of one 16-bit dtype; page size 16, 32 or a multiple of 64; each cache's rows contiguous,
16-byte aligned, pages back to back (one 2-D TMA tensor of rows), fewer than 2^31 rows; q read as rows of
``[B * H, 128]`` (copied contiguous where its strides are not that); a non-persistent schedule whose items start at
multiples of ``BOX`` (the persistent kernel: any schedule so aligned); an sm_90 GPU with triton 3.6's Gluon, not the
interpreter.

A plan's launches, as ``mla_sm90_ws``'s: ``BOUNDED`` (a capacity grid; programs past the plan's slot count exit at
once) and ``TIMELINE`` (consumer 0 writes the program's ``kernels.timeline`` record).

The persistent kernel (``PERSISTENT``; ``launch``'s ``cta_offsets``, the work list's; ``mqa_decode_ws(...,
persistent=True)``; opt-in: ``PERSISTENT_ENABLED`` off, the work-list launchers run one item a slot): one program a
CTA slot walks the slot's items ``cta_offsets[slot] .. cta_offsets[slot + 1]`` in order (``mla_sm90_ws``'s
persistent seesaw, on this kernel), so that an item pays no CTA prologue and the next item's copies start while this
one finishes. Each partition carries across items the slot's tile count (tile g in buffer g % stages, its K / V
ready and free phases (g // stages) mod 2) and its count of non-empty items (the phases of ``q_ready`` and of one
more barrier, ``q_free``: every consumer arrives once its item's last QK GEMM is done). The producer issues the next
item's first K and V tile as soon as their buffer is released (during this item's last tile), then its Q once
``q_free`` completes. The epilogue needs no buffer the producer fills (each consumer stages through its own output
stage), so no release waits on it. An empty item (or one outside ``[0, max_keys]``) copies nothing and writes its
zeros (NaN) and lse -inf (NaN) as the one-item kernel does; output rows and partial rows are the one-item kernel's.
Shared memory 32 bytes more (164240 at 128 heads and 2 stages). The one-item build compiles to the same PTX as
before the persistent one was added (compared instruction by instruction). Compiled for sm_90a without spills
(``tests/test_compile_mqa_ws.py``); its protocol is modelled in ``tests/test_mqa_ws_scope.py``; on a GPU
(``experiments/mqa_ws``, "The persistent MQA kernel") it passes every check and is not faster, so it stays opt-in.
"""

from __future__ import annotations

import torch

from splitlab.errors import SplitlabError
from splitlab.kernels import _launch as launch_common
from splitlab.kernels.bound_launch import launch_cached
from splitlab.kernels.mla_sm90 import HAVE_GLUON
from splitlab.kernels.mla_sm90_ws import (
    CONSUMER_REGS,
    CONSUMER_WARPS,
    LOADER_REGS,
    LOADER_WARPS,
    MAXNREG,
    NUM_WARPS,
    _tma_rows,
    box_layout,
    check_offsets,
)
from splitlab.kernels.mla_sm90_ws import cache_ok as rows_ok  # the paged-cache rule, asked of each cache
from splitlab.kernels.workitems import LN2, LOG2E, WorkList, alloc_partials, check_worklist, launch_merge

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from splitlab.kernels.mla_sm90_ws import (
        _load_item,
        _pages_bad,
        absent_record,
        end_record,
        end_record_slot,
        start_record,
        start_record_slot,
        tma_descriptor,
    )

HEAD_DIM = 128
HEADS = (64, 128)  # the query-head counts it takes: one or two consumer warpgroups
BLOCK_H = 64  # heads a consumer warpgroup: one wgmma M
BLOCK_N = 64  # keys a tile
PIECE = 64  # columns of a TMA copy: 128 bytes, the swizzle width
STAGES = 2  # K and V tiles in flight, by default
STAGE_CHOICES = (2, 3)  # what fits beside Q and the output stages
MIN_PAGE = 16  # the smallest box: a page of 16 rows (8-row swizzle atoms, wgmma's k16)

if HAVE_GLUON:
    _D = gl.constexpr(HEAD_DIM)
    _BH = gl.constexpr(BLOCK_H)
    _BN = gl.constexpr(BLOCK_N)
    _PIECE = gl.constexpr(PIECE)
    _LN2 = gl.constexpr(LN2.value)
    _WARPS = gl.constexpr((CONSUMER_WARPS, LOADER_WARPS))
    _REGS = gl.constexpr((CONSUMER_REGS, LOADER_REGS))
    # S (m64n64), the output (m64n128), P as the output GEMM's A operand.
    _QK_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                   instr_shape=[16, BLOCK_N, 16]))
    _PV_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                   instr_shape=[16, HEAD_DIM, 16]))
    _P_L = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=_PV_L.value, k_width=2))

    @gluon.jit
    def _issue_tile(desc, bt_row, bt_stride_p, n0, end, buf, bar, PAGE_SIZE: gl.constexpr, BOX: gl.constexpr):
        """The TMA copies of one 64 x 128 tile of keys ``[n0, n0 + 64)`` into ``buf``: each box of ``BOX`` rows
        that starts before ``end`` (its page entry read here, 4 bytes), as two 64-column copies, all signalling
        ``bar`` with the bytes of the boxes copied."""
        NBOX: gl.constexpr = _BN // BOX
        nbytes: gl.constexpr = desc.block_type.nbytes
        valid = gl.minimum(gl.cdiv(end - n0, BOX), NBOX)
        for i in gl.static_range(1, NBOX + 1):
            mbarrier.expect(bar, i * 2 * nbytes, pred=valid == i)
        for i in gl.static_range(NBOX):
            r = n0 + i * BOX
            some = r < end
            page = gl.load(bt_row + (r // PAGE_SIZE) * bt_stride_p, mask=some, other=0)
            krow = page * PAGE_SIZE + r % PAGE_SIZE
            for c in gl.static_range(_D // _PIECE):
                tma.async_copy_global_to_shared(desc, [krow, c * _PIECE], bar,
                                                buf.slice(i * BOX, BOX, 0).slice(c * _PIECE, _PIECE, 1), pred=some)

    @gluon.jit
    def _zero_tail(v, n0, end):
        """Zero the rows of the landed V tile ``v`` ([64 keys, 128]) at or past the item's end (stale or unread
        rows), so that the PV GEMM never multiplies them; a no-op for a full tile. 64 x 128 x 2 bytes of shared
        memory read and written, once an item."""
        if n0 + _BN > end:
            ZL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
            keep = (n0 + gl.arange(0, _BN, layout=gl.SliceLayout(1, ZL)) < end)[:, None]
            for c in gl.static_range(_D // _PIECE):
                piece = v.slice(c * _PIECE, _PIECE, 1)
                x = piece.load(ZL)
                piece.store(gl.where(keep, x, gl.zeros_like(x)))
            fence_async_shared()
            gl.thread_barrier()

    @gluon.jit
    def _store_rows(stage, base, stride_h, stride_d, head0):
        """Rows of ``stage`` ([64, 128], staged) to ``base`` (head rows ``head0 + [0, 64)``, 128 columns), 16 rows
        at a time, 16 bytes a thread."""
        VEC: gl.constexpr = 128 // stage.dtype.primitive_bitwidth
        ROW_L: gl.constexpr = gl.BlockedLayout([1, VEC], [32 * VEC // _D, _D // VEC], [4, 1], [1, 0])
        cols = gl.arange(0, _D, layout=gl.SliceLayout(0, ROW_L))
        for r in gl.static_range(0, _BH, 16):
            heads = head0 + r + gl.arange(0, 16, layout=gl.SliceLayout(1, ROW_L))
            vals = stage.slice(r, 16, 0).load(ROW_L)
            gl.store(base + heads[:, None] * stride_h + cols[None, :] * stride_d, vals)

    @gluon.jit
    def _epilogue(acc, m_i, l_i, outs, b, row, head0, stage_buf):
        """``acc / l`` into the consumer's 64 head rows: the output row (q's dtype) of a request with one item
        (``row < 0``), else partial row ``row`` (fp32); the lse (natural log; an empty row 0 with lse -inf, a NaN
        ``l_i`` NaN). Bytes: 64 x 128 x (elt or 4) + 64 x 4."""
        (out_ptr, lse_ptr, po_ptr, pl_ptr, out_stride_b, out_stride_h, out_stride_d, lse_stride_b, lse_stride_h,
         po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h) = outs
        ROWS: gl.constexpr = gl.SliceLayout(1, _PV_L)
        l_o = gl.convert_layout(l_i, ROWS)
        empty = l_o == 0.0
        l_safe = gl.where(empty, 1.0, l_o)
        vals = acc / l_safe[:, None]
        heads = head0 + gl.arange(0, _BH, layout=ROWS)
        lse = gl.where(empty, float("-inf"), (gl.convert_layout(m_i, ROWS) + gl.log2(l_safe)) * _LN2)
        if row < 0:
            out_dtype: gl.constexpr = out_ptr.dtype.element_ty
            VEC: gl.constexpr = 128 // out_dtype.primitive_bitwidth
            out_stage = stage_buf._reinterpret(out_dtype, [_BH, _D], gl.SwizzledSharedLayout(
                vec=VEC, per_phase=1, max_phase=8, order=[1, 0]))
            out_stage.store(vals.to(out_dtype))
            gl.thread_barrier()
            _store_rows(out_stage, out_ptr + b * out_stride_b, out_stride_h, out_stride_d, head0)
            gl.store(lse_ptr + b * lse_stride_b + heads * lse_stride_h, lse)
        else:
            stage_buf.store(vals)
            gl.thread_barrier()
            r64 = row.to(gl.int64)
            _store_rows(stage_buf, po_ptr + r64 * po_stride_r, po_stride_h, po_stride_d, head0)
            gl.store(pl_ptr + r64 * pl_stride_r + heads * pl_stride_h, lse)

    @gluon.jit
    def _consumer(smem, bars, item, geo, outs, W: gl.constexpr, PAGE_SIZE: gl.constexpr):
        """Consumer ``W``: heads ``64 W + [0, 64)``, every tile's S = Q K^T, online softmax and P V, then its rows."""
        q_s, k_s, v_s, o_s = smem
        q_ready, k_ready, v_ready, k_free, v_free = bars
        b, start, end, row, bad, n_tiles = item
        bt_row, bt_stride_p, num_pages, qk_scale = geo
        NST: gl.constexpr = k_s.shape[0]  # buffers: the launch's stages
        QK_L: gl.constexpr = _QK_L
        PV_L: gl.constexpr = _PV_L
        P_L: gl.constexpr = _P_L
        ROWS: gl.constexpr = gl.SliceLayout(1, QK_L)
        dtype: gl.constexpr = q_s.dtype
        bad = bad | _pages_bad(bt_row, bt_stride_p, start, end, num_pages, PAGE_SIZE)
        q = q_s.index(W)
        m_i = gl.full([_BH], float("-inf"), gl.float32, layout=ROWS)
        l_i = gl.zeros([_BH], gl.float32, layout=ROWS)
        acc = gl.zeros([_BH, _D], gl.float32, layout=PV_L)
        mbarrier.wait(q_ready, 0, pred=n_tiles > 0)
        for t in range(n_tiles):
            buf = t % NST
            phase = (t // NST) & 1
            n0 = start + t * _BN
            k = k_s.index(buf)
            v = v_s.index(buf)
            # S = Q_w K^T: 2 x 64 x 64 x 128 FLOPs, both operands in shared memory, one chain of two k=64 pieces.
            mbarrier.wait(k_ready.index(buf), phase)
            s = warpgroup_mma(q.slice(0, _PIECE, 1), k.slice(0, _PIECE, 1).permute((1, 0)),
                              gl.zeros([_BH, _BN], gl.float32, layout=QK_L), use_acc=False, is_async=True)
            s = warpgroup_mma(q.slice(_PIECE, _PIECE, 1), k.slice(_PIECE, _PIECE, 1).permute((1, 0)), s,
                              is_async=True)
            s = warpgroup_mma_wait(0, deps=[s])
            gl.thread_barrier()
            mbarrier.arrive(k_free.index(buf))
            ok = n0 + gl.arange(0, _BN, layout=gl.SliceLayout(0, QK_L)) < end
            s = gl.where(ok[None, :], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_safe)
            p = gl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, PV_L))[:, None]
            # O_w += P V: 2 x 64 x 64 x 128 FLOPs, P from registers.
            mbarrier.wait(v_ready.index(buf), phase)
            _zero_tail(v, n0, end)
            acc = warpgroup_mma(gl.convert_layout(p.to(dtype), P_L), v, acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            gl.thread_barrier()
            mbarrier.arrive(v_free.index(buf))
        l_i = gl.where(bad, float("nan"), l_i)
        _epilogue(acc, m_i, l_i, outs, b, row, W * _BH, o_s.index(W))

    @gluon.jit
    def _part_consumer0(smem, bars, item, geo, outs, rec, NCONS: gl.constexpr, PAGE_SIZE: gl.constexpr,
                        BOX: gl.constexpr, TIMELINE: gl.constexpr):
        """The default partition (4 warps): heads [0, 64); with ``TIMELINE`` the program's record (its start at
        once, the rest after its rows)."""
        timeline_ptr, it = rec
        if TIMELINE:
            t_start = start_record(timeline_ptr, it, TIMELINE)
        _consumer(smem, bars, item, geo, outs, 0, PAGE_SIZE)
        if TIMELINE:
            end_record(timeline_ptr, it, it, it * 0, t_start, TIMELINE)  # head group: the one kv head

    @gluon.jit
    def _part_consumer1(smem, bars, item, geo, outs, rec, NCONS: gl.constexpr, PAGE_SIZE: gl.constexpr,
                        BOX: gl.constexpr, TIMELINE: gl.constexpr):
        """A worker partition (4 warps): heads [64, 128), idle with 64 heads."""
        if NCONS == 2:
            _consumer(smem, bars, item, geo, outs, 1, PAGE_SIZE)

    @gluon.jit
    def _part_load(smem, bars, item, geo, outs, descs, NCONS: gl.constexpr, PAGE_SIZE: gl.constexpr,
                   BOX: gl.constexpr, TIMELINE: gl.constexpr):
        """The producer (1 warp): Q (NCONS x 64 x 128 x elt bytes), then every tile's K and V (64 x 128 x elt
        each, and their page entries) into buffer ``t % stages`` once the consumers released that buffer's last."""
        q_s, k_s, v_s, o_s = smem
        q_ready, k_ready, v_ready, k_free, v_free = bars
        b, start, end, row, bad, n_tiles = item
        bt_row, bt_stride_p, num_pages, qk_scale = geo
        NST: gl.constexpr = k_s.shape[0]  # buffers: the launch's stages
        q_desc, k_desc, v_desc, q_row = descs
        some = n_tiles > 0  # (an empty item copies nothing: no copy may outlive the program)
        mbarrier.expect(q_ready, NCONS * (_D // _PIECE) * q_desc.block_type.nbytes, pred=some)
        for w in gl.static_range(NCONS):
            for c in gl.static_range(_D // _PIECE):
                tma.async_copy_global_to_shared(q_desc, [q_row + w * _BH, c * _PIECE], q_ready,
                                                q_s.index(w).slice(c * _PIECE, _PIECE, 1), pred=some)
        for t in range(n_tiles):
            buf = t % NST
            free_phase = ((t // NST) & 1) ^ 1  # (a fresh barrier passes parity 1)
            n0 = start + t * _BN
            mbarrier.wait(k_free.index(buf), free_phase)
            _issue_tile(k_desc, bt_row, bt_stride_p, n0, end, k_s.index(buf), k_ready.index(buf), PAGE_SIZE, BOX)
            mbarrier.wait(v_free.index(buf), free_phase)
            _issue_tile(v_desc, bt_row, bt_stride_p, n0, end, v_s.index(buf), v_ready.index(buf), PAGE_SIZE, BOX)

    # --- the persistent kernel: a program walks its CTA slot's items ------------------------------------------------

    @gluon.jit
    def _walk_item(walk, it):
        """Item ``it`` of the slot (``_load_item``): (request, key_begin, key_end, partial row, bad, its tile count),
        its block-table row and its q row."""
        items_ptr, first, stop, max_keys, bt_ptr, bt_stride_b, num_heads, q_free = walk
        b, start, end, row, bad = _load_item(items_ptr, it, max_keys)
        return ((b, start, end, row, bad, gl.cdiv(end - start, _BN)), bt_ptr + b * bt_stride_b,
                b.to(gl.int32) * num_heads)

    @gluon.jit
    def _persist_consumer(smem, bars, walk, geo, outs, W: gl.constexpr, PAGE_SIZE: gl.constexpr):
        """Consumer ``W`` of the persistent kernel: each item of the slot in order as ``_consumer``, with the slot's
        tile count carried across items (tile g of the program in buffer g % stages, its ready / free phases
        (g // stages) mod 2) and its count of non-empty items (Q's phase, ``q_free``'s); it releases Q's buffer
        (``q_free``) once its item's last QK GEMM is done (a branch on the last tile only, whose barrier the other
        tiles do not pay), so that the producer copies the next item's Q during this item's last softmax, PV and
        epilogue. The epilogue stages through this consumer's own output stage (no buffer the producer fills), an
        empty item's (NaN's) too."""
        q_s, k_s, v_s, o_s = smem
        q_ready, k_ready, v_ready, k_free, v_free = bars
        items_ptr, first, stop, max_keys, bt_ptr, bt_stride_b, num_heads, q_free = walk
        bt_stride_p, num_pages, qk_scale = geo
        NST: gl.constexpr = k_s.shape[0]
        QK_L: gl.constexpr = _QK_L
        PV_L: gl.constexpr = _PV_L
        P_L: gl.constexpr = _P_L
        ROWS: gl.constexpr = gl.SliceLayout(1, QK_L)
        dtype: gl.constexpr = q_s.dtype
        q = q_s.index(W)
        tiles = first * 0  # tiles of the slot's earlier items; the non-empty items among them
        done = first * 0
        for it in range(first, stop):
            item, bt_row, q_row = _walk_item(walk, it)
            b, start, end, row, bad, n_tiles = item
            bad = bad | _pages_bad(bt_row, bt_stride_p, start, end, num_pages, PAGE_SIZE)
            m_i = gl.full([_BH], float("-inf"), gl.float32, layout=ROWS)
            l_i = gl.zeros([_BH], gl.float32, layout=ROWS)
            acc = gl.zeros([_BH, _D], gl.float32, layout=PV_L)
            mbarrier.wait(q_ready, done & 1, pred=n_tiles > 0)
            for t in range(n_tiles):
                g = tiles + t
                buf = g % NST
                phase = (g // NST) & 1
                n0 = start + t * _BN
                k = k_s.index(buf)
                v = v_s.index(buf)
                mbarrier.wait(k_ready.index(buf), phase)
                s = warpgroup_mma(q.slice(0, _PIECE, 1), k.slice(0, _PIECE, 1).permute((1, 0)),
                                  gl.zeros([_BH, _BN], gl.float32, layout=QK_L), use_acc=False, is_async=True)
                s = warpgroup_mma(q.slice(_PIECE, _PIECE, 1), k.slice(_PIECE, _PIECE, 1).permute((1, 0)), s,
                                  is_async=True)
                s = warpgroup_mma_wait(0, deps=[s])
                gl.thread_barrier()
                mbarrier.arrive(k_free.index(buf))
                if t == n_tiles - 1:  # the item's last QK: Q's buffer free (a branch: no barrier on other tiles)
                    mbarrier.arrive(q_free)
                ok = n0 + gl.arange(0, _BN, layout=gl.SliceLayout(0, QK_L)) < end
                s = gl.where(ok[None, :], s * qk_scale, float("-inf"))
                m_new = gl.maximum(m_i, gl.max(s, axis=1))
                m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = gl.exp2(m_i - m_safe)
                p = gl.exp2(s - m_safe[:, None])
                l_i = l_i * alpha + gl.sum(p, axis=1)
                m_i = m_new
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, PV_L))[:, None]
                mbarrier.wait(v_ready.index(buf), phase)
                _zero_tail(v, n0, end)
                acc = warpgroup_mma(gl.convert_layout(p.to(dtype), P_L), v, acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=[acc])
                gl.thread_barrier()
                mbarrier.arrive(v_free.index(buf))
            l_i = gl.where(bad, float("nan"), l_i)
            gl.thread_barrier()  # (every warp past the last item's reads of the output stage before it is rewritten)
            _epilogue(acc, m_i, l_i, outs, b, row, W * _BH, o_s.index(W))
            tiles += n_tiles
            done += gl.where(n_tiles > 0, 1, 0)

    @gluon.jit
    def _persist_consumer0(smem, bars, walk, geo, outs, rec, NCONS: gl.constexpr, PAGE_SIZE: gl.constexpr,
                           BOX: gl.constexpr, TIMELINE: gl.constexpr):
        """The default partition of the persistent kernel: heads [0, 64); with ``TIMELINE`` the program's record
        (its slot, first item and item count at once, its end after its last item's rows)."""
        items_ptr, first, stop, max_keys, bt_ptr, bt_stride_b, num_heads, q_free = walk
        timeline_ptr, pid = rec
        if TIMELINE:
            start_record_slot(timeline_ptr, pid, pid, pid * 0, first, stop - first)  # head group: the one kv head
        _persist_consumer(smem, bars, walk, geo, outs, 0, PAGE_SIZE)
        if TIMELINE:
            end_record_slot(timeline_ptr, pid)

    @gluon.jit
    def _persist_consumer1(smem, bars, walk, geo, outs, rec, NCONS: gl.constexpr, PAGE_SIZE: gl.constexpr,
                           BOX: gl.constexpr, TIMELINE: gl.constexpr):
        """A worker partition of the persistent kernel: heads [64, 128), idle with 64 heads."""
        if NCONS == 2:
            _persist_consumer(smem, bars, walk, geo, outs, 1, PAGE_SIZE)

    @gluon.jit
    def _persist_load(smem, bars, walk, geo, outs, descs, NCONS: gl.constexpr, PAGE_SIZE: gl.constexpr,
                      BOX: gl.constexpr, TIMELINE: gl.constexpr):
        """The producer of the persistent kernel: the slot's tiles in order, tile g of the program (K, then V) into
        buffer g % stages once every consumer released tile g - stages's; each non-empty item's Q after its first
        tile, once every consumer's last QK of the item before released Q's buffer (``q_free``). The next item's
        first tiles and Q are thus in flight while this item's last softmax, PV and epilogue run. An empty item
        copies nothing."""
        q_s, k_s, v_s, o_s = smem
        q_ready, k_ready, v_ready, k_free, v_free = bars
        items_ptr, first, stop, max_keys, bt_ptr, bt_stride_b, num_heads, q_free = walk
        bt_stride_p, num_pages, qk_scale = geo
        q_desc, k_desc, v_desc = descs
        NST: gl.constexpr = k_s.shape[0]
        tiles = first * 0
        done = first * 0
        for it in range(first, stop):
            item, bt_row, q_row = _walk_item(walk, it)
            b, start, end, row, bad, n_tiles = item
            for t in range(n_tiles):
                g = tiles + t
                buf = g % NST
                free_phase = ((g // NST) & 1) ^ 1  # (a fresh barrier passes parity 1)
                n0 = start + t * _BN
                mbarrier.wait(k_free.index(buf), free_phase)
                _issue_tile(k_desc, bt_row, bt_stride_p, n0, end, k_s.index(buf), k_ready.index(buf), PAGE_SIZE,
                            BOX)
                mbarrier.wait(v_free.index(buf), free_phase)
                _issue_tile(v_desc, bt_row, bt_stride_p, n0, end, v_s.index(buf), v_ready.index(buf), PAGE_SIZE,
                            BOX)
                if t == 0:  # (V_0's buffer frees before Q's: tile g - stages's PV precedes the last item's last QK)
                    mbarrier.wait(q_free, (done & 1) ^ 1)
                    mbarrier.expect(q_ready, NCONS * (_D // _PIECE) * q_desc.block_type.nbytes)
                    for w in gl.static_range(NCONS):
                        for c in gl.static_range(_D // _PIECE):
                            tma.async_copy_global_to_shared(q_desc, [q_row + w * _BH, c * _PIECE], q_ready,
                                                            q_s.index(w).slice(c * _PIECE, _PIECE, 1))
            tiles += n_tiles
            done += gl.where(n_tiles > 0, 1, 0)

    @gluon.jit
    def _mqa_ws_kernel(
        q_desc, k_desc, v_desc, bt_ptr, items_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
        num_heads, qk_scale, num_pages, max_keys,
        bt_stride_b, bt_stride_p,
        out_stride_b, out_stride_h, out_stride_d,
        lse_stride_b, lse_stride_h,
        po_stride_r, po_stride_h, po_stride_d,
        pl_stride_r, pl_stride_h,
        num_ctas_ptr, timeline_ptr,
        NCONS: gl.constexpr, PAGE_SIZE: gl.constexpr, BOX: gl.constexpr, STAGES: gl.constexpr,
        BOUNDED: gl.constexpr, TIMELINE: gl.constexpr, num_warps: gl.constexpr,
        cta_ptr=None, PERSISTENT: gl.constexpr = False,
    ):
        # One program per work item (every head of the one kv head); BOUNDED: a capacity grid, the programs past the
        # plan's slot count exit at once. PERSISTENT: one program per CTA slot, walking the slot's items
        # cta_ptr[slot] .. cta_ptr[slot + 1] (the work list's CTA offsets).
        it = gl.program_id(0)
        if BOUNDED:
            if it >= gl.load(num_ctas_ptr):
                if TIMELINE:
                    absent_record(timeline_ptr, it)
                return
        if PERSISTENT:
            first = gl.load(cta_ptr + it)
            stop = gl.load(cta_ptr + it + 1)
        else:
            b, start, end, row, bad = _load_item(items_ptr, it, max_keys)
            n_tiles = gl.cdiv(end - start, _BN)
        dtype: gl.constexpr = q_desc.dtype
        SM_L: gl.constexpr = q_desc.layout
        F32_L: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
        q_s = gl.allocate_shared_memory(dtype, [NCONS, _BH, _D], SM_L)
        k_s = gl.allocate_shared_memory(dtype, [STAGES, _BN, _D], SM_L)
        v_s = gl.allocate_shared_memory(dtype, [STAGES, _BN, _D], SM_L)
        o_s = gl.allocate_shared_memory(gl.float32, [NCONS, _BH, _D], F32_L)
        # Barriers: Q landed; each buffer's K and V landed (producer -> consumers, by TMA bytes); each buffer's K and
        # V free (every consumer -> producer).
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_free.index(i), count=NCONS)
            mbarrier.init(v_free.index(i), count=NCONS)
        if PERSISTENT:  # Q's buffer free for the next item's Q (every consumer past its item's last QK)
            q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            mbarrier.init(q_free, count=NCONS)

        smem = (q_s, k_s, v_s, o_s)
        bars = (q_ready, k_ready, v_ready, k_free, v_free)
        outs = (out_ptr, lse_ptr, po_ptr, pl_ptr, out_stride_b, out_stride_h, out_stride_d, lse_stride_b,
                lse_stride_h, po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h)
        rec = (timeline_ptr, it)
        if PERSISTENT:
            walk = (items_ptr, first, stop, max_keys, bt_ptr, bt_stride_b, num_heads, q_free)
            geo = (bt_stride_p, num_pages, qk_scale)
            descs = (q_desc, k_desc, v_desc)
            gl.warp_specialize([(_persist_consumer0, (smem, bars, walk, geo, outs, rec, NCONS, PAGE_SIZE, BOX,
                                                      TIMELINE)),
                                (_persist_consumer1, (smem, bars, walk, geo, outs, rec, NCONS, PAGE_SIZE, BOX,
                                                      TIMELINE)),
                                (_persist_load, (smem, bars, walk, geo, outs, descs, NCONS, PAGE_SIZE, BOX, TIMELINE))],
                               _WARPS, _REGS)
        else:
            item = (b, start, end, row, bad, n_tiles)
            geo = (bt_ptr + b * bt_stride_b, bt_stride_p, num_pages, qk_scale)
            descs = (q_desc, k_desc, v_desc, b.to(gl.int32) * num_heads)
            gl.warp_specialize([(_part_consumer0, (smem, bars, item, geo, outs, rec, NCONS, PAGE_SIZE, BOX,
                                                   TIMELINE)),
                                (_part_consumer1, (smem, bars, item, geo, outs, rec, NCONS, PAGE_SIZE, BOX,
                                                   TIMELINE)),
                                (_part_load, (smem, bars, item, geo, outs, descs, NCONS, PAGE_SIZE, BOX, TIMELINE))],
                               _WARPS, _REGS)


#: Off: the work-list launchers run the tl tile everywhere (A/B runs; tests/gpu compares the two).
ENABLED = True
#: On: the work-list launchers may run the persistent kernel (``launch``'s ``cta_offsets``) on persistent schedules
#: (stream-K, FlashInfer's: several items a slot). Off: correct on a GPU but not faster than the one-item kernel
#: at splitlab's schedule (0.95x; experiments/mqa_ws, "The persistent MQA kernel"), so ``use_ws`` refuses persistent
#: schedules and the tl tile runs them.
PERSISTENT_ENABLED = False


def use_ws(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, tile: tuple[int, int, int],
           page_size: int, device: torch.device, persistent: bool, align: int) -> bool:
    """Whether the work-list launchers (``worklist.gqa_decode_scheduled``, ``decode_plan.GQADecodePlan``) run this
    kernel instead of the tl tile: ``ENABLED``, Gluon, not the interpreter, an sm_90 GPU, a 16-bit dtype, 64 or 128
    query heads on one kv head of dim 128 at the tl tile's default (``tile`` = (block_n, num_warps, num_stages) as
    ``gqa.default_knobs`` gives them), page 16, 32 or a multiple of 64, a schedule whose items start at multiples
    of a box, of one item a slot unless ``PERSISTENT_ENABLED`` (then a persistent one runs the persistent kernel:
    the launchers pass ``launch`` the work list's ``cta_offsets``). A call's caches must also read as TMA tensors
    of rows (``cache_ok``)."""
    from splitlab.kernels import gqa

    if not (ENABLED and HAVE_GLUON) or launch_common.INTERPRET or device.type != "cuda":
        return False
    if dtype not in (torch.bfloat16, torch.float16) or kv_heads != 1 or heads not in HEADS or head_dim != HEAD_DIM:
        return False
    d = gqa.default_knobs(heads, head_dim, launch_common.TORCH_DTYPE_NAMES[dtype])
    page_ok = page_size in (16, 32) or page_size % BLOCK_N == 0
    return (page_ok and tile == (d["block_n"], d["num_warps"], d["num_stages"])
            and (not persistent or PERSISTENT_ENABLED) and align % box_rows(page_size) == 0
            and torch.cuda.get_device_capability(device)[0] == 9)


def cache_ok(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether both caches (``[num_pages >= 1, page_size, 1, 128]``) read as 2-D TMA tensors of fewer than 2^31
    rows (``mla_sm90_ws.cache_ok`` of each: ``check_launch``'s cache scope, as a test; the launchers run the tl tile
    on any other caches)."""
    return rows_ok(k_cache) and rows_ok(v_cache)


def box_rows(page_size: int) -> int:
    """Rows of a TMA box: a page, or a 64-key tile where a page holds several."""
    return min(page_size, BLOCK_N)


def check_launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                 work: object, stages: object = STAGES, persistent: bool = False) -> WorkList:
    """The scope in the module docstring, each breach one ``SplitlabError`` line; returns the checked work list.
    ``persistent``: for the persistent kernel, which takes any schedule whose items start at multiples of a box
    (persistent or not)."""
    from splitlab.kernels import gqa

    if not HAVE_GLUON:
        raise SplitlabError("mqa_decode_ws: needs triton 3.6's Gluon (triton.experimental.gluon)")
    if launch_common.INTERPRET:
        raise SplitlabError("mqa_decode_ws: Gluon kernels do not run under TRITON_INTERPRET=1")
    if isinstance(stages, bool) or stages not in STAGE_CHOICES:
        raise SplitlabError(f"mqa_decode_ws: stages={launch_common.short_repr(stages)} is not allowed; expected one "
                            f"of {', '.join(map(str, STAGE_CHOICES))}")
    gqa._check_inputs(q, k_cache, v_cache, block_table)
    if q.is_cuda and torch.cuda.get_device_capability(q.device)[0] != 9:
        raise SplitlabError(f"mqa_decode_ws: q is on {torch.cuda.get_device_name(q.device)}; expected an sm_90 GPU")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise SplitlabError(f"mqa_decode_ws: dtype {q.dtype} is not allowed; expected bfloat16 or float16")
    B, H, D = q.shape
    num_pages, page_size, hkv, _ = k_cache.shape
    if hkv != 1 or H not in HEADS or D != HEAD_DIM:
        raise SplitlabError(f"mqa_decode_ws: {H} query heads on {hkv} kv heads of dim {D}; expected "
                            f"{' or '.join(map(str, HEADS))} on 1, dim {HEAD_DIM}")
    if page_size % (MIN_PAGE if page_size < BLOCK_N else BLOCK_N) or BLOCK_N % box_rows(page_size):
        raise SplitlabError(f"mqa_decode_ws: page_size={page_size} is not allowed; expected 16, 32 or a multiple "
                            f"of {BLOCK_N}")
    if num_pages * page_size >= 2**31:
        raise SplitlabError(f"mqa_decode_ws: the caches hold {num_pages * page_size} rows; expected fewer than "
                            "2^31")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not rows_ok(c):
            raise SplitlabError(f"mqa_decode_ws: {name} strides {tuple(c.stride())} are not allowed; expected pages "
                                "of contiguous rows back to back, 16-byte aligned (one 2-D TMA tensor of rows)")
    work = check_worklist(work, B, block_table.shape[1] * page_size, q.device, "mqa_decode_ws")
    box = box_rows(page_size)
    if persistent:
        if work.schedule.align % box:
            raise SplitlabError(f"mqa_decode_ws: a schedule with items aligned to {work.schedule.align} keys is not "
                                f"allowed; expected items starting at multiples of {box} (persistent)")
    elif work.schedule.persistent or work.schedule.align % box:
        kind = "a persistent schedule" if work.schedule.persistent else "a schedule"
        raise SplitlabError(f"mqa_decode_ws: {kind} with items aligned to {work.schedule.align} keys is not allowed; "
                            f"expected one item a CTA slot (not persistent), items starting at multiples of {box}")
    return work


def mqa_decode_ws(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                  work: WorkList, *, stages: int = STAGES, sm_scale: float | None = None, return_lse: bool = False,
                  persistent: bool = False):
    """Paged MQA decode over a work list on this module's kernel: ``worklist.gqa_decode_scheduled``'s inputs and
    outputs within the scope of the module docstring; ``stages`` K and V tiles in flight (``STAGE_CHOICES``);
    ``persistent``: the persistent kernel (a program walks its slot's items: any schedule so aligned)."""
    work = check_launch(q, k_cache, v_cache, block_table, work, stages, persistent)
    B, H, D = q.shape
    scale = launch_common.resolve_sm_scale(sm_scale, D)
    out = launch_common.alloc(B, H, D, dtype=q.dtype, device=q.device)
    lse = launch_common.alloc(B, H, dtype=torch.float32, device=q.device)
    po, pl = alloc_partials(work, H, D, q.device)
    with launch_common.device_guard(q):
        launch(q, k_cache, v_cache, block_table, work.items, work.ctas, out, lse, po, pl, scale * LOG2E, stages,
               cta_offsets=work.cta_offsets if persistent else None)
        launch_merge(work, po, pl, out, lse)
    return (out, lse) if return_lse else out


def descriptors(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor):
    """The TMA descriptors of q (rows of ``[B * H, 128]`` in 64 x 64 boxes; a contiguous copy where q's strides are
    not that) and of each cache (rows of ``[num_pages * page_size, 128]`` in ``box_rows`` x 64 boxes), one swizzled
    layout for all."""
    B, H, D = q.shape
    if not (_tma_rows(q, q.stride(1)) and q.stride(0) == H * q.stride(1)):
        q = q.contiguous()
    layout = box_layout(q.dtype)
    rows = k_cache.shape[0] * k_cache.shape[1]
    box = [box_rows(k_cache.shape[1]), PIECE]
    q_desc = tma_descriptor(q, [B * H, D], [q.stride(1), 1], [BLOCK_H, PIECE], layout)
    k_desc = tma_descriptor(k_cache, [rows, D], [k_cache.stride(1), 1], box, layout)
    v_desc = tma_descriptor(v_cache, [rows, D], [v_cache.stride(1), 1], box, layout)
    return q_desc, k_desc, v_desc


def launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
           items: torch.Tensor, slots: int, out: torch.Tensor, lse: torch.Tensor, po: torch.Tensor, pl: torch.Tensor,
           qk_scale: float, stages: int = STAGES, *, num_ctas: torch.Tensor | None = None,
           timeline: dict | None = None, cta_offsets: torch.Tensor | None = None, bound: bool = False) -> None:
    """The partial kernel alone (no checks: ``check_launch``'s inputs; ``qk_scale`` in base 2): ``slots`` CTA slots
    of the work list ``items``; ``num_ctas``, ``timeline`` and ``bound`` as ``mla_sm90_ws.launch`` takes them.
    ``cta_offsets`` (int32 ``[slots + 1]``, the work list's; at least that many with ``num_ctas``): the persistent
    kernel, whose program walks its slot's items ``cta_offsets[slot] .. cta_offsets[slot + 1]`` (``check_walk``;
    launched directly, not bound: its per-call argument follows the constexprs); None: one item a slot."""
    check_walk(cta_offsets, slots, items.device, bounded=num_ctas is not None)
    B, H, _ = q.shape
    num_pages, page_size = k_cache.shape[:2]
    q_desc, k_desc, v_desc = descriptors(q, k_cache, v_cache)
    args = (q_desc, k_desc, v_desc, block_table, items, out, lse, po, pl,
            H, qk_scale, num_pages, block_table.shape[1] * page_size,
            *block_table.stride(), *out.stride(), *lse.stride(), *po.stride(), *pl.stride(),
            num_ctas if num_ctas is not None else items, timeline["timeline_ptr"] if timeline else items)
    meta = dict(NCONS=H // BLOCK_H, PAGE_SIZE=page_size, BOX=box_rows(page_size), STAGES=stages,
                BOUNDED=num_ctas is not None, TIMELINE=timeline["TIMELINE"] if timeline else False,
                num_warps=NUM_WARPS, maxnreg=MAXNREG)
    if cta_offsets is not None:
        _mqa_ws_kernel[(slots,)](*args, **meta, cta_ptr=cta_offsets, PERSISTENT=True)
    else:
        launch_cached(_mqa_ws_kernel, _BOUND, (slots,), args, meta, bound=bound and not timeline)


#: ``launch``'s ``BoundLaunch`` per meta-parameters (``bound_launch.launch_cached``).
_BOUND: dict = {}


def check_walk(cta_offsets: torch.Tensor | None, slots: int, device: torch.device, bounded: bool = False) -> None:
    """``launch``'s rule for ``cta_offsets`` (``mla_sm90_ws.check_walk``'s): None (one item a slot), or an int32
    vector of ``slots + 1`` entries (at least that many where ``bounded``: a capacity grid's) on the items' device;
    else one ``SplitlabError`` line. (Its values are the work list's: not read on the host.)"""
    if cta_offsets is not None:
        check_offsets(cta_offsets, slots, device, bounded, "mqa_decode_ws")


__all__ = ["ENABLED", "HEADS", "PERSISTENT_ENABLED", "STAGE_CHOICES", "box_rows", "cache_ok", "check_launch",
           "check_walk", "launch", "mqa_decode_ws", "use_ws"]
