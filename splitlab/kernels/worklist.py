"""Work-list decode: partial kernels that run any schedule (``planners.schedule``), and the merge of a variable
number of partials per request.

A schedule's items become one int32 tensor ``items [n_items, 4]`` of (request, first key, end key, partial row)
and CSR offsets ``cta_offsets [ctas + 1]`` (a slot's items) and ``partial_offsets [batch + 1]`` (a request's
partial rows): ``WorkList``, built once per batch and reused by every layer's call. A program is one (CTA slot,
head group): GQA's kv head, MLA's head tile. It walks its slot's items in order (one item unless the schedule is
persistent); an item whose request has one item writes the request's output and lse directly, any other writes
its partial row (fp32 ``[partial_rows, Hq, Dv]`` and lse ``[partial_rows, Hq]``), which ``launch_merge`` combines
per request with ``combine.merge_splits`` (requests without partial rows are left as written). A grid may hold more
slots than the schedule (a CUDA graph's capacity, ``kernels.decode_plan``): with ``BOUNDED`` the partial kernels read
the slot count from ``num_ctas_ptr`` (int32, on the device) and a program past it exits at once; the launchers here
pass neither and launch the schedule's slots (the same compiled code as before the argument existed).

Bytes moved per item (GQA; elt = the cache's element size, n = the item's keys, G = the group): K and V ``2 * n *
D * elt`` (once per kv head), the block table as ``kernels.gqa`` reads it, q ``G * D * elt``, the item's 16 bytes;
writes ``G * D * (elt or 4) + G * 4``. MLA: one latent row per key (``n * Dqk * elt``) per head tile, and the head
tile's rows. The merge reads each partial row once (``Dv * 4 + 4`` per head) and writes the request's row.

The kernels keep the split-count kernels' rules: a length or page out of range makes the request NaN (never a read
outside the cache), NaN keys propagate, an empty request writes zeros and lse ``-inf``.

``WorkList``, the item rule, the partial buffers and the merge live in ``kernels.workitems`` (shared with the Gluon
work-list kernels this module's launchers dispatch to) and are re-exported here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from splitlab.errors import SplitlabError
from splitlab.intmath import next_power_of_two
from splitlab.kernels import _launch
from splitlab.kernels import timeline as tlog
from splitlab.kernels._launch import check_knob, check_pow2
from splitlab.kernels.mla import load_latent_rows, load_q_tile, softmax_update, store_head_tile
from splitlab.kernels.paging import any_bad, num_tiles, poison, scan_pages, tile_pages
from splitlab.kernels.timeline import Timelines
from splitlab.kernels.workitems import (
    FLT_MAX,
    LN2,
    LOG2E,
    PDL_AVAILABLE,
    WorkList,
    alloc_partials,
    check_worklist,
    gdc_launch_dependents,
    launch_merge,
    load_item,
    timeline_args,
)

#: Where the partial kernel lets the merge launch under ``pdl=`` (``check_pdl``): at its programs' start, or after
#: their last store.
PDL_TRIGGERS = ("start", "end")

# =====================================================================================================
# GQA
# =====================================================================================================


@triton.jit
def _gqa_item(it, q_ptr, k_head, v_head, bt_ptr, items_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
              qk_scale, num_pages, max_keys, heads, offs_g, offs_n, offs_d, mask_g, mask_d,
              q_stride_b, q_stride_h, q_stride_d, k_stride_p, k_stride_s, k_stride_d,
              v_stride_p, v_stride_s, v_stride_d, bt_stride_b, bt_stride_p,
              out_stride_b, out_stride_h, out_stride_d, lse_stride_b, lse_stride_h,
              po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h,
              PAGE_SIZE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
              offsets_ptr, counters_ptr, kvh, num_kv_heads, FUSED: tl.constexpr):
    """One work item of one kv head: its keys streamed (as ``kernels.gqa``'s loop), its row stored; with
    ``FUSED``, a partial row's item then arrives at its request's counter (``_arrive_and_merge``)."""
    b64, start, end, row, bad_len = load_item(items_ptr, it, max_keys)

    q = tl.load(q_ptr + b64 * q_stride_b + heads[:, None] * q_stride_h + offs_d[None, :] * q_stride_d,
                mask=mask_g[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    bt_row = bt_ptr + b64 * bt_stride_b
    m_i = tl.full([BLOCK_G], -FLT_MAX, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    seen = scan_pages(bt_row, bt_stride_p, start, end, PAGE_SIZE)
    page_next, _ = tile_pages(bt_row, bt_stride_p, start, end, offs_n, num_pages, PAGE_SIZE, BLOCK_N)
    for t in range(0, num_tiles(start, end, BLOCK_N)):
        start_n = start + t * BLOCK_N
        pos = start_n + offs_n
        mask_n = pos < end
        page = page_next
        page_next, _ = tile_pages(bt_row, bt_stride_p, start_n + BLOCK_N, end, offs_n, num_pages, PAGE_SIZE,
                                  BLOCK_N)
        slot = pos % PAGE_SIZE
        kv_mask = mask_n[:, None] & mask_d[None, :]
        # K and V tiles [BLOCK_N, BLOCK_D]: 2 * BLOCK_N * D * elt bytes.
        k = tl.load(k_head + (page * k_stride_p + slot * k_stride_s)[:, None] + offs_d[None, :] * k_stride_d,
                    mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_head + (page * v_stride_p + slot * v_stride_s)[:, None] + offs_d[None, :] * v_stride_d,
                    mask=kv_mask, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_i = poison(l_i, bad_len | any_bad(seen, num_pages, True))
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)
    st_mask = mask_g[:, None] & mask_d[None, :]
    if row < 0:
        tl.store(out_ptr + b64 * out_stride_b + heads[:, None] * out_stride_h + offs_d[None, :] * out_stride_d,
                 out.to(out_ptr.dtype.element_ty), mask=st_mask)
        tl.store(lse_ptr + b64 * lse_stride_b + heads * lse_stride_h, lse, mask=mask_g)
    else:
        r64 = row.to(tl.int64)
        tl.store(po_ptr + r64 * po_stride_r + heads[:, None] * po_stride_h + offs_d[None, :] * po_stride_d,
                 out, mask=st_mask)
        tl.store(pl_ptr + r64 * pl_stride_r + heads * pl_stride_h, lse, mask=mask_g)
        if FUSED:
            _arrive_and_merge(b64, kvh, num_kv_heads, offsets_ptr, counters_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                              heads, offs_d, mask_g, mask_d, po_stride_r, po_stride_h, po_stride_d,
                              pl_stride_r, pl_stride_h, out_stride_b, out_stride_h, out_stride_d,
                              lse_stride_b, lse_stride_h, BLOCK_G, BLOCK_D)


@triton.jit
def _arrive_and_merge(b64, kvh, num_kv_heads, offsets_ptr, counters_ptr, po_ptr, pl_ptr, out_ptr, lse_ptr,
                      heads, offs_d, mask_g, mask_d, po_stride_r, po_stride_h, po_stride_d,
                      pl_stride_r, pl_stride_h, out_stride_b, out_stride_h, out_stride_d,
                      lse_stride_b, lse_stride_h, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    """The fused merge (``gqa_decode_scheduled(fused_merge=True)``): called by a program of kv head ``kvh`` right
    after it stored its item's partial row of request ``b64``. It adds 1 to the request's counter of that kv head
    (``counters_ptr[b * num_kv_heads + kvh]``, int32); the program that brings it to the request's item count (its
    partial rows, ``offsets_ptr``) is the last: it sets the counter back to 0 (so that the next launch, a CUDA
    graph's replay included, finds zeros with no memset) and merges the request's rows of its group's heads into
    ``out`` / ``lse`` (``merge_rows``). Bytes: 4 read, 4 written (the atomic), 8 read (the offsets); the last
    arriver reads n rows of ``G * (D + 1) * 4`` bytes and writes ``G * (D * elt + 4)``, 4 more (the reset).

    Memory ordering (the PTX memory model, "Memory Consistency Model" in NVIDIA's PTX ISA; the split-K semaphore of
    CUTLASS's ``arch/barrier.h`` and the CUDA sample threadFenceReduction follow the same steps):

    1. Every thread of the program has stored its share of the partial row (weak stores). ``tl.debug_barrier``
       (``bar.sync``) orders them before what the thread doing the atomic does next, at CTA scope.
    2. The atomic add is ``atom.acq_rel.gpu`` (one thread of the program; Triton broadcasts its result to the
       others through shared memory behind a barrier). Its release half, at GPU scope, is cumulative: the row's
       stores, ordered before it by step 1's barrier, are visible to any thread that acquires the counter's later
       value. Releases of one counter form a chain of read-modify-writes (a release sequence), so the last
       arriver's acquire synchronises with every earlier arriver's release, not only the one before it.
    3. The last arriver's acquire half precedes a second ``bar.sync``, after which every thread of it reads the
       other items' rows: each load is causally after the acquire (acquire, then barrier), so it sees the rows'
       stores; the acquire also drops the SM's stale L1 lines. Its own row it stored itself before step 1.
    4. The reset is a plain store: every arrival of this launch has happened (the count says so) and the next
       launch starts after this one ends (stream order), which orders it before that launch's atomics.

    Only the counter's atomic decides who merges: no program waits on another, so no schedule (one item a CTA or
    persistent, any number of CTAs resident) can deadlock. Under Triton's interpreter programs run one at a time,
    which every ordering above allows."""
    tl.debug_barrier()  # step 1
    first = tl.load(offsets_ptr + b64)
    n = tl.load(offsets_ptr + b64 + 1) - first
    counter = counters_ptr + b64 * num_kv_heads + kvh
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")  # step 2
    if arrived == n - 1:
        tl.debug_barrier()  # step 3
        tl.store(counter, 0)  # step 4
        f64 = first.to(tl.int64)
        out, lse = merge_rows(po_ptr + f64 * po_stride_r, pl_ptr + f64 * pl_stride_r, n, heads, offs_d, mask_g,
                              mask_d, po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h,
                              BLOCK_G, BLOCK_D)
        st_mask = mask_g[:, None] & mask_d[None, :]
        tl.store(out_ptr + b64 * out_stride_b + heads[:, None] * out_stride_h + offs_d[None, :] * out_stride_d,
                 out.to(out_ptr.dtype.element_ty), mask=st_mask)
        tl.store(lse_ptr + b64 * lse_stride_b + heads * lse_stride_h, lse, mask=mask_g)


@triton.jit
def merge_rows(po_base, pl_base, n, heads, offs_d, mask_g, mask_d, po_stride_r, po_stride_h, po_stride_d,
               pl_stride_r, pl_stride_h, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    """``(out [BLOCK_G, BLOCK_D], lse [BLOCK_G])``: the merge of ``n`` partial rows (the first at ``po_base`` /
    ``pl_base``) for the heads ``heads``, one row a step, with ``combine.merge_splits``'s rules per head (an lse of
    -inf weighs 0 and its row is never read into the sum; a NaN lse stays out of the running max and makes the head
    NaN; every row empty: zeros and lse -inf). A whole group's heads a step, where ``merge_splits`` takes one head:
    the fused merge's program holds the group (MQA-128: 128 heads, which one head at a time would take 128 serial
    loads). Bytes: ``n * G * (D + 1) * 4`` read."""
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    wsum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for r in range(0, n):
        r64 = tl.cast(r, tl.int64)
        lse_r = tl.load(pl_base + r64 * pl_stride_r + heads * pl_stride_h, mask=mask_g, other=float("-inf"))
        po = tl.load(po_base + r64 * po_stride_r + heads[:, None] * po_stride_h + offs_d[None, :] * po_stride_d,
                     mask=mask_g[:, None] & mask_d[None, :], other=0.0)
        live = lse_r != float("-inf")
        m_new = tl.maximum(m, tl.where(lse_r == lse_r, lse_r, float("-inf")))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)  # 0 while nothing live has been seen
        w = tl.where(live, tl.exp(lse_r - m_safe), 0.0)
        acc = acc * alpha[:, None] + w[:, None] * tl.where(live[:, None], po, 0.0)
        wsum = wsum * alpha + w
        m = m_new
    empty = wsum == 0.0
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, wsum)[:, None])
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    lse = tl.where(empty, float("-inf"), m_safe + tl.log(tl.where(empty, 1.0, wsum)))
    return out, lse


@triton.jit
def _gqa_worklist_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, items_ptr, cta_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
    qk_scale, num_kv_heads, group, num_pages, max_keys,
    q_stride_b, q_stride_h, q_stride_d,
    k_stride_p, k_stride_s, k_stride_h, k_stride_d,
    v_stride_p, v_stride_s, v_stride_h, v_stride_d,
    bt_stride_b, bt_stride_p,
    out_stride_b, out_stride_h, out_stride_d,
    lse_stride_b, lse_stride_h,
    po_stride_r, po_stride_h, po_stride_d,
    pl_stride_r, pl_stride_h,
    PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, PERSISTENT: tl.constexpr,
    num_ctas_ptr=None, BOUNDED: tl.constexpr = False,
    timeline_ptr=None, TIMELINE: tl.constexpr = False, CLOCK: tl.constexpr = True,
    LAUNCH_DEPENDENTS: tl.constexpr = 0, offsets_ptr=None, counters_ptr=None, FUSED: tl.constexpr = False,
):
    # 1-D grid, kv head fastest: the kv heads of one slot run side by side (kernels.gqa's split-major order when
    # the schedule is uniform's). A non-persistent slot runs the item of its own index (no loop around the key
    # loop: the loop nest cost the 8-warp MQA-128 tile ~10% on the H200). TIMELINE: each program writes its
    # record (64 bytes; kernels.timeline), the clock read at its start and after its last store.
    # LAUNCH_DEPENDENTS (gqa_decode_scheduled's pdl, a plan's): 1 lets the merge launch
    # (griddepcontrol.launch_dependents) at the program's start, 2 after its last item; the merge waits for this
    # grid's end before it reads a row, so where the trigger sits moves only when the merge's programs take their
    # SMs. FUSED: the last item of a request to finish merges its rows (_arrive_and_merge; offsets_ptr: the work
    # list's partial offsets, counters_ptr: int32 [batch, num_kv_heads], zeros before and after a launch).
    if LAUNCH_DEPENDENTS == 1:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    kvh = pid % num_kv_heads
    cta = pid // num_kv_heads
    if BOUNDED:  # a grid sized to a capacity (kernels.decode_plan, CUDA graphs): slots past the count exit
        if cta >= tl.load(num_ctas_ptr):
            if TIMELINE:
                tlog.absent_record(timeline_ptr, pid)
            return
    if TIMELINE:
        t_start = tlog.start_record(timeline_ptr, pid, CLOCK, TIMELINE)
    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g = offs_g < group
    mask_d = offs_d < HEAD_DIM
    heads = kvh * group + offs_g
    k_head = k_ptr + kvh.to(tl.int64) * k_stride_h
    v_head = v_ptr + kvh.to(tl.int64) * v_stride_h
    if PERSISTENT:
        for it in tl.range(tl.load(cta_ptr + cta), tl.load(cta_ptr + cta + 1), num_stages=1):
            _gqa_item(it, q_ptr, k_head, v_head, bt_ptr, items_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
                      qk_scale, num_pages, max_keys, heads, offs_g, offs_n, offs_d, mask_g, mask_d,
                      q_stride_b, q_stride_h, q_stride_d, k_stride_p, k_stride_s, k_stride_d,
                      v_stride_p, v_stride_s, v_stride_d, bt_stride_b, bt_stride_p,
                      out_stride_b, out_stride_h, out_stride_d, lse_stride_b, lse_stride_h,
                      po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h,
                      PAGE_SIZE, BLOCK_G, BLOCK_N, BLOCK_D, UPCAST, DOT_PRECISION,
                      offsets_ptr, counters_ptr, kvh, num_kv_heads, FUSED)
    else:
        _gqa_item(cta, q_ptr, k_head, v_head, bt_ptr, items_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
                  qk_scale, num_pages, max_keys, heads, offs_g, offs_n, offs_d, mask_g, mask_d,
                  q_stride_b, q_stride_h, q_stride_d, k_stride_p, k_stride_s, k_stride_d,
                  v_stride_p, v_stride_s, v_stride_d, bt_stride_b, bt_stride_p,
                  out_stride_b, out_stride_h, out_stride_d, lse_stride_b, lse_stride_h,
                  po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h,
                  PAGE_SIZE, BLOCK_G, BLOCK_N, BLOCK_D, UPCAST, DOT_PRECISION,
                  offsets_ptr, counters_ptr, kvh, num_kv_heads, FUSED)
    if LAUNCH_DEPENDENTS == 2:
        gdc_launch_dependents()
    if TIMELINE:
        record_slot(timeline_ptr, pid, cta, kvh, cta_ptr, PERSISTENT, CLOCK, t_start, TIMELINE)


@triton.jit
def record_slot(timeline_ptr, pid, cta, group, cta_ptr, PERSISTENT: tl.constexpr, CLOCK: tl.constexpr, start,
                TIMELINE: tl.constexpr):
    """A partial kernel program's record: its slot's first item and item count (8 bytes read back when
    persistent), else its own item; ``start`` and ``TIMELINE`` as ``timeline.write_record``'s."""
    if PERSISTENT:
        first = tl.load(cta_ptr + cta)
        n = tl.load(cta_ptr + cta + 1) - first
    else:
        first = cta
        n = tl.full([], 1, tl.int32)
    tlog.write_record(timeline_ptr, pid, cta, group, first, n, CLOCK, start, TIMELINE)


def gqa_decode_scheduled(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                         work: WorkList, *, block_n: int | None = None, num_warps: int | None = None,
                         num_stages: int | None = None, sm_scale: float | None = None, return_lse: bool = False,
                         timelines: Timelines | None = None, pdl: str | None = None, fused_merge: bool = False,
                         counters: torch.Tensor | None = None):
    """Paged GQA decode over a schedule's work list (``WorkList.from_schedule``): ``kernels.gqa.gqa_decode``'s
    inputs and outputs, the split of the keys taken from ``work`` instead of a split count. The request lengths are
    the schedule's (the keys its items cover); ``seq_lens`` is not read. ``timelines`` (``kernels.timeline``): each
    program of both kernels records its SM, start, end and work there (the plain launch without it). The partial
    kernel: the warp-specialized Gluon MQA kernel (``mqa_sm90_ws``) where ``mqa_sm90_ws.use_ws`` and ``cache_ok`` say
    so (an sm_90 GPU, 16-bit, 64 or 128 heads on one kv head of dim 128, the default tile, one item a slot, neither
    variant below), else the tl tile.

    Two variants for short launches (``experiments/short_launch``), the plain launch without either:

    * ``pdl="start"`` or ``"end"``: the merge is launched with programmatic dependent launch, the partial kernel
      letting it launch at its programs' start or after their last item (``check_pdl``); the merge's launch and
      prologue overlap the partial kernel's tail. Under Triton's interpreter (programs run one at a time, in launch
      order) the same launches run without it.
    * ``fused_merge=True``: no merge launch; the last item of a split request to finish merges the request's rows
      (``_arrive_and_merge``: an int32 counter per request and kv head, acq_rel). ``counters`` (int32 ``[B,
      Hkv]``, contiguous, all zero; the kernel leaves them zero, so one buffer serves every launch and every CUDA
      graph replay, one stream's launches in order; never two launches that may run at once) defaults to a fresh
      zeroed buffer a call.
    """
    from splitlab.kernels import gqa
    from splitlab.kernels import mqa_sm90_ws as mqa_ws

    gqa._check_inputs(q, k_cache, v_cache, block_table)
    B, Hq, D = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    max_keys = block_table.shape[1] * page_size
    check_worklist(work, B, max_keys, q.device, "gqa_decode_scheduled")
    scale = _launch.resolve_sm_scale(sm_scale, D)
    d = gqa.default_knobs(Hq // Hkv, D, _launch.TORCH_DTYPE_NAMES[q.dtype])
    block_n = check_pow2("block_n", d["block_n"] if block_n is None else block_n, lo=16, hi=256)
    num_warps = check_pow2("num_warps", d["num_warps"] if num_warps is None else num_warps, lo=1, hi=16)
    num_stages = check_knob("num_stages", d["num_stages"] if num_stages is None else num_stages, lo=1, hi=8)
    if page_size % block_n == 0 and work.schedule.align % block_n:
        raise SplitlabError(f"gqa_decode_scheduled: the schedule's items start at multiples of "
                            f"{work.schedule.align} keys; block_n={block_n} at page_size {page_size} needs "
                            f"multiples of {block_n} (a smaller block_n, or a schedule aligned to it)")
    launch_pdl = check_pdl(pdl, fused_merge, "gqa_decode_scheduled")
    fused = check_fused(fused_merge, counters, B, Hkv, q.device, "gqa_decode_scheduled")
    out = _launch.alloc(B, Hq, D, dtype=q.dtype, device=q.device)
    lse = _launch.alloc(B, Hq, dtype=torch.float32, device=q.device)
    po, pl = alloc_partials(work, Hq, D, q.device)
    upcast = _launch.interpret_upcast(q.dtype)
    extra = timeline_args(timelines, work.ctas * Hkv, q.device, "gqa_decode_scheduled")
    if launch_pdl:
        extra["LAUNCH_DEPENDENTS"] = 1 + PDL_TRIGGERS.index(pdl)
    if fused is not None:
        extra.update(offsets_ptr=work.partial_offsets, counters_ptr=fused, FUSED=True)
    elif not launch_pdl and mqa_ws.use_ws(q.dtype, Hq, Hkv, D, (block_n, num_warps, num_stages), page_size,
                                          q.device, work.schedule.persistent, work.schedule.align) \
            and mqa_ws.cache_ok(k_cache, v_cache):
        with _launch.device_guard(q):
            mqa_ws.launch(q, k_cache, v_cache, block_table, work.items, work.ctas, out, lse, po, pl, scale * LOG2E,
                          timeline=extra or None,
                          cta_offsets=work.cta_offsets if work.schedule.persistent else None)
            launch_merge(work, po, pl, out, lse, timelines)
        return (out, lse) if return_lse else out
    with _launch.device_guard(q):
        _gqa_worklist_kernel[(work.ctas * Hkv,)](
            q, k_cache, v_cache, block_table, work.items, work.cta_offsets, out, lse, po, pl,
            scale * LOG2E, Hkv, Hq // Hkv, num_pages, max_keys,
            *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_table.stride(),
            *out.stride(), *lse.stride(), *po.stride(), *pl.stride(),
            PAGE_SIZE=page_size, HEAD_DIM=D, BLOCK_G=max(16, next_power_of_two(Hq // Hkv)), BLOCK_N=block_n,
            BLOCK_D=max(16, next_power_of_two(D)), UPCAST=upcast,
            DOT_PRECISION="ieee" if upcast or q.dtype == torch.float32 else None,
            PERSISTENT=work.schedule.persistent, num_warps=num_warps, num_stages=num_stages, **extra,
        )
        if fused is None:
            launch_merge(work, po, pl, out, lse, timelines, pdl=launch_pdl)
    return (out, lse) if return_lse else out


def check_pdl(pdl: object, fused_merge: bool, what: str) -> bool:
    """Whether a launch uses programmatic dependent launch for ``pdl`` (None, or where the partial kernel lets the
    merge launch: ``PDL_TRIGGERS``): False under Triton's interpreter, which runs the same launches without it; one
    ``SplitlabError`` for any other value, with ``fused_merge`` (no merge to launch), or on a triton without
    ``triton.language.extra.cuda.gdc_wait`` (before 3.4)."""
    if pdl is None:
        return False
    if not isinstance(pdl, str) or pdl not in PDL_TRIGGERS:
        raise SplitlabError(f"{what}: pdl={_launch.short_repr(pdl)} is not allowed; expected None or one of "
                            f"{', '.join(map(repr, PDL_TRIGGERS))} (where the partial kernel lets the merge launch)")
    if fused_merge:
        raise SplitlabError(f"{what}: pdl={pdl!r} with fused_merge=True is not allowed: the fused merge launches no "
                            "merge kernel to overlap")
    if not PDL_AVAILABLE:
        raise SplitlabError(f"{what}: pdl={pdl!r} needs triton.language.extra.cuda.gdc_wait (triton >= 3.4); this "
                            f"is triton {triton.__version__}")
    return not _launch.INTERPRET


def check_fused(fused_merge: object, counters: object, batch: int, num_kv_heads: int, device: torch.device,
                what: str) -> torch.Tensor | None:
    """The fused merge's counters (``counters``, else a fresh zeroed int32 ``[batch, num_kv_heads]``), or None
    without ``fused_merge``; one ``SplitlabError`` for a non-bool ``fused_merge``, counters without it, or counters
    of another shape, dtype or device, or not contiguous (the kernel indexes them ``b * num_kv_heads + kvh``).
    Their values are not read here (a host sync): they must be zeros, as every fused launch leaves them."""
    if not isinstance(fused_merge, bool):
        raise SplitlabError(f"{what}: fused_merge={_launch.short_repr(fused_merge)} is not allowed; expected True "
                            "or False")
    if not fused_merge:
        if counters is not None:
            raise SplitlabError(f"{what}: counters are read only with fused_merge=True")
        return None
    if counters is None:
        return torch.zeros(batch, num_kv_heads, dtype=torch.int32, device=device)
    _launch.check_tensor("counters", counters, 2, dtypes=(torch.int32,), device=device)
    if tuple(counters.shape) != (batch, num_kv_heads) or not counters.is_contiguous():
        raise SplitlabError(f"{what}: counters has shape {tuple(counters.shape)} and strides {counters.stride()}; "
                            f"expected a contiguous [{batch}, {num_kv_heads}] (batch, kv heads)")
    return counters


# =====================================================================================================
# MLA (the tl kernel's tile helpers: kernels.mla)
# =====================================================================================================


@triton.jit
def _mla_item(it, q_ptr, kv_ptr, bt_ptr, items_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
              qk_scale, v_scale, num_pages, max_keys, offs_h, mask_h, offs_t,
              q_stride_b, q_stride_h, q_stride_d, kv_stride_p, kv_stride_s, kv_stride_d,
              bt_stride_b, bt_stride_p, out_stride_b, out_stride_h, out_stride_d, lse_stride_b, lse_stride_h,
              po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h,
              PAGE_SIZE: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_R: tl.constexpr,
              BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr,
              UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, ISOLATE_QK: tl.constexpr, KV_FP8: tl.constexpr,
              FP8_QK: tl.constexpr):
    """One work item of one head tile: its keys streamed (as ``kernels.mla``'s loop), its row stored."""
    b64, start, end, row, bad_len = load_item(items_ptr, it, max_keys)
    q_v, q_r, q_row_scale = load_q_tile(q_ptr + b64 * q_stride_b, offs_h, mask_h, q_stride_h, q_stride_d,
                                        HEAD_DIM_V, HEAD_DIM_R, BLOCK_DV, BLOCK_DR, UPCAST, FP8_QK)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    bt_row = bt_ptr + b64 * bt_stride_b
    # Per tile: BLOCK_N latent rows (BLOCK_N * Dqk * elt bytes) and the pages' table entries, a tile ahead.
    page_next, seen = tile_pages(bt_row, bt_stride_p, start, end, offs_t, num_pages, PAGE_SIZE, BLOCK_N)
    for t in range(0, num_tiles(start, end, BLOCK_N)):
        n0 = start + t * BLOCK_N
        offs_n = n0 + offs_t
        valid = offs_n < end
        page = page_next
        page_next, raw_next = tile_pages(bt_row, bt_stride_p, n0 + BLOCK_N, end, offs_t, num_pages,
                                         PAGE_SIZE, BLOCK_N)
        seen = tl.maximum(seen, raw_next)
        rows = kv_ptr + page * kv_stride_p + (offs_n % PAGE_SIZE) * kv_stride_s
        kv_v, kv_r = load_latent_rows(rows, valid, kv_stride_d, HEAD_DIM_V, HEAD_DIM_R, BLOCK_DV, BLOCK_DR,
                                      UPCAST)
        m_i, l_i, acc = softmax_update(q_v, q_r, kv_v, kv_r, valid, float("-inf"), m_i, l_i, acc, qk_scale,
                                       q_row_scale, HEAD_DIM_R, DOT_PRECISION, ISOLATE_QK, KV_FP8, FP8_QK,
                                       q_ptr.dtype.element_ty)
    l_i = poison(l_i, bad_len | any_bad(seen, num_pages, PAGE_SIZE % BLOCK_N != 0))
    if row < 0:
        store_head_tile(acc, m_i, l_i, v_scale, out_ptr + b64 * out_stride_b, lse_ptr + b64 * lse_stride_b,
                        offs_h, mask_h, out_stride_h, out_stride_d, lse_stride_h, HEAD_DIM_V, BLOCK_DV, KV_FP8)
    else:
        r64 = row.to(tl.int64)
        store_head_tile(acc, m_i, l_i, v_scale, po_ptr + r64 * po_stride_r, pl_ptr + r64 * pl_stride_r,
                        offs_h, mask_h, po_stride_h, po_stride_d, pl_stride_h, HEAD_DIM_V, BLOCK_DV, KV_FP8)


@triton.jit
def _mla_worklist_kernel(
    q_ptr, kv_ptr, bt_ptr, items_ptr, cta_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
    num_heads, num_head_tiles, qk_scale, v_scale, num_pages, max_keys,
    q_stride_b, q_stride_h, q_stride_d,
    kv_stride_p, kv_stride_s, kv_stride_d,
    bt_stride_b, bt_stride_p,
    out_stride_b, out_stride_h, out_stride_d,
    lse_stride_b, lse_stride_h,
    po_stride_r, po_stride_h, po_stride_d,
    pl_stride_r, pl_stride_h,
    PAGE_SIZE: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_R: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, ISOLATE_QK: tl.constexpr, KV_FP8: tl.constexpr,
    FP8_QK: tl.constexpr, PERSISTENT: tl.constexpr, num_ctas_ptr=None, BOUNDED: tl.constexpr = False,
    timeline_ptr=None, TIMELINE: tl.constexpr = False, CLOCK: tl.constexpr = True,
    LAUNCH_DEPENDENTS: tl.constexpr = 0,
):
    # 1-D grid, head tile fastest: the head tiles of one slot share its latent tiles through L2. TIMELINE and
    # LAUNCH_DEPENDENTS (a plan's pdl): as _gqa_worklist_kernel's.
    if LAUNCH_DEPENDENTS == 1:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    head_tile = pid % num_head_tiles
    cta = pid // num_head_tiles
    if BOUNDED:  # as _gqa_worklist_kernel's
        if cta >= tl.load(num_ctas_ptr):
            if TIMELINE:
                tlog.absent_record(timeline_ptr, pid)
            return
    if TIMELINE:
        t_start = tlog.start_record(timeline_ptr, pid, CLOCK, TIMELINE)
    offs_h = head_tile * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_t = tl.arange(0, BLOCK_N)
    if PERSISTENT:
        for it in tl.range(tl.load(cta_ptr + cta), tl.load(cta_ptr + cta + 1), num_stages=1):
            _mla_item(it, q_ptr, kv_ptr, bt_ptr, items_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
                      qk_scale, v_scale, num_pages, max_keys, offs_h, mask_h, offs_t,
                      q_stride_b, q_stride_h, q_stride_d, kv_stride_p, kv_stride_s, kv_stride_d,
                      bt_stride_b, bt_stride_p, out_stride_b, out_stride_h, out_stride_d, lse_stride_b,
                      lse_stride_h, po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h,
                      PAGE_SIZE, HEAD_DIM_V, HEAD_DIM_R, BLOCK_H, BLOCK_N, BLOCK_DV, BLOCK_DR,
                      UPCAST, DOT_PRECISION, ISOLATE_QK, KV_FP8, FP8_QK)
    else:
        _mla_item(cta, q_ptr, kv_ptr, bt_ptr, items_ptr, out_ptr, lse_ptr, po_ptr, pl_ptr,
                  qk_scale, v_scale, num_pages, max_keys, offs_h, mask_h, offs_t,
                  q_stride_b, q_stride_h, q_stride_d, kv_stride_p, kv_stride_s, kv_stride_d,
                  bt_stride_b, bt_stride_p, out_stride_b, out_stride_h, out_stride_d, lse_stride_b,
                  lse_stride_h, po_stride_r, po_stride_h, po_stride_d, pl_stride_r, pl_stride_h,
                  PAGE_SIZE, HEAD_DIM_V, HEAD_DIM_R, BLOCK_H, BLOCK_N, BLOCK_DV, BLOCK_DR,
                  UPCAST, DOT_PRECISION, ISOLATE_QK, KV_FP8, FP8_QK)
    if LAUNCH_DEPENDENTS == 2:
        gdc_launch_dependents()
    if TIMELINE:
        record_slot(timeline_ptr, pid, cta, head_tile, cta_ptr, PERSISTENT, CLOCK, t_start, TIMELINE)


def mla_decode_scheduled(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, work: WorkList, *,
                         head_dim_v: int = 512, block_n: int | None = None, block_h: int | None = None,
                         num_warps: int | None = None, num_stages: int | None = None,
                         sm_scale: float | None = None, kv_scale: float | None = None, return_lse: bool = False,
                         timelines: Timelines | None = None):
    """Absorbed MLA decode over a schedule's work list: ``kernels.mla.mla_decode``'s inputs and outputs, the split
    of the keys taken from ``work``; ``timelines`` as ``gqa_decode_scheduled``'s. The kernel: the warp-specialized
    Gluon kernel (``mla_sm90_ws``, FlashMLA's schedule) where ``mla_sm90_ws.use_ws`` and ``cache_ok`` say so (an
    sm_90 GPU, 16-bit, 40 heads and more at the default tile, one item a slot), else the tl tile."""
    from splitlab.kernels import mla
    from splitlab.kernels import mla_sm90_ws as ws

    q, kv_scale = mla.check_inputs(q, kv_cache, block_table, kv_scale=kv_scale)
    B, H, Dqk = q.shape
    num_pages, page_size, _ = kv_cache.shape
    max_keys = block_table.shape[1] * page_size if num_pages else 0
    check_worklist(work, B, max_keys, q.device, "mla_decode_scheduled")
    Dv = check_knob("head_dim_v", head_dim_v, lo=1, hi=Dqk)
    scale = _launch.resolve_sm_scale(sm_scale, Dqk, kv_scale=kv_scale)
    d = mla.mla_defaults(H, Dqk, _launch.TORCH_DTYPE_NAMES[kv_cache.dtype], head_dim_v=Dv,
                         block_h=None if block_h is None else check_pow2("block_h", block_h, lo=16, hi=64),
                         block_n=None if block_n is None else check_pow2("block_n", block_n, lo=16, hi=256))
    nw = d.num_warps if num_warps is None else mla.check_num_warps(num_warps)
    ns = d.num_stages if num_stages is None else check_knob("num_stages", num_stages, lo=1, hi=8)
    if page_size % d.block_n == 0 and work.schedule.align % d.block_n:
        raise SplitlabError(f"mla_decode_scheduled: the schedule's items start at multiples of "
                            f"{work.schedule.align} keys; block_n={d.block_n} at page_size {page_size} needs "
                            f"multiples of {d.block_n}")
    block_dv, block_dr = mla.padded_dims(Dqk, Dv)
    out = _launch.alloc(B, H, Dv, dtype=q.dtype, device=q.device)
    lse = _launch.alloc(B, H, dtype=torch.float32, device=q.device)
    po, pl = alloc_partials(work, H, Dv, q.device)
    tiles = -(-H // d.block_h)
    extra = timeline_args(timelines, work.ctas * tiles, q.device, "mla_decode_scheduled")
    if ws.use_ws(q.dtype, kv_cache.dtype, Dqk, Dv, (d.block_h, d.block_n, nw, ns), page_size, q.device,
                 work.schedule.persistent, work.schedule.align) and ws.cache_ok(kv_cache):
        with _launch.device_guard(q):
            persistent = work.schedule.persistent
            ws.launch(q, kv_cache, block_table, work.items, work.ctas, out, lse, po, pl, scale * LOG2E,
                      ws.variant_for(persistent), timeline=extra or None,
                      cta_offsets=work.cta_offsets if persistent else None)
            launch_merge(work, po, pl, out, lse, timelines)
        return (out, lse) if return_lse else out
    with _launch.device_guard(q):
        _mla_worklist_kernel[(work.ctas * tiles,)](
            q, kv_cache, block_table, work.items, work.cta_offsets, out, lse, po, pl,
            H, tiles, scale * kv_scale * LOG2E, kv_scale, num_pages, max_keys,
            *q.stride(), *kv_cache.stride(), *block_table.stride(), *out.stride(), *lse.stride(),
            *po.stride(), *pl.stride(),
            PAGE_SIZE=page_size, HEAD_DIM_V=Dv, HEAD_DIM_R=Dqk - Dv, BLOCK_H=d.block_h, BLOCK_N=d.block_n,
            BLOCK_DV=block_dv, BLOCK_DR=max(block_dr, mla.MIN_DOT), UPCAST=_launch.interpret_upcast(q.dtype),
            DOT_PRECISION=_launch.dot_input_precision(q.dtype),
            ISOLATE_QK=mla.isolate_qk(d.block_h, nw, q.dtype), KV_FP8=kv_cache.dtype == _launch.FP8_KV_DTYPE,
            FP8_QK=mla.fp8_qk_on(kv_cache.dtype, d.block_h), PERSISTENT=work.schedule.persistent,
            num_warps=nw, num_stages=ns, **extra,
        )
        launch_merge(work, po, pl, out, lse, timelines)
    return (out, lse) if return_lse else out


__all__ = ["WorkList", "alloc_partials", "check_worklist", "gqa_decode_scheduled", "launch_merge", "load_item",
           "mla_decode_scheduled", "record_slot", "timeline_args"]
