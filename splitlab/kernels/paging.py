"""The paged-cache addressing shared by the GQA and MLA kernels (a ``@triton.jit`` helper).

Why a tile's pages are loaded one iteration ahead: Triton's software pipeliner turns a loop's K/V loads
into asynchronous copies (``num_stages`` deep) only when their addresses do not depend on another load
of the same iteration. A block-table read feeding the K/V address in the same iteration left the MLA
loop unpipelined (synchronous loads through registers, compiled for sm_90a with triton 3.6); carrying the
next tile's pages in the loop state lets every K/V load be issued stages ahead.
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
