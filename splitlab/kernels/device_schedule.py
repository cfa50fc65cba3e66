"""Schedules computed on the GPU: one Triton program turns device ``seq_lens`` into a work list, so that a CUDA
graph captured once for a batch size replays correctly for any lengths (the schedule is recomputed at every replay,
inside the graph, before the partial kernel).

It writes, into the fixed-capacity buffers a ``WorkList`` / ``kernels.decode_plan`` plan holds (``items [cap, 4]``
int32 of (request, key_begin, key_end, partial row or -1), ``cta_offsets [cap_ctas + 1]``, ``partial_offsets
[batch + 1]``, the slot count the ``BOUNDED`` kernels read), the schedule that the host scheduler makes for the same
lengths, bit for bit (same items in the same order, same rows, offsets and counts; ``tests/test_device_schedule.py``):

* ``balanced`` at a CTA ``budget`` (``planners.schedulers.balanced``): tiles ``t_b = cdiv(len_b, tile)``; the
  smallest chunk (in tiles) whose count ``sum(cdiv(max(t_b, 1), chunk))`` fits the budget, by
  ``schedulers.smallest_chunk``'s binary search (low 1, high ``max(t_b, 1)``); request ``b`` in ``n_b =
  cdiv(max(t_b, 1), chunk)`` chunks (an empty request one empty item), request-major;
* ``uniform`` at ``num_splits`` (``schedulers.uniform``), split-major or ``request_major``;
* ``stream_k`` over ``ctas`` CTAs (``schedulers.stream_k``, persistent): the batch's ``T`` tiles end to end cut into
  ``C = max(1, min(ctas, T))`` spans (the first ``T % C`` one tile longer); request ``b``'s items are its pieces of
  the spans it crosses (an empty request one empty item, in the CTA whose span holds its place), request-major.

* ``flashmla`` over ``num_sm_parts`` parts (``schedulers.flashmla``, persistent): FlashMLA's ``get_mla_metadata``
  walk (``planners.flashmla``), one step a finished request or a closed part (at most parts + batch steps of
  scalar work in one program): blocks ``max(L - 1, 0) // 64 + 1``, payload ``cdiv(sum(blocks + 5), parts) + 5``; a
  part takes the rest of a request while its payload holds it plus the overhead, else ``payload - 5`` of its
  blocks and closes; an item per (part, request span), written as the walk goes; slot count the parts;
* ``splitlab`` (``schedulers.splitlab`` within the capacity, ``persistent=False``): a first launch prices each candidate
  in a program of its own (``_splitlab_price_kernel``: uniform at the split counts
  ``planners.splitlab.split_candidates`` weighs for the batch's longest request, balanced at the ``BALANCED_WAVES``
  budgets; those past the items or CTA slots left out) by ``schedulers._priced``'s arithmetic, operation for operation
  in fp64 without FMA contraction: ``ragged_launch_time``, its closed form past ``SCHEDULE_WAVES`` waves
  (``planners.splitlab._closed_form``) from three integer reductions over the requests (the items, their key tiles,
  the longest item's; every chunking of a request into whole tiles sums to its tiles, so the tiles are the
  batch's), else its list schedule simulated over each item's duration ``tiles x RATE + FIXED`` in issue order
  (written to ``durations``, every request's next ``BLOCK_J`` chunks a round): the slots' end times a [32, slots /
  32] tile, each event the least end (a tree within each lane, then across the lanes), its CTAs freed and the next
  ones issued into the freed slots (ranks by scans within the lanes and one across them, each CTA's item by a
  multiply, not a division), the elapsed time divided by ``min(1 / CAP, slots / resident)``; then the partial writes
  and the merge.
  The schedule then takes the least (time, partial rows, items, uniform by split count before balanced by
  budget), the host's key and order, and writes that ``uniform`` or ``balanced`` schedule: in the same launch, by the
  last pricing program to finish (``_splitlab_plan_kernel``: each program counts itself in an atomic counter,
  ``SplitlabPricing.arrived``, after its prices; the one that counts last reads them all, writes the schedule and
  zeroes the counter for the next launch), or where ``FUSED_PRICING`` is off in a second launch (the schedule kernel).
  The terms that do not depend on the lengths (``schedulers.splitlab_terms``, the constants) come from the host
  (``splitlab_pricing``, once per shape and batch size).

Partial rows for the requests of more than one item (``partial_offsets``: exclusive prefix sums of ``n_b`` where
``n_b > 1``, else 0). ``balanced`` and ``uniform`` run one item per CTA slot (``cta_offsets[i] = i``, the slot count =
the items); ``stream_k`` writes its slots' CSR offsets (each slot's last item ends its range) and ``C``.
Request-major items find their request by a binary search over the requests' item ends (written to ``scratch``, an
int32 buffer of at least ``2 x batch`` entries, stream-K's first tile of each request beside them, behind a CTA
barrier), ``BLOCK_I`` items at a time; split-major items are written a split at a time (``num_splits`` rounds over the
requests).

Capacity. ``balanced`` deals at most ``max(budget, batch)`` items, ``uniform`` ``batch x num_splits``, ``stream_k``
and ``flashmla`` ``ctas`` slots and ``ctas + batch`` items, ``splitlab`` a candidate that fits the items and slots
(uniform at one split always does): a plan's default capacities (``decode_plan.capacity_bound``) hold them, so the
default never overflows. Where a smaller capacity is given and a schedule would pass it (items past the ``items``
rows, slots past the CTA slots, partial rows past ``max_partial_rows``), the kernel writes instead one *bad* item per
request (keys ``[1, 0)``: ``worklist.load_item`` makes its request NaN, never reading a key) and no partial rows, and
sets ``status`` (an int32 on the device) to 1: every row of the run is NaN, nothing is written out of bounds, and
nothing is read back to the host. A negative length makes its request's item bad too (status bit 2); the host plan
refuses both in one line instead. ``status`` is 0 after a good schedule. Lengths are int32 (a request's tile count times
the batch must fit int32).

Reuse. Given a ``memo`` (a plan's: the batch size and lengths of the schedule its buffers hold), the kernels note the
lengths they schedule; with ``reuse=True`` each first compares the lengths with the memo and, where the batch size and
every length are equal, writes nothing (one load and a compare a program): the launchers' default call plans before
every layer of a step with the same lengths, and keeps the step's first schedule. Without ``reuse`` they forget the
memo; whatever else writes the buffers zeroes its batch (a plan's host ``plan()`` copy does).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from splitlab.errors import SplitlabError, bad, check_int
from splitlab.intmath import next_power_of_two
from splitlab.kernels._launch import device_guard
from splitlab.kernels.bound_launch import bound_for
from splitlab.planners import schedulers as S
from splitlab.planners.schedulers import TILE_KEYS

__all__ = ["schedule_on_device", "prepare_schedule", "ScheduleLaunch", "splitlab_pricing", "SplitlabPricing",
           "DEVICE_SCHEDULERS", "OVER_CAPACITY", "NEGATIVE_LENGTH"]

#: The schedulers computed on the device.
DEVICE_SCHEDULERS = ("balanced", "uniform", "stream_k", "flashmla", "splitlab")
#: ``status`` bits.
OVER_CAPACITY, NEGATIVE_LENGTH = 1, 2
#: Items written a round (request-major: each binary-searches its request).
BLOCK_I = 256

#: Warps of the pricing programs (one a candidate; the fused launch's last one also writes the schedule). Four: on
#: an H100 (``tests/gpu/test_device_schedule_gpu.py::test_price_warps``, fused) 1 / 2 / 4 warps priced GQA 32/8 at 16
#: requests to 6K in 33.8 / 27.9 / 25.0 us, 64 to 6K and 30K 58.6 / 54.6 / 49.5 and 165.1 / 162.7 / 145.0, MLA-16
#: 18.3 / 17.9 / 19.7, 34.4 / 31.4 / 31.1 and 81.3 / 78.3 / 72.8; the fused launch at one warp wrote its schedule
#: slower than the schedule kernel's four (``experiments/plan_run``). MLA-128's pricing is slower at four (28.1 ->
#: 31.5 us at 8 requests, 97.8 -> 119.4 at 64; ``test_schedule_kernel_time`` on two H100s): a count per shape is
#: not chosen.
PRICE_WARPS = 4
#: splitlab's pricing and schedule in one launch (``_splitlab_plan_kernel``, at ``PRICE_WARPS``), else two (the
#: pricing, then ``_device_schedule_kernel``): a launch fewer on the host and in a graph; what each costs is
#: ``experiments/plan_run/gpu.py``'s ``schedule_kernels_two_launches_us`` beside ``schedule_kernels_us``.
FUSED_PRICING = True
#: Elements of the pricing's durations tile (requests x chunks written a round: ``PRICE_TILE // BLOCK_B`` chunks of
#: every request, at least one).
PRICE_TILE = 512

_BALANCED, _UNIFORM_RM, _UNIFORM_SM, _STREAM_K, _SPLITLAB, _FLASHMLA = 0, 1, 2, 3, 4, 5
#: The kernels' ``MEMO``: no memo, forget the kept schedule, keep it where the lengths are its lengths.
_MEMO_NONE, _MEMO_FORGET, _MEMO_REUSE = 0, 1, 2
_FORGET, _REUSE = tl.constexpr(_MEMO_FORGET), tl.constexpr(_MEMO_REUSE)  # (as the kernels compare them)


@triton.jit
def _store_item(items_ptr, pos, r, begin, end, row, is_bad, mask):
    begin = tl.where(is_bad, 1, begin)
    end = tl.where(is_bad, 0, end)
    row = tl.where(is_bad, -1, row)
    base = items_ptr + pos * 4
    tl.store(base, r, mask=mask)
    tl.store(base + 1, begin, mask=mask)
    tl.store(base + 2, end, mask=mask)
    tl.store(base + 3, row, mask=mask)


@triton.jit
def _cta_of(p, ctas, q, extra):
    """Stream-K: the CTA whose span holds batch tile ``p`` (spans of ``q + 1`` tiles for the first ``extra`` CTAs,
    ``q`` after), the last CTA for ``p`` past the end."""
    x = extra * (q + 1)
    c = tl.where(p < x, p // (q + 1), extra + (p - x) // tl.maximum(q, 1))
    return tl.minimum(c, ctas - 1)


@triton.jit
def _smallest_chunk(t1, valid, budget):
    """``schedulers.smallest_chunk``'s binary search (low 1, high ``max(t, 1)``): the smallest chunk, in tiles, whose
    count ``sum(cdiv(t1, chunk))`` fits ``budget``."""
    c_hi = tl.max(tl.where(valid, t1, 1), axis=0)
    c_lo = c_hi * 0 + 1
    while c_lo < c_hi:  # about log2(longest tiles) rounds, each one reduction over the batch
        c_mid = (c_lo + c_hi) // 2
        count = tl.sum(tl.where(valid, (t1 + c_mid - 1) // c_mid, 0), axis=0)
        fits = count <= budget
        c_lo = tl.where(fits, c_lo, c_mid + 1)
        c_hi = tl.where(fits, c_mid, c_hi)
    return c_lo


@triton.jit
def _uniform_step(lens, splits, tile):
    """Keys of a uniform chunk: ``cdiv(cdiv(L, S), tile) * tile``."""
    return ((lens + splits - 1) // splits + tile - 1) // tile * tile


@triton.jit
def _write_split_major(items_ptr, n, lens, offs, step, pofs, bad_req, splits):
    # split s of every request that has it, then split s + 1
    base = tl.sum(n * 0, axis=0)
    for s in range(0, splits):
        has = n > s
        h = has.to(tl.int32)
        pos = base + tl.cumsum(h, axis=0) - h
        begin = s * step
        end = tl.minimum(begin + step, lens)
        _store_item(items_ptr, pos, offs, begin, end, tl.where(n > 1, pofs + s, -1), bad_req, has)
        base += tl.sum(h, axis=0)


@triton.jit
def _write_request_major(seq_lens_ptr, items_ptr, cta_ptr, po_ptr, scratch_ptr, total, batch, param, tile,
                         chunk_keys, is_uni, over, C, q, extra,
                         MODE: tl.constexpr, BLOCK_I: tl.constexpr, LOG_B: tl.constexpr):
    # item i belongs to the request whose item range holds it (binary search of the ends in scratch)
    offs_i = tl.arange(0, BLOCK_I)
    zero = tl.zeros([BLOCK_I], tl.int32)
    for i0 in range(0, total, BLOCK_I):
        i = i0 + offs_i
        live = i < total
        s_lo = zero
        s_hi = zero + batch
        for _step in range(LOG_B):
            act = s_lo < s_hi
            s_mid = (s_lo + s_hi) // 2
            c = tl.load(scratch_ptr + s_mid, mask=act & live, other=0)
            s_lo = tl.where(act & (c <= i), s_mid + 1, s_lo)
            s_hi = tl.where(act & (c > i), s_mid, s_hi)
        r = tl.minimum(s_lo, batch - 1)
        end_r = tl.load(scratch_ptr + r, mask=live, other=0)
        first = tl.load(scratch_ptr + r - 1, mask=live & (r > 0), other=0)
        n_r = end_r - first
        k = i - first
        raw_r = tl.load(seq_lens_ptr + r, mask=live, other=0).to(tl.int32)
        len_r = tl.maximum(raw_r, 0)
        if MODE == 3:  # item k: request r's piece of CTA first + k; the slot's last item ends its CSR range
            pos_r = tl.load(scratch_ptr + batch + r, mask=live, other=0)
            t_r = (len_r + tile - 1) // tile
            c_i = _cta_of(pos_r, C, q, extra) + k
            span0 = c_i * q + tl.minimum(c_i, extra)
            span1 = span0 + q + (c_i < extra).to(tl.int32)
            begin = tl.where(t_r > 0, (tl.maximum(pos_r, span0) - pos_r) * tile, 0)
            end = tl.where(t_r > 0, tl.minimum((tl.minimum(pos_r + t_r, span1) - pos_r) * tile, len_r), 0)
            last = (k < n_r - 1) | (r == batch - 1) | (_cta_of(pos_r + t_r, C, q, extra) != c_i)
            tl.store(cta_ptr + c_i + 1, i + 1, mask=live & last & (over == 0))
        else:
            step_r = tl.where(is_uni != 0, _uniform_step(len_r, param, tile), chunk_keys)
            begin = k * step_r
            end = tl.minimum(begin + step_r, len_r)
        po_r = tl.load(po_ptr + r, mask=live, other=0)
        row = tl.where(n_r > 1, po_r + k, -1)
        _store_item(items_ptr, i, r, begin, end, row, over | (raw_r < 0), live)


@triton.jit
def _splitlab_winner(res_f_ptr, res_i_ptr, n_cands, BLOCK_C: tl.constexpr):
    """splitlab's choice among the priced candidates: the least (modelled time, partial rows, items, rank) of those
    that fit (``schedulers.splitlab``'s key and order; the ranks differ, so the least is one candidate), all
    candidates loaded at once and the key narrowed field by field; uniform at one split (candidate 0) where none
    fits. Returns (uniform?, its split count or budget)."""
    k = tl.arange(0, BLOCK_C)
    live = k < n_cands
    # (".cg": from L2, where the other programs' prices are, whichever launch wrote them)
    fit = live & (tl.load(res_i_ptr + 6 * k, mask=live, other=0, cache_modifier=".cg") != 0)
    t = tl.load(res_f_ptr + k, mask=live, other=0.0, cache_modifier=".cg")
    pr = tl.load(res_i_ptr + 6 * k + 1, mask=live, other=0, cache_modifier=".cg")
    nn = tl.load(res_i_ptr + 6 * k + 2, mask=live, other=0, cache_modifier=".cg")
    rk = tl.load(res_i_ptr + 6 * k + 3, mask=live, other=0, cache_modifier=".cg")
    big = 2147483647
    least = fit & (t == tl.min(tl.where(fit, t, float("inf")), axis=0))
    least = least & (pr == tl.min(tl.where(least, pr, big), axis=0))
    least = least & (nn == tl.min(tl.where(least, nn, big), axis=0))
    least = least & (rk == tl.min(tl.where(least, rk, big), axis=0))
    best_k = tl.min(tl.where(least, k, big), axis=0)
    best_k = tl.where(best_k == big, 0, best_k)  # uniform at one split always fits a capacity of the batch
    return (tl.load(res_i_ptr + 6 * best_k + 4, cache_modifier=".cg"),
            tl.load(res_i_ptr + 6 * best_k + 5, cache_modifier=".cg"))


@triton.jit
def _kept(memo_ptr, raw, offs, valid, batch):
    """Whether the plan's kept schedule (``memo``: its batch size, 0 for none, then its lengths) was made for these
    lengths ``raw``: one load of the lengths and a compare."""
    old = tl.load(memo_ptr + 1 + offs, mask=valid, other=0)
    return (tl.load(memo_ptr) == batch) & (tl.sum(((old != raw) & valid).to(tl.int32), axis=0) == 0)


@triton.jit
def _todo(memo_ptr, raw, offs, valid, batch, MEMO: tl.constexpr):
    """Whether a kernel writes its schedule: always, but under ``MEMO`` reuse where the lengths are the kept
    schedule's (``_kept``); ``batch`` is at least 1."""
    if MEMO == _REUSE:
        todo = _kept(memo_ptr, raw, offs, valid, batch) == 0
    else:
        todo = batch > 0
    return todo


@triton.jit
def _note(memo_ptr, raw, offs, valid, batch, MEMO: tl.constexpr):
    """After a schedule is written: under reuse, note the lengths it was made for (``_kept``'s memo); under forget,
    forget the kept one; nothing without a memo."""
    if MEMO == _REUSE:
        tl.store(memo_ptr + 1 + offs, raw, mask=valid)
        tl.store(memo_ptr, batch)
    elif MEMO == _FORGET:
        tl.store(memo_ptr, 0)


@triton.jit
def _device_schedule_kernel(
    seq_lens_ptr, items_ptr, cta_ptr, po_ptr, num_ctas_ptr, status_ptr, scratch_ptr, res_f_ptr, res_i_ptr, memo_ptr,
    batch, param, tile, cap_items, cap_ctas, cap_rows, n_cands,
    MODE: tl.constexpr, SPLIT_MAJOR: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_I: tl.constexpr,
    LOG_B: tl.constexpr, MEMO: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # One program. param: balanced's budget, uniform's split count, or stream-K's CTAs; splitlab (MODE 4): the
    # winner's, read from the priced candidates (uniform at a split count or balanced at a budget). MEMO (``_MEMO_*``):
    # none, forget the kept schedule, or keep the buffers as they are where the lengths are the kept schedule's.
    offs = tl.arange(0, BLOCK_B)
    valid = offs < batch
    raw = tl.load(seq_lens_ptr + offs, mask=valid, other=0).to(tl.int32)
    if _todo(memo_ptr, raw, offs, valid, batch, MEMO):
        _schedule(seq_lens_ptr, items_ptr, cta_ptr, po_ptr, num_ctas_ptr, status_ptr, scratch_ptr, res_f_ptr,
                  res_i_ptr, batch, param, tile, cap_items, cap_ctas, cap_rows, n_cands, offs, valid, raw,
                  MODE, SPLIT_MAJOR, BLOCK_B, BLOCK_I, LOG_B, BLOCK_C)
        _note(memo_ptr, raw, offs, valid, batch, MEMO)


@triton.jit
def _schedule(
    seq_lens_ptr, items_ptr, cta_ptr, po_ptr, num_ctas_ptr, status_ptr, scratch_ptr, res_f_ptr, res_i_ptr,
    batch, param, tile, cap_items, cap_ctas, cap_rows, n_cands, offs, valid, raw,
    MODE: tl.constexpr, SPLIT_MAJOR: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_I: tl.constexpr,
    LOG_B: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # _device_schedule_kernel's work: the schedule of the lengths `raw` (`offs` < batch `valid`) into the buffers.
    neg = valid & (raw < 0)
    lens = tl.maximum(raw, 0)
    t1 = tl.maximum((lens + tile - 1) // tile, 1)
    zero = tl.sum(offs * 0, axis=0)
    if MODE == 1 or MODE == 2:
        is_uni = zero + 1
    else:
        is_uni = zero
    C = zero + 1
    q = zero
    extra = zero
    if MODE == 4:
        is_uni, param = _splitlab_winner(res_f_ptr, res_i_ptr, n_cands, BLOCK_C)
    if MODE == 0 or MODE == 4:  # balanced: schedulers.smallest_chunk's binary search
        c_lo = _smallest_chunk(t1, valid, param)
        chunk_keys = c_lo * tile
        step = tl.zeros([BLOCK_B], tl.int32) + chunk_keys
        n = (t1 + c_lo - 1) // c_lo
    if MODE == 3:  # stream-K: the batch's tiles end to end, cut into C spans; a request's items: the spans it crosses
        chunk_keys = 0
        t = tl.where(valid, (lens + tile - 1) // tile, 0)
        T = tl.sum(t, axis=0)
        C = tl.where(T > 0, tl.maximum(1, tl.minimum(param, T)), 1)
        q = T // C
        extra = T % C
        tpos = tl.cumsum(t, axis=0) - t
        first_c = _cta_of(tpos, C, q, extra)
        n = tl.where(t > 0, _cta_of(tpos + t - 1, C, q, extra) - first_c + 1, 1)
        step = t
    if MODE == 1 or MODE == 2 or MODE == 4:  # uniform: the chunks that start before L (one if L == 0)
        step_u = _uniform_step(lens, param, tile)
        n_u = tl.where(lens > 0, (lens + tl.maximum(step_u, 1) - 1) // tl.maximum(step_u, 1), 1)
        if MODE == 4:
            n = tl.where(is_uni != 0, n_u, n)
            step = tl.where(is_uni != 0, step_u, step)
        else:
            chunk_keys = 0
            n = n_u
            step = step_u
    n = tl.where(valid, n, 0)
    total = tl.sum(n, axis=0)
    rows = tl.where(n > 1, n, 0)
    total_rows = tl.sum(rows, axis=0)
    if MODE == 3:
        slots = C
    else:
        slots = total
    over = (total > cap_items) | (slots > cap_ctas) | (total_rows > cap_rows)
    # Past the capacity: one bad item a request (NaN rows), no partial rows.
    n = tl.where(over, valid.to(tl.int32), n)
    rows = tl.where(over, 0, rows)
    total = tl.where(over, batch, total)
    slots = tl.where(over, batch, slots)
    total_rows = tl.where(over, 0, total_rows)
    bad_req = neg | over
    pofs = tl.cumsum(rows, axis=0) - rows

    tl.store(po_ptr + offs, pofs, mask=valid)
    tl.store(po_ptr + batch, total_rows)
    tl.store(num_ctas_ptr, slots)
    tl.store(status_ptr, over.to(tl.int32) * 1 + (tl.max(neg.to(tl.int32), axis=0) > 0).to(tl.int32) * 2)
    offs_i = tl.arange(0, BLOCK_I)
    for c0 in range(0, cap_ctas + 1, BLOCK_I):  # one item a slot (stream-K: only past the capacity)
        ci = c0 + offs_i
        if MODE == 3:
            tl.store(cta_ptr + ci, ci, mask=(ci <= cap_ctas) & over)
        else:
            tl.store(cta_ptr + ci, ci, mask=ci <= cap_ctas)
    if MODE == 3:
        tl.store(cta_ptr, 0)

    # the scratch the request-major writer searches (the requests' item ends; stream-K: each request's first tile)
    tl.store(scratch_ptr + offs, tl.cumsum(n, axis=0), mask=valid)
    if MODE == 3:
        tl.store(scratch_ptr + batch + offs, tpos, mask=valid)
    tl.debug_barrier()
    if MODE == 2:
        _write_split_major(items_ptr, n, lens, offs, step, pofs, bad_req, tl.where(over, 1, param))
    elif MODE == 4 and SPLIT_MAJOR:  # GQA's grid order for uniform, request-major balanced chunks
        if is_uni != 0:
            _write_split_major(items_ptr, n, lens, offs, step, pofs, bad_req, tl.where(over, 1, param))
        else:
            _write_request_major(seq_lens_ptr, items_ptr, cta_ptr, po_ptr, scratch_ptr, total, batch, param, tile,
                                 chunk_keys, is_uni, over, C, q, extra, MODE, BLOCK_I, LOG_B)
    else:
        _write_request_major(seq_lens_ptr, items_ptr, cta_ptr, po_ptr, scratch_ptr, total, batch, param, tile,
                             chunk_keys, is_uni, over, C, q, extra, MODE, BLOCK_I, LOG_B)


@triton.jit
def _flashmla_kernel(
    seq_lens_ptr, items_ptr, cta_ptr, po_ptr, num_ctas_ptr, status_ptr, scratch_ptr, memo_ptr,
    batch, parts, block_n, overhead, cap_items, cap_ctas, cap_rows,
    BLOCK_B: tl.constexpr, BLOCK_I: tl.constexpr, MEMO: tl.constexpr,
):
    # One program: FlashMLA's get_mla_metadata walk (planners.flashmla), one step a finished request or a closed part;
    # MEMO as _device_schedule_kernel's.
    offs = tl.arange(0, BLOCK_B)
    valid = offs < batch
    raw = tl.load(seq_lens_ptr + offs, mask=valid, other=0).to(tl.int32)
    if _todo(memo_ptr, raw, offs, valid, batch, MEMO):
        _flashmla_walk(seq_lens_ptr, items_ptr, cta_ptr, po_ptr, num_ctas_ptr, status_ptr, scratch_ptr, batch,
                       parts, block_n, overhead, cap_items, cap_ctas, cap_rows, offs, valid, raw, BLOCK_I)
        _note(memo_ptr, raw, offs, valid, batch, MEMO)


@triton.jit
def _flashmla_walk(
    seq_lens_ptr, items_ptr, cta_ptr, po_ptr, num_ctas_ptr, status_ptr, scratch_ptr,
    batch, parts, block_n, overhead, cap_items, cap_ctas, cap_rows, offs, valid, raw, BLOCK_I: tl.constexpr,
):
    # _flashmla_kernel's work for the lengths `raw`.
    neg = valid & (raw < 0)
    lens = tl.maximum(raw, 0)
    blocks = tl.maximum(lens - 1, 0) // block_n + 1  # a zero length still counts one block
    total = tl.sum(tl.where(valid, blocks + overhead, 0), axis=0)
    payload = (total + parts - 1) // parts + overhead
    zero = tl.sum(offs * 0, axis=0)
    p = zero  # the SM part
    remain = payload
    req = zero
    blk = zero  # the first block of req not yet dealt
    split = zero  # req's items so far
    count = zero  # items written
    tl.store(cta_ptr, 0)
    while (p < parts) & (req < batch):
        len_r = tl.maximum(tl.load(seq_lens_ptr + req).to(tl.int32), 0)
        nb = tl.maximum(len_r - 1, 0) // block_n + 1
        left = nb - blk
        finish = remain >= left + overhead  # the part takes the rest of req
        take = remain - overhead
        cut = (finish == 0) & (take > 0)  # else it takes `take` blocks of req and closes
        b1 = tl.where(finish, nb, blk + take)
        write = finish | cut
        begin = tl.where(len_r == 0, 0, blk * block_n)
        end = tl.where(len_r == 0, 0, tl.minimum(b1 * block_n, len_r))
        base = items_ptr + count * 4
        wmask = write & (count < cap_items)
        tl.store(base, req, mask=wmask)
        tl.store(base + 1, begin, mask=wmask)
        tl.store(base + 2, end, mask=wmask)
        count += write.to(tl.int32)
        tl.store(scratch_ptr + req, split + 1, mask=finish)  # req's items (its split count)
        tl.store(cta_ptr + p + 1, count, mask=(finish == 0) & (p < cap_ctas))  # the part closes
        remain = tl.where(finish, remain - (left + overhead), payload)
        req = tl.where(finish, req + 1, req)
        blk = tl.where(finish, 0, tl.where(cut, blk + take, blk))
        split = tl.where(finish, 0, tl.where(cut, split + 1, split))
        p = tl.where(finish, p, p + 1)
    offs_i = tl.arange(0, BLOCK_I)
    for c0 in range(0, parts + 1, BLOCK_I):  # the part that dealt the last request and the empty ones after it
        ci = c0 + offs_i
        tl.store(cta_ptr + ci, count, mask=(ci > p) & (ci <= parts) & (ci <= cap_ctas))
    tl.debug_barrier()
    n = tl.load(scratch_ptr + offs, mask=valid, other=0)
    rows = tl.where(n > 1, n, 0)
    total_rows = tl.sum(rows, axis=0)
    # past a capacity (or, never, requests left when the parts ran out: upstream's device assert)
    over = (count > cap_items) | (parts > cap_ctas) | (total_rows > cap_rows) | (req < batch)
    rows = tl.where(over, 0, rows)
    total_rows = tl.where(over, 0, total_rows)
    pofs = tl.cumsum(rows, axis=0) - rows
    tl.store(po_ptr + offs, pofs, mask=valid)
    tl.store(po_ptr + batch, total_rows)
    tl.store(scratch_ptr + batch + offs, tl.cumsum(n, axis=0) - n, mask=valid)  # each request's first item
    tl.store(num_ctas_ptr, tl.where(over, batch, parts))
    tl.store(status_ptr, over.to(tl.int32) * 1 + (tl.max(neg.to(tl.int32), axis=0) > 0).to(tl.int32) * 2)
    for c0 in range(0, cap_ctas + 1, BLOCK_I):  # past the capacity: one item a slot
        ci = c0 + offs_i
        tl.store(cta_ptr + ci, ci, mask=(ci <= cap_ctas) & over)
    tl.debug_barrier()
    items = tl.where(over, batch, count)
    for i0 in range(0, items, BLOCK_I):  # each item's partial row (its request's items are consecutive)
        i = i0 + offs_i
        live = i < items
        keep = live & (over == 0)
        r = tl.where(over, i, tl.load(items_ptr + i * 4, mask=keep, other=0))
        begin = tl.load(items_ptr + i * 4 + 1, mask=keep, other=0)
        end = tl.load(items_ptr + i * 4 + 2, mask=keep, other=0)
        n_r = tl.load(scratch_ptr + r, mask=keep, other=1)
        first = tl.load(scratch_ptr + batch + r, mask=keep, other=0)
        po_r = tl.load(po_ptr + r, mask=keep, other=0)
        row = tl.where(n_r > 1, po_r + i - first, -1)
        raw_r = tl.load(seq_lens_ptr + r, mask=live, other=0).to(tl.int32)
        _store_item(items_ptr, i, r, begin, end, row, over | (raw_r < 0), live)


@triton.jit
def _item_of(c, magic):
    """``c // h`` for CTA numbers ``c`` without a division: the high word of ``2c x magic`` in uint32, ``magic =
    ceil(2^31 / h)`` (exact while ``c x (h - 1) < 2^31``: ``splitlab_pricing`` checks its CTAs)."""
    return tl.umulhi(c.to(tl.uint32) * 2, magic).to(tl.int32)


@triton.jit
def _next_event(ends):
    """The list schedule's next event: the least end time ``e`` among the slots' ``ends`` (a [32, BLOCK_S / 32]
    tile, a row to a lane), the slots that free at it, as a mask and as int32, their count per lane and in all."""
    # the least: a tree of pairwise minima within each lane (independent compares, not a chain through the lane's
    # registers), then across the lanes
    x = ends
    for _ in tl.static_range(0, 16):
        if x.shape[1] > 1:
            x = tl.reduce(tl.reshape(x, [32, 2, x.shape[1] // 2]), 1, _lesser)
    e = _least_across_lanes(tl.reshape(x, [32]))
    freed = ends == e
    fi = freed.to(tl.int32)
    per_lane = tl.sum(fi, axis=1)
    return e, freed, fi, per_lane, tl.sum(per_lane, axis=0)


@triton.jit
def _least_across_lanes(x):
    """The least of fp64 values ``x`` (``[32]``, one a lane; no NaN) by two 32-bit min-reductions across the warp
    (one instruction each on sm_80+) rather than five rounds of 64-bit shuffles: over the high words of the values'
    order-preserving keys (the bits with the sign bit set, negative values' bits inverted), then over the low words
    of the lanes that hold the least high word; the key of the least value turned back into it."""
    u = x.to(tl.uint64, bitcast=True)
    hi = (u >> 32).to(tl.uint32)
    lo = u.to(tl.uint32)
    neg = hi >= 0x80000000
    # (x ^ 0xFFFFFFFF, not ~x: the interpreter's ~ takes no unsigned operand)
    k_hi = tl.where(neg, hi ^ 0xFFFFFFFF, hi | 0x80000000)
    k_lo = tl.where(neg, lo ^ 0xFFFFFFFF, lo)
    m_hi = tl.min(k_hi, axis=0)
    m_lo = tl.min(tl.where(k_hi == m_hi, k_lo, 0xFFFFFFFF), axis=0)
    pos = m_hi >= 0x80000000
    hi = tl.where(pos, m_hi & 0x7FFFFFFF, m_hi ^ 0xFFFFFFFF)
    lo = tl.where(pos, m_lo, m_lo ^ 0xFFFFFFFF)
    return ((hi.to(tl.uint64) << 32) | lo.to(tl.uint64)).to(tl.float64, bitcast=True)


@triton.jit
def _lesser(a, b):
    # min of two end times (never NaN): one compare and a select, not IEEE minNum's NaN handling
    return tl.where(b < a, b, a)


@triton.jit(do_not_specialize=["batch", "h", "slots", "sm_count", "cap_items", "cap_ctas", "closed_ctas"])
def _splitlab_price_kernel(
    seq_lens_ptr, cand_ptr, consts_ptr, dur_ptr, res_f_ptr, res_i_ptr, memo_ptr,
    batch, max_splits, min_keys, h, slots, sm_count, cap_items, cap_ctas, tile, closed_ctas,
    SPLIT_MAJOR: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_S: tl.constexpr,
    MEMO: tl.constexpr,
):
    # Under reuse, nothing to price where the lengths are the kept schedule's (the schedule kernel after it keeps it
    # too, and notes the memo).
    offs = tl.arange(0, BLOCK_B)
    valid = offs < batch
    raw = tl.load(seq_lens_ptr + offs, mask=valid, other=0).to(tl.int32)
    if _todo(memo_ptr, raw, offs, valid, batch, MEMO):
        _price(seq_lens_ptr, cand_ptr, consts_ptr, dur_ptr, res_f_ptr, res_i_ptr, batch, max_splits, min_keys, h,
               slots, sm_count, cap_items, cap_ctas, tile, closed_ctas, SPLIT_MAJOR, BLOCK_B, BLOCK_J, BLOCK_S)


@triton.jit(do_not_specialize=["batch", "h", "slots", "sm_count", "cap_items", "cap_ctas", "cap_rows",
                                "closed_ctas", "n_cands"])
def _splitlab_plan_kernel(
    seq_lens_ptr, cand_ptr, consts_ptr, dur_ptr, res_f_ptr, res_i_ptr, arrived_ptr,
    items_ptr, cta_ptr, po_ptr, num_ctas_ptr, status_ptr, scratch_ptr, memo_ptr,
    batch, max_splits, min_keys, h, slots, sm_count, cap_items, cap_ctas, cap_rows, tile, closed_ctas, n_cands,
    SPLIT_MAJOR: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_I: tl.constexpr, LOG_B: tl.constexpr, BLOCK_C: tl.constexpr, MEMO: tl.constexpr,
):
    # splitlab's pricing and schedule in one launch: program k prices candidate k (_price), then counts itself in
    # `arrived` (acq_rel: its prices before, the others' after); the program that counts last writes the winner's
    # schedule (_schedule, MODE 4) and zeroes the counter for the next launch. MEMO as the two kernels': where the
    # lengths are the kept schedule's, no program prices or counts (the memo is written only after every program
    # has read it: by the last to count).
    offs = tl.arange(0, BLOCK_B)
    valid = offs < batch
    raw = tl.load(seq_lens_ptr + offs, mask=valid, other=0).to(tl.int32)
    if _todo(memo_ptr, raw, offs, valid, batch, MEMO):
        _price(seq_lens_ptr, cand_ptr, consts_ptr, dur_ptr, res_f_ptr, res_i_ptr, batch, max_splits, min_keys, h,
               slots, sm_count, cap_items, cap_ctas, tile, closed_ctas, SPLIT_MAJOR, BLOCK_B, BLOCK_J, BLOCK_S)
        tl.debug_barrier()
        if tl.atomic_add(arrived_ptr, 1, sem="acq_rel") == n_cands - 1:
            tl.store(arrived_ptr, 0)
            _schedule(seq_lens_ptr, items_ptr, cta_ptr, po_ptr, num_ctas_ptr, status_ptr, scratch_ptr, res_f_ptr,
                      res_i_ptr, batch, batch * 0 + 1, tile, cap_items, cap_ctas, cap_rows, n_cands, offs, valid, raw,
                      4, SPLIT_MAJOR, BLOCK_B, BLOCK_I, LOG_B, BLOCK_C)
            _note(memo_ptr, raw, offs, valid, batch, MEMO)


@triton.jit
def _price(
    seq_lens_ptr, cand_ptr, consts_ptr, dur_ptr, res_f_ptr, res_i_ptr,
    batch, max_splits, min_keys, h, slots, sm_count, cap_items, cap_ctas, tile, closed_ctas,
    SPLIT_MAJOR: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_S: tl.constexpr,
):
    # Program k prices candidate k as schedulers._priced does (fp64, operation for operation; launched without FMA
    # contraction): the launch's time by planners.splitlab.ragged_launch_time (its closed form past SCHEDULE_WAVES
    # waves of CTAs, from integer reductions of the requests' key tiles; else the list schedule of its CTAs on the
    # slots, over each item's duration tiles x RATE + FIXED in issue order), plus the partial-row writes and the merge.
    k = tl.program_id(0)
    kind = tl.load(cand_ptr + 2 * k)  # 0 uniform at a fixed split count, 1 uniform at the limit, 2 balanced
    arg = tl.load(cand_ptr + 2 * k + 1)
    offs = tl.arange(0, BLOCK_B)
    valid = offs < batch
    lens = tl.maximum(tl.load(seq_lens_ptr + offs, mask=valid, other=0).to(tl.int32), 0)
    longest = tl.max(lens, axis=0)
    lim = tl.maximum(1, tl.minimum(max_splits, (longest + min_keys - 1) // min_keys))  # split_candidates' limit
    is_bal = kind == 2
    s = tl.maximum(tl.where(kind == 1, lim, arg), 1)
    ok = tl.where(kind == 0, (arg < lim).to(tl.int32), 1)  # a fixed count at or past the limit is the limit's candidate
    t = (lens + tile - 1) // tile
    t1 = tl.maximum(t, 1)
    chunk = longest * 0 + 1
    if is_bal:
        chunk = _smallest_chunk(t1, valid, arg)
    per = _uniform_step(lens, s, tile)
    n_u = tl.where(lens > 0, (lens + tl.maximum(per, 1) - 1) // tl.maximum(per, 1), 1)
    n_b = (t1 + chunk - 1) // chunk
    n = tl.where(valid, tl.where(is_bal, n_b, n_u), 0)
    N = tl.sum(n, axis=0)
    prows = tl.sum(tl.where(n > 1, n, 0), axis=0)
    fits = (ok != 0) & (N <= cap_items) & (N <= cap_ctas)

    rate = tl.load(consts_ptr + 0)
    fixed = tl.load(consts_ptr + 1)
    cap = tl.load(consts_ptr + 3)
    zf = rate * 0.0
    ctas = h * N
    closed = ctas >= closed_ctas
    # closed form (planners.splitlab._closed_form): the durations sum to T x RATE + N x FIXED, T the items' key
    # tiles: a request's chunks, all whole (`whole` tiles: uniform's per keys, balanced's chunk) but its last, sum to
    # its tiles (one for an empty request), so T is the batch's. The longest duration is the longest item's tiles x
    # RATE + FIXED: a request's first chunk where it has several, else its tiles.
    whole = tl.where(is_bal, chunk, per // tile)
    total_t = tl.sum(tl.where(valid, t1, 0), axis=0)
    long_t = tl.max(tl.where(valid, tl.where(n > 1, whole, t1), 0), axis=0)
    total = total_t.to(tl.float64) * rate + N.to(tl.float64) * fixed
    work = total * h.to(tl.float64) / slots.to(tl.float64)
    closed_time = tl.maximum(work + cap * total / N.to(tl.float64) / 2.0, cap * (long_t.to(tl.float64) * rate + fixed))

    # the list schedule's items' durations, in issue order (only where it runs): a request's chunks but its last are
    # whole, its last the rest (one tile for an empty request). BLOCK_J chunks of every request a round:
    # request-major, request b's j-th item after its requests' items before it; split-major (GQA's uniform
    # candidates), after every item of the chunks before j and the j-th chunks of the requests before b.
    n_sim = tl.where(fits & (closed == 0), ctas, 0)
    dur = dur_ptr + k.to(tl.int64) * cap_items
    by_split = kind != 2
    last_u = tl.where(lens > 0, (lens - (n - 1) * per + tile - 1) // tile, 1)
    last_b = tl.maximum(t - (n - 1) * chunk, 1)
    whole_d = whole.to(tl.float64) * rate + fixed
    last_d = tl.where(is_bal, last_b, last_u).to(tl.float64) * rate + fixed
    n2 = n[:, None]
    whole_d2 = whole_d[:, None]
    last_d2 = last_d[:, None]
    start2 = (tl.cumsum(n, axis=0) - n)[:, None]
    offs_j = tl.arange(0, BLOCK_J)[None, :]
    placed = tl.sum(offs * 0, axis=0)
    for j0 in range(0, tl.where(n_sim > 0, tl.max(n, axis=0), 0), BLOCK_J):
        j = j0 + offs_j
        has = n2 > j
        if SPLIT_MAJOR:
            hi = has.to(tl.int32)
            in_split = tl.sum(hi, axis=0)
            before = placed + tl.cumsum(in_split, axis=0) - in_split
            pos = tl.where(by_split, before[None, :] + tl.cumsum(hi, axis=0) - hi, start2 + j)
            placed += tl.sum(in_split, axis=0)
        else:
            pos = start2 + j
        tl.store(dur + pos, tl.where(j < n2 - 1, whole_d2, last_d2), mask=has)
    tl.debug_barrier()

    # list schedule (planners.splitlab._schedule): CTA c (item c // h) starts in the first slot that frees, the
    # resident CTAs stream at min(1 / CAP, slots / resident); CTAs that end at one virtual work end together (the
    # host's merged heap pops). The slots' virtual end times are a [32, BLOCK_S / 32] tile, a row to a lane (its
    # registers): the freed slots take the next CTAs in row order (a lane's registers, then the next lane's), so an
    # event's counts and ranks are sums and scans within each thread and one 32-wide scan across the lanes. (Which
    # free slot takes which CTA does not change the schedule: only the slots' end times as a whole do. The first
    # wave fills the tile column by column.) A CTA's duration is its item's, read from ``durations``: an event's one
    # global load.
    SPT: tl.constexpr = BLOCK_S // 32
    lin = tl.arange(0, 32)[:, None] + tl.arange(0, SPT)[None, :] * 32
    magic = (((1 << 31) + h.to(tl.int64) - 1) // h.to(tl.int64)).to(tl.uint32)
    inv_cap = tl.load(consts_ptr + 2)  # 1 / CAP, or inf where CAP is 0
    q0 = tl.minimum(slots, n_sim)
    first = lin < q0
    ends = tl.load(dur + _item_of(lin, magic), mask=first, other=float("inf"))
    head = q0
    done = zf
    now = zf
    # while CTAs are left to issue, every slot is busy at each event (the freed ones refilled at once): the speed is
    # min(1 / CAP, slots / slots)
    speed = tl.minimum(inv_cap, slots.to(tl.float64) / slots.to(tl.float64))
    got = head * 0
    nf = got
    while head < n_sim:
        e, freed, fi, per_lane, nf = _next_event(ends)
        now = now + (e - done) / speed
        done = e
        rank = tl.cumsum(fi, axis=1) - fi + (tl.cumsum(per_lane, axis=0) - per_lane)[:, None]
        c = head + rank
        d = tl.load(dur + _item_of(c, magic), mask=freed & (c < n_sim), other=float("inf"))  # none left: e + inf
        ends = tl.where(freed, e + d, ends)
        got = tl.minimum(nf, n_sim - head)
        head += got
    resident = tl.where(n_sim > q0, slots - nf + got, q0)
    while resident > 0:  # the drain: nothing left to issue
        e, freed, fi, per_lane, nf = _next_event(ends)
        now = now + (e - done) / tl.minimum(inv_cap, slots.to(tl.float64) / resident.to(tl.float64))
        done = e
        ends = tl.where(freed, float("inf"), ends)
        resident -= nf
    launch = tl.where(closed, closed_time, now)
    # the partial rows' writes and the merge (schedulers._priced)
    rows_f = prows.to(tl.float64)
    wrote = launch + tl.load(consts_ptr + 4) * ((prows * h + sm_count - 1) // sm_count).to(tl.float64)
    merge = tl.load(consts_ptr + 5) + tl.load(consts_ptr + 6) * rows_f * h.to(tl.float64) * tl.load(consts_ptr + 7) \
        / sm_count.to(tl.float64)
    launch = tl.where(prows > 0, wrote + merge, launch)
    tl.store(res_f_ptr + k, launch)
    base = res_i_ptr + 6 * k
    tl.store(base, fits.to(tl.int32))
    tl.store(base + 1, prows)
    tl.store(base + 2, N)
    tl.store(base + 3, tl.where(is_bal, (1 << 20) + k, s))  # ties: uniform by split count, then balanced in order
    tl.store(base + 4, (kind != 2).to(tl.int32))
    tl.store(base + 5, tl.where(is_bal, arg, s))


@dataclass(frozen=True)
class SplitlabPricing:
    """What the device needs to price splitlab's candidates for one shape and batch size (``splitlab_pricing``):
    the candidates (``cands`` int32 ``[K, 2]``: kind 0 uniform at a fixed split count, 1 uniform at the split
    limit, 2 balanced at a budget; and the count or budget), the fp64 terms (``consts``: RATE, FIXED
    (``schedulers.item_fixed``), 1 / CAP or inf, CAP, PARTIAL x P, COMBINE, COMBINE_PER_SPLIT, P), the integer terms
    and the buffers the pricing writes (``durations`` fp64 ``K x max_items``, ``res_f`` fp64 ``[K]``, ``res_i`` int32
    ``[K, 6]``, ``arrived`` int32 ``[1]``: the fused launch's counter, zero between launches), allocated once."""

    batch: int
    cands: torch.Tensor
    consts: torch.Tensor
    durations: torch.Tensor
    res_f: torch.Tensor
    res_i: torch.Tensor
    arrived: torch.Tensor
    max_items: int
    max_splits: int
    min_keys: int
    h: int
    slots: int
    sm_count: int
    closed_ctas: int
    split_major: bool


def splitlab_pricing(w: object, dev: object, constants: object, max_items: int,
                     device: torch.device | str) -> SplitlabPricing:
    """The host's share of splitlab's scheduler on the device for workload ``w``'s shape and batch (its lengths are
    not read) on ``dev`` under ``constants`` (``planners.splitlab.constants_for``'s): ``schedulers.splitlab_terms``,
    the uniform split counts ``planners.splitlab.split_candidates`` can weigh at any split limit (the device keeps
    those below the batch's limit, and the limit), the balanced budgets; ``max_items`` sizes the durations buffer
    (the plan's item capacity: a candidate past it is never priced)."""
    from splitlab.planners import splitlab as rule

    c = constants
    terms = S.splitlab_terms(w, dev, c)
    min_keys = rule.MIN_KEYS_PER_SPLIT[w.kind]
    # The split counts weighed at the largest limit: split_candidates at one past it (the limit itself is weighed
    # as its own candidate, since below it only the powers of two and wave-filling counts are).
    long = (c.max_splits + 1) * min_keys
    w_long = replace(w, ctx_len=long, seq_lens=(long,) * w.batch)
    fixed = [n for n in rule.split_candidates(w_long, c.max_splits + 1, dev.sm_count) if n <= c.max_splits]
    cands = [(0, n) for n in fixed] + [(1, 0)] + [(2, b) for b in terms.budgets]
    k = len(cands)
    inv_cap = 1 / terms.cap if terms.cap > 0 else float("inf")
    consts = [terms.rate, S.item_fixed(c), inv_cap, terms.cap, c.partial * terms.p, c.combine, c.combine_per_split,
              terms.p]
    closed_ctas = rule.SCHEDULE_WAVES * terms.slots
    if closed_ctas * terms.h >= 1 << 31:  # the list schedule's CTA numbers, divided by h without a division
        raise SplitlabError(f"splitlab_pricing: {closed_ctas} CTAs of {terms.h} head groups to schedule; expected "
                            f"fewer than 2^31 / {terms.h}")
    f64 = dict(dtype=torch.float64, device=device)
    return SplitlabPricing(
        batch=w.batch, cands=torch.tensor(cands, dtype=torch.int32, device=device),
        consts=torch.tensor(consts, **f64), durations=torch.empty(k * max_items, **f64),
        res_f=torch.empty(k, **f64), res_i=torch.empty(k * 6, dtype=torch.int32, device=device),
        arrived=torch.zeros(1, dtype=torch.int32, device=device), max_items=max_items, max_splits=c.max_splits,
        min_keys=min_keys, h=terms.h, slots=terms.slots, sm_count=terms.sm_count, closed_ctas=closed_ctas,
        split_major=not terms.request_major)


@dataclass(frozen=True)
class ScheduleLaunch:
    """``schedule_on_device``'s launches for one batch size and one set of buffers, checked once
    (``prepare_schedule``): ``launch(seq_lens)`` runs them for lengths of that batch on that device (a plan's
    ``plan_on_device`` checks those; nothing else is checked again)."""

    batch: int
    device: torch.device
    launches: tuple  # (kernel, grid, the arguments after seq_lens, meta), in launch order

    def launch(self, seq_lens: torch.Tensor, *, bound: bool = False) -> None:
        """Launch the schedule for ``seq_lens`` (``[batch]`` int32, contiguous, on ``device``); ``bound``: through
        ``kernels.bound_launch`` (Triton's binding once per specialization)."""
        with device_guard(self.device):
            if bound:
                for b, (_, grid, rest, _) in zip(self._bound, self.launches, strict=True):
                    b.launch(grid, seq_lens, *rest)
            else:
                for kernel, grid, rest, meta in self.launches:
                    kernel[grid](seq_lens, *rest, **meta)

    @functools.cached_property
    def _bound(self) -> tuple:
        """The launches' ``BoundLaunch`` objects (shared through ``_BOUND`` by every plan of the same meta), looked up
        once."""
        return tuple(bound_for(kernel, _BOUND, meta) for kernel, _, _, meta in self.launches)


def schedule_on_device(seq_lens: torch.Tensor, items: torch.Tensor, cta_offsets: torch.Tensor,
                       partial_offsets: torch.Tensor, num_ctas: torch.Tensor, status: torch.Tensor, *,
                       bound: bool = False, **knobs) -> None:
    """``prepare_schedule(seq_lens, ...)``'s launches, launched: the schedule of ``seq_lens`` written into the
    buffers (``prepare_schedule`` says what each argument is; ``bound`` as ``ScheduleLaunch.launch``)."""
    prepare_schedule(seq_lens, items, cta_offsets, partial_offsets, num_ctas, status, **knobs).launch(
        seq_lens, bound=bound)


def prepare_schedule(seq_lens: torch.Tensor, items: torch.Tensor, cta_offsets: torch.Tensor,
                     partial_offsets: torch.Tensor, num_ctas: torch.Tensor, status: torch.Tensor, *,
                     scheduler: str, budget: int | None = None, num_splits: int | None = None,
                     ctas: int | None = None,
                     request_major: bool = False, tile: int = TILE_KEYS, max_partial_rows: int | None = None,
                     scratch: torch.Tensor | None = None, max_batch: int | None = None,
                     pricing: SplitlabPricing | None = None, memo: torch.Tensor | None = None,
                     reuse: bool = False) -> ScheduleLaunch:
    """The schedule kernel's launches (the module docstring), checked: ``seq_lens [B]`` int32 on the device (padded
    slots 0) into ``items [cap, 4]``, ``cta_offsets [>= 1]`` (its length - 1 is the CTA slots' capacity),
    ``partial_offsets [>= B + 1]``, ``num_ctas`` and ``status`` (int32, one element each), all int32 on
    ``seq_lens``' device.
    ``scheduler`` ``balanced`` (``budget``), ``uniform`` (``num_splits``, ``request_major``), ``stream_k``
    (``ctas``), ``flashmla`` (``ctas``: its ``num_sm_parts``) or ``splitlab`` (``pricing``: ``splitlab_pricing``'s
    for this batch size, its durations sized for these items); ``max_partial_rows`` (default: the items' capacity)
    the partial buffer's rows; items and CTA slots of at least B each (else refused); ``scratch`` int32 of at least
    2 x B entries (allocated here if not given: pass it inside a graph capture); ``max_batch`` sizes the program's
    block (default B: a plan passes its capacity, so one compiled kernel serves every batch). Checks only host-visible
    metadata (no host sync); the launches are capturable. ``seq_lens`` is not kept: ``ScheduleLaunch.launch`` takes
    the lengths to schedule.

    ``memo`` (int32, at least B + 1 entries, zeroed before its first use; a plan's) notes the lengths of the schedule
    the buffers hold: with ``reuse=True`` the kernels compare the lengths with it first and, where they are equal
    (the same batch size and every length), leave the buffers as they are (each kernel one load and a compare: for
    a caller that plans before each layer of a step with the same lengths); without it they forget it (a schedule
    they write is not noted). Whatever else writes the buffers must zero ``memo[0]`` (a plan's host ``plan()``
    does)."""
    what = "schedule_on_device"
    if scheduler not in DEVICE_SCHEDULERS:
        raise bad("scheduler", scheduler, "one of " + ", ".join(DEVICE_SCHEDULERS) + " (on the device)")
    if not isinstance(seq_lens, torch.Tensor) or seq_lens.dim() != 1 or seq_lens.dtype != torch.int32 \
            or seq_lens.numel() < 1 or not seq_lens.is_contiguous():
        got = getattr(seq_lens, "shape", type(seq_lens).__name__)
        if isinstance(seq_lens, torch.Tensor):
            got = f"{seq_lens.dtype} {list(got)}, stride {seq_lens.stride()}"
        raise SplitlabError(f"{what}: seq_lens must be a non-empty contiguous 1-D int32 tensor (the kernels read it "
                            f"densely); got {got}")
    B = seq_lens.shape[0]
    dev = seq_lens.device
    for name, t in (("items", items), ("cta_offsets", cta_offsets), ("partial_offsets", partial_offsets),
                    ("num_ctas", num_ctas), ("status", status)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.device != dev or not t.is_contiguous():
            raise SplitlabError(f"{what}: {name} must be a contiguous int32 tensor on {dev}")
    if items.dim() != 2 or items.shape[1] != 4:
        raise SplitlabError(f"{what}: items has shape {tuple(items.shape)}; expected [capacity, 4]")
    if partial_offsets.numel() < B + 1:
        raise SplitlabError(f"{what}: partial_offsets holds {partial_offsets.numel()}; expected at least B + 1 = "
                            f"{B + 1}")
    split_major = False
    if scheduler == "balanced":
        param = check_int("budget", budget)
        mode = _BALANCED
    elif scheduler in ("stream_k", "flashmla"):
        param = check_int("ctas", ctas)
        mode = _STREAM_K if scheduler == "stream_k" else _FLASHMLA
    elif scheduler == "splitlab":
        if not isinstance(pricing, SplitlabPricing):
            raise bad("pricing", pricing, "splitlab_pricing(...)'s for scheduler splitlab")
        if pricing.batch != B or pricing.cands.device != dev or pricing.max_items < items.shape[0]:
            raise SplitlabError(f"{what}: pricing is for {pricing.batch} requests, {pricing.max_items} items on "
                                f"{pricing.cands.device}; expected {B} requests, at least {items.shape[0]} items on "
                                f"{dev}")
        param, mode, split_major = 1, _SPLITLAB, pricing.split_major
    else:
        param = check_int("num_splits", num_splits)
        mode = _UNIFORM_RM if request_major else _UNIFORM_SM
    tile = check_int("tile", tile)
    cap_items = items.shape[0]
    cap_rows = cap_items if max_partial_rows is None else check_int("max_partial_rows", max_partial_rows, minimum=0)
    max_batch = B if max_batch is None else check_int("max_batch", max_batch)
    if B > max_batch:
        raise SplitlabError(f"{what}: a batch of {B} requests is past max_batch={max_batch}")
    if cap_items < B or cta_offsets.numel() - 1 < B:
        raise SplitlabError(f"{what}: capacities of {cap_items} items and {cta_offsets.numel() - 1} CTA slots for "
                            f"{B} requests; expected both at least the batch (a request is one item at least)")
    if not isinstance(reuse, bool):
        raise bad("reuse", reuse, "True or False")
    if memo is None:
        if reuse:
            raise SplitlabError(f"{what}: reuse=True without a memo; expected memo (int32, at least B + 1 entries)")
        memo_mode = _MEMO_NONE
    elif not isinstance(memo, torch.Tensor) or memo.dtype != torch.int32 or memo.device != dev \
            or not memo.is_contiguous() or memo.numel() < B + 1:
        raise SplitlabError(f"{what}: memo must be a contiguous int32 tensor on {dev} with at least B + 1 = {B + 1} "
                            "entries")
    else:
        memo_mode = _MEMO_REUSE if reuse else _MEMO_FORGET
    if scratch is None:
        scratch = torch.empty(2 * B, dtype=torch.int32, device=dev)
    elif scratch.dtype != torch.int32 or scratch.device != dev or scratch.numel() < 2 * B:
        raise SplitlabError(f"{what}: scratch must be int32 on {dev} with at least 2 x {B} entries")
    block_b = max(16, next_power_of_two(max_batch))
    warps = 4 if block_b <= 256 else 8
    cap_ctas = cta_offsets.numel() - 1
    memo_t = scratch if memo is None else memo  # (unread without a memo)
    if mode == _FLASHMLA:
        return ScheduleLaunch(B, dev, ((_flashmla_kernel, (1,), (
            items, cta_offsets, partial_offsets, num_ctas, status, scratch, memo_t,
            B, param, S.FLASHMLA_BLOCK_N, S.FLASHMLA_OVERHEAD, cap_items, cap_ctas, cap_rows),
            dict(BLOCK_B=block_b, BLOCK_I=BLOCK_I, MEMO=memo_mode, num_warps=warps)),))
    launches = []
    res_f = res_i = scratch  # (unread but by splitlab's)
    n_cands = 1 if mode != _SPLITLAB else pricing.cands.shape[0]
    block_c = max(16, next_power_of_two(n_cands))  # the winner's candidates, loaded at once
    if mode == _SPLITLAB:
        p = pricing
        res_f, res_i = p.res_f, p.res_i
        # the pricing's meta-parameters, one launch or two (the same prices either way)
        price = dict(SPLIT_MAJOR=p.split_major, BLOCK_B=block_b, BLOCK_J=max(1, PRICE_TILE // block_b),
                     BLOCK_S=max(32, next_power_of_two(p.slots)), MEMO=memo_mode, num_warps=PRICE_WARPS,
                     enable_fp_fusion=False)
        if FUSED_PRICING:
            return ScheduleLaunch(B, dev, ((_splitlab_plan_kernel, (n_cands,), (
                p.cands, p.consts, p.durations, p.res_f, p.res_i, p.arrived,
                items, cta_offsets, partial_offsets, num_ctas, status, scratch, memo_t,
                B, p.max_splits, p.min_keys, p.h, p.slots, p.sm_count, cap_items, cap_ctas, cap_rows, tile,
                p.closed_ctas, n_cands),
                dict(price, BLOCK_I=BLOCK_I, LOG_B=block_b.bit_length(), BLOCK_C=block_c)),))
        launches.append((_splitlab_price_kernel, (n_cands,), (
            p.cands, p.consts, p.durations, p.res_f, p.res_i, memo_t,
            B, p.max_splits, p.min_keys, p.h, p.slots, p.sm_count, cap_items, cap_ctas, tile, p.closed_ctas), price))
    launches.append((_device_schedule_kernel, (1,), (
        items, cta_offsets, partial_offsets, num_ctas, status, scratch, res_f, res_i, memo_t,
        B, param, tile, cap_items, cap_ctas, cap_rows, n_cands),
        dict(MODE=mode, SPLIT_MAJOR=split_major, BLOCK_B=block_b, BLOCK_I=BLOCK_I, LOG_B=block_b.bit_length(),
             MEMO=memo_mode, BLOCK_C=block_c, num_warps=warps)))
    return ScheduleLaunch(B, dev, tuple(launches))


#: The schedule kernels' ``BoundLaunch`` per kernel and meta-parameters (``bound_launch.bound_for``).
_BOUND: dict = {}

