"""The paged-cache addressing shared by the GQA and MLA kernels (a ``@triton.jit`` helper).

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
def tile_pages(bt_row, bt_stride_p, tile_start, end, offs_n, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Physical pages (int64) of the keys ``tile_start + offs_n``: a scalar when a tile never crosses a page
    (tiles start on multiples of BLOCK_N), else one entry per key; 0 where the tile is past ``end``."""
    if PAGE_SIZE % BLOCK_N == 0:
        # One table read per tile: 4 bytes.
        page = tl.load(bt_row + (tile_start // PAGE_SIZE) * bt_stride_p, mask=tile_start < end, other=0)
    else:
        # BLOCK_N * 4 bytes of table per tile (BLOCK_N / PAGE_SIZE distinct entries; the repeats hit L1).
        pos = tile_start + offs_n
        page = tl.load(bt_row + (pos // PAGE_SIZE) * bt_stride_p, mask=pos < end, other=0)
    return page.to(tl.int64)
