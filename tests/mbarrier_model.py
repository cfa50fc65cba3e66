"""A CPU model of the warp-specialized Gluon kernels' mbarrier protocols, shared by their scope tests
(``test_mla_ws_scope``, ``test_mqa_ws_scope``): ``Bar`` (an mbarrier's phases), ``Memory`` (the buffers' contents,
each read checked) and ``interleave`` (the partitions, as generators, and the TMA copies in flight, run in a random
order until all finish or none can move: a deadlock)."""

from __future__ import annotations

import random


class Bar:
    """An mbarrier: ``count`` arrivals complete a phase; ``wait(parity)`` passes once the phase of that parity
    before the current one has completed (PTX ``mbarrier.try_wait.parity``; a fresh barrier passes parity 1). A TMA
    barrier's one arrival is its copy landing (``expect`` counts bytes, the copy's landing completes the phase)."""

    def __init__(self, count: int) -> None:
        self.count, self.arrived, self.phases = count, 0, 0

    def arrive(self) -> None:
        self.arrived += 1
        if self.arrived == self.count:
            self.arrived, self.phases = 0, self.phases + 1

    def passed(self, parity: int) -> bool:
        return (self.phases & 1) != parity


class Memory(dict):
    """Shared-memory buffers' contents by name; ``read(buf, want)`` asserts that ``buf`` holds ``want`` and records it
    in ``checked`` (the reads a model made, in order)."""

    def __init__(self, *buffers: str) -> None:
        super().__init__(dict.fromkeys(buffers))
        self.checked: list = []

    def read(self, buf: str, want: object) -> None:
        assert self[buf] == want, f"{buf} holds {self[buf]}, expected {want}"
        self.checked.append(want)


def interleave(parts: dict, bars: dict[str, Bar], mem: dict, landing: list, rng: random.Random) -> None:
    """Run the partitions ``parts`` (generators yielding ``("step",)`` or ``("wait", barrier, parity)``) and the copies
    in ``landing`` (``(contents by buffer, barrier)``, landing in any order: their contents into ``mem``, then one
    arrival) in an order drawn from ``rng``, until every partition has finished and every copy landed; a state where
    nothing can move is a deadlock (AssertionError)."""
    want = {name: ("step",) for name in parts}
    while parts or landing:
        ready = [p for p in parts if want[p][0] == "step" or bars[want[p][1]].passed(want[p][2])]
        assert ready or landing, f"deadlock: {want}"
        pick = rng.randrange(len(ready) + len(landing))
        if pick >= len(ready):
            contents, bar = landing.pop(pick - len(ready))
            mem.update(contents)
            bars[bar].arrive()
            continue
        try:
            want[ready[pick]] = next(parts[ready[pick]])
        except StopIteration:
            del parts[ready[pick]], want[ready[pick]]
