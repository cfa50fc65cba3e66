"""The gap ledger: a measured decode's distance to the roofline floor, split into named parts that add up to it.

``ledger`` takes what the H200 collection measures for one point (``experiments/timelines/collect.py``): the
per-program timeline of the partial kernel and of the merge (``kernels.timeline`` records: SM, start and end in ns
of the GPU's ``%globaltimer``), the measured wall time ``W`` of the timed launch (partial kernel + merge, CUDA-graph
replay of the plain build, us), the roofline floor ``F`` (``workloads.floor_time_us`` at the device preset's
``roofline_gbps`` / ``roofline_tflops``), the device's ``S`` SMs and bandwidth ``B``, and the bytes the partial
kernel moves (``partial_bytes``: K/V, q, block table, partial rows written). With ``P`` the partial kernel's span
(its first program's start to its last program's end), ``M`` the merge's span (0 without a merge) and ``busy_sm``
the time SM ``sm`` had at least one partial program resident (the union of its programs' intervals), the parts, in
us, are:

* ``launch`` (launch and fixed cost): the timed wall outside the kernels' programs. With ``anchor_ns`` (the clock
  when a marker kernel launched just before the partial kernel ended): ``(first start - anchor) + max(0, merge
  start - partial end)``, the wait before the first program and between the kernels; without it ``W - P - M``
  (also the time after the last program, which then leaves ``unexplained`` at 0).
* ``idle`` (idle SMs: wave quantisation and tail imbalance): ``P - sum(busy_sm) / S``, the SM-time with no program
  resident while the partial kernel runs, over the SMs (an SM that ran nothing is idle for all of ``P``).
* ``merge``: ``M``.
* ``below_peak`` (streaming below the peak inside busy CTAs): ``sum(busy_sm) / S - partial_bytes / B``, the busy
  SM-time beyond what the kernel's bytes need at the peak bandwidth.
* ``extra_bytes``: ``partial_bytes / B - F``: the bytes the floor does not count at the peak (partial rows, q,
  block table; negative where the floor is the matrix rate's or counts bytes the kernel does not move).
* ``unexplained``: the rest, ``(W - F)`` minus the five above: with an anchor, the time after the last program
  ends until the timed wall does, and whatever differs between the plain build's wall and the recorded run.

So the parts add up to ``W - F`` exactly (``Ledger.check``), by construction; the measure of the ledger is how
small ``unexplained`` is. ``peer_ledger`` is the form for an implementation that cannot be instrumented (a peer
library): only its wall time and grid, with ``idle`` modelled from the waves and every other cost in ``rest``,
labelled modelled. Pure Python; no torch. Source: splitlab (the per-SM timeline as ThunderKittens records it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from splitlab.errors import SplitlabError
from splitlab.intmath import cdiv

#: The measured ledger's parts, in the order a stacked bar draws them.
PARTS = ("launch", "idle", "merge", "below_peak", "extra_bytes", "unexplained")
#: The peer ledger's parts (``peer_ledger``).
PEER_PARTS = ("launch", "idle", "rest")


@dataclass(frozen=True)
class Ledger:
    """``measured_us - floor_us`` in named ``parts`` (us); ``modelled`` names the parts that are modelled, not
    measured."""

    measured_us: float
    floor_us: float
    parts: dict[str, float]
    modelled: tuple[str, ...] = field(default=())

    @property
    def gap_us(self) -> float:
        return self.measured_us - self.floor_us

    def check(self, rel: float = 1e-9) -> Ledger:
        """Raise ``SplitlabError`` unless the parts add up to the gap (to ``rel`` of the measured time)."""
        total = sum(self.parts.values())
        if abs(total - self.gap_us) > rel * max(abs(self.measured_us), 1e-12):
            raise SplitlabError(f"ledger parts add up to {total} us; expected the gap {self.gap_us} us")
        return self

    def row(self) -> dict[str, float | str]:
        """One CSV row: measured, floor, gap, each part (``<part>_us``) and which are modelled."""
        return dict(measured_us=self.measured_us, floor_us=self.floor_us, gap_us=self.gap_us,
                    **{f"{k}_us": v for k, v in self.parts.items()}, modelled=",".join(self.modelled))


def _spans(records: Iterable[Mapping[str, int]], what: str) -> list[tuple[int, int, int]]:
    out = []
    for r in records:
        sm, a, b = int(r["sm"]), int(r["start_ns"]), int(r["end_ns"])
        if sm < 0 or a < 0 or b < a:
            raise SplitlabError(f"ledger: a {what} record has sm={sm}, start {a}, end {b}; expected a measured "
                                "timeline (a GPU's, not the interpreter's absent fields)")
        out.append((sm, a, b))
    return out


def busy_ns(spans: Iterable[tuple[int, int, int]]) -> dict[int, int]:
    """Per SM, the time (ns) at least one of ``spans`` ((sm, start, end)) was running on it (their union)."""
    by_sm: dict[int, list[tuple[int, int]]] = {}
    for sm, a, b in spans:
        by_sm.setdefault(sm, []).append((a, b))
    out = {}
    for sm, iv in by_sm.items():
        iv.sort()
        total, cur_a, cur_b = 0, iv[0][0], iv[0][1]
        for a, b in iv[1:]:
            if a > cur_b:
                total, cur_a, cur_b = total + cur_b - cur_a, a, b
            else:
                cur_b = max(cur_b, b)
        out[sm] = total + cur_b - cur_a
    return out


def ledger(partial: Iterable[Mapping[str, int]], merge: Iterable[Mapping[str, int]], *, wall_us: float,
           floor_us: float, sm_count: int, bandwidth_gbps: float, partial_bytes: float,
           anchor_ns: int | None = None) -> Ledger:
    """The measured ledger of one point (module docstring): ``partial`` and ``merge`` are the two kernels' timeline
    records (``kernels.timeline.FIELDS``; ``merge`` empty where no merge ran)."""
    p = _spans(partial, "partial-kernel")
    m = _spans(merge, "merge")
    if not p:
        raise SplitlabError("ledger: no partial-kernel records; expected the timeline of the timed launch")
    if sm_count < 1 or bandwidth_gbps <= 0:
        raise SplitlabError(f"ledger: sm_count={sm_count}, bandwidth {bandwidth_gbps} GB/s; expected positive")
    if max(sm for sm, _, _ in p) >= sm_count:
        raise SplitlabError(f"ledger: a program ran on SM {max(sm for sm, _, _ in p)}; the device has {sm_count}")
    p0, p1 = min(a for _, a, _ in p), max(b for _, _, b in p)
    span_p = (p1 - p0) / 1e3
    span_m = (max(b for _, _, b in m) - min(a for _, a, _ in m)) / 1e3 if m else 0.0
    mean_busy = sum(busy_ns(p).values()) / sm_count / 1e3
    at_peak = partial_bytes / (bandwidth_gbps * 1e3)  # GB/s = 1e3 bytes/us
    if anchor_ns is None:
        launch = wall_us - span_p - span_m
    else:
        between = max(0, min(a for _, a, _ in m) - p1) if m else 0
        launch = (p0 - anchor_ns + between) / 1e3
    parts = dict(launch=launch, idle=span_p - mean_busy, merge=span_m, below_peak=mean_busy - at_peak,
                 extra_bytes=at_peak - floor_us)
    parts["unexplained"] = (wall_us - floor_us) - sum(parts.values())
    return Ledger(wall_us, floor_us, {k: parts[k] for k in PARTS}).check()


def peer_ledger(*, wall_us: float, floor_us: float, programs: int, slots: int, launch_us: float) -> Ledger:
    """The ledger of an implementation seen from outside (a peer: its wall time and grid only), all but nothing
    measured beyond ``wall_us``: ``launch`` is ``launch_us`` (the fixed cost of its launches, measured on an empty
    kernel or taken from splitlab's own ledger of the shape), ``idle`` the waves' empty places over the rest of the
    wall, ``(wall - launch) x (1 - programs / (waves x slots))`` with ``waves = ceil(programs / slots)`` (equal
    programs: no tail imbalance counted), and ``rest`` everything else (streaming below peak, the merge, extra bytes,
    imbalance: not separable without a timeline). ``launch`` and ``idle`` are labelled modelled."""
    if programs < 1 or slots < 1:
        raise SplitlabError(f"peer_ledger: programs={programs}, slots={slots}; expected at least 1 each")
    fill = programs / (cdiv(programs, slots) * slots)
    idle = (wall_us - launch_us) * (1 - fill)
    parts = dict(launch=launch_us, idle=idle, rest=wall_us - floor_us - launch_us - idle)
    return Ledger(wall_us, floor_us, parts, modelled=("launch", "idle")).check()



def program_errors(model: object, partial: Iterable[Mapping[str, int]]) -> list[dict[str, float | int]]:
    """The cost model's error per program: ``model`` a ``planners.timeline.ModelledTimeline`` of the launch,
    scaled so that its launch lasts the measured partial span, against the measured ``partial`` records (matched
    by program id): each program's measured and modelled duration (us) and ``rel_err`` = modelled / measured - 1.
    Programs the model leaves out (slots without items) are left out."""
    recs = {int(r["program"]): r for r in partial}
    spans = _spans(recs.values(), "partial-kernel")
    span_us = (max(b for _, _, b in spans) - min(a for _, a, _ in spans)) / 1e3
    f = span_us / model.launch if model.launch > 0 else 0.0
    out = []
    for p in model.programs:
        r = recs.get(p.program)
        if r is None:
            continue
        measured = (int(r["end_ns"]) - int(r["start_ns"])) / 1e3
        modelled = (p.end - p.start) * f
        out.append(dict(program=p.program, sm=int(r["sm"]), modelled_sm=p.sm, measured_us=measured,
                        modelled_us=modelled, rel_err=modelled / measured - 1 if measured > 0 else float("nan")))
    return out


__all__ = ["PARTS", "PEER_PARTS", "Ledger", "busy_ns", "ledger", "peer_ledger", "program_errors"]
