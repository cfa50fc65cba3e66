"""The gap ledger: a measured decode's distance to the roofline floor, split into named parts that add up to it.

``ledger`` takes what the H200 collection measures for one point (``experiments/timelines/collect.py``): the
per-program timeline of the partial kernel and of the merge (``kernels.timeline`` records: SM, start and end in ns
of the GPU's ``%globaltimer``), recorded by the instrumented build; the measured wall time ``W`` (partial kernel +
merge, CUDA-graph replay of the plain build, p50, us) and ``T``, the same timing of the instrumented build
(``timed_us``); the ``n`` input sets each replay rotates through (``sets``) and the graph replay's fixed cost ``c``
(``replay_cost_us``); the roofline floor ``F`` (``workloads.floor_time_us`` at the device preset's
``roofline_gbps`` / ``roofline_tflops``), the device's ``S`` SMs and bandwidth ``B``, and the bytes the partial
kernel moves (``partial_bytes``: K/V, q, block table, partial rows written). With ``P`` the partial kernel's span
(its first program's start ``p0`` to its last program's end ``p1``), the merge's programs running from ``m0`` to
``m1``, and ``busy_sm`` the time SM ``sm`` had at least one partial program resident (the union of its programs'
intervals), the parts, in us, are:

* ``launch`` (launch and fixed cost): the wall outside the kernels' programs. With ``anchor_ns`` (the clock when a
  marker kernel launched just before the partial kernel ran): ``(p0 - anchor) + max(0, m0 - p1)``, the wait before
  the first program and between the kernels. Without it: ``(T - replay - (m1 - p0)) + max(0, m0 - p1)``, which
  also holds the time after the last program (so ``unexplained`` cannot be told from it: it is 0 and labelled
  unmeasured). A wait below 0 (without an anchor: the programs outlast the wall; with one: a marker that read the
  clock after the first program started) is not kept in ``launch``: the wait is 0, and without an anchor the
  negative remainder is ``unexplained`` (then not labelled unmeasured), where the 5% check sees it.
* ``idle`` (idle SMs: wave quantisation and tail imbalance): ``P - sum(busy_sm) / S``, the SM-time with no program
  resident while the partial kernel runs, over the SMs (an SM that ran nothing is idle for all of ``P``).
* ``merge``: ``max(0, m1 - max(m0, p1))``, the merge's time after the partial kernel's last program. Under
  programmatic dependent launch (``pdl=``) the merge's programs start, and record their start, before the partial
  kernel ends and wait in ``gdc_wait``; counting them from ``m0`` would count that overlap twice.
* ``below_peak`` (streaming below the peak inside busy CTAs): ``sum(busy_sm) / S - partial_bytes / B``, the busy
  SM-time beyond what the kernel's bytes need at the peak bandwidth. It goes negative where busy SMs stream at
  nearly the peak while others idle (the bandwidth is the device's, not a share per SM): ``idle`` then counts SM-time
  that cost no time, and ``below_peak`` takes it back. Only their sum, ``P - partial_bytes / B``, is measured
  without that ambiguity (five or six points a run on the H200; the decomposition is kept).
* ``extra_bytes``: ``partial_bytes / B - F``: the bytes the floor does not count at the peak (partial rows, q,
  block table; negative where the floor is the matrix rate's or counts bytes the kernel does not move).
* ``recording``: ``W - T``, the plain build's wall against the instrumented build's. The timeline is the
  instrumented build's, so the parts above explain ``T``; this part carries them to ``W`` (negative where recording
  slows the launch). Without ``timed_us``: 0, labelled unmeasured (its time then in ``unexplained``, or in
  ``launch`` without an anchor).
* ``replay``: ``c / n``. ``bench.timing.time_graph`` divides each replay's time by its ``n`` calls, so each call
  carries ``1 / n`` of the replay's own start and end, which no program's record covers. ``c`` is measured apart:
  the collection times a graph of empty launches at 1 and at 64 calls a replay (``replay_cost``); for runs that did
  not, ``REPLAY_COST_US`` (the H200's timer check). Without ``sets`` or ``replay_cost_us``: 0, labelled unmeasured.
* ``unexplained``: the rest, ``(W - F)`` minus the seven above: with an anchor, the time after the last program ends
  until the timed wall does, beyond the replay's share, and whatever else no record covers.

So the parts add up to ``W - F`` exactly (``Ledger.check``), by construction; the measure of the ledger is how
small ``unexplained`` is. ``ledger_from_parts`` makes the same ledger from the first five parts where the records
are gone (a shipped set's points whose records were not kept). ``peer_ledger`` is the form for an implementation
that cannot be instrumented (a peer library): only its wall time and grid, with ``idle`` modelled from the waves,
the replay's share as above, and every other cost in ``rest``, labelled modelled. Pure Python; no torch. Source:
splitlab (the per-SM timeline as ThunderKittens records it).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from splitlab.errors import SplitlabError
from splitlab.intmath import cdiv

#: The parts a point's records measure (``ledger``; ``ledger_from_parts`` takes them stored).
TIMELINE_PARTS = ("launch", "idle", "merge", "below_peak", "extra_bytes")
#: The measured ledger's parts, in the order a stacked bar draws them.
PARTS = (*TIMELINE_PARTS, "recording", "replay", "unexplained")
#: The peer ledger's parts (``peer_ledger``).
PEER_PARTS = ("launch", "idle", "replay", "rest")

#: The CUDA-graph replay's fixed cost on the H200 (us): one replay's own start and end, shared by the calls it
#: holds (``bench.timing.time_graph``). The median of the eight estimates of
#: ``data/archive/bench/h200-kernel-v6/timer_check.csv`` (``timer_check_costs``: each row's decodes timed over its K
#: rotated sets and over the K sets 8 times in one graph, with and without a spin kernel ahead; 2.8-8.0 us, median
#: 5.91; docs/history.md, "The graph timer, checked"). For runs that did not measure their own (``replay_cost``).
REPLAY_COST_US = 5.9
#: Where ``REPLAY_COST_US`` comes from, as a points table labels it.
REPLAY_COST_SOURCE = "timer_check"


def replay_share(cost_us: float, calls: int) -> float:
    """The replay's fixed cost ``cost_us`` that each of the ``calls`` of one graph replay carries in
    ``time_graph``'s per-call time."""
    if calls < 1:
        raise SplitlabError(f"replay_share: calls={calls}; expected at least 1")
    return cost_us / calls


def replay_cost(few_us: float, many_us: float, *, few: int = 1, many: int = 64) -> float:
    """The replay's fixed cost ``c`` from ``time_graph``'s per-call time of the same call at ``few`` and at ``many``
    calls a replay: with ``t(k) = call + c / k``, ``c = (t(few) - t(many)) / (1 / few - 1 / many)``."""
    if not 1 <= few < many:
        raise SplitlabError(f"replay_cost: few={few}, many={many}; expected 1 <= few < many")
    return (few_us - many_us) / (1 / few - 1 / many)


def timer_check_costs(rows: Iterable[Mapping[str, str]]) -> list[float]:
    """The replay cost estimates of a timer check's rows (``timer_check.csv``: ``K`` sets; ``us_graph`` over them,
    ``us_graph_x8`` over them 8 times in one graph, and the same with a spin kernel ahead), two a row."""
    out = []
    for r in rows:
        k = int(r["K"])
        for few, many in (("us_graph", "us_graph_x8"), ("us_graph_spin", "us_graph_x8_spin")):
            out.append(replay_cost(float(r[few]), float(r[many]), few=k, many=8 * k))
    return out


def timer_check_median(rows: Iterable[Mapping[str, str]]) -> float:
    """The median of ``timer_check_costs`` (what ``REPLAY_COST_US`` rounds)."""
    return statistics.median(timer_check_costs(rows))


@dataclass(frozen=True)
class Ledger:
    """``measured_us - floor_us`` in named ``parts`` (us); ``modelled`` names the parts that are modelled, not
    measured; ``unmeasured`` the parts this point's inputs could not measure, set to 0 (their time is then in
    another part: ``unexplained``, or ``launch`` without an anchor)."""

    measured_us: float
    floor_us: float
    parts: dict[str, float]
    modelled: tuple[str, ...] = field(default=())
    unmeasured: tuple[str, ...] = field(default=())

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
        """One CSV row: measured, floor, gap, each part (``<part>_us``), which are modelled and which unmeasured."""
        return dict(measured_us=self.measured_us, floor_us=self.floor_us, gap_us=self.gap_us,
                    **{f"{k}_us": v for k, v in self.parts.items()}, modelled=",".join(self.modelled),
                    unmeasured=",".join(self.unmeasured))


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


def _replay(sets: int | None, replay_cost_us: float | None) -> float | None:
    if sets is None or replay_cost_us is None:
        return None
    return replay_share(replay_cost_us, sets)


def ledger_from_parts(timeline: Mapping[str, float], *, wall_us: float, floor_us: float,
                      timed_us: float | None = None, sets: int | None = None,
                      replay_cost_us: float | None = None, unmeasured: Iterable[str] = ()) -> Ledger:
    """The ledger of a point from its ``TIMELINE_PARTS`` (us: ``ledger``'s, or a points table's where the records
    are gone) and its timings: ``recording = wall - timed``, ``replay = replay_cost / sets``, ``unexplained`` the
    rest (module docstring). A missing input leaves its part 0 and names it in ``unmeasured``."""
    missing = [k for k in TIMELINE_PARTS if k not in timeline]
    if missing:
        raise SplitlabError(f"ledger_from_parts: no {', '.join(missing)}; expected the parts {TIMELINE_PARTS}")
    parts = {k: float(timeline[k]) for k in TIMELINE_PARTS}
    gone = list(unmeasured)
    parts["recording"] = wall_us - timed_us if timed_us is not None else 0.0
    replay = _replay(sets, replay_cost_us)
    parts["replay"] = replay if replay is not None else 0.0
    gone += [k for k, v in (("recording", timed_us), ("replay", replay)) if v is None]
    parts["unexplained"] = (wall_us - floor_us) - sum(parts.values())
    return Ledger(wall_us, floor_us, {k: parts[k] for k in PARTS},
                  unmeasured=tuple(k for k in PARTS if k in gone)).check()


def ledger(partial: Iterable[Mapping[str, int]], merge: Iterable[Mapping[str, int]], *, wall_us: float,
           floor_us: float, sm_count: int, bandwidth_gbps: float, partial_bytes: float,
           anchor_ns: int | None = None, timed_us: float | None = None, sets: int | None = None,
           replay_cost_us: float | None = None) -> Ledger:
    """The measured ledger of one point (module docstring): ``partial`` and ``merge`` are the two kernels' timeline
    records (``kernels.timeline.FIELDS``; ``merge`` empty where no merge ran), ``wall_us`` the plain build's time,
    ``timed_us`` the instrumented build's, ``sets`` the calls a replay of both timings holds and ``replay_cost_us``
    the replay's fixed cost (``REPLAY_COST_US`` for a run that did not measure it); each of the last three None:
    its part 0, labelled unmeasured."""
    p = _spans(partial, "partial-kernel")
    m = _spans(merge, "merge")
    if not p:
        raise SplitlabError("ledger: no partial-kernel records; expected the timeline of the timed launch")
    if sm_count < 1 or bandwidth_gbps <= 0:
        raise SplitlabError(f"ledger: sm_count={sm_count}, bandwidth {bandwidth_gbps} GB/s; expected positive")
    if max(sm for sm, _, _ in p) >= sm_count:
        raise SplitlabError(f"ledger: a program ran on SM {max(sm for sm, _, _ in p)}; the device has {sm_count}")
    p0, p1 = min(a for _, a, _ in p), max(b for _, _, b in p)
    m0, m1 = (min(a for _, a, _ in m), max(b for _, _, b in m)) if m else (p1, p1)
    span_p = (p1 - p0) / 1e3
    span_m = max(0, m1 - max(m0, p1)) / 1e3  # the merge after the partial kernel (under PDL it starts before)
    between = max(0, m0 - p1) / 1e3
    mean_busy = sum(busy_ns(p).values()) / sm_count / 1e3
    at_peak = partial_bytes / (bandwidth_gbps * 1e3)  # GB/s = 1e3 bytes/us
    unmeasured = []
    if anchor_ns is None:  # the wall outside the programs (after the last one too) but the gap between the kernels
        ref = timed_us if timed_us is not None else wall_us
        outside = ref - (_replay(sets, replay_cost_us) or 0.0) - (m1 - p0) / 1e3
        if outside >= 0:
            unmeasured.append("unexplained")
    else:
        outside = (p0 - anchor_ns) / 1e3
    # a negative wait (the programs outlast the wall; a marker after the first program) is left to ``unexplained``
    timeline = dict(launch=max(0.0, outside) + between, idle=span_p - mean_busy, merge=span_m,
                    below_peak=mean_busy - at_peak, extra_bytes=at_peak - floor_us)
    return ledger_from_parts(timeline, wall_us=wall_us, floor_us=floor_us, timed_us=timed_us, sets=sets,
                             replay_cost_us=replay_cost_us, unmeasured=unmeasured)


def peer_ledger(*, wall_us: float, floor_us: float, programs: int, slots: int, launch_us: float,
                replay_us: float | None = None) -> Ledger:
    """The ledger of an implementation seen from outside (a peer: its wall time and grid only), all but nothing
    measured beyond ``wall_us``: ``launch`` is ``launch_us`` (the fixed cost of its launches, measured on empty
    kernels without the replay's share, ``replay_share``, or taken from splitlab's own ledger of the shape),
    ``replay`` is ``replay_us`` (the replay's share of its graph timing, ``replay_share(c, n)``; None: 0, labelled
    unmeasured), ``idle`` the waves' empty places over the rest of the wall, ``(wall - launch - replay) x (1 -
    programs / (waves x slots))`` with ``waves = ceil(programs / slots)`` (equal programs: no tail imbalance
    counted), and ``rest`` everything else (streaming below peak, the merge, extra bytes, imbalance: not separable
    without a timeline). ``launch`` and ``idle`` are labelled modelled."""
    if programs < 1 or slots < 1:
        raise SplitlabError(f"peer_ledger: programs={programs}, slots={slots}; expected at least 1 each")
    replay = replay_us if replay_us is not None else 0.0
    fill = programs / (cdiv(programs, slots) * slots)
    idle = (wall_us - launch_us - replay) * (1 - fill)
    parts = dict(launch=launch_us, idle=idle, replay=replay, rest=wall_us - floor_us - launch_us - idle - replay)
    return Ledger(wall_us, floor_us, parts, modelled=("launch", "idle"),
                  unmeasured=("replay",) if replay_us is None else ()).check()


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


__all__ = ["PARTS", "PEER_PARTS", "REPLAY_COST_SOURCE", "REPLAY_COST_US", "TIMELINE_PARTS", "Ledger", "busy_ns",
           "ledger", "ledger_from_parts", "peer_ledger", "program_errors", "replay_cost", "replay_share",
           "timer_check_costs", "timer_check_median"]
