"""The default launchers' call as a thin use of a plan: ``gqa_decode`` / ``mla_decode`` with ``num_splits=None``
through a cached ``kernels.decode_plan`` plan whose schedule the GPU computes from ``seq_lens`` (no host sync).

The launchers' own default path reads ``seq_lens`` on the host, plans a split count in Python and launches the
split-count kernel: several times its kernels' time on an eager call, and refused under CUDA-graph capture. This path
keeps one plan per shape (``GQADecodePlan`` / ``MLADecodePlan``, scheduler ``splitlab``, ``use_cuda_graph=True``,
``device_schedule=True``, ``pdl=PDL``: the capacity grid, the splitlab scheduler's pricing on the device, the merge
by programmatic dependent launch) and runs ``plan_on_device(seq_lens, reuse=True)`` then ``run(...)``: a few
launches, nothing read back, capturable once a first call of the shape has made the plan outside the capture.
``reuse``: the schedule kernels compare the lengths with those of the schedule the plan holds and keep it where they
are equal, so the layers of a step after its first pay one load and a compare for their schedule
(``kernels.device_schedule``'s "Reuse"). What changes with it: the work-list kernels and the splitlab scheduler's
schedule run (the results agree with the split-count path within fp32 rounding), validation is off by default as
with an explicit ``num_splits`` (``validate=True`` / ``SPLITLAB_VALIDATE=1`` add the launchers' host
checks), and a length past the block table makes its request NaN instead of an error.

The launchers reach this module through ``_launch.planned_default`` (it imports the plans, whose kernels import the
launchers' modules; the package installs it there at import). Off by default (``VIA_PLAN`` None and
``SPLITLAB_DEFAULT_PLAN`` unset): which path is the default is decided by an
H200 timing of both (``experiments/plan_run``), as a kernel change is. ``SPLITLAB_DEFAULT_PLAN=1`` (or ``VIA_PLAN =
True``) turns it on.

The cache: at most ``CACHE_PLANS`` plans, least recently used dropped first, keyed by everything a plan fixes (the
family, heads, head dims, page size, dtypes, device, batch size, tile knobs, scales). A plan holds its capacity's
work-list and fp32 partial buffers (``decode_plan``'s default capacity on the H200: GQA 32/8/128 6-8 MiB at 1-64
requests, 32 MiB at 256; MLA-128 576/512 132 MiB at 1-64, 513 MiB at 256), so a server with many batch sizes
wants buckets, or its own plans.
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

import torch

from splitlab.errors import SplitlabError
from splitlab.kernels import _launch

#: None: ``SPLITLAB_DEFAULT_PLAN`` decides (``1`` on; ``0`` or unset off); True / False: on / off.
VIA_PLAN: bool | None = None
ENV = "SPLITLAB_DEFAULT_PLAN"
#: Plans kept, least recently used dropped first.
CACHE_PLANS = 4
#: The plans' merge by programmatic dependent launch (``decode_plan``'s ``pdl``; part of a plan's key). On: on an H100
#: it brought an eager ``run()`` from 1.30x to 1.086x its graph (GQA 32/8, 8 x 4K) and a serving-loop step -0.1 to
#: +2.5% (experiments/plan_run, experiments/serving_loop).
PDL = True

_plans: OrderedDict[tuple, object] = OrderedDict()
T = TypeVar("T")


def via_plan() -> bool:
    """Whether ``num_splits=None`` runs through a cached plan (``VIA_PLAN``, else ``SPLITLAB_DEFAULT_PLAN``)."""
    if VIA_PLAN is not None:
        return VIA_PLAN
    env = os.environ.get(ENV, "")
    if env not in ("", "0", "1"):
        raise SplitlabError(f"{ENV}={env!r} is not allowed; expected 1 (the default call through a plan), 0 or unset")
    return env == "1"


def with_plan(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` to be called with the default call through a plan (``VIA_PLAN`` on during the call, as it was after):
    for A/B runs that time both paths in one process (``experiments/plan_run``)."""
    def call() -> T:
        global VIA_PLAN
        was, VIA_PLAN = VIA_PLAN, True
        try:
            return fn()
        finally:
            VIA_PLAN = was

    return call


def _plan(key: tuple, what: str, q: torch.Tensor, make):
    """The cached plan of ``key``, made by ``make()`` at its first call (refused while a CUDA graph is captured:
    making it allocates buffers and copies the scheduler's terms to the device)."""
    p = _plans.get(key)
    if p is not None:
        _plans.move_to_end(key)
        return p
    if _launch.capturing(q):
        raise SplitlabError(f"{what}(num_splits=None) through a plan: the first call of this shape ({q.shape[0]} "
                            "requests) while a CUDA graph is captured; expected one call outside the capture first "
                            "(it makes the plan's buffers)")
    p = make()
    _plans[key] = p
    while len(_plans) > CACHE_PLANS:
        _plans.popitem(last=False)
    return p


def clear() -> None:
    """Drop every cached plan (their buffers go with the last reference)."""
    _plans.clear()


def _pair(result, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    return result if return_lse else (result, None)


def _lengths(seq_lens: torch.Tensor) -> torch.Tensor:
    # plan_on_device reads the lengths densely: a strided view is copied (on the device, capturable)
    return seq_lens if seq_lens.is_contiguous() else seq_lens.contiguous()


def gqa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
        seq_lens: torch.Tensor, *, block_n: int | None, num_warps: int | None, num_stages: int | None,
        sm_scale: float | None, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``gqa_decode``'s default call through the cached ``GQADecodePlan`` of its shape: ``(out, lse)``, lse None
    unless ``return_lse`` (the plan's scratch rows then, no allocation); ``sm_scale`` as the caller gave it. The inputs
    were checked by the launcher (metadata only)."""
    from splitlab.kernels.decode_plan import GQADecodePlan

    B, Hq, D = q.shape
    _, page_size, Hkv, _ = k_cache.shape
    key = ("gqa", Hq, Hkv, D, page_size, q.dtype, q.device, B, block_n, num_warps, num_stages, sm_scale, PDL)
    p = _plan(key, "gqa_decode", q, lambda: GQADecodePlan(
        Hq, Hkv, D, page_size, dtype=q.dtype, device=q.device, max_batch=B, use_cuda_graph=True,
        device_schedule=True, block_n=block_n, num_warps=num_warps, num_stages=num_stages, sm_scale=sm_scale,
        pdl=PDL))
    p.plan_on_device(_lengths(seq_lens), reuse=True)
    return _pair(p.run(q, k_cache, v_cache, block_table, return_lse=return_lse, check=False), return_lse)


def mla(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, *,
        head_dim_v: int, block_n: int | None, block_h: int | None, num_warps: int | None, num_stages: int | None,
        sm_scale: float | None, kv_scale: float | None, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``mla_decode``'s default call through the cached ``MLADecodePlan`` of its shape: ``(out, lse)`` as ``gqa``'s;
    ``sm_scale`` as the caller gave it, ``kv_scale`` as the launcher resolved it (1.0 for a 16-bit cache, which the
    plan takes as None). The inputs were checked by the launcher (metadata only)."""
    from splitlab.kernels.decode_plan import MLADecodePlan

    B, H, Dqk = q.shape
    page_size = kv_cache.shape[1]
    key = ("mla", H, Dqk, head_dim_v, page_size, q.dtype, kv_cache.dtype, kv_scale, q.device, B, block_n, block_h,
           num_warps, num_stages, sm_scale, PDL)
    p = _plan(key, "mla_decode", q, lambda: MLADecodePlan(
        H, Dqk, head_dim_v, page_size, dtype=q.dtype, device=q.device, kv_dtype=kv_cache.dtype,
        kv_scale=kv_scale if kv_cache.dtype == _launch.FP8_KV_DTYPE else None, max_batch=B, use_cuda_graph=True,
        device_schedule=True, block_n=block_n, block_h=block_h, num_warps=num_warps, num_stages=num_stages,
        sm_scale=sm_scale, pdl=PDL))
    p.plan_on_device(_lengths(seq_lens), reuse=True)
    return _pair(p.run(q, kv_cache, block_table, return_lse=return_lse, check=False), return_lse)


_launch._planned_default = sys.modules[__name__]

__all__ = ["CACHE_PLANS", "ENV", "PDL", "VIA_PLAN", "clear", "gqa", "mla", "via_plan", "with_plan"]
