"""Implementations under study, behind one interface the sweep runner drives.

A kernel card names an implementation by import path. ``type = "kernel"`` wraps a splitlab-style launcher
(``fn(**inputs, [head_dim_v=...], **knobs)``, its fp64 reference with the same signature, and its
``*_launch_facts``) in ``KernelImpl``; ``type = "external"`` names an object that already speaks ``Impl``
(``splitlab.bench.peers`` holds PyTorch's SDPA and FlexAttention that way).

Schedules. A launcher with a work-list twin (``WORKLIST_LAUNCHERS``: every family's) also takes the knobs
``SCHEDULE_KNOBS``: ``scheduler`` (a name of ``planners.schedulers.NAMES`` the kind allows, ``scheduler_names``) and
``sched_ctas`` (the CTA count ``balanced`` and ``stream_k`` deal over). A point with ``scheduler`` set runs
``schedulers.schedule(w, device, scheduler, num_splits=, ctas=)`` on the work-list launcher (``num_splits`` is
``uniform``'s split count; the other schedulers take none); its launch facts carry the schedule (``"schedule"``)
and what a row records of it (``SCHEDULE_COLUMNS``), and ``ctas`` is the schedule's slots times the head groups.

Timelines. Where the work-list launcher takes ``timelines=`` (``kernels.timeline``: GQA's and MLA's, not sparse
MLA's yet), ``KernelImpl.records_timelines`` is True and ``KernelImpl.timeline`` runs a work-list point once more
with the timeline on and returns its per-program records (``splitlab sweep --timelines``, ``bench.worker``).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, Protocol

from splitlab import families
from splitlab.devices import DeviceSpec
from splitlab.errors import SplitlabError
from splitlab.workloads import DecodeWorkload

#: Knobs a card may declare; each is a result column (``LaunchFacts`` has the same fields).
KNOB_COLUMNS = ("num_splits", "block_n", "block_k", "block_h", "num_warps", "num_stages")
#: Launch facts recorded for every point (``None`` where an implementation has no such notion).
FACT_COLUMNS = (*KNOB_COLUMNS, "ctas")
#: Knobs of a work-list launch (see the module docstring): a string (``scheduler``) and an integer (``sched_ctas``).
SCHEDULE_KNOBS = ("scheduler", "sched_ctas")
#: What a row records of a point's schedule (empty / None for a split-count point): the scheduler asked for, the
#: schedule's hash (``Schedule.digest``), its CTA slots, items, partial rows and the busiest slot's keys.
SCHEDULE_COLUMNS = ("scheduler", "schedule_hash", "sched_ctas", "sched_items", "partial_rows", "busiest_keys")
#: splitlab's launchers that have a work-list twin: launcher -> the twin, import paths (the families' records,
#: ``families.Family.worklist``).
WORKLIST_LAUNCHERS = {f.launcher: f.worklist for f in families.ALL if f.worklist is not None}


def scheduler_names(kind: str) -> tuple[str, ...]:
    """The schedulers (``planners.schedulers.NAMES``) that plan workloads of ``kind`` (``schedulers.names_for``:
    ``flashinfer`` is GQA's, ``flashmla`` MLA's; sparse MLA takes splitlab's own four)."""
    from splitlab.planners.schedulers import names_for

    return names_for(kind)


class Impl(Protocol):
    """One implementation: what the runner needs to check it against the reference and time it.

    ``knobs``: the keyword arguments it takes as tuning knobs. ``unavailable()``: a reason it cannot run
    here (the points are then ``skipped``), else None. ``launch_facts``: the resolved knobs and CTAs of a
    call (no launch; None when it has no such notion). ``inputs``: one random input set for a workload.
    ``reference``: the fp64 reference output for those inputs. ``call``: a zero-argument callable that runs
    one full decode on an input set and returns the output.
    """

    knobs: tuple[str, ...]

    def unavailable(self) -> str | None: ...

    def launch_facts(self, w: DecodeWorkload, knobs: dict[str, int], device: DeviceSpec) -> dict | None: ...

    def inputs(self, w: DecodeWorkload, *, device: Any, seed: int) -> dict: ...

    def reference(self, w: DecodeWorkload, inputs: dict) -> Any: ...

    def call(self, w: DecodeWorkload, inputs: dict, knobs: dict[str, int]) -> Callable[[], Any]: ...


def resolve(path: str) -> Any:
    """Import ``"package.module:attribute"`` (``SplitlabError`` naming the path when that fails)."""
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise SplitlabError(f"import path {path!r} is not allowed; expected 'package.module:attribute'")
    mod_name, attr = path.split(":")
    try:
        obj = importlib.import_module(mod_name)
    except Exception as e:
        raise SplitlabError(f"import path {path!r} cannot be imported: {type(e).__name__}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SplitlabError(f"import path {path!r} cannot be imported: {mod_name} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def keyword_params(fn: Callable) -> set[str]:
    """Names ``fn`` accepts as keywords."""
    return {p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


class KernelImpl:
    """A splitlab-style launcher, its fp64 reference and its launch facts (see the module docstring).

    Inputs are ``splitlab.kernels.inputs.workload_inputs`` (values drawn on the GPU when there is one); the
    MLA kinds also get ``head_dim_v=w.head_dim_v`` when the launcher takes it.
    """

    def __init__(self, fn: Callable, reference: Callable, launch_facts: Callable,
                 worklist: Callable | None = None) -> None:
        self.fn, self.ref_fn, self.facts_fn = fn, reference, launch_facts
        params = keyword_params(fn) & keyword_params(launch_facts)
        self.knobs = tuple(k for k in KNOB_COLUMNS if k in params)
        self.takes_head_dim_v = "head_dim_v" in keyword_params(fn)
        #: The work-list launcher (``kernels.worklist``): given, or ``fn``'s twin (``WORKLIST_LAUNCHERS``).
        self.worklist_fn = worklist if worklist is not None else _family_worklist(fn)
        if self.worklist_fn is not None:
            self.knobs += SCHEDULE_KNOBS
        #: Whether a work-list point can record its per-program timeline (the launcher takes ``timelines=``).
        self.records_timelines = self.worklist_fn is not None and "timelines" in keyword_params(self.worklist_fn)

    def unavailable(self) -> str | None:
        import os

        import torch

        if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
            return None
        return "needs a CUDA GPU or Triton's interpreter (TRITON_INTERPRET=1 set before import)"

    def launch_facts(self, w: DecodeWorkload, knobs: dict[str, int], device: DeviceSpec) -> dict:
        if knobs.get("scheduler") or "sched_ctas" in knobs:
            return self._schedule_facts(w, knobs, device)
        f = self.facts_fn(w, **knobs, device=device)
        return {k: getattr(f, k, None) for k in FACT_COLUMNS}

    def _schedule_facts(self, w: DecodeWorkload, knobs: dict, device: DeviceSpec) -> dict:
        """A work-list point's facts: the tiles resolved as the split-count launch resolves them, ``num_splits``
        (``uniform``'s count, else None), ``ctas`` = the schedule's slots x head groups, ``SCHEDULE_COLUMNS``, and
        the schedule itself (``"schedule"``: what the point runs)."""
        from splitlab.planners import schedulers

        name = knobs.get("scheduler")
        if not name:
            raise SplitlabError(f"sched_ctas={knobs.get('sched_ctas')!r} is not allowed without a scheduler; "
                                "expected it with scheduler balanced or stream_k")
        allowed = scheduler_names(w.kind)
        if name not in allowed:
            raise SplitlabError(f"scheduler={name!r} is not allowed for kind {w.kind}; expected one of "
                                f"{', '.join(allowed) or 'none (no work-list kernel)'}")
        if self.worklist_fn is None:
            raise SplitlabError(f"scheduler={name!r} is not allowed: {getattr(self.fn, '__name__', self.fn)} has no "
                                "work-list launcher; expected a split-count point (no scheduler)")
        s = schedulers.schedule(w, device, name, num_splits=knobs.get("num_splits"), ctas=knobs.get("sched_ctas"))
        tiles = {k: v for k, v in knobs.items() if k not in (*SCHEDULE_KNOBS, "num_splits")}
        f = self.facts_fn(w, num_splits=1, **tiles, device=device)  # the tiles, resolved; one split: the groups
        facts = {k: getattr(f, k, None) for k in FACT_COLUMNS}
        groups = f.ctas // w.batch
        page, bn = w.page_size, facts.get("block_n")
        if bn and page % bn == 0 and s.align % bn:
            raise SplitlabError(f"block_n={bn} is not allowed with scheduler {name!r}: its items start at multiples "
                                f"of {s.align} keys; expected a block_n dividing {s.align}")
        facts.update(num_splits=s.params.get("num_splits") if s.scheduler == "uniform" else None,
                     ctas=s.ctas * groups, scheduler=name, schedule_hash=s.digest, sched_ctas=s.ctas,
                     sched_items=len(s.items), partial_rows=s.partial_rows, busiest_keys=max(s.cta_keys, default=0),
                     schedule=s)
        return facts

    def with_schedule(self, schedule: Any, knobs: dict, device: Any) -> dict:
        """The knobs a work-list point's calls take: its tiles and the schedule's ``WorkList`` on ``device``, built
        once per point (every timed call shares it)."""
        from splitlab.kernels.worklist import WorkList

        tiles = {k: v for k, v in knobs.items() if k not in (*SCHEDULE_KNOBS, "num_splits")}
        return {**tiles, "work": WorkList.from_schedule(schedule, device)}

    def _extra(self, w: DecodeWorkload) -> dict:
        return {"head_dim_v": w.head_dim_v} if self.takes_head_dim_v and w.kind != "gqa" else {}

    def inputs(self, w: DecodeWorkload, *, device: Any, seed: int) -> dict:
        from splitlab.kernels.inputs import workload_inputs

        return workload_inputs(w, device=device, seed=seed, draw_on="device")

    def reference(self, w: DecodeWorkload, inputs: dict) -> Any:
        return self.ref_fn(**inputs, **self._extra(w))

    def call(self, w: DecodeWorkload, inputs: dict, knobs: dict[str, int]) -> Callable[[], Any]:
        extra = self._extra(w)
        fn = self.fn
        if "work" in knobs:  # a work-list point (``with_schedule``): the schedule says how long each request is
            fn, inputs = self.worklist_fn, {k: v for k, v in inputs.items() if k != "seq_lens"}

        def run():
            return fn(**inputs, **extra, **knobs)

        return run


    def timeline(self, w: DecodeWorkload, inputs: dict, knobs: dict, *, warm: bool) -> dict | None:
        """One launch of a work-list point (``knobs`` holding its ``work``, ``with_schedule``) with the timeline on:
        ``{"fields": kernels.timeline.FIELDS, <kernel>: [[a record's fields], ...] for each kernel launched}``
        (``Timelines.read``, each record a list in ``fields`` order), or None where nothing can record (a split-count
        point, a launcher without ``timelines=``). ``warm``: launch it once before (its compile and first-launch
        costs out of the recorded one; the buffers are reused)."""
        if "work" not in knobs or not self.records_timelines:
            return None
        from splitlab.kernels.timeline import FIELDS, Timelines

        t = Timelines()
        call = self.call(w, inputs, {**knobs, "timelines": t})
        if warm:
            call()
        t.reset()
        call()
        return {"fields": list(FIELDS), **{k: [[r[f] for f in FIELDS] for r in recs]
                                           for k, recs in t.read().items()}}


def _family_worklist(fn: Callable) -> Callable | None:
    """The work-list launcher of splitlab's kernel ``fn`` (``WORKLIST_LAUNCHERS``), else None."""
    path = WORKLIST_LAUNCHERS.get(f"{getattr(fn, '__module__', '')}:{getattr(fn, '__qualname__', '')}")
    return None if path is None else resolve(path)
