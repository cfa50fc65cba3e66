"""A schedule: what a planner hands a work-list kernel for one decode batch.

A batch's decode is a list of *work items* ``(cta, request, key_begin, key_end)``: the CTA slot ``cta`` streams
request ``request``'s keys ``[key_begin, key_end)`` (token positions, end exclusive) and, where the request has
more than one item, writes one partial row that the merge combines. A CTA slot is one program of the launch per
head group (GQA's kv heads, MLA's head tiles multiply it); in a *persistent* schedule a slot runs several items in
order, otherwise one. The split count of earlier rules is one scheduler among several (``uniform``: every request
in ``num_splits`` equal, tile-aligned chunks); the others live in ``splitlab.planners.schedulers``.

Rules every schedule keeps (``Schedule.check``):

* every key of every request is covered exactly once, by items in ascending key order;
* a request without keys has exactly one item, empty (``key_begin == key_end == 0``): the kernel writes its
  output row (zeros, lse ``-inf``) as the launchers always have;
* every other item is non-empty, and every item's ``key_begin`` is a multiple of ``align`` (the key tile the
  scheduler worked in), so a kernel whose tiles never cross a page can take it;
* CTA slots are ``0 .. ctas - 1`` and the items of one slot are consecutive in ``items``; a non-persistent
  schedule runs exactly one item per slot, a persistent one any number (a slot without items exits at once, as
  FlashMLA's trailing SM parts do).

Partial rows: a request with ``n > 1`` items owns ``n`` consecutive rows of the partial buffer, in its items'
key order (``partial_offsets``); a request with one item writes its output directly (``item_rows`` gives -1).

Pure Python (no torch): the kernels' launchers turn a schedule into device tensors (``kernels.worklist``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from splitlab.errors import SplitlabError

#: An item: (cta slot, request, first key, end key), keys as token positions, end exclusive.
Item = tuple[int, int, int, int]


@dataclass(frozen=True)
class Schedule:
    """One batch's work items (see the module docstring). Build with ``make`` (which checks), or construct and call
    ``check``. ``params`` records the scheduler's parameters (split count, chunk, CTA count) for a sweep's row."""

    scheduler: str
    lengths: tuple[int, ...]
    ctas: int
    items: tuple[Item, ...]
    persistent: bool = False
    align: int = 1
    params: dict = field(default_factory=dict, compare=False)

    # --- derived -------------------------------------------------------------------------------------------
    @property
    def batch(self) -> int:
        return len(self.lengths)

    @cached_property
    def partials(self) -> tuple[int, ...]:
        """Items per request (its split count)."""
        n = [0] * self.batch
        for _, r, _, _ in self.items:
            n[r] += 1
        return tuple(n)

    @cached_property
    def partial_offsets(self) -> tuple[int, ...]:
        """CSR offsets (length ``batch + 1``) of each request's partial rows: a request with one item has none."""
        out = [0]
        for n in self.partials:
            out.append(out[-1] + (n if n > 1 else 0))
        return tuple(out)

    @property
    def partial_rows(self) -> int:
        """Rows of the partial buffer (the items of split requests)."""
        return self.partial_offsets[-1]

    @cached_property
    def item_rows(self) -> tuple[int, ...]:
        """Per item (in ``items`` order), its partial row, or -1 where its request has one item (direct write).
        A request's rows follow its items' key order."""
        by_req: dict[int, list[tuple[int, int]]] = {}
        for i, (_, r, b, _) in enumerate(self.items):
            by_req.setdefault(r, []).append((b, i))
        rows = [-1] * len(self.items)
        offs = self.partial_offsets
        for r, its in by_req.items():
            if len(its) > 1:
                for k, (_, i) in enumerate(sorted(its)):
                    rows[i] = offs[r] + k
        return tuple(rows)

    @cached_property
    def cta_offsets(self) -> tuple[int, ...]:
        """CSR offsets (length ``ctas + 1``) of each slot's items in ``items``."""
        out = [0] * (self.ctas + 1)
        for c, _, _, _ in self.items:
            out[c + 1] += 1
        for c in range(self.ctas):
            out[c + 1] += out[c]
        return tuple(out)

    @cached_property
    def cta_keys(self) -> tuple[int, ...]:
        """Keys each slot streams."""
        keys = [0] * self.ctas
        for c, _, b, e in self.items:
            keys[c] += e - b
        return tuple(keys)

    def cta_tiles(self, tile: int) -> tuple[int, ...]:
        """Key tiles of ``tile`` keys each slot streams (an item's partial tile counts whole; an empty item one)."""
        t = [0] * self.ctas
        for c, _, b, e in self.items:
            t[c] += max(1, -(-(e - b) // tile))
        return tuple(t)

    def summary(self) -> dict:
        """What a sweep row records of the schedule: its hash, slots, items, partial rows, the busiest slot's keys
        and items."""
        per_cta = [self.cta_offsets[c + 1] - self.cta_offsets[c] for c in range(self.ctas)]
        return dict(scheduler=self.scheduler, schedule_hash=self.digest, ctas=self.ctas, items=len(self.items),
                    partial_rows=self.partial_rows, max_partials=max(self.partials, default=0),
                    busiest_keys=max(self.cta_keys, default=0), max_items_per_cta=max(per_cta, default=0),
                    persistent=self.persistent)

    @cached_property
    def digest(self) -> str:
        """A short hash of what runs (lengths, slots, items): equal schedules hash equal, whatever made them."""
        blob = json.dumps([self.lengths, self.ctas, self.persistent, self.items], separators=(",", ":"))
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        """The ``splitlab schedule --json`` object."""
        return dict(self.summary(), seq_lens=list(self.lengths), params=dict(self.params),
                    items=[list(it) for it in self.items], partials=list(self.partials))

    # --- the rules ---------------------------------------------------------------------------------------------
    def check(self) -> Schedule:
        """Raise one ``SplitlabError`` naming the first broken rule (module docstring); return self."""
        name = f"schedule {self.scheduler!r}"
        if not self.lengths:
            raise SplitlabError(f"{name}: no requests; expected at least one")
        if any((not isinstance(n, int)) or isinstance(n, bool) or n < 0 for n in self.lengths):
            raise SplitlabError(f"{name}: lengths {self.lengths[:8]}... must be integers >= 0")
        if not isinstance(self.ctas, int) or self.ctas < 1:
            raise SplitlabError(f"{name}: ctas={self.ctas!r}; expected an integer >= 1")
        if self.align < 1:
            raise SplitlabError(f"{name}: align={self.align}; expected >= 1")
        seen_cta = -1
        used = [False] * self.ctas
        covered: list[list[tuple[int, int]]] = [[] for _ in self.lengths]
        for it in self.items:
            if len(it) != 4:
                raise SplitlabError(f"{name}: item {it!r} is not (cta, request, key_begin, key_end)")
            c, r, b, e = it
            if not 0 <= c < self.ctas:
                raise SplitlabError(f"{name}: item {it} runs on cta {c}; expected 0..{self.ctas - 1}")
            if c < seen_cta:
                raise SplitlabError(f"{name}: item {it} comes after an item of cta {seen_cta}; expected each "
                                    "cta's items together, in cta order")
            if c == seen_cta and not self.persistent:
                raise SplitlabError(f"{name}: cta {c} runs two items; a non-persistent schedule runs one a cta")
            seen_cta = c
            used[c] = True
            if not 0 <= r < self.batch:
                raise SplitlabError(f"{name}: item {it} names request {r}; the batch has {self.batch}")
            n = self.lengths[r]
            if n == 0:
                if (b, e) != (0, 0):
                    raise SplitlabError(f"{name}: item {it} of an empty request; expected keys [0, 0)")
            elif not 0 <= b < e <= n:
                raise SplitlabError(f"{name}: item {it} reads keys [{b}, {e}) of request {r} ({n} keys); "
                                    "expected a non-empty range inside them")
            if b % self.align:
                raise SplitlabError(f"{name}: item {it} starts at key {b}, not a multiple of align={self.align}")
            covered[r].append((b, e))
        if not self.persistent and not all(used):
            raise SplitlabError(f"{name}: cta {used.index(False)} runs no item; expected one item a cta")
        for r, spans in enumerate(covered):
            n = self.lengths[r]
            if n == 0:
                if len(spans) != 1:
                    raise SplitlabError(f"{name}: empty request {r} has {len(spans)} items; expected exactly one")
                continue
            pos = 0
            for b, e in sorted(spans):
                if b != pos:
                    what = "reads twice" if b < pos else "leaves out"
                    raise SplitlabError(f"{name}: request {r} {what} keys from {min(b, pos)}; expected every key "
                                        "covered exactly once")
                pos = e
            if pos != n:
                raise SplitlabError(f"{name}: request {r} covers keys [0, {pos}) of {n}; expected all")
        return self


def make(scheduler: str, lengths: Sequence[int], items: Iterable[Item], *, persistent: bool = False,
         align: int = 1, ctas: int | None = None, **params: object) -> Schedule:
    """A checked ``Schedule``: ``items`` sorted by slot (stable: each slot's items keep the order given); ``ctas``
    defaults to the highest slot + 1. A non-persistent schedule's items need not name slots: pass ``cta=-1`` and they
    are numbered in the order given."""
    its = list(items)
    if not persistent and any(c < 0 for c, *_ in its):
        its = [(i, r, b, e) for i, (_, r, b, e) in enumerate(its)]
    its.sort(key=lambda it: it[0])
    n_ctas = ctas if ctas is not None else (max(c for c, *_ in its) + 1 if its else 0)
    return Schedule(scheduler, tuple(int(n) for n in lengths), n_ctas, tuple(its), persistent, align,
                    dict(params)).check()


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """``[0, n)`` in consecutive chunks of ``size`` keys (the last shorter); ``[(0, 0)]`` for ``n == 0``."""
    if n == 0:
        return [(0, 0)]
    return [(b, min(b + size, n)) for b in range(0, n, size)]
