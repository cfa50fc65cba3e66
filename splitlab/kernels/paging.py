"""The paged-cache addressing shared by the GQA and MLA kernels (``@triton.jit`` helpers), and the key masks of
every kernel (sparse MLA's too).

The kernels read a tile's block-table entries one iteration ahead and carry them in the loop state, so
that no K/V address depends on a load of the same iteration. Triton's software pipeliner also handles the
in-iteration chain (it schedules the table load a stage earlier), so this changes which schedule it builds,
not whether the loop is pipelined (sm_90a, triton 3.6: asynchronous copies either way). On the H200 the MLA
kernel's version with it, together with ``mla.isolate_qk``, was the faster one (BENCHMARKS.md, "Kernel
versions"); GQA's kernel was written this way from the start, and its MQA-128 tile loading the table in the
iteration instead ran 1.5x slower on the H200 (64K keys, 2 splits: 1032 against 685 us).
"""

from __future__ import annotations

import triton
import triton.language as tl

#: Block-table entries ``scan_pages`` reads per chunk (one to eight a thread): 1024 cover a split of 16K keys at
#: 16-key pages in one load.
SCAN_PAGES = tl.constexpr(1024)


@triton.jit
def tile_pages(bt_row, bt_stride_p, tile_start, end, offs_n, num_pages, PAGE_SIZE: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """``(pages, raw)`` of the keys ``tile_start + offs_n``: their physical pages (int64), a scalar when a tile
    never crosses a page (tiles start on multiples of BLOCK_N), else one entry per key; 0 where the tile is past
    ``end``. An entry outside ``[0, num_pages)`` (unvalidated input) is clamped into the cache by one unsigned
    minimum (a negative entry reads as >= 2^31), so no read leaves it; ``raw`` is the entries as uint32 (scalar or
    per key, like the pages). The request is made NaN (``poison``) by one of two detections, each the faster on its
    kernel on the H200: MLA folds ``raw`` into a running unsigned maximum over its tiles (one instruction a tile:
    its pages are scalars) and tests it after the loop (``any_bad``); GQA, whose pages are per key, reads its
    split's entries once before the loop instead (``scan_pages``) and leaves ``raw`` unused. Not a load mask: a mask
    that depends on a loaded value must be held for every tile in flight (+57 registers on the MQA-128 tile,
    sm_90a, triton 3.6)."""
    if PAGE_SIZE % BLOCK_N == 0:
        # One table read per tile: 4 bytes.
        page = tl.load(bt_row + (tile_start // PAGE_SIZE) * bt_stride_p, mask=tile_start < end, other=0)
    else:
        # BLOCK_N * 4 bytes of table per tile (BLOCK_N / PAGE_SIZE distinct entries; the repeats hit L1).
        pos = tile_start + offs_n
        page = tl.load(bt_row + (pos // PAGE_SIZE) * bt_stride_p, mask=pos < end, other=0)
    raw = page.to(tl.uint32, bitcast=True)
    # An empty cache (num_pages = 0, MLA) clamps nothing, and has no live key to read (checked_len).
    page = tl.minimum(raw, tl.cast(num_pages - 1, tl.uint32))
    return page.to(tl.int64), raw


@triton.jit
def scan_pages(bt_row, bt_stride_p, start, end, PAGE_SIZE: tl.constexpr):
    """The block-table entries of the keys ``[start, end)`` (exactly the entries the split's tiles read), as a
    running unsigned maximum in ``SCAN_PAGES`` lanes (0 where nothing was read), for ``any_bad``. Read before the
    loop and reduced after it, so the loads' latency hides behind the loop: one load per ``SCAN_PAGES`` entries, and
    nothing in the loop (on the H200 a per-tile flag of GQA's per-key pages cost more: MQA-128, 64K keys, 2 splits,
    822-848 us against 728 us with this scan and 685 us with no detection at all)."""
    offs = tl.arange(0, SCAN_PAGES)
    lo = start // PAGE_SIZE
    hi = tl.cdiv(end, PAGE_SIZE)
    seen = tl.zeros([SCAN_PAGES], tl.uint32)
    for c in range(lo, hi, SCAN_PAGES):
        idx = c + offs
        entry = tl.load(bt_row + idx * bt_stride_p, mask=idx < hi, other=0)
        seen = tl.maximum(seen, entry.to(tl.uint32, bitcast=True))
    return seen


@triton.jit
def any_bad(seen, num_pages, PER_KEY: tl.constexpr):
    """Whether a table entry a request read was outside ``[0, num_pages)``, once per program: ``seen`` is a running
    unsigned maximum of the entries read (``tile_pages``'s ``raw``, a scalar or per key, or ``scan_pages``'s lanes;
    ``PER_KEY``: a vector to reduce first), 0 where nothing was read. Never with an empty cache, whose live lengths
    ``checked_len`` flags already (and whose 0s would read as out of range)."""
    if PER_KEY:
        top = tl.max(seen, axis=0)
    else:
        top = seen
    return (top >= tl.cast(num_pages, tl.uint32)) & (num_pages > 0)


@triton.jit
def num_tiles(start, end, BLOCK_N: tl.constexpr):
    """How many BLOCK_N tiles a split's loop runs over its keys ``[start, end)``: at least one, a masked tile that
    reads nothing when the split is empty, so the loop has no zero-trip path. Measured on the H200 (sm_90a, triton
    3.6): with a value carried out of the loop (a page flag), the zero-trip path's accumulator initialisation lands
    between the loop's last wgmma and the wait after it, and ptxas serialises every wgmma of the loop (C7515,
    MQA-128's tile); and the counted loop, with the guards, ran the MLA-16 tile as fast as before them (2768 against
    2756 us at 64K keys, unsplit) where ``range(start, end, BLOCK_N)`` ran it 1.13x slower."""
    return tl.maximum(tl.cdiv(end - start, BLOCK_N), 1)


@triton.jit
def checked_len(seq_len, max_keys):
    """``(seq_len, bad)``: a request's length, 0 (nothing read) when outside ``[0, max_keys]`` (``max_keys`` =
    the block table's columns x PAGE_SIZE; 0 for an empty cache), with ``bad`` set; the kernel then stores NaN for
    the request (``poison``). Once per program: no key past the table's last column is ever read, validated or
    not."""
    bad = (seq_len < 0) | (seq_len > max_keys)
    return tl.where(bad, 0, seq_len), bad


@triton.jit
def key_masks(live, in_range):
    """``(valid, fill)`` of a tile's keys: ``valid`` = a key of the request (``live``) whose slot is in the pool
    (``in_range``): its row is read and its score kept; ``fill`` = the score of a key that is not valid: -inf
    where there is no key, NaN for a live key out of range (unvalidated input): its row is never read and the
    output becomes NaN instead of a finite wrong number. (Sparse MLA, whose load mask depends on the index
    anyway.)"""
    return live & in_range, tl.where(live, float("nan"), float("-inf"))


@triton.jit
def poison(l_i, bad):
    """The running softmax sum, NaN where ``bad`` (a length or a page out of range): the epilogue then stores NaN
    (out and lse), which the combine propagates."""
    return tl.where(bad, float("nan"), l_i)
