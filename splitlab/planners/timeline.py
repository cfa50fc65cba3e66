"""Modelled timelines: which SM the cost model puts each program of a schedule's partial launch on, and when.

``planners.schedulers.modelled_time`` prices a schedule's partial launch with ``planners.splitlab``'s wave model
(``ragged_launch_time``): the launch's programs (each busy CTA slot once per head group, slot after slot, head
group fastest: the work-list kernels' grid order) are issued, in order, into ``slots`` = SMs x CTAs per SM places,
each into the first place that frees; a program lasts its slot's key tiles at the tile's rate plus FIXED per item,
and the resident programs share the bandwidth, each streaming at ``min(1 / cap, slots / resident)`` of its
full-wave rate. ``modelled_timeline`` runs that same schedule program by program and keeps each one's place, start
and end. Place ``i`` is on SM ``i mod SMs`` (the block scheduler deals a launch's first programs one per SM
before it gives an SM a second); a program issued later takes the place its predecessor freed. Slots without items
(a persistent schedule's spare slots) exit at once and are not modelled.

Times are in the cost model's unit (key tiles streamed by one CTA with every place busy), not microseconds;
``ModelledTimeline.scaled`` turns them into microseconds given a measured total. ``tail`` is what the model adds after
the launch: the busiest SM's partial-row writes and the merge (``schedulers._priced`` without the launch).

The launch's makespan is ``ragged_launch_time``'s schedule exactly (tests/test_timelines_model.py) where the wave
model schedules it, i.e. below ``planners.splitlab.SCHEDULE_WAVES`` waves of programs; at that many waves or more
``modelled_time`` takes a closed form (within 5% of the schedule on the fit batches) and this timeline is the
schedule it approximates. Pure Python; no torch. Source: splitlab.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

from splitlab.planners import schedulers
from splitlab.planners.schedule import Schedule

#: The unit of a modelled timeline's times before ``scaled``.
MODEL_UNITS = "key tiles of one CTA"


@dataclass(frozen=True)
class ModelledProgram:
    """One program of the partial launch: its linear id (``slot x groups + group``), slot, head group, the place it
    was issued into, the SM that place is on, and its start and end."""

    program: int
    slot: int
    group: int
    place: int
    sm: int
    start: float
    end: float


@dataclass(frozen=True)
class ModelledTimeline:
    """A schedule's partial launch as the cost model runs it (module docstring)."""

    programs: tuple[ModelledProgram, ...]
    launch: float  # the partial launch's makespan
    tail: float  # the partial-row writes and the merge after it
    sm_count: int
    units: str = MODEL_UNITS

    @property
    def total(self) -> float:
        """``launch + tail``: ``schedulers.modelled_time`` where the models coincide."""
        return self.launch + self.tail

    def scaled(self, total_us: float) -> ModelledTimeline:
        """The same timeline with every time multiplied so that ``total`` is ``total_us`` (a measured time): the
        model's shape at the measurement's scale."""
        f = total_us / self.total if self.total > 0 else 0.0
        return ModelledTimeline(tuple(replace(p, start=p.start * f, end=p.end * f) for p in self.programs),
                                self.launch * f, self.tail * f, self.sm_count, "us")


def modelled_timeline(s: Schedule, w: object, dev: object, c: object = None) -> ModelledTimeline:
    """The modelled timeline (module docstring) of schedule ``s`` for workload ``w`` (its kind, heads, dims) on
    device ``dev`` (its SMs and architecture) under the fitted constants ``c`` (default: the family's for ``dev``,
    ``planners.splitlab.constants_for``)."""
    from splitlab.planners import splitlab as rule

    c = rule.constants_for(dev, w.kind).constants if c is None else c
    t = schedulers.splitlab_terms(w, dev, c)  # modelled_time's wave width, tile rate, drain cap and P
    h, slots, rate, cap, p = t.h, t.slots, t.rate, t.cap, t.p
    per_cta = [s.cta_offsets[i + 1] - s.cta_offsets[i] for i in range(s.ctas)]
    tiles = schedulers.slot_tiles(s, w, c, rate)
    # modelled_time's durations, in its arithmetic (ragged_launch_time: tiles x RATE + FIXED)
    fixed = schedulers.item_fixed(c)
    queue = [(slot, g, tiles[slot] * rate + fixed) for slot in range(s.ctas) if per_cta[slot] for g in range(h)]
    programs = _run(queue, slots, cap, h, dev.sm_count)
    launch = max((q.end for q in programs), default=0.0)
    tail = schedulers._priced([], s.partial_rows, h, slots, rate, cap, p, dev.sm_count, c)
    return ModelledTimeline(tuple(programs), launch, tail, dev.sm_count)


def _run(queue: list[tuple[int, int, float]], slots: int, cap: float, groups: int,
         sm_count: int) -> list[ModelledProgram]:
    """``planners.splitlab._schedule`` program by program: ``queue`` ((slot, group, duration) in issue order) into
    ``slots`` places, the resident programs each streaming at ``min(1 / cap, slots / resident)``; programs that end
    at the same virtual work end together (the schedule's events, so the makespan is its own to the last bit)."""
    free = list(range(slots))  # places free now, lowest first
    pending: list[tuple[float, int]] = []  # (the virtual work at which a program ends, its index in queue)
    start: dict[int, tuple[float, int]] = {}
    out: list[ModelledProgram] = []
    done, now, head = 0.0, 0.0, 0

    def issue() -> None:
        nonlocal head
        while free and head < len(queue):
            place = heapq.heappop(free)
            heapq.heappush(pending, (done + queue[head][2], head))
            start[head] = (now, place)
            head += 1

    issue()
    while pending:
        end, i = heapq.heappop(pending)
        ending = [i]
        while pending and pending[0][0] == end:
            ending.append(heapq.heappop(pending)[1])
        resident = len(start) - len(out)
        speed = min(1 / cap, slots / resident) if cap > 0 else slots / resident
        now += (end - done) / speed
        done = end
        for j in ending:
            t0, place = start[j]
            slot, group, _ = queue[j]
            out.append(ModelledProgram(slot * groups + group, slot, group, place, place % sm_count, t0, now))
            heapq.heappush(free, place)
        issue()
    return sorted(out, key=lambda p: p.program)


__all__ = ["MODEL_UNITS", "ModelledProgram", "ModelledTimeline", "modelled_timeline"]
