"""GPU timing: the median (and p20/p80) of many L2-flushed runs, by CUDA events.

``triton.testing.do_bench`` zeroes a buffer larger than the L2 before every timed run, so each run reads
its inputs from HBM, and times the run alone with CUDA events. The callable must enqueue everything that
is being timed (for split-K: the partial kernel and the combine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Quantiles of one timed callable, in microseconds."""

    p20_us: float
    p50_us: float
    p80_us: float
    method: str = "events+l2flush"


def time_events(fn: Callable[[], object], *, warmup_ms: float = 10, rep_ms: float = 50) -> Timing:
    """Time ``fn`` with ``triton.testing.do_bench`` (L2 flushed before each run, CUDA events)."""
    import triton

    p20, p50, p80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.2, 0.5, 0.8])
    return Timing(p20 * 1e3, p50 * 1e3, p80 * 1e3)


def rotations(set_bytes: int, l2_bytes: int, *, factor: int = 3, most: int = 64) -> int:
    """How many input sets to rotate through so that one pass touches ``factor`` times the L2 (at least
    two, so that back-to-back calls never share inputs)."""
    need = -(-factor * l2_bytes // max(set_bytes, 1))
    return max(2, min(most, need))


def time_graph(calls: list[Callable[[], object]], *, replays: int = 30, warmup: int = 3) -> Timing:
    """Capture ``calls`` (one full decode each, on rotated input sets) into one CUDA graph and time its
    replays with CUDA events; each sample is one replay's time over ``len(calls)``. No host overhead
    and no L2 reuse between consecutive calls (the sets are sized by ``rotations``)."""
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
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    q = torch.tensor(samples).quantile(torch.tensor([0.2, 0.5, 0.8])).tolist()
    return Timing(q[0], q[1], q[2], method=f"cuda-graph x{len(calls)} rotated")
