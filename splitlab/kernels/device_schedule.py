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

Partial rows for the requests of more than one item (``partial_offsets``: exclusive prefix sums of ``n_b`` where
``n_b > 1``, else 0). ``balanced`` and ``uniform`` run one item per CTA slot (``cta_offsets[i] = i``, the slot count =
the items); ``stream_k`` writes its slots' CSR offsets (each slot's last item ends its range) and ``C``.
Request-major items find their request by a binary search over the requests' item ends (written to ``scratch``, an
int32 buffer of at least ``2 x batch`` entries, stream-K's first tile of each request beside them, behind a CTA
barrier), ``BLOCK_I`` items at a time; split-major items are written a split at a time (``num_splits`` rounds over the
requests).

Capacity. ``balanced`` deals at most ``max(budget, batch)`` items, ``uniform`` ``batch x num_splits``, ``stream_k``
``ctas`` slots and ``ctas + batch`` items: a plan's default capacities (``decode_plan.capacity_bound``) hold them, so
the default never overflows. Where a smaller capacity is given and a schedule would pass it (items past the ``items``
rows, slots past the CTA slots, partial rows past ``max_partial_rows``), the kernel writes instead one *bad* item per
request (keys ``[1, 0)``: ``worklist.load_item`` makes its request NaN, never reading a key) and no partial rows, and
sets ``status`` (an int32 on the device) to 1: every row of the run is NaN, nothing is written out of bounds, and
nothing is read back to the host. A negative length makes its request's item bad too (status bit 2); the host plan
refuses both in one line instead. ``status`` is 0 after a good schedule. Lengths are int32 (a request's tile count times
the batch must fit int32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from splitlab.errors import SplitlabError, bad, check_int
from splitlab.intmath import next_power_of_two
from splitlab.planners.schedulers import TILE_KEYS

__all__ = ["schedule_on_device", "DEVICE_SCHEDULERS", "OVER_CAPACITY", "NEGATIVE_LENGTH"]

#: The schedulers computed on the device.
DEVICE_SCHEDULERS = ("balanced", "uniform", "stream_k")
#: ``status`` bits.
OVER_CAPACITY, NEGATIVE_LENGTH = 1, 2
#: Items written a round (request-major: each binary-searches its request).
BLOCK_I = 256

_BALANCED, _UNIFORM_RM, _UNIFORM_SM, _STREAM_K = 0, 1, 2, 3


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
def _device_schedule_kernel(
    seq_lens_ptr, items_ptr, cta_ptr, po_ptr, num_ctas_ptr, status_ptr, scratch_ptr,
    batch, param, tile, cap_items, cap_ctas, cap_rows,
    MODE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_I: tl.constexpr, LOG_B: tl.constexpr,
):
    # One program. param: balanced's budget, uniform's split count, or stream-K's CTAs.
    offs = tl.arange(0, BLOCK_B)
    valid = offs < batch
    raw = tl.load(seq_lens_ptr + offs, mask=valid, other=0).to(tl.int32)
    neg = valid & (raw < 0)
    lens = tl.maximum(raw, 0)
    t1 = tl.maximum((lens + tile - 1) // tile, 1)
    if MODE == 0:  # balanced: schedulers.smallest_chunk's binary search, low 1, high max(t, 1)
        c_hi = tl.max(tl.where(valid, t1, 1), axis=0)
        c_lo = c_hi * 0 + 1
        while c_lo < c_hi:  # about log2(longest tiles) rounds, each one reduction over the batch
            c_mid = (c_lo + c_hi) // 2
            count = tl.sum(tl.where(valid, (t1 + c_mid - 1) // c_mid, 0), axis=0)
            fits = count <= param
            c_lo = tl.where(fits, c_lo, c_mid + 1)
            c_hi = tl.where(fits, c_mid, c_hi)
        chunk_keys = c_lo * tile
        step = tl.zeros([BLOCK_B], tl.int32) + chunk_keys
        n = (t1 + c_lo - 1) // c_lo
    elif MODE == 3:  # stream-K: the batch's tiles end to end, cut into C spans; a request's items: the spans it crosses
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
    else:  # uniform: cdiv(cdiv(L, S), tile) * tile keys a chunk; the chunks that start before L (one if L == 0)
        chunk_keys = 0
        step = ((lens + param - 1) // param + tile - 1) // tile * tile
        n = tl.where(lens > 0, (lens + tl.maximum(step, 1) - 1) // tl.maximum(step, 1), 1)
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

    if MODE == 2:  # split-major: split s of every request that has it, then split s + 1
        base = total * 0
        for s in range(0, tl.where(over, 1, param)):
            has = n > s
            h = has.to(tl.int32)
            pos = base + tl.cumsum(h, axis=0) - h
            begin = s * step
            end = tl.minimum(begin + step, lens)
            _store_item(items_ptr, pos, offs, begin, end, tl.where(n > 1, pofs + s, -1), bad_req, has)
            base += tl.sum(h, axis=0)
    else:  # request-major: item i belongs to the request whose item range holds it (binary search of the ends)
        tl.store(scratch_ptr + offs, tl.cumsum(n, axis=0), mask=valid)
        if MODE == 3:
            tl.store(scratch_ptr + batch + offs, tpos, mask=valid)
        tl.debug_barrier()
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
                if MODE == 0:
                    step_r = chunk_keys  # one chunk for all
                else:
                    step_r = ((len_r + param - 1) // param + tile - 1) // tile * tile
                begin = k * step_r
                end = tl.minimum(begin + step_r, len_r)
            po_r = tl.load(po_ptr + r, mask=live, other=0)
            row = tl.where(n_r > 1, po_r + k, -1)
            _store_item(items_ptr, i, r, begin, end, row, over | (raw_r < 0), live)


def schedule_on_device(seq_lens: torch.Tensor, items: torch.Tensor, cta_offsets: torch.Tensor,
                       partial_offsets: torch.Tensor, num_ctas: torch.Tensor, status: torch.Tensor, *,
                       scheduler: str, budget: int | None = None, num_splits: int | None = None,
                       ctas: int | None = None,
                       request_major: bool = False, tile: int = TILE_KEYS, max_partial_rows: int | None = None,
                       scratch: torch.Tensor | None = None, max_batch: int | None = None) -> None:
    """Launch the schedule kernel (the module docstring): ``seq_lens [B]`` int32 on the device (padded slots 0) into
    ``items [cap, 4]``, ``cta_offsets [>= 1]`` (its length - 1 is the CTA slots' capacity), ``partial_offsets
    [>= B + 1]``, ``num_ctas`` and ``status`` (int32, one element each), all int32 on ``seq_lens``' device.
    ``scheduler`` ``balanced`` (``budget``), ``uniform`` (``num_splits``, ``request_major``) or ``stream_k``
    (``ctas``); ``max_partial_rows`` (default: the items' capacity) the partial buffer's rows; items and CTA slots of
    at least B each (else refused); ``scratch`` int32 of at least 2 x B entries (allocated here
    if not given: pass it inside a graph capture); ``max_batch`` sizes the program's block (default B: a plan passes
    its capacity, so one compiled kernel serves every batch). Checks only host-visible metadata (no host sync);
    capturable."""
    what = "schedule_on_device"
    if scheduler not in DEVICE_SCHEDULERS:
        raise bad("scheduler", scheduler, "one of " + ", ".join(DEVICE_SCHEDULERS) + " (on the device)")
    if not isinstance(seq_lens, torch.Tensor) or seq_lens.dim() != 1 or seq_lens.dtype != torch.int32 \
            or seq_lens.numel() < 1:
        raise SplitlabError(f"{what}: seq_lens must be a non-empty 1-D int32 tensor; got "
                            f"{getattr(seq_lens, 'shape', type(seq_lens).__name__)}")
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
    if scheduler == "balanced":
        param = check_int("budget", budget)
        mode = _BALANCED
    elif scheduler == "stream_k":
        param = check_int("ctas", ctas)
        mode = _STREAM_K
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
    if scratch is None:
        scratch = torch.empty(2 * B, dtype=torch.int32, device=dev)
    elif scratch.dtype != torch.int32 or scratch.device != dev or scratch.numel() < 2 * B:
        raise SplitlabError(f"{what}: scratch must be int32 on {dev} with at least 2 x {B} entries")
    block_b = max(16, next_power_of_two(max_batch))
    guard = torch.cuda.device(dev) if dev.type == "cuda" else _null()
    with guard:
        _device_schedule_kernel[(1,)](
            seq_lens, items, cta_offsets, partial_offsets, num_ctas, status, scratch,
            B, param, tile, cap_items, cta_offsets.numel() - 1, cap_rows,
            MODE=mode, BLOCK_B=block_b, BLOCK_I=BLOCK_I, LOG_B=block_b.bit_length(),
            num_warps=4 if block_b <= 256 else 8)


def _null():
    import contextlib

    return contextlib.nullcontext()
