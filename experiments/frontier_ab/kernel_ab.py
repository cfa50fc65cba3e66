"""Kernel A/B (README.md): the shipped GQA kernel against two experiments on the layout A/B's shapes (NHD pages 16
and 64), beside SDPA: ``python experiments/frontier_ab/kernel_ab.py OUT.jsonl {table,gluon64}`` on one GPU.

- ``table``: the shipped partial kernel with its block-table entries loaded in the iteration that uses them
  (``rebuilt``). Compiled for sm_90a (triton 3.6) the shipped loop carries no entries either: the pipeliner loads
  tile t + 2's entries and issues its K/V copies right after them, in iteration t. ``a0`` (entries in the
  iteration) puts the table load a stage ahead of the copies; ``a1`` is the shipped loop through the same
  launcher; ``bn128w8``: BLOCK_N 128 at 8 warps.
- ``gluon64``: ``gqa_wide_gluon.py``'s tile at 64 rows (one warpgroup; 4 warps), 3, 4 and 6 cp.async buffers."""

import functools
import importlib.util
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
from layout_ab import HEADS, SHAPES, bench_paged, bench_sdpa, shape_setup

import splitlab.kernels.gqa as shipped
from splitlab.kernels.combine import launch_combine
from splitlab.kernels.gqa import gqa_decode


def rebuilt() -> types.ModuleType:
    """The experiment's kernel module, built from ``splitlab.kernels.gqa``'s source (kernel version 6) as it ran:
    two constexprs, AHEAD (1: the entries carried from the iteration before, as shipped; 0: loaded in the iteration)
    and PER_PAGE (unused: 0), the entries and row offsets through two small helpers, and a bare launcher
    (``decode``) that takes them. Compiled for sm_90a, AHEAD 0 keeps one K/V tile in flight at 3 stages (39 KiB of
    shared memory) and two at 5 (72 KiB); AHEAD 1 compiles as the shipped kernel (72 KiB at 3)."""
    src = open(shipped.__file__).read()
    k = src[src.index("@triton.jit\ndef _gqa_partial_kernel("):src.index("# --- defaults")]
    edits = [
        ('    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 operands, None (the backend default) for 16-bit\n):',
         "    DOT_PRECISION: tl.constexpr,\n    AHEAD: tl.constexpr,\n    PER_PAGE: tl.constexpr,\n):"),
        ("    page_next, _ = tile_pages(bt_row, bt_stride_p, start, end, offs_n, num_pages, PAGE_SIZE, BLOCK_N)\n",
         "    page_next = _pages(bt_row, bt_stride_p, start, end, offs_n, num_pages, PAGE_SIZE, BLOCK_N, PER_PAGE)\n"),
        ("        page = page_next\n"
         "        page_next, _ = tile_pages(bt_row, bt_stride_p, start_n + BLOCK_N, end, offs_n, num_pages, PAGE_SIZE, "
         "BLOCK_N)\n"
         "        # Paged gather: token pos lives in page block_table[b, pos // PAGE_SIZE], slot pos % PAGE_SIZE.\n"
         "        slot = pos % PAGE_SIZE\n"
         "        k_rows = page * k_stride_p + slot * k_stride_s\n"
         "        v_rows = page * v_stride_p + slot * v_stride_s\n",
         "        if AHEAD == 0:\n"
         "            page = _pages(bt_row, bt_stride_p, start_n, end, offs_n, num_pages, PAGE_SIZE, BLOCK_N, "
         "PER_PAGE)\n"
         "        else:\n"
         "            page = page_next\n"
         "            page_next = _pages(bt_row, bt_stride_p, start_n + BLOCK_N, end, offs_n, num_pages, PAGE_SIZE, "
         "BLOCK_N, PER_PAGE)\n"
         "        k_rows = _rows(page, pos, k_stride_p, k_stride_s, PAGE_SIZE)\n"
         "        v_rows = _rows(page, pos, v_stride_p, v_stride_s, PAGE_SIZE)\n"),
    ]
    for old, new in edits:
        if old not in k:
            raise SystemExit("the shipped kernel changed: these edits are for kernel version 6")
        k = k.replace(old, new)
    path = Path(tempfile.mkdtemp()) / "gqa_table_variant.py"  # triton reads a jit function's source from its file
    path.write_text(HELPERS + k)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.decode = functools.partial(_decode, mod._gqa_partial_kernel)
    return mod


HELPERS = """
import triton
import triton.language as tl
from splitlab.kernels.gqa import LN2, FLT_MAX
from splitlab.kernels.paging import any_bad, checked_len, num_tiles, poison, scan_pages, tile_pages


@triton.jit
def _pages(bt_row, bt_stride_p, tile_start, end, offs_n, num_pages, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
           PER_PAGE: tl.constexpr):
    page, _ = tile_pages(bt_row, bt_stride_p, tile_start, end, offs_n, num_pages, PAGE_SIZE, BLOCK_N)
    return page


@triton.jit
def _rows(page, pos, stride_p, stride_s, PAGE_SIZE: tl.constexpr):
    return page * stride_p + (pos % PAGE_SIZE) * stride_s

"""


def _decode(kernel, q, k_cache, v_cache, block_table, seq_lens, *, num_splits, block_n=None, num_warps=None,
            num_stages=None, ahead=1):
    """The shipped launcher's launch of ``kernel`` (no checks, no planner) with AHEAD = ``ahead``."""
    B, Hq, D = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    d = shipped.default_knobs(Hq // Hkv, D)
    S = num_splits
    lse = torch.empty(B, Hq, dtype=torch.float32, device=q.device)
    if S == 1:
        out = dst = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)
        dst_lse, dst_strides, lse_strides = lse, (out.stride(0), out.stride(1), 0, out.stride(2)), (*lse.stride(), 0)
    else:
        dst = torch.empty(B, Hq, S, D, dtype=torch.float32, device=q.device)
        dst_lse = torch.empty(B, Hq, S, dtype=torch.float32, device=q.device)
        dst_strides, lse_strides = tuple(dst.stride()), tuple(dst_lse.stride())
    kernel[(B * Hkv, S)](
        q, k_cache, v_cache, block_table, seq_lens, dst, dst_lse, D ** -0.5 * shipped.LOG2E,
        Hkv, Hq // Hkv, S, seq_lens.stride(0), num_pages, block_table.shape[1] * page_size,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_table.stride(), *dst_strides, *lse_strides,
        PAGE_SIZE=page_size, HEAD_DIM=D, BLOCK_G=d["block_g"], BLOCK_N=block_n or d["block_n"], BLOCK_D=d["block_d"],
        UPCAST=False, DOT_PRECISION=None, AHEAD=ahead, PER_PAGE=False, num_warps=num_warps or d["num_warps"],
        num_stages=num_stages or d["num_stages"])
    if S > 1:
        out = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)
        launch_combine(dst, dst_lse, out, lse)
    return out


def variants(part: str):
    yield "shipped", gqa_decode, {}
    if part == "table":
        v = rebuilt().decode
        yield "a1s3", v, dict(ahead=1, num_stages=3)
        yield "a0s3", v, dict(ahead=0, num_stages=3)
        yield "a0s5", v, dict(ahead=0, num_stages=5)
        yield "a1bn128w8s3", v, dict(ahead=1, block_n=128, num_warps=8, num_stages=3)
        yield "a0bn128w8s5", v, dict(ahead=0, block_n=128, num_warps=8, num_stages=5)
    else:
        import gqa_wide_gluon as wide

        def gluon(q, k_cache, v_cache, block_table, seq_lens, *, num_splits, stages):
            return wide.gqa_wide(q, k_cache, v_cache, block_table, seq_lens, num_splits, stages=stages,
                                 block_g=64, num_warps=4)
        for stages in (3, 4, 6):
            yield f"gl64s{stages}", gluon, dict(stages=stages)


def main(path: str, part: str) -> None:
    t0 = time.time()
    impls = [(name, "nhd", fn, knobs) for name, fn, knobs in variants(part)]
    for hq, hkv in HEADS:
        for batch, n in SHAPES:
            planned, splits = shape_setup(batch, hq, hkv, n)
            for page in (16, 64):
                bench_paged(path, batch, hq, hkv, n, page, splits, planned, impls)
            bench_sdpa(path, batch, hq, hkv, n)
            print("elapsed", time.time() - t0, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
