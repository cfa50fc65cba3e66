"""splitlab's own planner: a wave-aware cost model, the same for every kernel family.

Rule (one line): pick the split count ``s`` that minimises the modelled time

    T(s) = ceil(c0 * s / (sm_count * ctas_per_sm)) * (ceil(L / s) + KEYS_FIXED)   # partial waves
           + COMBINE_KEYS * (s > 1) + COMBINE_PER_SPLIT * s * c0 / sm_count      # the merge

in units of "keys streamed by one CTA", where ``c0`` is the CTAs of the unsplit launch (``waves.ctas``),
``L`` the longest request's keys (``topk`` for sparse MLA) and ``KEYS_FIXED`` the per-CTA start-up cost
(launch, Q load, epilogue) expressed in keys. Candidates are powers of two up to ``MAX_SPLITS`` and never
more splits than ``ceil(L / MIN_KEYS_PER_SPLIT)``; ties go to fewer splits.

The constants below are a first, reasoned setting (one CTA per SM for the large-tile MLA kernels, two for
GQA; a CTA's fixed cost of about one 128-key tile); issue 6 fits them to the measured H200 data. Source:
splitlab (this repository), no upstream.
"""

from __future__ import annotations

from splitlab import waves  # module import: waves itself imports splitlab.planners._math
from splitlab.devices import DeviceSpec
from splitlab.planners._math import cdiv
from splitlab.planners.registry import Plan, register
from splitlab.workloads import DecodeWorkload

MAX_SPLITS = {"gqa": 64, "mla": 256, "sparse_mla": 64}
MIN_KEYS_PER_SPLIT = {"gqa": 64, "mla": 64, "sparse_mla": 64}
CTAS_PER_SM = {"gqa": 2, "mla": 1, "sparse_mla": 1}
KEYS_FIXED = {"gqa": 128, "mla": 128, "sparse_mla": 128}
COMBINE_KEYS = 64.0  # the second launch, in keys of one CTA
COMBINE_PER_SPLIT = 2.0  # reading one split's partial row, in keys of one CTA


def modelled_cost(w: DecodeWorkload, num_splits: int, sm_count: int) -> float:
    """``T(s)`` of the rule above, in keys streamed by one CTA (a modelled figure, not a time)."""
    kind = w.kind
    c0 = waves.ctas(w, 1)
    keys = w.keys_per_request
    n_waves = cdiv(c0 * num_splits, sm_count * CTAS_PER_SM[kind])
    t = n_waves * (cdiv(keys, num_splits) + KEYS_FIXED[kind])
    if num_splits > 1:
        t += COMBINE_KEYS + COMBINE_PER_SPLIT * num_splits * c0 / sm_count
    return t


def splitlab_num_splits(w: DecodeWorkload, sm_count: int) -> int:
    """The split count the rule picks for ``w`` on ``sm_count`` SMs."""
    keys = w.keys_per_request
    limit = max(1, min(MAX_SPLITS[w.kind], cdiv(keys, MIN_KEYS_PER_SPLIT[w.kind])))
    best, best_cost = 1, modelled_cost(w, 1, sm_count)
    s = 2
    while s <= limit:
        cost = modelled_cost(w, s, sm_count)
        if cost < best_cost:
            best, best_cost = s, cost
        s *= 2
    return best


@register("splitlab", kinds=("gqa", "mla", "sparse_mla"), source="splitlab (this repository)")
def plan_splitlab(w: DecodeWorkload, dev: DeviceSpec) -> Plan:
    """splitlab's wave-cost rule on the device's SM count; tiles are left to the kernel's defaults."""
    return Plan("splitlab", splitlab_num_splits(w, dev.sm_count),
                note=f"wave-cost model over powers of two, {CTAS_PER_SM[w.kind]} CTA(s) per SM")
