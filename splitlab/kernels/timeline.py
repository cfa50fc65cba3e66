"""Per-program timelines of the work-list kernels (``kernels.worklist``): which SM ran which program, when.

A launch with timelines on (``TIMELINE=True``, ``timeline_ptr`` an int64 buffer of ``programs x RECORD``) writes one
record per program, ``FIELDS`` in order (8 x 8 = 64 bytes a program: ``start_ns`` at its start, the rest at its end):

* ``program``: the program's linear id (``program_id(0)``; the merge's 2-D grid: ``pid0 * grid1 + pid1``);
* ``sm``: the SM it ran on (PTX ``%smid``);
* ``start_ns`` / ``end_ns``: ``%globaltimer`` (ns, one clock for the whole GPU) read when the program begins (stored
  at once, so that no register holds it through the program; with ``TIMELINE = HOLD_START`` held and stored at the
  end instead) and after it issued its last store;
* ``slot``, ``group``, ``item``, ``items``: what it ran. Partial kernels: its CTA slot, its head group (GQA's kv
  head, MLA's head tile), its first work item and the number of items it ran (1 for a non-persistent schedule;
  a persistent slot's run in order from ``item``). The merge: the request, the head, the column block, and the
  partial rows it merged (0: a request written directly by its item).

The clock is the constexpr ``CLOCK``: Triton's interpreter cannot run inline PTX, so without it (``CLOCK=False``,
what ``clock_on`` says for the device) a record holds the program's identity and work with ``sm``, ``start_ns``
and ``end_ns`` left ``ABSENT`` (-1). The buffer starts filled with ``ABSENT``, and a program that exits before
recording (``BOUNDED``'s slots past the count) marks its record ``ABSENT`` (``absent_record``): ``read`` drops it,
and a buffer reused by later launches (a CUDA graph's) needs no refill.

The clock reads are Triton's own (``triton.language.extra.cuda.globaltimer`` / ``smid``: ``mov.u64 $0,
%globaltimer`` and ``mov.u32 $0, %smid``), the per-SM timeline as ThunderKittens' and ThunderMLA's schedulers record
it (clock events per task, drawn per SM). With ``TIMELINE=False`` (the default) the kernels take no buffer and
compile to the code they had without this module.

``Timelines`` holds a launch's buffers (one per kernel, allocated on first use and reused, so that a CUDA graph can
capture an instrumented launch); the launchers take it as ``timelines=``; ``record`` runs one launch with timelines on
and returns its records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer, smid

from splitlab.errors import SplitlabError
from splitlab.kernels._launch import INTERPRET

#: A record's int64 fields, in the order a program writes them (module docstring).
FIELDS = ("program", "sm", "start_ns", "end_ns", "slot", "group", "item", "items")
#: int64 values a program writes (the record's stride in the buffer).
RECORD = tl.constexpr(len(FIELDS))
#: A field the program did not measure (no clock under the interpreter), and the fill of a buffer before the launch.
ABSENT = -1
#: The kernels a work-list decode launches, by the name ``Timelines`` keeps their buffers under.
KERNELS = ("partial", "merge")
#: ``TIMELINE``'s value for a build that holds a one-item program's start time in a register and stores it with the
#: rest at the end (``Timelines(hold_start=True)``), where ``TIMELINE=True`` stores it at once: what each costs is
#: ``experiments/timelines``'s A/B. The Gluon kernels' persistent programs store theirs at once either way.
HOLD_START = 2
_HOLD = tl.constexpr(HOLD_START)


@triton.jit
def now_ns(CLOCK: tl.constexpr):
    """``%globaltimer`` (ns) where ``CLOCK``, else ``ABSENT`` (the interpreter runs no inline PTX)."""
    if CLOCK:
        t = globaltimer()
    else:
        t = tl.full([], -1, tl.int64)
    return t


@triton.jit
def absent_record(timeline_ptr, program):
    """Mark the calling program's record absent (``program`` = ``ABSENT``, 8 bytes): a program that exits without
    running anything (``BOUNDED``'s slots past the count), so that no record of an earlier launch stands in its
    place and a buffer needs no refill between launches."""
    tl.store(timeline_ptr + program.to(tl.int64) * RECORD, -1)


@triton.jit
def start_record(timeline_ptr, program, CLOCK: tl.constexpr, TIMELINE: tl.constexpr = True):
    """The calling program's start time, stored in its record at once (``start_ns``, 8 bytes: no register holds it
    through the program) unless ``TIMELINE`` is ``HOLD_START``; returned for ``write_record``, which writes the
    rest at the program's end."""
    t = now_ns(CLOCK)
    if TIMELINE != _HOLD:
        tl.store(timeline_ptr + program.to(tl.int64) * RECORD + 2, t)
    return t


@triton.jit
def write_record(timeline_ptr, program, slot, group, item, items, CLOCK: tl.constexpr, start=None,
                 TIMELINE: tl.constexpr = True):
    """Write the rest of the calling program's record (``FIELDS`` order; ``start_ns`` stored by ``start_record``,
    or here from ``start`` where ``TIMELINE`` is ``HOLD_START``) after reading the end time and the SM."""
    end = now_ns(CLOCK)
    if CLOCK:
        sm = smid().to(tl.int64)
    else:
        sm = tl.full([], -1, tl.int64)
    base = timeline_ptr + program.to(tl.int64) * RECORD
    tl.store(base + 0, program.to(tl.int64))
    tl.store(base + 1, sm)
    tl.store(base + 3, end)
    tl.store(base + 4, slot.to(tl.int64))
    tl.store(base + 5, group.to(tl.int64))
    tl.store(base + 6, item.to(tl.int64))
    tl.store(base + 7, items.to(tl.int64))
    if TIMELINE == _HOLD:
        tl.store(base + 2, start)


def clock_on(device: torch.device | str) -> bool:
    """Whether a launch on ``device`` reads the GPU's clock and SM (a CUDA device, not under the interpreter)."""
    return torch.device(device).type == "cuda" and not INTERPRET


class Timelines:
    """The record buffers of one launcher call's kernels (``KERNELS``), allocated on first use for the program count
    the kernel launches and reused by later calls of the same count (a CUDA graph captures the launch with its
    buffer). Pass it to a work-list launcher as ``timelines=``; ``read`` returns the records after the launch."""

    def __init__(self, kernels: tuple[str, ...] = KERNELS, *, hold_start: bool = False) -> None:
        """``kernels``: the kernels that record (``KERNELS`` by default); the others launch their plain build, so
        that a timing can tell one kernel's recording cost from the other's. ``hold_start``: the builds that hold a
        one-item program's start time until its end (``HOLD_START``); the records are the same."""
        bad = [k for k in kernels if k not in KERNELS]
        if bad or not kernels:
            raise SplitlabError(f"kernels={kernels!r} is not allowed; expected one or more of {', '.join(KERNELS)}")
        self.kernels = tuple(kernels)
        self.hold_start = bool(hold_start)
        self.buffers: dict[str, torch.Tensor] = {}

    def args(self, kernel: str, programs: int, device: torch.device) -> dict[str, Any]:
        """The keyword arguments that turn ``kernel``'s timeline on for a launch of ``programs`` programs (none for
        a kernel this ``Timelines`` does not record)."""
        if kernel not in KERNELS:
            raise SplitlabError(f"kernel={kernel!r} is not allowed; expected one of {', '.join(KERNELS)}")
        if kernel not in self.kernels:
            return {}
        if not self.ready(kernel, programs, device):
            self.buffers[kernel] = torch.full((programs, len(FIELDS)), ABSENT, dtype=torch.int64, device=device)
        return dict(timeline_ptr=self.buffers[kernel], TIMELINE=HOLD_START if self.hold_start else True,
                    CLOCK=clock_on(device))

    def ready(self, kernel: str, programs: int, device: torch.device | str) -> bool:
        """Whether ``kernel``'s buffer exists for ``programs`` programs on ``device`` (``args`` then allocates
        nothing: what a launch inside a CUDA graph capture needs); True for a kernel not recorded."""
        if kernel not in self.kernels:
            return True
        buf = self.buffers.get(kernel)
        return buf is not None and buf.shape[0] == programs and buf.device == torch.device(device)

    def drop(self, kernel: str) -> None:
        """Forget ``kernel``'s buffer (a launch that does not run that kernel: no record of an earlier one stands)."""
        self.buffers.pop(kernel, None)

    def reset(self) -> None:
        """Fill every buffer with ``ABSENT`` again (before a launch whose programs may exit unrecorded)."""
        for buf in self.buffers.values():
            buf.fill_(ABSENT)

    def read(self) -> dict[str, list[dict[str, int]]]:
        """Each launched kernel's records (``read``), by kernel name."""
        return {k: read(buf) for k, buf in self.buffers.items()}


def read(buf: torch.Tensor) -> list[dict[str, int]]:
    """The records of ``buf`` (``programs x len(FIELDS)`` int64) as dicts of ``FIELDS``, in program order, less the
    programs that left none (``program`` still ``ABSENT``). One copy to the host (synchronises)."""
    rows = buf.detach().to("cpu").tolist()
    return [dict(zip(FIELDS, r, strict=True)) for r in rows if r[0] != ABSENT]


def record(launch: Callable[[Timelines], object]) -> tuple[object, dict[str, list[dict[str, int]]]]:
    """Run ``launch(timelines)`` (a launcher call given ``timelines=``) once and return its result and its kernels'
    records (``Timelines.read``)::

        out, recs = timeline.record(lambda t: gqa_decode_scheduled(q, k, v, bt, work, timelines=t))
    """
    t = Timelines()
    out = launch(t)
    return out, t.read()


__all__ = ["ABSENT", "FIELDS", "HOLD_START", "KERNELS", "RECORD", "Timelines", "absent_record", "clock_on",
           "now_ns", "read", "record", "start_record", "write_record"]
