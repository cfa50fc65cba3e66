"""Implementations under study, behind one interface the sweep runner drives.

A kernel card names an implementation by import path. ``type = "kernel"`` wraps a splitlab-style launcher
(``fn(**inputs, [head_dim_v=...], **knobs)``, its fp64 reference with the same signature, and its
``*_launch_facts``) in ``KernelImpl``; ``type = "external"`` names an object that already speaks ``Impl``
(``splitlab.bench.peers`` holds PyTorch's SDPA and FlexAttention that way).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, Protocol

from splitlab.devices import DeviceSpec
from splitlab.errors import SplitlabError
from splitlab.workloads import DecodeWorkload

#: Knobs a card may declare; each is a result column (``LaunchFacts`` has the same fields).
KNOB_COLUMNS = ("num_splits", "block_n", "block_k", "block_h", "num_warps", "num_stages")
#: Launch facts recorded for every point (``None`` where an implementation has no such notion).
FACT_COLUMNS = (*KNOB_COLUMNS, "ctas")


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

    def __init__(self, fn: Callable, reference: Callable, launch_facts: Callable) -> None:
        self.fn, self.ref_fn, self.facts_fn = fn, reference, launch_facts
        params = keyword_params(fn) & keyword_params(launch_facts)
        self.knobs = tuple(k for k in KNOB_COLUMNS if k in params)
        self.takes_head_dim_v = "head_dim_v" in keyword_params(fn)

    def unavailable(self) -> str | None:
        import os

        import torch

        if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
            return None
        return "needs a CUDA GPU or Triton's interpreter (TRITON_INTERPRET=1 set before import)"

    def launch_facts(self, w: DecodeWorkload, knobs: dict[str, int], device: DeviceSpec) -> dict:
        f = self.facts_fn(w, **knobs, device=device)
        return {k: getattr(f, k, None) for k in FACT_COLUMNS}

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

        def run():
            return fn(**inputs, **extra, **knobs)

        return run
