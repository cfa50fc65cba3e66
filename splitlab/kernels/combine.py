"""The split-K merge shared by every decode kernel: partial outputs, each normalised by its own softmax
sum, merged by log-sum-exp.

    lse   = log(sum_s exp(lse_s))                       (-inf when every split is empty)
    out   = sum_s exp(lse_s - lse) * out_s

A split with no keys has ``lse_s = -inf`` and weight 0: it contributes nothing, its (possibly
uninitialised) partial row is never read into the sum, and -inf minus -inf never happens.

NaN is never dropped. A split whose lse is NaN (a NaN among its keys, or a key scoring +inf, makes the partial
kernels store one) makes the row's ``out`` and ``lse`` NaN, as the unsplit kernel and the fp64 reference give;
so does a +inf lse (no kernel stores one). A NaN in a live split's partial row reaches the same columns of
``out``. Only a split whose lse is exactly -inf is skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from splitlab.errors import SplitlabError
from splitlab.kernels import _launch
from splitlab.kernels._launch import (
    FLOAT_DTYPES,
    check_no_grad,
    check_out,
    check_spans,
    check_tensor,
    shares_memory,
)


@triton.jit
def _combine_kernel(
    po_ptr, plse_ptr, out_ptr, lse_ptr,
    num_heads, num_splits, head_dim_v,
    po_stride_r, po_stride_h, po_stride_s, po_stride_d,
    pl_stride_r, pl_stride_h, pl_stride_s,
    out_stride_r, out_stride_h, out_stride_d,
    lse_stride_r, lse_stride_h,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per (row, head, slice of BLOCK_D output columns).
    # Bytes: reads num_splits * 4 (lse) + num_splits * BLOCK_D * partial elt (4, or 2 for MLA's 16-bit partials);
    # writes BLOCK_D * out elt.
    pid = tl.program_id(0)
    row = pid // num_heads
    head = pid % num_heads
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim_v
    pl_base = plse_ptr + row.to(tl.int64) * pl_stride_r + head * pl_stride_h
    po_base = po_ptr + row.to(tl.int64) * po_stride_r + head * po_stride_h
    out, lse = merge_splits(po_base, pl_base, po_stride_s, po_stride_d, pl_stride_s, num_splits, offs_d, mask_d,
                            BLOCK_S, BLOCK_D)
    tl.store(out_ptr + row.to(tl.int64) * out_stride_r + head * out_stride_h + offs_d * out_stride_d,
             out.to(out_ptr.dtype.element_ty), mask=mask_d)
    if tl.program_id(1) == 0:
        tl.store(lse_ptr + row.to(tl.int64) * lse_stride_r + head * lse_stride_h, lse)


@triton.jit
def merge_splits(po_base, pl_base, po_stride_s, po_stride_d, pl_stride_s, num_splits, offs_d, mask_d,
                 BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """``(out, lse)`` of one (row, head) and the columns ``offs_d``: the merge of its ``num_splits`` partials, the
    split ``s`` at ``po_base + s * po_stride_s`` (its lse at ``pl_base + s * pl_stride_s``). Shared by
    ``_combine_kernel`` and the work-list merge (``kernels.worklist``), whose partials of a request are rows of a
    flat buffer."""
    # One pass, online over chunks of BLOCK_S splits (one chunk when S <= BLOCK_S). The lse and partial
    # loads of a chunk are issued together (one memory latency, not two); a split whose lse is -inf gets
    # weight 0 and its row, possibly uninitialised, is replaced by 0 before any arithmetic. A NaN lse is live:
    # it stays out of the running max (whose NaN handling differs between the GPU and the interpreter) and
    # its weight exp(NaN) = NaN makes the sum, and so out and lse, NaN.
    m = tl.full((), float("-inf"), tl.float32)  # running max of the lse seen so far
    acc = tl.zeros([BLOCK_D], tl.float32)
    wsum = tl.zeros((), tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        in_range = offs_s < num_splits
        lse_s = tl.load(pl_base + offs_s * pl_stride_s, mask=in_range, other=float("-inf"))
        po = tl.load(po_base + offs_s[:, None] * po_stride_s + offs_d[None, :] * po_stride_d,
                     mask=in_range[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        live = lse_s != float("-inf")
        m_new = tl.maximum(m, tl.max(tl.where(lse_s == lse_s, lse_s, float("-inf")), axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)  # 0 while nothing live has been seen (m = -inf)
        w = tl.where(live, tl.exp(lse_s - m_safe), 0.0)
        acc = acc * alpha + tl.sum(w[:, None] * tl.where(live[:, None], po, 0.0), axis=0)
        wsum = wsum * alpha + tl.sum(w, axis=0)
        m = m_new
    empty = wsum == 0.0
    out = tl.where(empty, 0.0, acc / tl.where(empty, 1.0, wsum))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    lse = tl.where(empty, float("-inf"), m_safe + tl.log(tl.where(empty, 1.0, wsum)))
    return out, lse


#: Fewest programs a combine launch aims at (132 SMs: about 31 each) before it widens BLOCK_D past 128 columns.
MIN_PROGRAMS = 4096


def combine_tile(rows: int, heads: int, splits: int, head_dim_v: int) -> tuple[int, int, int]:
    """``(BLOCK_S, BLOCK_D, num_warps)`` of a combine launch.

    The merge is a pure stream of partials, so what decides its speed is how many programs share the SMs
    and how much each one holds in registers. BLOCK_D is the widest of 512 / 256 / 128 columns that still gives
    ``MIN_PROGRAMS`` programs (rows x heads x Dv / BLOCK_D), else 128 (the head dim when narrower); BLOCK_S is up
    to 64 splits a chunk; the warps hold about 128 partials a thread (BLOCK_S x BLOCK_D / 4096, 1 to 8). Chosen
    on an H200 A/B (``data/archive/bench/h200-kernel-v5/combine_ab.csv``: graph replay, rotated partials, 10 shapes of
    MLA's 128 x 512 and GQA's 32 x 128 rows, up to 36 (BLOCK_D, BLOCK_S, warps) tiles each): within 1.02x of the best
    tile at every shape (it was chosen on them; the benchmark's decodes are its out-of-sample check), and
    1.19-3.49x faster than the fixed 128 columns at 4 warps it replaces (MLA-128 B=16, 4 splits: 25.5 -> 7.3 us).
    """
    block_s = min(64, triton.next_power_of_2(max(splits, 1)))
    block_d = min(128, triton.next_power_of_2(head_dim_v))
    while block_d < min(512, head_dim_v) and rows * heads * triton.cdiv(head_dim_v, 2 * block_d) >= MIN_PROGRAMS:
        block_d *= 2
    num_warps = max(1, min(8, block_s * block_d // 4096))
    return block_s, block_d, num_warps


def combine_grid(rows: int, heads: int, splits: int, head_dim_v: int) -> tuple[int, int]:
    """Grid of the combine launch: (rows * heads, column slices of ``combine_tile``'s BLOCK_D)."""
    return rows * heads, triton.cdiv(head_dim_v, combine_tile(rows, heads, splits, head_dim_v)[1])


def combine(partial_out: torch.Tensor, partial_lse: torch.Tensor, *, out: torch.Tensor | None = None,
            out_dtype: torch.dtype | None = None, lse: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``partial_out [rows, heads, S, Dv]`` (fp32, or fp16 / bf16, read as fp32) and ``partial_lse
    [rows, heads, S]`` (fp32, natural log, -inf for an empty split) into ``(out [rows, heads, Dv], lse [rows,
    heads])``.

    ``out`` defaults to a new tensor of ``out_dtype`` (fp32 if not given); a row whose splits are all
    empty comes out all zero with ``lse = -inf``; a NaN lse makes its row NaN (see the module docstring).
    A given ``out`` must be ``[rows, heads, Dv]`` of fp32 / fp16 / bf16 (``out_dtype``, if also given, must
    match), a given ``lse`` ``[rows, heads]`` fp32, both on the partials' device with non-overlapping elements
    (any strides) and sharing no memory with the partials; anything else is refused with a ``SplitlabError``, as
    is a tensor that requires grad while autograd records (the merge has no backward).

    fp32 range: each row sums up to S partial rows, weights <= 1, before it normalises, so ``|partial_out|`` must
    stay below ``3.4e38 / S`` (with headroom: ``3.4e38 / (2 S)``), else the row may come out inf where the fp64
    reference is finite (the launchers' validation checks their results for this, ``_launch.check_result``).
    """
    check_tensor("partial_out", partial_out, 4, dtypes=(torch.float32, torch.float16, torch.bfloat16))
    _launch.check_launch_device("partial_out", partial_out)
    dev = partial_out.device
    check_tensor("partial_lse", partial_lse, 3, dtypes=(torch.float32,), device=dev)
    rows, heads, splits, dv = partial_out.shape
    if tuple(partial_lse.shape) != (rows, heads, splits):
        raise SplitlabError(f"partial_lse has shape {tuple(partial_lse.shape)}; expected {(rows, heads, splits)} "
                            "to match partial_out")
    if dv < 1:
        raise SplitlabError(f"partial_out has shape {tuple(partial_out.shape)}; expected [rows, heads, S, Dv >= 1]")
    check_spans("partial_out", partial_out, (1, 2, 3))
    check_spans("partial_lse", partial_lse, (1, 2))
    if out_dtype is not None and out_dtype not in FLOAT_DTYPES:
        raise SplitlabError(f"out_dtype={out_dtype!r} is not allowed; expected one of "
                            f"{', '.join(map(str, FLOAT_DTYPES))}")
    if out is None:
        out = torch.empty(rows, heads, dv, dtype=out_dtype or torch.float32, device=dev)
    else:
        check_out("out", out, (rows, heads, dv), FLOAT_DTYPES, dev)
        if out_dtype is not None and out.dtype != out_dtype:
            raise SplitlabError(f"out has dtype {out.dtype}; expected out_dtype={out_dtype} (or leave one unset)")
        check_spans("out", out, (1, 2))
    if lse is None:
        lse = torch.empty(rows, heads, dtype=torch.float32, device=dev)
    else:
        check_out("lse", lse, (rows, heads), (torch.float32,), dev)
        check_spans("lse", lse, (1,))
    check_no_grad(partial_out=partial_out, partial_lse=partial_lse, out=out, lse=lse)  # no backward
    for name, t in (("out", out), ("lse", lse)):
        for src_name, src in (("partial_out", partial_out), ("partial_lse", partial_lse)):
            if shares_memory(t, src):
                raise SplitlabError(f"{name} shares memory with {src_name}; expected separate buffers")
    if shares_memory(out, lse):
        raise SplitlabError("lse shares memory with out; expected separate buffers")
    return launch_combine(partial_out, partial_lse, out, lse)


def launch_combine(partial_out: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``combine`` without its checks: for the launchers, whose partials and outputs are their own buffers."""
    rows, heads, splits, dv = partial_out.shape
    block_s, block_d, num_warps = combine_tile(rows, heads, splits, dv)
    _combine_kernel[combine_grid(rows, heads, splits, dv)](
        partial_out, partial_lse, out, lse,
        heads, splits, dv,
        *partial_out.stride(), *partial_lse.stride(), *out.stride(), *lse.stride(),
        BLOCK_S=block_s, BLOCK_D=block_d, num_warps=num_warps,
    )
    return out, lse
