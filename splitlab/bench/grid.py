"""Grid expansion: a card's named grid -> the points to measure.

For every shape of every block: the product of the block's knob axes (knobs it leaves out take the kernel's
defaults), then every registered planner's choice that covers the kind (the plan fields the card's
``[planners] knobs`` names; the rest at the kernel's defaults). Each candidate is resolved to explicit knobs
through the implementation's launch facts (no launch), so a grid point and a planner's choice that launch
the same configuration are one point, measured once, with every planner that picked it recorded in
``Point.planners``. A planner that refuses a shape (``SplitlabError``) is recorded in ``Expansion.notes``.

``point_id`` is a hash of what is measured (kernel, implementation, workload, resolved knobs), not of the
sweep, so that a resumed sweep and the regret join across sweeps find the same point again.

A block with a ``scheduler`` axis makes work-list points (``bench.impls``: the schedule a scheduler makes for the
shape): its ``num_splits`` axis goes to ``uniform`` only and its ``sched_ctas`` axis to ``balanced`` and
``stream_k`` only (the other schedulers take neither); their ids add the scheduler and the schedule's hash, so a
split-count point keeps the id it always had.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from splitlab import devices, planners
from splitlab.bench.cards import Block, Card
from splitlab.bench.impls import FACT_COLUMNS, SCHEDULE_COLUMNS
from splitlab.devices import DeviceSpec
from splitlab.errors import SplitlabError
from splitlab.planners.schedule import Schedule
from splitlab.waves import WaveStats, wave_fill_splits
from splitlab.workloads import DecodeWorkload, length_columns


def point_id(kernel: str, impl: str, w: DecodeWorkload, facts: dict) -> str:
    """Stable id of a measured configuration: sha1 of the canonical JSON of kernel, impl, the workload's
    fields (``length_dist`` and ``length_seed`` only where the batch is ragged) and the resolved launch knobs
    (16 hex digits)."""
    row = w.row()
    if not w.ragged:  # the fields ragged batches added: left out, so a uniform batch keeps the id it always had
        del row["length_dist"], row["length_seed"]
    key = {"kernel": kernel, "impl": impl, "workload": row,
           "knobs": {k: facts.get(k) for k in FACT_COLUMNS if k != "ctas"}}
    if facts.get("scheduler"):  # a work-list point: what runs is its schedule (absent: the id split counts had)
        key["schedule"] = {"scheduler": facts["scheduler"], "hash": facts.get("schedule_hash")}
    return hashlib.sha1(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


@dataclass
class Point:
    """One configuration to check and time: a workload, the knobs passed to the implementation, the
    resolved launch facts (``FACT_COLUMNS``; a work-list point's also ``SCHEDULE_COLUMNS``), who asked for it
    (``in_grid``; ``planners``) and, for a work-list point, the schedule it runs."""

    point_id: str
    kernel: str
    impl: str
    workload: DecodeWorkload
    knobs: dict[str, int]
    facts: dict[str, int | None]
    in_grid: bool = False
    planners: list[str] = field(default_factory=list)
    schedule: Schedule | None = field(default=None, repr=False, compare=False)

    def row(self, *, sm_count: int | None = None) -> dict:
        """The columns of this point that do not depend on running it."""
        w = self.workload
        ctas = self.facts.get("ctas")
        waves = WaveStats(ctas, sm_count).waves if ctas and sm_count else None
        return dict(point_id=self.point_id, kernel=self.kernel, impl=self.impl,
                    **{k: v for k, v in w.row().items() if k != "seq_lens"}, **length_columns(w),
                    **{k: self.facts.get(k) for k in FACT_COLUMNS}, waves=waves, kv_bytes=w.kv_bytes,
                    planners=",".join(self.planners), in_grid=self.in_grid,
                    **{k: self.facts.get(k) for k in SCHEDULE_COLUMNS if k != "scheduler"},
                    scheduler=self.facts.get("scheduler") or "")  # "": a split-count point


@dataclass
class Expansion:
    """The points of one grid, shape-major (all points of a shape are adjacent), and notes on planners
    that refused a shape or chose knobs outside the card's ranges."""

    card: str
    grid: str
    device: str
    points: list[Point]
    notes: list[dict]

    @property
    def shapes(self) -> int:
        return len({p.workload for p in self.points})

    def counts(self) -> dict[str, int]:
        """Points in total, from the grid, only from planners; and, per planner, the points it chose."""
        out = {"points": len(self.points), "shapes": self.shapes,
               "grid_points": sum(p.in_grid for p in self.points),
               "planner_only_points": sum(not p.in_grid for p in self.points)}
        for p in self.points:
            for name in p.planners:
                out[f"planner:{name}"] = out.get(f"planner:{name}", 0) + 1
        return out


def _split_ok(w: DecodeWorkload, s: int, min_keys: int) -> bool:
    return s == 1 or w.keys_per_request // s >= min_keys


def _block_candidates(block: Block, w: DecodeWorkload, dev: DeviceSpec) -> Iterable[dict[str, int]]:
    # The wave-filling split counts depend on the head tile (it sets the unsplit launch's CTAs), so they are
    # worked out per BLOCK_H value of the block.
    for block_h in block.knob_axes.get("block_h", (None,)):
        axes = {k: v for k, v in block.knob_axes.items()}
        if block_h is not None:
            axes["block_h"] = (block_h,)
        if block.wave_splits:
            axes["num_splits"] = tuple(sorted({*axes["num_splits"], *wave_fill_splits(
                w, dev.sm_count, block.wave_splits, block_h=block_h)}))
        if "num_splits" in axes:
            axes["num_splits"] = tuple(s for s in axes["num_splits"] if _split_ok(w, s, block.min_keys_per_split))
        names = list(axes)
        seen = []
        for combo in itertools.product(*(axes[k] for k in names)):
            given = dict(zip(names, combo, strict=True))
            if given.get("scheduler"):  # num_splits is uniform's, sched_ctas balanced's and stream_k's
                if given["scheduler"] != "uniform":
                    given.pop("num_splits", None)
                if given["scheduler"] not in ("balanced", "stream_k"):
                    given.pop("sched_ctas", None)
                if given in seen:
                    continue
                seen.append(given)
            yield given


def expand(card: Card, grid: str, device: DeviceSpec | str | None = None) -> Expansion:
    """Expand ``card``'s grid ``grid`` for ``device`` (a ``DeviceSpec`` or preset name; default: the card's
    device). Planners plan for ``device``; defaults that depend on the device (sparse MLA's BLOCK_K) are
    resolved for it."""
    blocks = card.grid(grid)
    dev = devices.get(device or card.device) if not isinstance(device, DeviceSpec) else device
    impl = card.impl
    by_shape: dict[DecodeWorkload, dict[str, Point]] = {}
    notes: list[dict] = []

    def add(w: DecodeWorkload, given: dict[str, int], *, planner: str | None, where: str) -> None:
        try:
            facts = impl.launch_facts(w, dict(given), dev)
        except SplitlabError as e:
            if planner is None:
                raise SplitlabError(f"{card.path}: {where}: {e}") from None
            notes.append(dict(planner=planner, workload=w.row(), note=f"its choice {given} is refused by the "
                              f"implementation: {e}"))
            return
        facts = dict(facts) if facts is not None else {k: None for k in FACT_COLUMNS}
        schedule = facts.pop("schedule", None)
        knobs = {k: facts[k] if facts.get(k) is not None else given[k] for k in card.knobs if
                 facts.get(k) is not None or k in given}
        pid = point_id(card.name, card.impl_label, w, facts)
        pts = by_shape.setdefault(w, {})
        p = pts.get(pid)
        if p is None:
            p = pts[pid] = Point(pid, card.name, card.impl_label, w, knobs, facts, schedule=schedule)
        if planner is None:
            p.in_grid = True
        elif planner not in p.planners:
            p.planners.append(planner)

    for block in blocks:
        for w in block.shapes:
            for given in _block_candidates(block, w, dev):
                add(w, given, planner=None, where=block.where)
            if not card.planner_knobs:  # an implementation without a split knob (the peers)
                continue
            for pdev_name in (None, *block.planner_devices):
                pdev = dev if pdev_name is None else devices.get(pdev_name)
                for name in planners.names(w.kind):
                    label = name if pdev_name is None else f"{name}@{pdev.name}"
                    try:
                        plan = planners.plan(w, pdev, name)
                    except SplitlabError as e:
                        notes.append(dict(planner=label, workload=w.row(), note=str(e)))
                        continue
                    given = {"num_splits": plan.num_splits}
                    for k in card.planner_knobs:
                        v = getattr(plan, k, None)
                        if k == "num_splits" or v is None:
                            continue
                        if card.knobs[k].allows(v):
                            given[k] = v
                        else:
                            notes.append(dict(planner=label, workload=w.row(), note=f"{k}={v} is outside "
                                              f"knobs.{k} ({card.knobs[k].describe()}); the kernel's default used"))
                    add(w, given, planner=label, where=block.where)
    points = [p for pts in by_shape.values() for p in pts.values()]
    return Expansion(card.name, grid, dev.name, points, notes)


def shard(points: list[Point], index: int, count: int) -> list[Point]:
    """The points of shard ``index`` of ``count`` (0-based): whole shapes, dealt round-robin in order."""
    shapes: dict[DecodeWorkload, int] = {}
    for p in points:
        shapes.setdefault(p.workload, len(shapes))
    return [p for p in points if shapes[p.workload] % count == index]
