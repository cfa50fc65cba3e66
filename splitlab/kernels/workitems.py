"""What every work-list kernel shares: a schedule as device tensors (``WorkList``), the rule that reads one of its
items (``load_item``), the partial rows a split request's items write (``alloc_partials``) and their merge
(``launch_merge``, ``_merge_kernel``), and the timeline arguments of a partial launch. The tl kernels
(``kernels.worklist``, whose docstring has the work list's layout and rules) and the warp-specialized Gluon kernels
(``kernels.mla_sm90_ws``, ``kernels.mqa_sm90_ws``) build on it; ``kernels.worklist`` re-exports it, the launchers'
module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from splitlab.errors import SplitlabError
from splitlab.kernels import _launch
from splitlab.kernels import timeline as tlog
from splitlab.kernels._launch import check_spans
from splitlab.kernels.combine import combine_tile, merge_splits
from splitlab.kernels.timeline import Timelines
from splitlab.planners.schedule import Schedule

try:  # programmatic dependent launch's device side (triton PR #6394, in triton 3.4 onward)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    PDL_AVAILABLE = True
except ImportError:  # pragma: no cover - an older triton: pdl= is refused (check_pdl)
    PDL_AVAILABLE = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass


LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)
FLT_MAX = tl.constexpr(3.4028234663852886e38)


@dataclass(frozen=True)
class WorkList:
    """A schedule as device tensors (see the module docstring), with the host numbers a launch needs."""

    schedule: Schedule
    items: torch.Tensor  # int32 [n_items, 4]: request, key_begin, key_end, partial row (-1: direct)
    cta_offsets: torch.Tensor  # int32 [ctas + 1]
    partial_offsets: torch.Tensor  # int32 [batch + 1]

    @property
    def ctas(self) -> int:
        return self.schedule.ctas

    @property
    def batch(self) -> int:
        return self.schedule.batch

    @property
    def partial_rows(self) -> int:
        return self.schedule.partial_rows

    @classmethod
    def from_schedule(cls, s: Schedule, device: torch.device | str) -> WorkList:
        rows = s.item_rows
        flat = [v for (_, r, b, e), row in zip(s.items, rows, strict=True) for v in (r, b, e, row)]
        items = torch.tensor(flat or [0, 0, 0, -1], dtype=torch.int32).view(-1, 4)
        return cls(s, items.to(device), torch.tensor(s.cta_offsets, dtype=torch.int32).to(device),
                   torch.tensor(s.partial_offsets, dtype=torch.int32).to(device))


def check_worklist(work: object, batch: int, max_keys: int, device: torch.device, what: str) -> WorkList:
    """``work`` is a ``WorkList`` for ``batch`` requests on ``device`` whose keys lie in the block table
    (``max_keys``), else one ``SplitlabError`` line."""
    if not isinstance(work, WorkList):
        raise SplitlabError(f"{what}: work={type(work).__name__} is not allowed; expected a WorkList "
                            "(WorkList.from_schedule)")
    if work.batch != batch:
        raise SplitlabError(f"{what}: the work list is for {work.batch} requests; q has {batch}")
    if max(work.schedule.lengths) > max_keys:
        raise SplitlabError(f"{what}: the schedule reads up to key {max(work.schedule.lengths)}; the block table "
                            f"holds {max_keys} keys a request")
    if work.items.device != device:
        raise SplitlabError(f"{what}: the work list is on {work.items.device}; expected q's device {device}")
    return work


# =====================================================================================================
# Merge: a variable number of partial rows per request
# =====================================================================================================


@triton.jit
def _merge_kernel(
    po_ptr, plse_ptr, offsets_ptr, out_ptr, lse_ptr,
    num_heads, head_dim_v,
    po_stride_r, po_stride_h, po_stride_d,
    pl_stride_r, pl_stride_h,
    out_stride_b, out_stride_h, out_stride_d,
    lse_stride_b, lse_stride_h,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    timeline_ptr=None, TIMELINE: tl.constexpr = False, CLOCK: tl.constexpr = True,
    WAIT_PRIOR: tl.constexpr = False,
):
    # One program per (request, head, BLOCK_D columns). Bytes: n * (BLOCK_D + 1) * 4 read, BLOCK_D * elt + 4
    # written, for a request of n > 0 partial rows; nothing for one written directly by its item (n = 0).
    # TIMELINE: 64 bytes more a program, its record (kernels.timeline). WAIT_PRIOR (launched with programmatic
    # dependent launch, launch_merge's pdl, a plan's): the offsets (the work list, which the partial kernel never
    # writes) are read before griddepcontrol.wait, the partial rows after it, when the partial kernel has completed
    # and its stores are visible; a program without partial rows exits without waiting, but for program (0, 0),
    # which always waits: the merge then never ends before the partial kernel (whose direct writes what the stream
    # runs next reads), even when a plan's capacity launch has no partial rows at all.
    pid = tl.program_id(0)
    if TIMELINE:
        t_start = tlog.start_record(timeline_ptr, pid * tl.num_programs(1) + tl.program_id(1), CLOCK, TIMELINE)
    b = pid // num_heads
    head = pid % num_heads
    first = tl.load(offsets_ptr + b)
    n = tl.load(offsets_ptr + b + 1) - first
    if WAIT_PRIOR:
        if (n > 0) | (pid + tl.program_id(1) == 0):
            gdc_wait()
    if n > 0:
        offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        mask_d = offs_d < head_dim_v
        po_base = po_ptr + first.to(tl.int64) * po_stride_r + head * po_stride_h
        pl_base = plse_ptr + first.to(tl.int64) * pl_stride_r + head * pl_stride_h
        out, lse = merge_splits(po_base, pl_base, po_stride_r, po_stride_d, pl_stride_r, n, offs_d, mask_d,
                                BLOCK_S, BLOCK_D)
        b64 = b.to(tl.int64)
        tl.store(out_ptr + b64 * out_stride_b + head * out_stride_h + offs_d * out_stride_d,
                 out.to(out_ptr.dtype.element_ty), mask=mask_d)
        if tl.program_id(1) == 0:
            tl.store(lse_ptr + b64 * lse_stride_b + head * lse_stride_h, lse)
    if TIMELINE:
        tlog.write_record(timeline_ptr, pid * tl.num_programs(1) + tl.program_id(1), b, head,
                          tl.program_id(1), n, CLOCK, t_start, TIMELINE)


def launch_merge(work: WorkList, po: torch.Tensor, pl: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 timelines: Timelines | None = None, *, pdl: bool = False) -> None:
    """Merge each split request's partial rows into its ``out`` / ``lse`` row (no checks: the launchers' buffers);
    with ``timelines``, each program's record into its ``merge`` buffer (``kernels.timeline``). ``pdl``: launched
    with programmatic dependent launch (``check_pdl``'s answer: a GPU and a triton that has it), its programs
    waiting for the partial kernel before they read a partial row; the plain launch without it. Program (0, 0) waits
    too: the merge's end implies the partial kernel's end (and its direct writes' visibility) for whatever the
    stream runs next, as in the plain order."""
    if work.partial_rows == 0:
        return
    heads, dv = po.shape[1], po.shape[2]
    block_s, block_d, num_warps = combine_tile(work.batch, heads, max(work.schedule.partials), dv)
    grid = (work.batch * heads, triton.cdiv(dv, block_d))
    extra = {} if timelines is None else timelines.args("merge", grid[0] * grid[1], out.device)
    if pdl:
        extra.update(WAIT_PRIOR=True, launch_pdl=True)
    _merge_kernel[grid](
        po, pl, work.partial_offsets, out, lse, heads, dv,
        *po.stride(), *pl.stride(), *out.stride(), *lse.stride(),
        BLOCK_S=block_s, BLOCK_D=block_d, num_warps=num_warps, **extra,
    )


def alloc_partials(work: WorkList, heads: int, dv: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial buffers of ``work`` (one row at least, so that a kernel argument always points somewhere)."""
    rows = max(work.partial_rows, 1)
    po = _launch.alloc(rows, heads, dv, dtype=torch.float32, device=device)
    check_spans("the partial rows", po, (0, 1, 2))
    return po, _launch.alloc(rows, heads, dtype=torch.float32, device=device)


@triton.jit
def load_item(items_ptr, it, max_keys):
    """``(request (int64), key_begin, key_end, partial row, bad)`` of work item ``it`` (16 bytes). A range outside
    ``[0, max_keys]`` or reversed (a work list not made for this block table) reads nothing (``key_end`` is set to
    ``key_begin``) and ``bad`` makes the request NaN (``paging.poison``)."""
    b = tl.load(items_ptr + it * 4)
    start = tl.load(items_ptr + it * 4 + 1)
    end = tl.load(items_ptr + it * 4 + 2)
    row = tl.load(items_ptr + it * 4 + 3)
    bad = (start < 0) | (end > max_keys) | (start > end)
    return b.to(tl.int64), start, tl.where(bad, start, end), row, bad



def timeline_args(timelines: object, programs: int, device: torch.device, what: str) -> dict:
    """The partial kernel's timeline arguments (none without ``timelines``: the plain launch), or one
    ``SplitlabError`` for anything but a ``Timelines``."""
    if timelines is None:
        return {}
    if not isinstance(timelines, Timelines):
        raise SplitlabError(f"{what}: timelines={type(timelines).__name__} is not allowed; expected a "
                            "kernels.timeline.Timelines or None")
    return timelines.args("partial", programs, device)

__all__ = ["FLT_MAX", "LN2", "LOG2E", "PDL_AVAILABLE", "WorkList", "alloc_partials", "check_worklist",
           "gdc_launch_dependents", "gdc_wait", "launch_merge", "load_item", "timeline_args"]
