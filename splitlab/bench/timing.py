"""GPU timing, and the timers the sweep harness plugs in.

Two ways of timing one decode (the partial kernel and the combine, i.e. everything one launcher call
enqueues):

* ``time_events``: ``triton.testing.do_bench``, which zeroes a buffer larger than the L2 before every timed
  run (so each run reads its inputs from HBM) and times the run alone with CUDA events; p20/p50/p80 of all
  its samples.
* ``time_graph``: one CUDA graph holding one call per input set, the sets rotated through more than the L2
  (``rotations``: by the bytes a call reads), replayed many times; each sample is one replay's time over the
  calls in it. No host overhead and no L2 reuse between consecutive calls.

The sweep harness talks to a ``Timer``: ``GraphTimer`` and ``EventTimer`` wrap the two above; ``FakeTimer``
returns deterministic *modelled* figures (splitlab's wave-cost model; a work-list point's schedule by
``planners.schedulers.modelled_time``) for CI, labelled ``timing="fake"`` so that they can never be mistaken for
measurements. A work-list point's timer is also given ``schedule=`` (a timer that takes no such keyword times
split-count points only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from splitlab.devices import DeviceSpec
from splitlab.workloads import DecodeWorkload

if TYPE_CHECKING:
    from splitlab.planners.schedule import Schedule

QUANTILES = (0.2, 0.5, 0.8)


@dataclass(frozen=True)
class Timing:
    """Quantiles of one timed callable, in microseconds; ``n_samples`` timed runs (0: not measured)."""

    p20_us: float
    p50_us: float
    p80_us: float
    method: str = "events+l2flush"
    n_samples: int | None = None


def quantiles(samples: Sequence[float], qs: Sequence[float] = QUANTILES) -> list[float]:
    """Linear-interpolation quantiles of ``samples`` (as ``torch.quantile`` and numpy's default)."""
    xs = sorted(samples)
    if not xs:
        raise ValueError("no samples")
    out = []
    for q in qs:
        pos = q * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        out.append(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))
    return out


def time_events(fn: Callable[[], object], *, warmup_ms: float = 10, rep_ms: float = 50) -> Timing:
    """Time ``fn`` with ``triton.testing.do_bench`` (L2 flushed before each run, CUDA events)."""
    import triton

    samples = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
    p20, p50, p80 = quantiles(samples)
    return Timing(p20 * 1e3, p50 * 1e3, p80 * 1e3, n_samples=len(samples))


def rotations(read_bytes: int, l2_bytes: int, *, factor: int = 3, most: int = 64) -> int:
    """How many input sets to rotate through so that one pass touches ``factor`` times the L2, for calls that
    each read ``read_bytes`` of their set (at least two, so that back-to-back calls never share inputs; at most
    ``most``).

    Size it by the bytes a call reads, not by its set: sparse MLA's set is a 65536-token pool (67-75 MB) of which
    a call gathers its top-k rows (0.5-2 MB a token), so three sets of the pool rotate those rows through a
    fraction of the L2, and one graph replay's launch cost is shared by three calls instead of tens. On the H200,
    1-32 tokens timed over 3 sets ran 3-10% slower than over 12-64 at the planner's candidates (the shared
    launch), and long serial streams at 1-2 splits up to 1.33x faster (their rows came from L2) (``BENCHMARKS.md``,
    "Rotating by the bytes a call reads")."""
    need = -(-factor * l2_bytes // max(read_bytes, 1))
    return max(2, min(most, need))


def time_graph(calls: list[Callable[[], object]], *, replays: int = 30, warmup: int = 3,
               behind_us: float = 0.0) -> Timing:
    """Capture ``calls`` (one full decode each, on rotated input sets) into one CUDA graph and time its
    replays with CUDA events; each sample is one replay's time over ``len(calls)``. No host overhead
    and no L2 reuse between consecutive calls (the sets are sized by ``rotations``).

    Each sample starts on an idle stream, so it holds the replay launch's latency from the host (a few
    microseconds, shared by the calls). ``behind_us``: each replay queued behind a GPU spin of at least that long
    (``torch.cuda._sleep``), started before the first event, so that the host has launched the replay before the
    GPU reaches it: the replay's time on the GPU alone (the timelines' collection compares the two)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm outside the capture
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(warmup):
        graph.replay()
    spin = int(behind_us * _spin_cycles_per_us()) if behind_us > 0 else 0
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if spin:
            torch.cuda._sleep(spin)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    q = quantiles(samples)
    return Timing(q[0], q[1], q[2], method=f"cuda-graph x{len(calls)} rotated" + (" behind a spin" if spin else ""),
                  n_samples=len(samples))


_cycles_per_us: float | None = None


def _spin_cycles_per_us() -> float:
    """``torch.cuda._sleep``'s cycles a microsecond on this GPU, measured once (a 200K-cycle spin between events)."""
    global _cycles_per_us
    if _cycles_per_us is None:
        import torch

        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(200_000)  # warm
        a.record()
        torch.cuda._sleep(200_000)
        b.record()
        b.synchronize()
        _cycles_per_us = 200_000 / max(a.elapsed_time(b) * 1e3, 1e-3)
    return _cycles_per_us


# --- timers for the sweep harness ------------------------------------------------------------------------

#: ``calls(n)``: ``n`` zero-argument callables, one full decode each, on ``n`` distinct input sets.
CallsFactory = Callable[[int], list[Callable[[], object]]]


class Timer(Protocol):
    """What the sweep runner asks of a timer. ``name`` goes to the ``timing`` column."""

    name: str

    def measure(self, calls: CallsFactory, *, set_bytes: int, workload: DecodeWorkload,
                num_splits: int | None, schedule: Schedule | None = None) -> Timing:
        """Time one configuration; ``set_bytes`` is the size of one input set; ``schedule``: a work-list point's
        (passed only for those)."""
        ...


class GraphTimer:
    """CUDA-graph replay over input sets rotated until the bytes the calls read reach ``factor`` times the L2
    (``rotations``), with as many sets as fit in ``mem_fraction`` of the free GPU memory (at least one: a set
    much larger than the L2 barely reuses it anyway)."""

    name = "graph"

    def __init__(self, *, replays: int = 30, warmup: int = 3, factor: int = 3, mem_fraction: float = 0.4,
                 l2_bytes: int | None = None) -> None:
        import torch

        self.replays, self.warmup, self.factor, self.mem_fraction = replays, warmup, factor, mem_fraction
        self.l2_bytes = l2_bytes if l2_bytes is not None else torch.cuda.get_device_properties(
            torch.cuda.current_device()).L2_cache_size
        self._sets: dict[tuple[int, int], int] = {}

    def sets_for(self, set_bytes: int, read_bytes: int | None = None) -> int:
        """Input sets to rotate through for calls that each read ``read_bytes`` (default: the whole set) of a set
        of ``set_bytes`` (``rotations``; as many as fit in ``mem_fraction`` of the free memory), decided once per
        pair so that every point of a shape is timed over the same rotation."""
        import torch

        read = set_bytes if read_bytes is None else min(set_bytes, read_bytes)
        if (set_bytes, read) not in self._sets:
            n = rotations(read, self.l2_bytes, factor=self.factor)
            free, _ = torch.cuda.mem_get_info()
            self._sets[set_bytes, read] = max(1, min(n, int(free * self.mem_fraction) // max(set_bytes, 1) + 1))
        return self._sets[set_bytes, read]

    def measure(self, calls: CallsFactory, *, set_bytes: int, workload: DecodeWorkload,
                num_splits: int | None, schedule: Schedule | None = None) -> Timing:
        n = self.sets_for(set_bytes, workload.kv_bytes)
        return time_graph(calls(n), replays=self.replays, warmup=self.warmup)


class EventTimer:
    """``time_events``: each run alone, the L2 flushed before it, timed by CUDA events."""

    name = "events"

    def __init__(self, *, warmup_ms: float = 10, rep_ms: float = 50) -> None:
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms

    def measure(self, calls: CallsFactory, *, set_bytes: int, workload: DecodeWorkload,
                num_splits: int | None, schedule: Schedule | None = None) -> Timing:
        return time_events(calls(1)[0], warmup_ms=self.warmup_ms, rep_ms=self.rep_ms)


class FakeTimer:
    """Deterministic modelled figures for CI: NOT measurements. Nothing is run (the check before it is
    real). ``p50 = LAUNCH_US + T(s) * bytes of one key / (HBM bandwidth per SM)``, with ``T(s)`` splitlab's
    first, unfitted wave-cost model (``planners.splitlab.modelled_cost``) in keys streamed by one CTA; a work-list
    point's ``T`` is its schedule's ``planners.schedulers.modelled_time`` (key tiles of one CTA, under the fitted
    constants for the device) times the tile's keys; p20/p80 are p50 -/+ 2 %; ``n_samples`` is 0 and the method
    says ``fake``."""

    name = "fake"
    LAUNCH_US = 5.0

    def __init__(self, device: DeviceSpec) -> None:
        self.device = device

    def modelled_us(self, w: DecodeWorkload, num_splits: int | None, schedule: Schedule | None = None) -> float:
        """The fake p50 for ``w`` at ``num_splits`` (1 when the implementation has no split knob), or running
        ``schedule``."""
        from splitlab.planners.splitlab import modelled_cost

        if schedule is not None:
            from splitlab.planners import schedulers
            from splitlab.planners.splitlab import TILE_KEYS, constants_for

            c = constants_for(self.device, w.kind).constants
            cost = TILE_KEYS * schedulers.modelled_time(schedule, w, self.device.sm_count, c, self.device.arch)
        else:
            cost = modelled_cost(w, num_splits or 1, self.device.sm_count)
        per_sm_bytes_per_us = max(self.device.hbm_gbps, 1.0) * 1e3 / self.device.sm_count
        return self.LAUNCH_US + cost * w.key_bytes / per_sm_bytes_per_us

    def measure(self, calls: CallsFactory, *, set_bytes: int, workload: DecodeWorkload,
                num_splits: int | None, schedule: Schedule | None = None) -> Timing:
        p50 = self.modelled_us(workload, num_splits, schedule)
        model = "planners.splitlab" if schedule is None else "planners.schedulers"
        return Timing(0.98 * p50, p50, 1.02 * p50, method=f"fake: modelled ({model}), not measured", n_samples=0)


TIMERS = ("graph", "events", "fake")


def make_timer(name: str, device: DeviceSpec) -> Timer:
    """The timer called ``name`` (``graph`` and ``events`` need a GPU; ``fake`` plans for ``device``)."""
    if name == "fake":
        return FakeTimer(device)
    if name == "events":
        return EventTimer()
    if name == "graph":
        return GraphTimer()
    from splitlab.errors import bad

    raise bad("timer", name, "one of " + ", ".join(TIMERS))
