"""The paged-cache addressing shared by the GQA and MLA kernels (``@triton.jit`` helpers), and the key masks of
every kernel (sparse MLA's too).

The kernels read a tile's block-table entries one iteration ahead and carry them in the loop state, so
that no K/V address depends on a load of the same iteration. Triton's software pipeliner also handles the
in-iteration chain (it schedules the table load a stage earlier), so this changes which schedule it builds,
not whether the loop is pipelined (sm_90a, triton 3.6: asynchronous copies either way). On the H200 the MLA
kernel's version with it, together with ``mla.isolate_qk``, was the faster one (BENCHMARKS.md, "Kernel
versions"); GQA's kernel was written this way from the start.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_pages(bt_row, bt_stride_p, tile_start, end, offs_n, num_pages, PAGE_SIZE: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """``(pages, bad)`` of the keys ``tile_start + offs_n``: their physical pages (int64), a scalar when a tile
    never crosses a page (tiles start on multiples of BLOCK_N), else one entry per key; 0 where the tile is past
    ``end``. An entry outside ``[0, num_pages)`` (unvalidated input) is clamped into the cache, so no read leaves
    it, and flagged in ``bad`` (scalar or per key, like the pages): the kernel accumulates the flags over its
    tiles (``any_bad``) and stores NaN for the request (``poison``). The flags, not a load mask, because a mask
    that depends on a loaded value must be held for every tile in flight: +57 registers on the MQA-128 tile
    (sm_90a, triton 3.6)."""
    if PAGE_SIZE % BLOCK_N == 0:
        # One table read per tile: 4 bytes.
        live = tile_start < end
        page = tl.load(bt_row + (tile_start // PAGE_SIZE) * bt_stride_p, mask=live, other=0)
    else:
        # BLOCK_N * 4 bytes of table per tile (BLOCK_N / PAGE_SIZE distinct entries; the repeats hit L1).
        pos = tile_start + offs_n
        live = pos < end
        page = tl.load(bt_row + (pos // PAGE_SIZE) * bt_stride_p, mask=live, other=0)
    bad = live & ((page < 0) | (page >= num_pages))
    page = tl.minimum(tl.maximum(page, 0), num_pages - 1)  # (num_pages >= 1 whenever a key is live: checked_len)
    return page.to(tl.int64), bad


@triton.jit
def any_bad(bad, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Whether any flag of ``tile_pages``'s accumulated ``bad`` (scalar or per key) is set; once per program."""
    if PAGE_SIZE % BLOCK_N == 0:
        res = bad
    else:
        res = tl.max(bad.to(tl.int32), axis=0) > 0
    return res


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
