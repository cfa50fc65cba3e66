"""Absorbed MLA decode on a work list, in Gluon for Hopper (sm_90a), with FlashMLA's schedule: two consumer
warpgroups that split the 64 x 512 output, a producer warp that streams the latent cache as TMA pieces.

The work-list launchers' 64-row tile (kernel version 7): ``worklist.mla_decode_scheduled`` and
``decode_plan.MLADecodePlan`` run ``DEFAULT_VARIANT`` where ``use_ws`` and ``cache_ok`` say so; the split-count
``mla.mla_decode`` keeps ``mla_sm90``'s tile. The variants were measured against that tile and FlashMLA on the H200
(``experiments/mla_ws/``): the seesaw carries the gain.

The rule it ports. FlashMLA's dense decode kernel (deepseek-ai/FlashMLA, ``docs/20250422-new-kernel-deep-dive.md``:
read for the schedule, no code taken) holds the 64-row head tile's 64 x 512 fp32 output in two warpgroups, 64 x 256
each (the left ``O_L`` and the right ``O_R``), takes two KV blocks a step and interleaves one block's softmax with
the other's GEMMs under one running max shared through shared memory ("seesaw"), and copies each 64 x 576 block as
nine 64 x 64 TMA pieces, each GEMM starting as its piece lands. Per step, with blocks 0 and 1 (K = the whole latent
row, V its first 512 columns; [0] / [1] = the warpgroup; m the running max, in shared memory; c0, c1 and the P of
the other warpgroup's block also pass through shared memory):

    [0] S0 = Q K0^T                                 [1] S1 = Q K1^T
    [0] m0 = max(m, rowmax S0), c0 = exp(m - m0), P0 = exp(S0 - m0)
    [0] O_L = O_L c0 + P0 V0_L                      [1] O_R = O_R c0 + P0 V0_R, while
                                                    [1] m1 = max(m0, rowmax S1), c1 = exp(m0 - m1), P1 = exp(S1 - m1)
    [0] O_L = O_L c1 + P1 V1_L                      [1] O_R = O_R c1 + P1 V1_R

the online softmax exactly (every product ends up against the step's last max m1). FlashMLA's text has [1] scale
O_R by c0 c1 before P1 V1_R and [0] hand over P0 c1 for a last P0 V0_R; here [1] adds P0 V0_R first and c1 scales
both, the same sums, which spares [0] the rescaled copy of P0 (registers: with it consumer 0 spilled) and a
barrier. Each warpgroup keeps the row sum of its own P; the epilogue adds the two.

Variants (``VARIANTS``, constexprs of one kernel, so that an A/B measures each idea):

- ``recompute``: the simplest correct split. Both warpgroups compute every block's S = Q K^T and the same online
  softmax (the QK GEMM twice: 1.53x the tensor-core work of ``seesaw``), each its half of P V. No warpgroup waits on
  the other; only the buffers are shared.
- ``seesaw``: the schedule above.
- ``*-fine``: each block lands as nine 64 x 64 pieces with a barrier each, and the QK GEMM waits piece by piece;
  without it, one barrier for the block's 72 KiB.
- ``seesaw-persistent`` (``PERSISTENT_VARIANTS``; opt-in: the work-list launchers run it on persistent schedules
  only with ``PERSISTENT_VARIANT`` set): the seesaw with a persistent slot, below.

Partitions (``gl.warp_specialize``): consumer 0 (the default partition, 4 warps), consumer 1 (4 warps,
``CONSUMER_REGS``), the producer (1 warp, ``LOADER_REGS``): Q once (nine TMA pieces, 72 KiB), then block t into
buffer t % 2 once both consumers have released the block before it (t - 2): 9 x 8 KiB a block, plus the block's
4-byte table entry (a block is 64 keys of one page: ``BLOCK_N`` divides the page size and the schedule's items start
at multiples of it). Shared memory (bf16 / fp16): Q 72 KiB, two blocks 144 KiB; P0 and P1 (8 KiB each) overwrite the
rope piece of their block (read by that block's QK only, which is done by then); the running max, c0, c1 and the two
row sums 1.25 KiB; 24 barriers; the epilogue stages each half of the output through a block buffer. Compiled for
sm_90a (triton 3.6; ``tests/test_compile_mla_ws.py``): 222144 bytes (recompute) and 223008 (seesaw) of the 232448
an SM lends a block, no spills.

Rows a block holds past its item's end (the item's last block; TMA copies whole pages) score -inf, and each consumer
zeroes them in the V columns it multiplies before its P V GEMM (a NaN there would poison 0 x NaN); the other
warpgroup's QK may read those rows meanwhile, whose scores are masked. The work list is ``kernels.worklist``'s
(``WorkList``; one item per program: the program of CTA slot c runs item c, for each 64-row head tile, head tile
fastest); an item of a request with one item writes its output row and lse directly, any other its partial row
(fp32), which ``workitems.launch_merge`` merges. As the work-list kernels: an item outside ``[0, max_keys]`` or a
block-table entry outside the cache makes its row NaN (a TMA box outside the cache reads zeros, never memory outside
it); an empty request writes zeros and lse -inf.

Scope (``check_launch``, else one ``SplitlabError`` line): 16-bit q and cache of one dtype, Dqk 576 and Dv 512,
page size a multiple of 64, at least one page, cache rows of contiguous elements at a 16-byte-aligned stride and
pages of ``page_size`` rows back to back (the cache read as one 2-D TMA tensor of rows), fewer than 2^31 rows; any
head count (64-row tiles; q read as rows of ``[B * H, 576]``, copied contiguous where its strides are not that);
a non-persistent schedule aligned to 64 keys (``seesaw-persistent``: any schedule so aligned); an sm_90 GPU with
triton 3.6's Gluon, not the interpreter.

A plan's launches: ``BOUNDED`` (a grid of a capacity's slots, ``num_ctas`` on the device: programs past the plan's
count exit before they allocate anything) and ``TIMELINE`` (consumer 0 writes the program's ``kernels.timeline``
record: its start at once, the rest after its half of the output).

The persistent seesaw (``PERSISTENT``; ``launch``'s ``cta_offsets``, the work list's): one program per (CTA slot, head
tile) walks the slot's items ``cta_offsets[slot] .. cta_offsets[slot + 1]`` in order, so that an item pays no CTA
prologue and the next item's copies start while this one finishes. Each partition carries across items the slot's
block count (block g in buffer g % 2, its ``kv_ready`` / ``kv_free`` phase (g // 2) mod 2), its seesaw step count (the
m0 / c1 exchange's phases) and its non-empty item count (Q's, the row sums' and ``q_free``'s phases). The epilogue
leaves the producer a buffer: consumer 0 stages its half through Q's buffer and then arrives ``q_free``; consumer 1
keeps the item's last block past its last GEMM, stages its half there and only then releases it. The producer
copies the next item's first block once both consumers released the buffer the item's second-to-last block held
(during the item's last step), then that item's Q once ``q_free`` says Q's buffer is free, then its second block
once consumer 1 released the last one. An item without blocks copies nothing and writes its zeros (NaN) from
registers, without the row-sum exchange. Shared memory 223056 bytes (one barrier more). Compiled for sm_90a without
spills (``tests/test_compile_mla_ws.py``); its protocol is modelled in ``tests/test_mla_ws_scope.py``; on a GPU
(``experiments/mla_ws``, "The persistent seesaw") it passes every check and is not faster, so it stays opt-in.
"""

from __future__ import annotations

import functools

import torch

from splitlab.errors import SplitlabError
from splitlab.kernels import _launch as launch_common
from splitlab.kernels.bound_launch import launch_cached
from splitlab.kernels.mla_sm90 import BLOCK_H, BLOCK_N, HAVE_GLUON
from splitlab.kernels.timeline import FIELDS, HOLD_START, Timelines
from splitlab.kernels.workitems import (
    LN2,
    LOG2E,
    WorkList,
    alloc_partials,
    check_worklist,
    launch_merge,
    timeline_args,
)

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
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

HEAD_DIM_QK, HEAD_DIM_V = 576, 512
PIECE = 64  # columns of a TMA piece: 128 bytes, the swizzle width
PIECES = HEAD_DIM_QK // PIECE  # 9 a block: 8 of V, 1 of rope
#: name -> (seesaw, fine): the kernel's constexprs per variant (module docstring).
VARIANTS = {"recompute": (False, False), "recompute-fine": (False, True), "seesaw": (True, False),
            "seesaw-fine": (True, True), "seesaw-persistent": (True, False)}
#: The variants whose program walks its CTA slot's items (``PERSISTENT``; ``launch``'s ``cta_offsets``): they run
#: any schedule aligned to 64 keys, persistent or not. Opt-in (``experiments/mla_ws``): the work-list launchers run
#: one on persistent schedules only where ``PERSISTENT_VARIANT`` names it (``use_ws``, ``variant_for``).
PERSISTENT_VARIANTS = frozenset({"seesaw-persistent"})
#: Warps: the default partition (consumer 0) runs the launch's 4; consumer 1 has 4, the producer 1.
NUM_WARPS = 4
CONSUMER_WARPS, LOADER_WARPS = 4, 1
#: Registers a thread. At launch 168 (the producer's warp is padded to a warpgroup: 12 warps x 168 = 64512 of the
#: SM's 65536); then setmaxnreg: the producer 24 (it holds a few scalars), the consumers 240 each (64 x 256 fp32 of
#: output is 128 of them, S 32, P 16).
MAXNREG = 168
CONSUMER_REGS, LOADER_REGS = 240, 24
SCAN = 1024  # block-table entries a consumer reads at once when it checks an item's pages

if HAVE_GLUON:
    _HALF = gl.constexpr(HEAD_DIM_V // 2)
    _PIECE = gl.constexpr(PIECE)
    _NV = gl.constexpr(HEAD_DIM_V // PIECE)  # pieces of V: 8
    _NP = gl.constexpr(PIECES)
    _SCAN = gl.constexpr(SCAN)
    _RECORD = gl.constexpr(len(FIELDS))
    _HOLD_START = gl.constexpr(HOLD_START)
    _LN2 = gl.constexpr(LN2.value)
    _BH = gl.constexpr(BLOCK_H)
    _BN = gl.constexpr(BLOCK_N)
    _WARPS = gl.constexpr((CONSUMER_WARPS, LOADER_WARPS))
    _REGS = gl.constexpr((CONSUMER_REGS, LOADER_REGS))
    # The S tile's wgmma layout (m64n64), the output half's (m64n256), P as the output GEMM's A operand.
    _QK_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                   instr_shape=[16, BLOCK_N, 16]))
    _PV_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                   instr_shape=[16, HEAD_DIM_V // 2, 16]))
    _P_L = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=_PV_L.value, k_width=2))

    @gluon.jit
    def _load_item(items_ptr, it, max_keys):
        """``workitems.load_item`` (the work list's 16-byte rows, the same rule) for Gluon: ``(request (int64),
        key_begin, key_end, partial row, bad)``; a range outside ``[0, max_keys]`` or reversed reads nothing and
        is ``bad``."""
        base = items_ptr + it.to(gl.int64) * 4
        b = gl.load(base)
        start = gl.load(base + 1)
        end = gl.load(base + 2)
        row = gl.load(base + 3)
        bad = (start < 0) | (end > max_keys) | (start > end)
        return b.to(gl.int64), start, gl.where(bad, start, end), row, bad

    @gluon.jit
    def _pages_bad(bt_row, bt_stride_p, start, end, num_pages, PAGE_SIZE: gl.constexpr):
        """Whether a block-table entry of keys ``[start, end)`` lies outside ``[0, num_pages)`` (4 bytes an
        entry, ``SCAN`` at a time; negative entries read as huge unsigned ones). An empty range (a bad item's too)
        reads nothing."""
        L: gl.constexpr = gl.BlockedLayout([8], [32], [4], [0])
        offs = gl.arange(0, _SCAN, layout=L)
        seen = gl.zeros([_SCAN], gl.uint32, layout=L)
        first = start // PAGE_SIZE
        last = gl.where(end > start, gl.cdiv(end, PAGE_SIZE), first)
        for c in range(first, last, _SCAN):
            e = gl.load(bt_row + (c + offs) * bt_stride_p, mask=c + offs < last, other=0)
            seen = gl.maximum(seen, e.to(gl.uint32, bitcast=True))
        return gl.max(seen, axis=0) >= num_pages.to(gl.uint32)

    @gluon.jit
    def _issue_block(kv_desc, krow, v_buf, r_buf, kv_ready, buf, FINE: gl.constexpr):
        """The TMA copies of one 64 x 576 block (9 pieces of 64 x 64, 8 KiB each) at cache row ``krow``: with
        ``FINE`` piece c signals barrier ``buf * 9 + c``, else all nine signal ``buf * 9``."""
        nbytes: gl.constexpr = kv_desc.block_type.nbytes
        if FINE:
            for c in gl.static_range(_NV):
                bar = kv_ready.index(buf * _NP + c)
                mbarrier.expect(bar, nbytes)
                tma.async_copy_global_to_shared(kv_desc, [krow, c * _PIECE], bar, v_buf.slice(c * _PIECE, _PIECE, 1))
            bar = kv_ready.index(buf * _NP + _NV)
            mbarrier.expect(bar, nbytes)
            tma.async_copy_global_to_shared(kv_desc, [krow, _NV * _PIECE], bar, r_buf)
        else:
            bar = kv_ready.index(buf * _NP)
            mbarrier.expect(bar, _NP * nbytes)
            for c in gl.static_range(_NV):
                tma.async_copy_global_to_shared(kv_desc, [krow, c * _PIECE], bar, v_buf.slice(c * _PIECE, _PIECE, 1))
            tma.async_copy_global_to_shared(kv_desc, [krow, _NV * _PIECE], bar, r_buf)

    @gluon.jit
    def _wait_block(kv_ready, buf, phase, FINE: gl.constexpr):
        """Block ``buf`` (of this phase) has landed, every piece: what a consumer waits on before it reads the
        block other than through its own QK (which waits piece by piece)."""
        if FINE:
            for c in gl.static_range(_NP):
                mbarrier.wait(kv_ready.index(buf * _NP + c), phase)
        else:
            mbarrier.wait(kv_ready.index(buf * _NP), phase)

    @gluon.jit
    def _qk(q_v, q_r, v_buf, r_buf, kv_ready, buf, phase, FINE: gl.constexpr, QK_L: gl.constexpr):
        """S = Q K^T of one block ([64, 64] fp32; 2 x 64 x 64 x 576 FLOPs): one wgmma chain a 64-column piece (4
        x m64n64k16), each issued as its piece lands (``FINE``), else once the whole block has. (One chain over
        the whole [64, 512] V part instead compiled with more spill, sm_90a.)"""
        zero = gl.zeros([_BH, _BN], gl.float32, layout=QK_L)
        mbarrier.wait(kv_ready.index(buf * _NP), phase)
        s = warpgroup_mma(q_v.slice(0, _PIECE, 1), v_buf.slice(0, _PIECE, 1).permute((1, 0)), zero, use_acc=False,
                          is_async=True)
        for c in gl.static_range(1, _NV):
            if FINE:
                mbarrier.wait(kv_ready.index(buf * _NP + c), phase)
            s = warpgroup_mma(q_v.slice(c * _PIECE, _PIECE, 1), v_buf.slice(c * _PIECE, _PIECE, 1).permute((1, 0)),
                              s, is_async=True)
        if FINE:
            mbarrier.wait(kv_ready.index(buf * _NP + _NV), phase)
        s = warpgroup_mma(q_r, r_buf.permute((1, 0)), s, is_async=True)
        return warpgroup_mma_wait(0, deps=[s])

    @gluon.jit
    def _masked_scores(s, n0, end, qk_scale, QK_L: gl.constexpr):
        """Scores in base 2; keys at or past the item's end -inf (their rows may hold anything)."""
        ok = n0 + gl.arange(0, _BN, layout=gl.SliceLayout(0, QK_L)) < end
        return gl.where(ok[None, :], s * qk_scale, float("-inf"))

    @gluon.jit
    def _zero_tail(v_half, n0, end):
        """Zero the rows of ``v_half`` ([64 keys, 256] of a landed block) at or past the item's end, so that the
        P V GEMM never multiplies what lies there; a no-op for a full block. Reads and writes 64 x 256 x 2 bytes
        of shared memory, once an item."""
        if n0 + _BN > end:
            ZL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
            keep = (n0 + gl.arange(0, _BN, layout=gl.SliceLayout(1, ZL)) < end)[:, None]
            for c in gl.static_range(_HALF // _PIECE):
                piece = v_half.slice(c * _PIECE, _PIECE, 1)
                x = piece.load(ZL)
                piece.store(gl.where(keep, x, gl.zeros_like(x)))
            fence_async_shared()
            gl.thread_barrier()

    @gluon.jit
    def _store_rows(stage, base, stride_h, stride_d, head_tile, num_heads, COL0: gl.constexpr):
        """Rows of ``stage`` ([64, 256], staged) to ``base`` (head rows, columns ``COL0 + [0, 256)``), 16 rows at a
        time, 16 bytes a thread: whole rows, and few addresses live at once."""
        VEC: gl.constexpr = 128 // stage.dtype.primitive_bitwidth
        ROW_L: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [4, 1], [1, 0])
        cols = COL0 + gl.arange(0, _HALF, layout=gl.SliceLayout(0, ROW_L))
        for r in gl.static_range(0, _BH, 16):
            heads = head_tile * _BH + r + gl.arange(0, 16, layout=gl.SliceLayout(1, ROW_L))
            vals = stage.slice(r, 16, 0).load(ROW_L)
            gl.store(base + heads[:, None] * stride_h + cols[None, :] * stride_d, vals,
                     mask=(heads < num_heads)[:, None])

    @gluon.jit
    def _store_half(acc, m_i, l_i, outs, b, row, head_tile, stage_buf, COL0: gl.constexpr,
                    WRITE_LSE: gl.constexpr, PV_L: gl.constexpr):
        """``acc / l`` into columns ``COL0 + [0, 256)`` of the tile's head rows: the output row (q's dtype) of a
        request with one item (``row < 0``), else partial row ``row`` (fp32); with ``WRITE_LSE`` the lse too
        (natural log; an empty row 0 with lse -inf, a NaN ``l_i`` NaN). Staged through ``stage_buf`` (64 KiB of a
        block buffer no partition reads any more) so that the 64-bit addresses of the whole half are never live
        beside it. Bytes: 64 x 256 x elt (+ 64 x 4)."""
        (out_ptr, lse_ptr, po_ptr, pl_ptr, num_heads, out_stride_b, out_stride_h, out_stride_d, lse_stride_b,
         lse_stride_h, po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h) = outs
        ROWS: gl.constexpr = gl.SliceLayout(1, PV_L)
        l_o = gl.convert_layout(l_i, ROWS)
        empty = l_o == 0.0
        l_safe = gl.where(empty, 1.0, l_o)
        vals = acc / l_safe[:, None]
        heads = head_tile * _BH + gl.arange(0, _BH, layout=ROWS)
        if row < 0:
            out_dtype: gl.constexpr = out_ptr.dtype.element_ty
            VEC: gl.constexpr = 128 // out_dtype.primitive_bitwidth
            out_stage = stage_buf._reinterpret(out_dtype, [_BH, _HALF], gl.SwizzledSharedLayout(
                vec=VEC, per_phase=1, max_phase=8, order=[1, 0]))
            out_stage.store(vals.to(out_dtype))
            gl.thread_barrier()
            _store_rows(out_stage, out_ptr + b * out_stride_b, out_stride_h, out_stride_d, head_tile, num_heads, COL0)
        else:
            stage = stage_buf._reinterpret(gl.float32, [_BH, _HALF], gl.SwizzledSharedLayout(
                vec=4, per_phase=1, max_phase=8, order=[1, 0]))
            stage.store(vals)
            gl.thread_barrier()
            _store_rows(stage, po_ptr + row.to(gl.int64) * po_stride_r, po_stride_h, po_stride_d, head_tile,
                        num_heads, COL0)
        if WRITE_LSE:
            lse = gl.where(empty, float("-inf"), (gl.convert_layout(m_i, ROWS) + gl.log2(l_safe)) * _LN2)
            if row < 0:
                gl.store(lse_ptr + b * lse_stride_b + heads * lse_stride_h, lse, mask=heads < num_heads)
            else:
                gl.store(pl_ptr + row.to(gl.int64) * pl_stride_r + heads * pl_stride_h, lse, mask=heads < num_heads)

    @gluon.jit
    def _row_sums(l_i, l_smem, epi, SIDE: gl.constexpr, READ: gl.constexpr, ROWS: gl.constexpr, phase):
        """Both consumers are past their last GEMM (so both block buffers are free for the epilogue's staging),
        each having written its row sums; ``READ`` 2: the two added (seesaw: each covers its own P), 1: consumer
        0's (recompute: the same sums, with the page check's NaN). ``phase``: 0 in a one-item program; the
        persistent one's count of non-empty items so far, mod 2 (one exchange each)."""
        l_smem[SIDE].store(l_i)
        gl.thread_barrier()
        mbarrier.arrive(epi)
        mbarrier.wait(epi, phase)
        if READ == 2:
            l_i = l_smem[0].load(ROWS) + l_smem[1].load(ROWS)
        else:
            l_i = l_smem[0].load(ROWS)
        return l_i

    # --- recompute: both warpgroups run the whole softmax ---------------------------------------------------------

    @gluon.jit
    def _recompute(smem, bars, item, geo, outs, COL0: gl.constexpr, WRITE_LSE: gl.constexpr,
                   FINE: gl.constexpr, PAGE_SIZE: gl.constexpr):
        """A consumer of ``recompute``: every block's QK and online softmax, the P V of output columns
        ``COL0 + [0, 256)``, then that half of the output."""
        q_v, q_r, kv_v, kv_r, red = smem
        q_ready, kv_ready, kv_free, sync = bars
        b, start, end, row, bad, n_tiles, head_tile = item
        q_desc, kv_desc, bt_row, bt_stride_p, num_pages, q_row, qk_scale = geo
        QK_L: gl.constexpr = _QK_L
        PV_L: gl.constexpr = _PV_L
        P_L: gl.constexpr = _P_L
        dtype: gl.constexpr = q_v.dtype
        if COL0 == 0:  # (consumer 0 checks the pages; consumer 1 takes its row sums, NaN and all)
            bad = bad | _pages_bad(bt_row, bt_stride_p, start, end, num_pages, PAGE_SIZE)
        m_i = gl.full([_BH], float("-inf"), gl.float32, layout=gl.SliceLayout(1, QK_L))
        l_i = gl.zeros([_BH], gl.float32, layout=gl.SliceLayout(1, QK_L))
        acc = gl.zeros([_BH, _HALF], gl.float32, layout=PV_L)
        mbarrier.wait(q_ready, 0, pred=n_tiles > 0)
        for t in range(n_tiles):
            buf = t % 2
            n0 = start + t * _BN
            s = _masked_scores(_qk(q_v, q_r, kv_v.index(buf), kv_r.index(buf), kv_ready, buf, (t // 2) & 1, FINE,
                                   QK_L), n0, end, qk_scale, QK_L)
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_safe)
            p = gl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            v_half = kv_v.index(buf).slice(COL0, _HALF, 1)
            _zero_tail(v_half, n0, end)
            # acc = acc * alpha + P @ V[:, COL0:COL0 + 256]: 2 x 64 x 64 x 256 FLOPs, P from registers.
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, PV_L))[:, None]
            acc = warpgroup_mma(gl.convert_layout(p.to(dtype), P_L), v_half, acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            gl.thread_barrier()
            mbarrier.arrive(kv_free.index(buf))
        l_i = _row_sums(gl.where(bad, float("nan"), l_i), red[3], bars[3][2], COL0 // _HALF, 1,
                        gl.SliceLayout(1, QK_L), 0)
        _store_half(acc, m_i, l_i, outs, b, row, head_tile, kv_v.index(COL0 // _HALF), COL0, WRITE_LSE, PV_L)

    # --- seesaw: FlashMLA's schedule ------------------------------------------------------------------------------

    @gluon.jit
    def _opaque_zero(j):
        """0, which the compiler cannot see through (an asm with side effects, once a step): the seesaw's buffer
        indices are constants, and the smem descriptors of 36 QK and 8 PV wgmma a buffer hoisted out of the loop
        would not fit the consumers' registers (56-136 bytes of spill, sm_90a)."""
        return gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r,r", [j], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _step_buffers(j, q_v, q_r, walk, PERSISTENT: gl.constexpr):
        """Step ``j``'s Q views, its two K-block buffers ``b0``, ``b1``, their landings' phases and the step's
        exchange phase: in a persistent program from ``walk`` (``_seesaw_left``'s; Q is ``[1, 64, 576]`` there,
        indexed each step so that its descriptors are made each step too), else buffers 0 and 1 and phase j mod 2
        (buffer 0 recomputed each step: its smem descriptors are not held across the loop)."""
        if PERSISTENT:
            g0 = walk[0]
            phase = walk[1] & 1
            z = _opaque_zero(j)
            q_v = q_v.index(z)
            q_r = q_r.index(z)
            b0 = z + (g0 & 1)
            b1 = 1 - b0
            ph0 = (g0 >> 1) & 1
            ph1 = ((g0 + 1) >> 1) & 1
        else:
            phase = j & 1
            b0 = _opaque_zero(j)
            b1 = b0 + 1
            ph0 = phase
            ph1 = phase
        return q_v, q_r, b0, b1, ph0, ph1, phase

    @gluon.jit
    def _seesaw_left(j, smem, bars, m_i, l_i, acc, start, end, qk_scale, HAS1: gl.constexpr, FINE: gl.constexpr,
                     walk, PERSISTENT: gl.constexpr):
        """Consumer 0's part of step ``j`` (block 2j in buffer 0 and, with ``HAS1``, 2j + 1 in buffer 1): S0; the
        max m0, c0 and P0 for consumer 1; O_L = O_L c0 + P0 V0_L; then, given c1 and P1, O_L = O_L c1 + P1 V1_L.
        Its row sum covers its own P0s. ``PERSISTENT``: ``walk`` = (g0, step, _): the program's block count before
        the step (block g in buffer g % 2, its landing the (g // 2)-th of that buffer's barrier, phase g // 2 mod 2)
        and its step count before it (the m0 / c1 exchange's phase); one-item programs pass anything."""
        q_v, q_r, kv_v, kv_r, red = smem
        q_ready, kv_ready, kv_free, sync = bars
        m_smem, c0_smem, c1_smem, l_smem = red
        m0_bar, s1_bar, epi = sync
        QK_L: gl.constexpr = _QK_L
        PV_L: gl.constexpr = _PV_L
        ROWS: gl.constexpr = gl.SliceLayout(1, QK_L)
        PV_ROWS: gl.constexpr = gl.SliceLayout(1, PV_L)
        dtype: gl.constexpr = q_v.dtype
        q_v, q_r, b0, b1, ph0, ph1, phase = _step_buffers(j, q_v, q_r, walk, PERSISTENT)
        n0 = start + 2 * j * _BN
        s = _masked_scores(_qk(q_v, q_r, kv_v.index(b0), kv_r.index(b0), kv_ready, b0, ph0, FINE, QK_L), n0, end,
                           qk_scale, QK_L)
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        c0 = gl.exp2(m_i - m_safe)
        p = gl.exp2(s - m_safe[:, None])
        l_i = l_i * c0 + gl.sum(p, axis=1)
        # m0, c0 and P0 (over block 0's rope piece, which only this warpgroup's QK read: 8 KiB) to consumer 1; its
        # loads of the last step's m and c0 are behind s1_bar, which this warpgroup passed.
        kv_r.index(b0).store(p.to(dtype))
        m_smem.store(m_new)
        c0_smem.store(c0)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(m0_bar)
        v_left = kv_v.index(b0).slice(0, _HALF, 1)
        _zero_tail(v_left, n0, end)
        acc = acc * gl.convert_layout(c0, PV_ROWS)[:, None]
        acc = warpgroup_mma(kv_r.index(b0), v_left, acc, is_async=True)
        # c1 and the step's last max from consumer 1, while the GEMM runs.
        mbarrier.wait(s1_bar, phase)
        c1 = c1_smem.load(ROWS)
        m_i = m_smem.load(ROWS)
        l_i = l_i * c1
        acc = warpgroup_mma_wait(0, deps=[acc])
        gl.thread_barrier()
        mbarrier.arrive(kv_free.index(b0))
        acc = acc * gl.convert_layout(c1, PV_ROWS)[:, None]
        if HAS1:
            # O_L += P1 V1_L, P1 from consumer 1 (over block 1's rope piece).
            _wait_block(kv_ready, b1, ph1, FINE)
            v1_left = kv_v.index(b1).slice(0, _HALF, 1)
            _zero_tail(v1_left, n0 + _BN, end)
            acc = warpgroup_mma(kv_r.index(b1), v1_left, acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            gl.thread_barrier()
            mbarrier.arrive(kv_free.index(b1))
        return m_i, l_i, acc

    @gluon.jit
    def _seesaw_right(j, smem, bars, l_i, acc, start, end, qk_scale, HAS1: gl.constexpr, FINE: gl.constexpr,
                      walk, PERSISTENT: gl.constexpr):
        """Consumer 1's part of step ``j``: S1 (block 2j + 1, with ``HAS1``); given m0, c0 and P0,
        O_R = O_R c0 + P0 V0_R, and meanwhile the step's last max m1, c1 and P1 for consumer 0; then
        O_R = O_R c1 + P1 V1_R. Its row sum covers its own P1s. Without ``HAS1`` (an odd item's last step) c1 = 1
        and there is no P1. ``PERSISTENT``: buffers and phases from ``walk`` = (g0, step, release) as
        ``_seesaw_left``'s, and the item's last block is not released here (this warpgroup's epilogue stages
        through it and releases it after): the odd last step's block 0, and block 1 where ``release`` is false."""
        q_v, q_r, kv_v, kv_r, red = smem
        q_ready, kv_ready, kv_free, sync = bars
        m_smem, c0_smem, c1_smem, l_smem = red
        m0_bar, s1_bar, epi = sync
        QK_L: gl.constexpr = _QK_L
        PV_L: gl.constexpr = _PV_L
        P_L: gl.constexpr = _P_L
        ROWS: gl.constexpr = gl.SliceLayout(1, QK_L)
        PV_ROWS: gl.constexpr = gl.SliceLayout(1, PV_L)
        dtype: gl.constexpr = q_v.dtype
        q_v, q_r, b0, b1, ph0, ph1, phase = _step_buffers(j, q_v, q_r, walk, PERSISTENT)
        n0 = start + 2 * j * _BN
        n1 = n0 + _BN
        if HAS1:
            s = _masked_scores(_qk(q_v, q_r, kv_v.index(b1), kv_r.index(b1), kv_ready, b1, ph1, FINE, QK_L), n1,
                               end, qk_scale, QK_L)
        mbarrier.wait(m0_bar, phase)
        m0 = m_smem.load(ROWS)
        c0 = c0_smem.load(ROWS)
        gl.thread_barrier()  # every thread has read m0 before any overwrites it
        _wait_block(kv_ready, b0, ph0, FINE)
        v0_right = kv_v.index(b0).slice(_HALF, _HALF, 1)
        _zero_tail(v0_right, n0, end)
        acc = acc * gl.convert_layout(c0, PV_ROWS)[:, None]
        acc = warpgroup_mma(kv_r.index(b0), v0_right, acc, is_async=True)
        if HAS1:
            m_new = gl.maximum(m0, gl.max(s, axis=1))
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            c1 = gl.exp2(m0 - m_safe)
            p = gl.exp2(s - m_safe[:, None])
            l_i = l_i * c0 * c1 + gl.sum(p, axis=1)
            p = p.to(dtype)
            kv_r.index(b1).store(p)
        else:
            m_new = m0
            c1 = gl.full([_BH], 1.0, gl.float32, layout=ROWS)
            l_i = l_i * c0
        m_smem.store(m_new)
        c1_smem.store(c1)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(s1_bar)
        acc = warpgroup_mma_wait(0, deps=[acc])
        gl.thread_barrier()
        if PERSISTENT:
            if HAS1:  # (else block 0 is the item's last: held for the epilogue)
                mbarrier.arrive(kv_free.index(b0))
        else:
            mbarrier.arrive(kv_free.index(b0))
        if HAS1:
            acc = acc * gl.convert_layout(c1, PV_ROWS)[:, None]
            v1_right = kv_v.index(b1).slice(_HALF, _HALF, 1)
            _zero_tail(v1_right, n1, end)
            acc = warpgroup_mma(gl.convert_layout(p, P_L), v1_right, acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            gl.thread_barrier()
            if PERSISTENT:
                mbarrier.arrive(kv_free.index(b1), pred=walk[2])
            else:
                mbarrier.arrive(kv_free.index(b1))
        return l_i, acc

    @gluon.jit
    def _seesaw_consumer0(smem, bars, item, geo, outs, FINE: gl.constexpr, PAGE_SIZE: gl.constexpr):
        q_v, q_r, kv_v, kv_r, red = smem
        q_ready, kv_ready, kv_free, sync = bars
        b, start, end, row, bad, n_tiles, head_tile = item
        q_desc, kv_desc, bt_row, bt_stride_p, num_pages, q_row, qk_scale = geo
        QK_L: gl.constexpr = _QK_L
        PV_L: gl.constexpr = _PV_L
        ROWS: gl.constexpr = gl.SliceLayout(1, QK_L)
        bad = bad | _pages_bad(bt_row, bt_stride_p, start, end, num_pages, PAGE_SIZE)
        m_i = gl.full([_BH], float("-inf"), gl.float32, layout=ROWS)
        l_i = gl.zeros([_BH], gl.float32, layout=ROWS)
        acc = gl.zeros([_BH, _HALF], gl.float32, layout=PV_L)
        mbarrier.wait(q_ready, 0, pred=n_tiles > 0)
        for j in range(n_tiles // 2):
            m_i, l_i, acc = _seesaw_left(j, smem, bars, m_i, l_i, acc, start, end, qk_scale, True, FINE, 0, False)
        if n_tiles % 2 == 1:
            m_i, l_i, acc = _seesaw_left(n_tiles // 2, smem, bars, m_i, l_i, acc, start, end, qk_scale, False, FINE,
                                         0, False)
        l_i = _row_sums(gl.where(bad, float("nan"), l_i), red[3], sync[2], 0, 2, ROWS, 0)
        _store_half(acc, m_i, l_i, outs, b, row, head_tile, smem[2].index(0), 0, True, PV_L)

    @gluon.jit
    def _seesaw_consumer1(smem, bars, item, geo, outs, FINE: gl.constexpr, PAGE_SIZE: gl.constexpr):
        q_v, q_r, kv_v, kv_r, red = smem
        q_ready, kv_ready, kv_free, sync = bars
        b, start, end, row, bad, n_tiles, head_tile = item
        q_desc, kv_desc, bt_row, bt_stride_p, num_pages, q_row, qk_scale = geo
        QK_L: gl.constexpr = _QK_L
        PV_L: gl.constexpr = _PV_L
        ROWS: gl.constexpr = gl.SliceLayout(1, QK_L)
        l_i = gl.zeros([_BH], gl.float32, layout=ROWS)
        acc = gl.zeros([_BH, _HALF], gl.float32, layout=PV_L)
        mbarrier.wait(q_ready, 0, pred=n_tiles > 0)
        for j in range(n_tiles // 2):
            l_i, acc = _seesaw_right(j, smem, bars, l_i, acc, start, end, qk_scale, True, FINE, 0, False)
        if n_tiles % 2 == 1:
            l_i, acc = _seesaw_right(n_tiles // 2, smem, bars, l_i, acc, start, end, qk_scale, False, FINE, 0, False)
        l_i = _row_sums(l_i, red[3], sync[2], 1, 2, ROWS, 0)
        # (m is consumer 0's to write with the lse; it is not read here)
        _store_half(acc, l_i, l_i, outs, b, row, head_tile, smem[2].index(1), _HALF, False, PV_L)

    # --- the persistent seesaw: a program walks its slot's items ----------------------------------------------------

    @gluon.jit
    def _fill_half(outs, b, row, bad, head_tile, COL0: gl.constexpr, WRITE_LSE: gl.constexpr):
        """An item without blocks (an empty request, or an item outside ``[0, max_keys]``): columns ``COL0 + [0,
        256)`` of its rows 0 (NaN where ``bad``), with ``WRITE_LSE`` the lse -inf (NaN), where ``_store_half`` of
        a zero accumulator puts them; stored from registers (no staging buffer: the producer may be filling every
        buffer with the next item's copies). Bytes: 64 x 256 x elt (+ 64 x 4)."""
        (out_ptr, lse_ptr, po_ptr, pl_ptr, num_heads, out_stride_b, out_stride_h, out_stride_d, lse_stride_b,
         lse_stride_h, po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h) = outs
        ROW_L: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
        cols = COL0 + gl.arange(0, _HALF, layout=gl.SliceLayout(0, ROW_L))
        fill = gl.zeros([16, _HALF], gl.float32, layout=ROW_L) + gl.where(bad, float("nan"), 0.0)
        for r in gl.static_range(0, _BH, 16):
            heads = head_tile * _BH + r + gl.arange(0, 16, layout=gl.SliceLayout(1, ROW_L))
            mask = (heads < num_heads)[:, None]
            if row < 0:
                gl.store(out_ptr + b * out_stride_b + heads[:, None] * out_stride_h + cols[None, :] * out_stride_d,
                         fill.to(out_ptr.dtype.element_ty), mask=mask)
            else:
                gl.store(po_ptr + row.to(gl.int64) * po_stride_r + heads[:, None] * po_stride_h
                         + cols[None, :] * po_stride_d, fill, mask=mask)
        if WRITE_LSE:
            LSE_L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
            heads = head_tile * _BH + gl.arange(0, _BH, layout=LSE_L)
            lse = gl.zeros([_BH], gl.float32, layout=LSE_L) + gl.where(bad, float("nan"), float("-inf"))
            if row < 0:
                gl.store(lse_ptr + b * lse_stride_b + heads * lse_stride_h, lse, mask=heads < num_heads)
            else:
                gl.store(pl_ptr + row.to(gl.int64) * pl_stride_r + heads * pl_stride_h, lse, mask=heads < num_heads)

    @gluon.jit
    def _opaque_outs(outs, head_tile, it):
        """``outs`` and ``head_tile`` plus an opaque 0 (``_opaque_zero``, once an item): the epilogue's addresses
        are then computed in each item's epilogue, not hoisted out of the item loop and held (spilled) through the
        GEMMs."""
        (out_ptr, lse_ptr, po_ptr, pl_ptr, num_heads, out_stride_b, out_stride_h, out_stride_d, lse_stride_b,
         lse_stride_h, po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h) = outs
        z = _opaque_zero(it)
        return ((out_ptr + z, lse_ptr + z, po_ptr + z, pl_ptr + z, num_heads + z, out_stride_b + z, out_stride_h + z,
                 out_stride_d + z, lse_stride_b + z, lse_stride_h + z, po_stride_r + z, po_stride_h + z,
                 po_stride_d + z, pl_stride_r + z, pl_stride_h + z), head_tile + z)

    @gluon.jit
    def _walk_item(walk, it):
        """Item ``it`` of the slot (``_load_item``), its block count, its block-table row and its q row."""
        items_ptr, first, stop, max_keys, head_tile, bt_ptr, bt_stride_b, num_heads, q_free = walk
        b, start, end, row, bad = _load_item(items_ptr, it, max_keys)
        return (b, start, end, row, bad, gl.cdiv(end - start, _BN), bt_ptr + b * bt_stride_b,
                b.to(gl.int32) * num_heads + head_tile * _BH)

    @gluon.jit
    def _persist_consumer0(smem, bars, walk, geo, outs, rec, FINE: gl.constexpr, PAGE_SIZE: gl.constexpr,
                           TIMELINE: gl.constexpr):
        """Consumer 0 of the persistent seesaw (the default partition): each item of the slot in order as
        ``_seesaw_consumer0``, the block and step counts carried across items (the phases), its half of the output
        staged through Q's buffer (free: both consumers are past their last QK), which it then hands to the
        producer for the next item's Q (``q_free``). ``TIMELINE``: the program's record, its slot's first item and
        item count."""
        q_v, q_r, kv_v, kv_r, red = smem
        q_ready, kv_ready, kv_free, sync = bars
        items_ptr, first, stop, max_keys, head_tile, bt_ptr, bt_stride_b, num_heads, q_free = walk
        q_desc, kv_desc, bt_stride_p, num_pages, qk_scale = geo
        timeline_ptr, pid, slot = rec
        QK_L: gl.constexpr = _QK_L
        PV_L: gl.constexpr = _PV_L
        ROWS: gl.constexpr = gl.SliceLayout(1, QK_L)
        if TIMELINE:
            start_record_slot(timeline_ptr, pid, slot, head_tile, first, stop - first)
        blocks = first * 0  # blocks of the slot's earlier items, their steps, the non-empty items among them
        steps = first * 0
        done = first * 0
        for it in range(first, stop):
            b, start, end, row, bad, n_tiles, bt_row, q_row = _walk_item(walk, it)
            if n_tiles > 0:
                bad = bad | _pages_bad(bt_row, bt_stride_p, start, end, num_pages, PAGE_SIZE)
                m_i = gl.full([_BH], float("-inf"), gl.float32, layout=ROWS)
                l_i = gl.zeros([_BH], gl.float32, layout=ROWS)
                acc = gl.zeros([_BH, _HALF], gl.float32, layout=PV_L)
                mbarrier.wait(q_ready, done & 1)
                for j in range(n_tiles // 2):
                    m_i, l_i, acc = _seesaw_left(j, smem, bars, m_i, l_i, acc, start, end, qk_scale, True, FINE,
                                                 (blocks + 2 * j, steps + j, True), True)
                if n_tiles % 2 == 1:
                    m_i, l_i, acc = _seesaw_left(n_tiles // 2, smem, bars, m_i, l_i, acc, start, end, qk_scale,
                                                 False, FINE, (blocks + n_tiles - 1, steps + n_tiles // 2, True),
                                                 True)
                l_i = _row_sums(gl.where(bad, float("nan"), l_i), red[3], sync[2], 0, 2, ROWS, done & 1)
                outs_i, tile_i = _opaque_outs(outs, head_tile, it)
                _store_half(acc, m_i, l_i, outs_i, b, row, tile_i, q_v.index(_opaque_zero(it)), 0, True, PV_L)
                fence_async_shared()  # (the staging's generic accesses before the producer's TMA into q_v)
                gl.thread_barrier()
                mbarrier.arrive(q_free)
                blocks += n_tiles
                steps += (n_tiles + 1) // 2
                done += 1
            else:
                outs_i, tile_i = _opaque_outs(outs, head_tile, it)
                _fill_half(outs_i, b, row, bad, tile_i, 0, True)
        if TIMELINE:
            end_record_slot(timeline_ptr, pid)

    @gluon.jit
    def _persist_consumer1(smem, bars, walk, geo, outs, rec, FINE: gl.constexpr, PAGE_SIZE: gl.constexpr,
                           TIMELINE: gl.constexpr):
        """Consumer 1 of the persistent seesaw: each item as ``_seesaw_consumer1``; it keeps the item's last block
        (buffer (blocks + n - 1) % 2) past its last GEMM, stages its half of the output there and releases it
        after (the producer's next copy into that buffer waits for this release and consumer 0's)."""
        q_v, q_r, kv_v, kv_r, red = smem
        q_ready, kv_ready, kv_free, sync = bars
        items_ptr, first, stop, max_keys, head_tile, bt_ptr, bt_stride_b, num_heads, q_free = walk
        q_desc, kv_desc, bt_stride_p, num_pages, qk_scale = geo
        QK_L: gl.constexpr = _QK_L
        PV_L: gl.constexpr = _PV_L
        ROWS: gl.constexpr = gl.SliceLayout(1, QK_L)
        blocks = first * 0
        steps = first * 0
        done = first * 0
        for it in range(first, stop):
            b, start, end, row, bad, n_tiles, bt_row, q_row = _walk_item(walk, it)
            if n_tiles > 0:
                l_i = gl.zeros([_BH], gl.float32, layout=ROWS)
                acc = gl.zeros([_BH, _HALF], gl.float32, layout=PV_L)
                mbarrier.wait(q_ready, done & 1)
                for j in range(n_tiles // 2):  # (an even item's last step keeps its block 1)
                    l_i, acc = _seesaw_right(j, smem, bars, l_i, acc, start, end, qk_scale, True, FINE,
                                             (blocks + 2 * j, steps + j, (2 * j + 2 < n_tiles)), True)
                if n_tiles % 2 == 1:
                    l_i, acc = _seesaw_right(n_tiles // 2, smem, bars, l_i, acc, start, end, qk_scale, False, FINE,
                                             (blocks + n_tiles - 1, steps + n_tiles // 2, False), True)
                l_i = _row_sums(l_i, red[3], sync[2], 1, 2, ROWS, done & 1)
                last = (blocks + n_tiles - 1) & 1
                outs_i, tile_i = _opaque_outs(outs, head_tile, it)
                _store_half(acc, l_i, l_i, outs_i, b, row, tile_i, kv_v.index(last), _HALF, False, PV_L)
                fence_async_shared()  # (the staging's generic accesses before the producer's TMA into the buffer)
                gl.thread_barrier()
                mbarrier.arrive(kv_free.index(last))
                blocks += n_tiles
                steps += (n_tiles + 1) // 2
                done += 1
            else:
                outs_i, tile_i = _opaque_outs(outs, head_tile, it)
                _fill_half(outs_i, b, row, bad, tile_i, _HALF, False)

    @gluon.jit
    def _persist_load(smem, bars, walk, geo, outs, rec, FINE: gl.constexpr, PAGE_SIZE: gl.constexpr,
                      TIMELINE: gl.constexpr):
        """The producer of the persistent seesaw: the slot's blocks in order, block g of the program into buffer
        g % 2 once both consumers released block g - 2 (consumer 1 releases an item's last block after its
        epilogue); each non-empty item's Q after its first block (whose buffer frees first), once consumer 0's last
        epilogue left Q's buffer (``q_free``). An empty item copies nothing."""
        q_all, q_rall, kv_v, kv_r, red = smem
        q_v = q_all.index(0)
        q_r = q_rall.index(0)
        q_ready, kv_ready, kv_free, sync = bars
        items_ptr, first, stop, max_keys, head_tile, bt_ptr, bt_stride_b, num_heads, q_free = walk
        q_desc, kv_desc, bt_stride_p, num_pages, qk_scale = geo
        blocks = first * 0
        done = first * 0
        for it in range(first, stop):
            b, start, end, row, bad, n_tiles, bt_row, q_row = _walk_item(walk, it)
            for t in range(n_tiles):
                g = blocks + t
                buf = g & 1
                n0 = start + t * _BN
                page = gl.load(bt_row + (n0 // PAGE_SIZE) * bt_stride_p)  # (as _part_load's)
                krow = page * PAGE_SIZE + n0 % PAGE_SIZE
                mbarrier.wait(kv_free.index(buf), ((g >> 1) & 1) ^ 1)  # (a fresh barrier passes parity 1)
                _issue_block(kv_desc, krow, kv_v.index(buf), kv_r.index(buf), kv_ready, buf, FINE)
                if t == 0:
                    mbarrier.wait(q_free, (done & 1) ^ 1)
                    mbarrier.expect(q_ready, _NP * q_desc.block_type.nbytes)
                    for c in gl.static_range(_NV):
                        tma.async_copy_global_to_shared(q_desc, [q_row, c * _PIECE], q_ready,
                                                        q_v.slice(c * _PIECE, _PIECE, 1))
                    tma.async_copy_global_to_shared(q_desc, [q_row, _NV * _PIECE], q_ready, q_r)
            blocks += n_tiles
            done += gl.where(n_tiles > 0, 1, 0)

    # --- partitions -----------------------------------------------------------------------------------------------

    @gluon.jit
    def _now_ns(j):
        """``%globaltimer`` (ns; ``j``, any int32 scalar, only anchors the asm)."""
        return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [j], dtype=gl.int64, is_pure=False,
                                         pack=1)

    @gluon.jit
    def _smid(j):
        """The SM the program runs on (PTX ``%smid``)."""
        return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [j], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def absent_record(timeline_ptr, pid):
        """A program past a capacity's slot count marks its record absent (``kernels.timeline.absent_record``)."""
        gl.store(timeline_ptr + pid.to(gl.int64) * _RECORD, (pid * 0 - 1).to(gl.int64))

    @gluon.jit
    def start_record(timeline_ptr, pid, TIMELINE: gl.constexpr):
        """A program's ``start_ns`` (``kernels.timeline``'s record), stored at once unless ``TIMELINE`` is
        ``HOLD_START``; returned for ``end_record``."""
        t = _now_ns(pid)
        if TIMELINE != _HOLD_START:
            gl.store(timeline_ptr + pid.to(gl.int64) * _RECORD + 2, t)
        return t

    @gluon.jit
    def end_record(timeline_ptr, pid, it, group, start, TIMELINE: gl.constexpr):
        """The rest of a one-item program's record (``kernels.timeline.FIELDS``): its end and SM, slot and item
        ``it``, head group ``group``, one item; ``start`` too where ``TIMELINE`` is ``HOLD_START``."""
        end = _now_ns(pid)
        base = timeline_ptr + pid.to(gl.int64) * _RECORD
        if TIMELINE == _HOLD_START:
            gl.store(base + 2, start)
        gl.store(base, pid.to(gl.int64))
        gl.store(base + 1, _smid(pid).to(gl.int64))
        gl.store(base + 3, end)
        gl.store(base + 4, it.to(gl.int64))
        gl.store(base + 5, group.to(gl.int64))
        gl.store(base + 6, it.to(gl.int64))
        gl.store(base + 7, (it * 0 + 1).to(gl.int64))

    @gluon.jit
    def start_record_slot(timeline_ptr, pid, slot, group, first, count):
        """A persistent program's ``start_ns`` and what it runs (slot ``slot``, head group ``group``, its first item
        ``first`` and ``count`` items), stored at once: no register holds them through the item loop."""
        base = timeline_ptr + pid.to(gl.int64) * _RECORD
        gl.store(base + 2, _now_ns(pid))
        gl.store(base + 4, slot.to(gl.int64))
        gl.store(base + 5, group.to(gl.int64))
        gl.store(base + 6, first.to(gl.int64))
        gl.store(base + 7, count.to(gl.int64))

    @gluon.jit
    def end_record_slot(timeline_ptr, pid):
        """The rest of a persistent program's record: its id, SM and end (the id last: a record without one is a
        program that did not finish, which ``kernels.timeline.read`` drops)."""
        end = _now_ns(pid)
        base = timeline_ptr + pid.to(gl.int64) * _RECORD
        gl.store(base + 1, _smid(pid).to(gl.int64))
        gl.store(base + 3, end)
        gl.store(base, pid.to(gl.int64))

    @gluon.jit
    def _part_consumer0(smem, bars, item, geo, outs, rec, SEESAW: gl.constexpr, FINE: gl.constexpr,
                        PAGE_SIZE: gl.constexpr, TIMELINE: gl.constexpr):
        """The default partition (4 warps): output columns [0, 256) and the lse. ``TIMELINE``: the program's record
        (``kernels.timeline``: 64 bytes, the start stored at once, the rest after this half's last store)."""
        timeline_ptr, pid, it, head_tile = rec
        if TIMELINE:
            t_start = start_record(timeline_ptr, pid, TIMELINE)
        if SEESAW:
            _seesaw_consumer0(smem, bars, item, geo, outs, FINE, PAGE_SIZE)
        else:
            _recompute(smem, bars, item, geo, outs, 0, True, FINE, PAGE_SIZE)
        if TIMELINE:
            end_record(timeline_ptr, pid, it, head_tile, t_start, TIMELINE)

    @gluon.jit
    def _part_consumer1(smem, bars, item, geo, outs, rec, SEESAW: gl.constexpr, FINE: gl.constexpr,
                        PAGE_SIZE: gl.constexpr, TIMELINE: gl.constexpr):
        """A worker partition (4 warps): output columns [256, 512)."""
        if SEESAW:
            _seesaw_consumer1(smem, bars, item, geo, outs, FINE, PAGE_SIZE)
        else:
            _recompute(smem, bars, item, geo, outs, _HALF, False, FINE, PAGE_SIZE)

    @gluon.jit
    def _part_load(smem, bars, item, geo, outs, rec, SEESAW: gl.constexpr, FINE: gl.constexpr,
                   PAGE_SIZE: gl.constexpr, TIMELINE: gl.constexpr):
        """The producer (1 warp): Q's nine pieces (64 x 576 x 2 bytes), then every block of the item into buffer
        t % 2 once both consumers released block t - 2 (64 x 576 x 2 bytes and its 4-byte table entry)."""
        q_v, q_r, kv_v, kv_r, red = smem
        q_ready, kv_ready, kv_free, sync = bars
        b, start, end, row, bad, n_tiles, head_tile = item
        q_desc, kv_desc, bt_row, bt_stride_p, num_pages, q_row, qk_scale = geo
        some = n_tiles > 0  # (an empty item copies nothing: no copy may outlive the program)
        mbarrier.expect(q_ready, _NP * q_desc.block_type.nbytes, pred=some)
        for c in gl.static_range(_NV):
            tma.async_copy_global_to_shared(q_desc, [q_row, c * _PIECE], q_ready, q_v.slice(c * _PIECE, _PIECE, 1),
                                            pred=some)
        tma.async_copy_global_to_shared(q_desc, [q_row, _NV * _PIECE], q_ready, q_r, pred=some)
        for t in range(n_tiles):
            buf = t % 2
            n0 = start + t * _BN
            # The block's page (read before the wait, so its latency hides behind it); an entry outside the cache
            # puts the box outside the tensor (zeros) or wraps into it, and the consumers' scan makes the row NaN.
            page = gl.load(bt_row + (n0 // PAGE_SIZE) * bt_stride_p)
            krow = page * PAGE_SIZE + n0 % PAGE_SIZE
            mbarrier.wait(kv_free.index(buf), ((t // 2) & 1) ^ 1)  # (a fresh barrier passes parity 1)
            _issue_block(kv_desc, krow, kv_v.index(buf), kv_r.index(buf), kv_ready, buf, FINE)

    @gluon.jit
    def _mla_ws_kernel(
        q_desc, kv_desc, bt_ptr, items_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
        num_heads, num_head_tiles, qk_scale, num_pages, max_keys,
        bt_stride_b, bt_stride_p,
        out_stride_b, out_stride_h, out_stride_d,
        lse_stride_b, lse_stride_h,
        po_stride_r, po_stride_h, po_stride_d,
        pl_stride_r, pl_stride_h,
        num_ctas_ptr, timeline_ptr,
        PAGE_SIZE: gl.constexpr, SEESAW: gl.constexpr, FINE: gl.constexpr, BOUNDED: gl.constexpr,
        TIMELINE: gl.constexpr, num_warps: gl.constexpr, cta_ptr=None, PERSISTENT: gl.constexpr = False,
    ):
        # One program per (work item, head tile), head tile fastest: the head tiles of an item share its blocks
        # through L2. BOUNDED: a grid sized to a plan's capacity (kernels.decode_plan, CUDA graphs), the programs
        # past the plan's slot count exit at once. PERSISTENT (the seesaw only): one program per (CTA slot, head
        # tile), walking the slot's items cta_ptr[slot] .. cta_ptr[slot + 1] (the work list's CTA offsets).
        pid = gl.program_id(0)
        head_tile = pid % num_head_tiles
        it = pid // num_head_tiles
        if BOUNDED:
            if it >= gl.load(num_ctas_ptr):
                if TIMELINE:
                    absent_record(timeline_ptr, pid)
                return
        if PERSISTENT:
            first = gl.load(cta_ptr + it)
            stop = gl.load(cta_ptr + it + 1)
        else:
            b, start, end, row, bad = _load_item(items_ptr, it, max_keys)
            n_tiles = gl.cdiv(end - start, _BN)
        dtype: gl.constexpr = q_desc.dtype
        SM_L: gl.constexpr = q_desc.layout
        VEC_L: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        if PERSISTENT:  # (Q as one of one: the consumers index it with an opaque 0, _seesaw_left)
            q_v = gl.allocate_shared_memory(dtype, [1, _BH, _NV * _PIECE], SM_L)
            q_r = gl.allocate_shared_memory(dtype, [1, _BH, _PIECE], SM_L)
        else:
            q_v = gl.allocate_shared_memory(dtype, [_BH, _NV * _PIECE], SM_L)
            q_r = gl.allocate_shared_memory(dtype, [_BH, _PIECE], SM_L)
        kv_v = gl.allocate_shared_memory(dtype, [2, _BN, _NV * _PIECE], SM_L)
        kv_r = gl.allocate_shared_memory(dtype, [2, _BN, _PIECE], SM_L)
        m_smem = gl.allocate_shared_memory(gl.float32, [_BH], VEC_L)
        c0_smem = gl.allocate_shared_memory(gl.float32, [_BH], VEC_L)
        c1_smem = gl.allocate_shared_memory(gl.float32, [_BH], VEC_L)
        l_smem = (gl.allocate_shared_memory(gl.float32, [_BH], VEC_L),
                  gl.allocate_shared_memory(gl.float32, [_BH], VEC_L))
        # Barriers: Q landed; each piece (or block) landed (producer -> consumers, by TMA bytes); each buffer free
        # (both consumers -> producer); seesaw: m0, c0 and P0 ready; m1, c1 and P1 ready; the row sums (both).
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [2 * _NP, 1], mbarrier.MBarrierLayout())
        kv_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        m0_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        s1_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        epi = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        for i in gl.static_range(2 * _NP):
            mbarrier.init(kv_ready.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(kv_free.index(i), count=2)
        mbarrier.init(m0_bar, count=1)
        mbarrier.init(s1_bar, count=1)
        mbarrier.init(epi, count=2)
        if PERSISTENT:  # Q's buffer free for the next item's Q (consumer 0's epilogue stages through it)
            q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            mbarrier.init(q_free, count=1)

        smem = (q_v, q_r, kv_v, kv_r, (m_smem, c0_smem, c1_smem, l_smem))
        bars = (q_ready, kv_ready, kv_free, (m0_bar, s1_bar, epi))
        outs = (out_ptr, lse_ptr, po_ptr, pl_ptr, num_heads, out_stride_b, out_stride_h, out_stride_d, lse_stride_b,
                lse_stride_h, po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h)
        if PERSISTENT:
            walk = (items_ptr, first, stop, max_keys, head_tile, bt_ptr, bt_stride_b, num_heads, q_free)
            geo = (q_desc, kv_desc, bt_stride_p, num_pages, qk_scale)
            rec = (timeline_ptr, pid, it)
            gl.warp_specialize([(_persist_consumer0, (smem, bars, walk, geo, outs, rec, FINE, PAGE_SIZE, TIMELINE)),
                                (_persist_consumer1, (smem, bars, walk, geo, outs, rec, FINE, PAGE_SIZE, TIMELINE)),
                                (_persist_load, (smem, bars, walk, geo, outs, rec, FINE, PAGE_SIZE, TIMELINE))],
                               _WARPS, _REGS)
        else:
            item = (b, start, end, row, bad, n_tiles, head_tile)
            geo = (q_desc, kv_desc, bt_ptr + b * bt_stride_b, bt_stride_p, num_pages,
                   b.to(gl.int32) * num_heads + head_tile * _BH, qk_scale)
            # (The constexprs go into each tuple as it is written: a tuple assigned to a name first turns them into
            # runtime values.)
            rec = (timeline_ptr, pid, it, head_tile)
            gl.warp_specialize([(_part_consumer0, (smem, bars, item, geo, outs, rec, SEESAW, FINE, PAGE_SIZE,
                                                   TIMELINE)),
                                (_part_consumer1, (smem, bars, item, geo, outs, rec, SEESAW, FINE, PAGE_SIZE,
                                                   TIMELINE)),
                                (_part_load, (smem, bars, item, geo, outs, rec, SEESAW, FINE, PAGE_SIZE, TIMELINE))],
                               _WARPS, _REGS)


#: Off: the work-list launchers run the tl tile everywhere (A/B runs; tests/gpu compares the two).
ENABLED = True
#: The variant the work-list launchers run: the seesaw carries the gain, the 64 x 64 pieces add nothing (H200,
#: experiments/mla_ws).
DEFAULT_VARIANT = "seesaw"
#: The variant they run on a persistent schedule (stream-K, FlashMLA's: several items a slot), or None: the tl tile
#: there. None: the persistent seesaw is correct on a GPU but not faster (its item loop costs 3-5%, and at FlashMLA's
#: own split it runs 0.93-1.02x the one-item kernel: experiments/mla_ws, "The persistent seesaw").
PERSISTENT_VARIANT: str | None = None


def variant_for(persistent: bool) -> str:
    """The variant the work-list launchers run where ``use_ws`` says so, for a schedule that is ``persistent`` or
    not."""
    return PERSISTENT_VARIANT if persistent else DEFAULT_VARIANT


def use_ws(q_dtype: torch.dtype, kv_dtype: torch.dtype, head_dim_qk: int, head_dim_v: int, tile: tuple[int, ...],
           page_size: int, device: torch.device, persistent: bool, align: int) -> bool:
    """Whether the work-list launchers (``worklist.mla_decode_scheduled``, ``decode_plan.MLADecodePlan``) run this
    kernel (``DEFAULT_VARIANT``) instead of the tl tile: ``ENABLED``, Gluon, not the interpreter, an sm_90 GPU, a
    16-bit q and cache of one dtype, Dqk 576 / Dv 512, the tl tile's 64-row default (``tile`` = (block_h, block_n,
    num_warps, num_stages) as ``mla_sm90.in_scope`` takes it: 40 heads and more), pages of a multiple of 64 keys,
    and a schedule aligned to 64 keys, of one item a slot unless ``PERSISTENT_VARIANT`` is set (``variant_for``).
    A call's cache must also be one TMA tensor of rows (``cache_ok``)."""
    from splitlab.kernels import mla_sm90

    if not (ENABLED and HAVE_GLUON) or launch_common.INTERPRET or device.type != "cuda":
        return False
    return (mla_sm90.in_scope(q_dtype, kv_dtype, head_dim_qk, head_dim_v, *tile)
            and (head_dim_qk, head_dim_v) == (HEAD_DIM_QK, HEAD_DIM_V) and page_size % BLOCK_N == 0
            and (not persistent or PERSISTENT_VARIANT is not None) and align % BLOCK_N == 0
            and torch.cuda.get_device_capability(device)[0] == 9)


def cache_ok(kv_cache: torch.Tensor) -> bool:
    """Whether a paged cache (``[num_pages >= 1, page_size, ...]``, the rows' elements contiguous) reads as one 2-D
    TMA tensor of fewer than 2^31 rows (``check_launch``'s cache scope, as a test: the launchers run the tl tile on
    any other cache; ``mqa_sm90_ws`` asks it of each of its caches)."""
    num_pages, page_size = kv_cache.shape[:2]
    return (num_pages >= 1 and num_pages * page_size < 2**31 and kv_cache.stride(0) == page_size * kv_cache.stride(1)
            and _tma_rows(kv_cache, kv_cache.stride(1)))


def _tma_rows(t: torch.Tensor, row_stride: int) -> bool:
    """Whether ``t`` can be read as a 2-D TMA tensor of rows ``row_stride`` elements apart: contiguous rows, a
    16-byte-aligned base and row stride."""
    e = t.element_size()
    return t.stride(-1) == 1 and (t.data_ptr() % 16 == 0) and (row_stride * e) % 16 == 0


def check_launch(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, work: object, variant: str,
                 head_dim_v: int) -> WorkList:
    """The scope in the module docstring, each breach one ``SplitlabError`` line; returns the checked work list."""
    from splitlab.kernels import mla

    if not HAVE_GLUON:
        raise SplitlabError("mla_decode_ws: needs triton 3.6's Gluon (triton.experimental.gluon)")
    if launch_common.INTERPRET:
        raise SplitlabError("mla_decode_ws: Gluon kernels do not run under TRITON_INTERPRET=1")
    if variant not in VARIANTS:
        raise SplitlabError(f"mla_decode_ws: variant={variant!r} is not allowed; expected one of {sorted(VARIANTS)}")
    mla.check_inputs(q, kv_cache, block_table)
    if q.is_cuda and torch.cuda.get_device_capability(q.device)[0] != 9:
        raise SplitlabError(f"mla_decode_ws: q is on {torch.cuda.get_device_name(q.device)}; expected an sm_90 GPU")
    if q.dtype not in (torch.bfloat16, torch.float16) or kv_cache.dtype != q.dtype:
        raise SplitlabError(f"mla_decode_ws: q {q.dtype} and kv_cache {kv_cache.dtype}; expected both bfloat16 or "
                            "both float16")
    B, H, Dqk = q.shape
    num_pages, page_size, _ = kv_cache.shape
    if (Dqk, head_dim_v) != (HEAD_DIM_QK, HEAD_DIM_V):
        raise SplitlabError(f"mla_decode_ws: head_dim_qk={Dqk}, head_dim_v={head_dim_v}; expected "
                            f"{HEAD_DIM_QK}/{HEAD_DIM_V}")
    if page_size % BLOCK_N or num_pages < 1:
        raise SplitlabError(f"mla_decode_ws: kv_cache has {num_pages} pages of {page_size}; expected at least one "
                            f"page, of a multiple of {BLOCK_N} keys")
    if num_pages * page_size >= 2**31:
        raise SplitlabError(f"mla_decode_ws: kv_cache holds {num_pages * page_size} rows; expected fewer than 2^31")
    if not cache_ok(kv_cache):
        raise SplitlabError(f"mla_decode_ws: kv_cache strides {tuple(kv_cache.stride())} are not allowed; expected "
                            "pages of contiguous rows back to back, 16-byte aligned (one 2-D TMA tensor of rows)")
    work = check_worklist(work, B, block_table.shape[1] * page_size, q.device, "mla_decode_ws")
    if variant in PERSISTENT_VARIANTS:
        if work.schedule.align % BLOCK_N:
            raise SplitlabError(f"mla_decode_ws: a schedule with items aligned to {work.schedule.align} keys is not "
                                f"allowed; expected items starting at multiples of {BLOCK_N} ({variant})")
    elif work.schedule.persistent or work.schedule.align % BLOCK_N:
        kind = "a persistent schedule" if work.schedule.persistent else "a schedule"
        raise SplitlabError(f"mla_decode_ws: {kind} with items aligned to {work.schedule.align} keys is not allowed; "
                            f"expected one item a CTA slot (not persistent), items starting at multiples of {BLOCK_N}")
    return work


def mla_decode_ws(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, work: WorkList, *,
                  variant: str = "seesaw-fine", head_dim_v: int = HEAD_DIM_V, sm_scale: float | None = None,
                  return_lse: bool = False, timelines: Timelines | None = None):
    """Absorbed MLA decode over a work list on this module's kernel (``variant`` of ``VARIANTS``):
    ``worklist.mla_decode_scheduled``'s inputs and outputs within the scope of the module docstring."""
    work = check_launch(q, kv_cache, block_table, work, variant, head_dim_v)
    B, H, Dqk = q.shape
    scale = launch_common.resolve_sm_scale(sm_scale, Dqk)
    out = launch_common.alloc(B, H, head_dim_v, dtype=q.dtype, device=q.device)
    lse = launch_common.alloc(B, H, dtype=torch.float32, device=q.device)
    po, pl = alloc_partials(work, H, head_dim_v, q.device)
    with launch_common.device_guard(q):
        launch(q, kv_cache, block_table, work.items, work.ctas, out, lse, po, pl, scale * LOG2E, variant,
               timeline=timeline_args(timelines, work.ctas * -(-H // BLOCK_H), q.device, "mla_decode_ws"),
               cta_offsets=work.cta_offsets if variant in PERSISTENT_VARIANTS else None)
        launch_merge(work, po, pl, out, lse, timelines)
    return (out, lse) if return_lse else out


@functools.cache
def box_layout(dtype: torch.dtype):
    """The swizzled shared layout of a 64-column TMA box of ``dtype`` (bf16 or fp16), made once: a Gluon layout
    object costs microseconds of host time to build, on every launch otherwise."""
    return gl.NVMMASharedLayout.get_default_for([BLOCK_H, PIECE], gl.bfloat16 if dtype == torch.bfloat16
                                                else gl.float16)


def tma_descriptor(base: torch.Tensor, shape: list[int], strides: list[int], block_shape: list[int], layout):
    """``TensorDescriptor(base, shape, strides, block_shape, layout)`` without its constructor's checks (a fifth to a
    quarter of a launch's descriptors' host time: ``experiments/plan_run/launch_probe.py``'s ``ws-descriptors``;
    ``tests/test_bound_launch.py`` holds the two equal): the Gluon kernels' callers have made them (a 2-D view of rows
    ``strides[0]`` apart, contiguous, with a 16-byte aligned base and row stride: ``_tma_rows``, ``cache_ok``; boxes
    and layouts of these modules). A shape with a dimension below 1 takes the constructor, and its refusal."""
    if min(shape) < 1:
        return TensorDescriptor(base, shape, strides, block_shape, layout)
    d = object.__new__(TensorDescriptor)
    d.base, d.shape, d.strides, d.block_shape, d.layout, d.padding = base, shape, strides, block_shape, layout, "zero"
    return d


def descriptors(q: torch.Tensor, kv_cache: torch.Tensor):
    """The TMA descriptors of q (rows of ``[B * H, 576]``; a contiguous copy where q's strides are not that) and
    of the cache (rows of ``[num_pages * page_size, 576]``), both in 64 x 64 boxes."""
    B, H, Dqk = q.shape
    if not (_tma_rows(q, q.stride(1)) and q.stride(0) == H * q.stride(1)):
        q = q.contiguous()
    layout = box_layout(q.dtype)
    rows = kv_cache.shape[0] * kv_cache.shape[1]
    q_desc = tma_descriptor(q, [B * H, Dqk], [q.stride(1), 1], [BLOCK_H, PIECE], layout)
    kv_desc = tma_descriptor(kv_cache, [rows, Dqk], [kv_cache.stride(1), 1], [BLOCK_N, PIECE], layout)
    return q_desc, kv_desc


def launch(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, items: torch.Tensor, slots: int,
           out: torch.Tensor, lse: torch.Tensor, po: torch.Tensor, pl: torch.Tensor, qk_scale: float, variant: str,
           *, num_ctas: torch.Tensor | None = None, timeline: dict | None = None,
           cta_offsets: torch.Tensor | None = None, bound: bool = False) -> None:
    """The partial kernel alone (no checks of the inputs: ``check_launch``'s; ``qk_scale`` in base 2): ``slots`` CTA
    slots of the work list ``items`` (one item a slot), each head tile a program. ``num_ctas``: a device int32
    holding the plan's slot count, ``slots`` then a capacity (programs past the count exit); ``timeline``: the
    timeline arguments of ``kernels.timeline.Timelines.args`` (each program's record). ``cta_offsets`` (int32
    ``[slots + 1]``, the work list's ``cta_offsets``; at least that many with ``num_ctas``): a slot's items, which a
    ``PERSISTENT_VARIANTS`` variant's program walks in order; it is required with those variants and refused with
    the others (one ``SplitlabError`` line). ``bound`` (a plan's launches): through ``kernels.bound_launch`` (Gluon's
    argument binding once per specialization), but for timelines and the persistent variants (their per-call
    arguments follow the constexprs)."""
    check_walk(variant, cta_offsets, slots, items.device, bounded=num_ctas is not None)
    seesaw, fine = VARIANTS[variant]
    persistent = variant in PERSISTENT_VARIANTS
    B, H, _ = q.shape
    num_pages, page_size, _ = kv_cache.shape
    tiles = -(-H // BLOCK_H)
    q_desc, kv_desc = descriptors(q, kv_cache)
    args = (q_desc, kv_desc, block_table, items, out, lse, po, pl,
            H, tiles, qk_scale, num_pages, block_table.shape[1] * page_size,
            *block_table.stride(), *out.stride(), *lse.stride(), *po.stride(), *pl.stride(),
            num_ctas if num_ctas is not None else items, timeline["timeline_ptr"] if timeline else items)
    meta = dict(PAGE_SIZE=page_size, SEESAW=seesaw, FINE=fine, BOUNDED=num_ctas is not None,
                TIMELINE=timeline["TIMELINE"] if timeline else False, num_warps=NUM_WARPS, maxnreg=MAXNREG)
    if persistent:
        _mla_ws_kernel[(slots * tiles,)](*args, **meta, cta_ptr=cta_offsets, PERSISTENT=True)
    else:
        launch_cached(_mla_ws_kernel, _BOUND, (slots * tiles,), args, meta, bound=bound and not timeline)


#: ``launch``'s ``BoundLaunch`` per meta-parameters (``bound_launch.launch_cached``).
_BOUND: dict = {}


def check_walk(variant: str, cta_offsets: torch.Tensor | None, slots: int, device: torch.device,
               bounded: bool = False) -> None:
    """``launch``'s rule for ``cta_offsets``: an int32 vector of ``slots + 1`` entries (at least that many where
    ``bounded``: a capacity grid's) on the items' device for a ``PERSISTENT_VARIANTS`` variant, none for the others;
    else one ``SplitlabError`` line. (Its values are the work list's: not read on the host.)"""
    if variant not in VARIANTS:
        raise SplitlabError(f"mla_decode_ws: variant={variant!r} is not allowed; expected one of {sorted(VARIANTS)}")
    if variant not in PERSISTENT_VARIANTS:
        if cta_offsets is not None:
            raise SplitlabError(f"mla_decode_ws: cta_offsets with variant={variant!r} is not allowed; expected it "
                                f"only with {sorted(PERSISTENT_VARIANTS)} (one item a slot takes none)")
        return
    if cta_offsets is None:
        raise SplitlabError(f"mla_decode_ws: variant={variant!r} walks each slot's items; expected cta_offsets "
                            "(the work list's)")
    check_offsets(cta_offsets, slots, device, bounded, "mla_decode_ws")


def check_offsets(cta_offsets: object, slots: int, device: torch.device, bounded: bool, what: str) -> None:
    """The persistent kernels' CTA offsets (``mqa_sm90_ws`` asks it too): an int32 vector of ``slots + 1`` entries
    (at least that many where ``bounded``) on ``device``, else one ``SplitlabError`` line naming ``what``."""
    if not isinstance(cta_offsets, torch.Tensor):
        raise SplitlabError(f"{what}: cta_offsets={type(cta_offsets).__name__} is not allowed; expected an "
                            "int32 tensor (the work list's cta_offsets)")
    n = cta_offsets.numel()
    if (cta_offsets.dtype != torch.int32 or cta_offsets.dim() != 1 or cta_offsets.stride(0) != 1
            or (n < slots + 1 if bounded else n != slots + 1)):
        raise SplitlabError(f"{what}: cta_offsets {cta_offsets.dtype} of shape {tuple(cta_offsets.shape)} "
                            f"is not allowed; expected contiguous int32 of {'at least ' if bounded else ''}"
                            f"{slots + 1} (slots + 1)")
    if cta_offsets.device != device:
        raise SplitlabError(f"{what}: cta_offsets is on {cta_offsets.device}; expected the items' device {device}")


__all__ = ["DEFAULT_VARIANT", "ENABLED", "PERSISTENT_VARIANTS", "VARIANTS", "cache_ok", "check_launch", "check_walk",
           "launch", "mla_decode_ws", "use_ws"]
