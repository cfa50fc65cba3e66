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
* ``uniform`` at ``num_splits`` (``schedulers.uniform``), split-major or ``request_major``.

One item per CTA slot (``cta_offsets[i] = i``), partial rows for the requests of more than one item
(``partial_offsets``: exclusive prefix sums of ``n_b`` where ``n_b > 1``, else 0), the slot count = the items.
Request-major items find their request by a binary search over the requests' item ends (written to ``scratch``, an
int32 buffer of at least ``batch`` entries, behind a CTA barrier), ``BLOCK_I`` items at a time; split-major items are
written a split at a time (``num_splits`` rounds over the requests).

Capacity. ``balanced`` deals at most ``max(budget, batch)`` items and ``uniform`` ``batch x num_splits``: a plan's
default capacities (``decode_plan.capacity_bound``) hold them, so the default never overflows. Where a smaller
capacity is given and a schedule would pass it (items past the ``items`` rows or the CTA slots, partial rows past
``max_partial_rows``), the kernel writes instead one *bad* item per request (keys ``[1, 0)``: ``worklist.load_item``
makes its request NaN, never reading a key) and no partial rows, and sets ``status`` (an int32 on the device) to 1:
every row of the run is NaN, nothing is written out of bounds, and nothing is read back to the host. A negative
length makes its request's item bad too (status bit 2); the host plan refuses both in one line instead. ``status`` is
0 after a good schedule. Lengths are int32 (a request's tile count times the batch must fit int32).
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
DEVICE_SCHEDULERS = ("balanced", "uniform")
#: ``status`` bits.
OVER_CAPACITY, NEGATIVE_LENGTH = 1, 2
#: Items written a round (request-major: each binary-searches its request).
BLOCK_I = 256

_BALANCED, _UNIFORM_RM, _UNIFORM_SM = 0, 1, 2


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
def _device_schedule_kernel(
    seq_lens_ptr, items_ptr, cta_ptr, po_ptr, num_ctas_ptr, status_ptr, scratch_ptr,
    batch, param, tile, cap_items, cap_ctas, cap_rows,
    MODE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_I: tl.constexpr, LOG_B: tl.constexpr,
):
    # One program. param: balanced's budget, or uniform's split count.
    offs = tl.arange(0, BLOCK_B)
    valid = offs < batch
    raw = tl.load(seq_lens_ptr + offs, mask=valid, other=0).to(tl.int32)
    neg = valid & (raw < 0)
    lens = tl.maximum(raw, 0)
    t1 = tl.maximum((lens + tile - 1) // tile, 1)
    if MODE == 0:  # balanced: schedulers.smallest_chunk's binary search, low 1, high max(t, 1)
        c_hi = tl.max(tl.where(valid, t1, 1), axis=0)
        c_lo = c_hi * 0 + 1
        for _round in range(32):
            c_mid = (c_lo + c_hi) // 2
            count = tl.sum(tl.where(valid, (t1 + c_mid - 1) // c_mid, 0), axis=0)
            go = c_lo < c_hi
            c_lo = tl.where(go & (count > param), c_mid + 1, c_lo)
            c_hi = tl.where(go & (count <= param), c_mid, c_hi)
        chunk_keys = c_lo * tile
        step = tl.zeros([BLOCK_B], tl.int32) + chunk_keys
        n = (t1 + c_lo - 1) // c_lo
    else:  # uniform: cdiv(cdiv(L, S), tile) * tile keys a chunk; the chunks that start before L (one if L == 0)
        chunk_keys = 0
        step = ((lens + param - 1) // param + tile - 1) // tile * tile
        n = tl.where(lens > 0, (lens + tl.maximum(step, 1) - 1) // tl.maximum(step, 1), 1)
    n = tl.where(valid, n, 0)
    total = tl.sum(n, axis=0)
    rows = tl.where(n > 1, n, 0)
    total_rows = tl.sum(rows, axis=0)
    over = (total > cap_items) | (total > cap_ctas) | (total_rows > cap_rows)
    # Past the capacity: one bad item a request (NaN rows), no partial rows.
    n = tl.where(over, valid.to(tl.int32), n)
    rows = tl.where(over, 0, rows)
    total = tl.where(over, batch, total)
    total_rows = tl.where(over, 0, total_rows)
    bad_req = neg | over
    pofs = tl.cumsum(rows, axis=0) - rows

    tl.store(po_ptr + offs, pofs, mask=valid)
    tl.store(po_ptr + batch, total_rows)
    tl.store(num_ctas_ptr, total)
    tl.store(status_ptr, over.to(tl.int32) * 1 + (tl.max(neg.to(tl.int32), axis=0) > 0).to(tl.int32) * 2)
    offs_i = tl.arange(0, BLOCK_I)
    for c0 in range(0, cap_ctas + 1, BLOCK_I):
        ci = c0 + offs_i
        tl.store(cta_ptr + ci, ci, mask=ci <= cap_ctas)

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
                       request_major: bool = False, tile: int = TILE_KEYS, max_partial_rows: int | None = None,
                       scratch: torch.Tensor | None = None, max_batch: int | None = None) -> None:
    """Launch the schedule kernel (the module docstring): ``seq_lens [B]`` int32 on the device (padded slots 0) into
    ``items [cap, 4]``, ``cta_offsets [>= 1]`` (its length - 1 is the CTA slots' capacity), ``partial_offsets
    [>= B + 1]``, ``num_ctas`` and ``status`` (int32, one element each), all int32 on ``seq_lens``' device.
    ``scheduler`` ``balanced`` (``budget``) or ``uniform`` (``num_splits``, ``request_major``); ``max_partial_rows``
    (default: the items' capacity) the partial buffer's rows; ``scratch`` int32 of at least B entries (allocated here
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
    else:
        param = check_int("num_splits", num_splits)
        mode = _UNIFORM_RM if request_major else _UNIFORM_SM
    tile = check_int("tile", tile)
    cap_items = items.shape[0]
    cap_rows = cap_items if max_partial_rows is None else check_int("max_partial_rows", max_partial_rows, minimum=0)
    max_batch = B if max_batch is None else check_int("max_batch", max_batch)
    if B > max_batch:
        raise SplitlabError(f"{what}: a batch of {B} requests is past max_batch={max_batch}")
    if scratch is None:
        scratch = torch.empty(B, dtype=torch.int32, device=dev)
    elif scratch.dtype != torch.int32 or scratch.device != dev or scratch.numel() < B:
        raise SplitlabError(f"{what}: scratch must be int32 on {dev} with at least {B} entries")
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
