"""AMD aiter ``pa_decode_sparse`` (gfx950 gluon driver) and vLLM's ROCm sparse-MLA decode planners.

Ports, in upstream order and with upstream names:

* ``decode_num_splits``: aiter ``_decode_num_splits``, the gfx950 cost model (``ROCm/aiter``
  ``aiter/ops/triton/attention/pa_decode_sparse.py`` @ ``e4048607a535ace3a2b51ded31b1c8c2d45c0879``,
  docs/planners.md section 3.1; the function text was checked against two stored versions of that file, index
  ids 57497225317 and 57502482701, commit not exposed by the index).
* ``pa_decode_sparse_block_k``: the BLOCK_K rule *proposed* in seed 003 (``32 if ctas > num_sms else 64``). It
  is not upstream code: upstream hard-codes ``BLOCK_K = 64``.
* ``_decode_partial_iters``, ``vllm_decode_num_splits``, ``vllm_decode_gfx950_num_splits``: vLLM's copies
  (``vllm-project/vllm`` ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py`` @
  ``002ef941eef9b1ca9adbe9c6c931e04787074c98``, read in full at that commit, index id 69307531257).

Upstream's ``get_num_sms()`` / ``_decode_cu_count()`` is the explicit ``num_sms`` argument here. All
arithmetic is Python float (double) as upstream, so the ports are exact.

Note: the newest stored aiter text (commit ``021039d38eb83c48e17998aa347d6e7090c71397``, index id 70753069945)
no longer calls this cost model; its gfx950 driver uses ``_decode_num_splits_occ`` (fill ``2 * CU``
workgroups, capped by the BLOCK_K tile count and ``_MAX_SPLITS = 64``). The port follows planners.md's commit.
"""

from __future__ import annotations

import math

from splitlab.devices import DeviceSpec
from splitlab.errors import bad, check_int
from splitlab.intmath import cdiv
from splitlab.planners.registry import Plan, register
from splitlab.workloads import DecodeWorkload

AITER_SOURCE = ("ROCm/aiter aiter/ops/triton/attention/pa_decode_sparse.py @ "
                "e4048607a535ace3a2b51ded31b1c8c2d45c0879 (_decode_num_splits); BLOCK_K rule from seed 003")
VLLM_ROCM_SOURCE = ("vllm-project/vllm vllm/v1/attention/ops/rocm_aiter_mla_sparse.py @ "
                    "002ef941eef9b1ca9adbe9c6c931e04787074c98")

# gfx950 gluon driver's fixed launch config: BLOCK_M heads per MFMA M-tile, BLOCK_K keys per KV tile.
BLOCK_M = 16
BLOCK_K = 64


def _check_len(name: str, value: float) -> float:
    """An average segment length: a finite number >= 0 (upstream's ``indices.numel() / num_queries``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
        raise bad(name, value, "a finite number >= 0")
    return value


def decode_num_splits(num_queries: int, heads_blocks: int, avg_main: float = 0, avg_extra: float = 0,
                      block_k: int = 64, *, num_sms: int) -> int:
    """aiter gfx950 ``_decode_num_splits``: the split count ``s`` in 1..16 minimising

        cost(s) = waves(s) * (m_it(s) + e_it(s)) + GAMMA * s + DELTA * fill(s)

    with ``base = max(1, num_queries * heads_blocks)``, ``waves = cdiv(base * s, cu)``,
    ``m_it = ceil(ceil(avg_main / s) / block_k)`` (0 when ``avg_main <= 0``; ``e_it`` likewise),
    ``fill = max(0, 1 - base * s / (0.75 * cu)) / s``, ``GAMMA = 0.32``, ``DELTA = 2.0``; a later ``s`` wins
    only if its cost is below the best by more than 1e-9, so ties go to the smaller ``s``.

    Source: ``ROCm/aiter`` ``aiter/ops/triton/attention/pa_decode_sparse.py`` @
    ``e4048607a535ace3a2b51ded31b1c8c2d45c0879`` (planners.md 3.1).
    """
    num_queries = check_int("num_queries", num_queries, minimum=0)
    heads_blocks = check_int("heads_blocks", heads_blocks, minimum=0)
    avg_main = _check_len("avg_main", avg_main)
    avg_extra = _check_len("avg_extra", avg_extra)
    block_k = check_int("block_k", block_k)
    num_sms = check_int("num_sms", num_sms)

    cu = max(1, num_sms)
    base = max(1, num_queries * heads_blocks)
    GAMMA, DELTA, FILL_CU = 0.32, 2.0, 0.75
    thr = FILL_CU * cu
    best_splits, best_cost = 1, None
    for splits in range(1, 17):
        m_it = math.ceil(math.ceil(avg_main / splits) / block_k) if avg_main > 0 else 0
        e_it = math.ceil(math.ceil(avg_extra / splits) / block_k) if avg_extra > 0 else 0
        waves = (base * splits + cu - 1) // cu
        fill = max(0.0, 1.0 - base * splits / thr) / splits
        cost = waves * (m_it + e_it) + GAMMA * splits + DELTA * fill
        if best_cost is None or cost < best_cost - 1e-9:
            best_splits, best_cost = splits, cost
    return best_splits


def pa_decode_sparse_block_k(ctas: int, num_sms: int) -> int:
    """Seed 003's proposed gfx950 BLOCK_K: ``32 if ctas > num_sms else 64``.

    ``ctas = num_queries * num_splits * heads_blocks`` of the partial launch, so ``num_splits`` must be known
    first. While every CTA has its own CU the larger tile (4 warps, 64 KB LDS) wins; past one wave the smaller
    one (2 warps) packs better. A proposal (seed 003, measured on MI355X), not upstream code: upstream
    ``ROCm/aiter`` ``pa_decode_sparse.py`` @ ``e4048607`` hard-codes ``BLOCK_K = 64``.
    """
    ctas = check_int("ctas", ctas, minimum=0)
    num_sms = check_int("num_sms", num_sms)
    return 32 if ctas > num_sms else 64


def _decode_partial_iters(avg_main_len: float, avg_extra_len: float, splits: int, block_k: int) -> int:
    """vLLM ``_decode_partial_iters``: BLOCK_K iterations one partial workgroup walks at ``splits`` splits,
    ``ceil(ceil(avg_main_len / splits) / block_k)`` (0 if ``avg_main_len <= 0``) plus the same for the extra
    segment.

    Source: ``vllm-project/vllm`` ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py`` @
    ``002ef941eef9b1ca9adbe9c6c931e04787074c98``.
    """
    main_iters = math.ceil(math.ceil(avg_main_len / splits) / block_k) if avg_main_len > 0 else 0
    extra_iters = math.ceil(math.ceil(avg_extra_len / splits) / block_k) if avg_extra_len > 0 else 0
    return main_iters + extra_iters


def vllm_decode_num_splits(num_queries: int, heads_blocks: int, avg_main_len: float = 0.0,
                           avg_extra_len: float = 0.0, block_k: int = 32, *, num_sms: int) -> int:
    """vLLM ROCm ``_decode_num_splits`` (the gfx942 path): minimise ``waves * (1/s + mu)`` over s in 1..16
    (``waves = cdiv(base * s, cu)``, ``base = max(1, num_queries * heads_blocks)``, ``mu = 0.04``, strict
    minimum with a 1e-9 margin so ties go to the smaller s), then, when the best is > 1 and a segment length
    is known, snap down to the first ``s`` below it with the same wave count and the same
    ``_decode_partial_iters``. The caller uses ``block_k = 32``.

    Source: ``vllm-project/vllm`` ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py`` @
    ``002ef941eef9b1ca9adbe9c6c931e04787074c98``.
    """
    num_queries = check_int("num_queries", num_queries, minimum=0)
    heads_blocks = check_int("heads_blocks", heads_blocks, minimum=0)
    avg_main_len = _check_len("avg_main_len", avg_main_len)
    avg_extra_len = _check_len("avg_extra_len", avg_extra_len)
    block_k = check_int("block_k", block_k)
    num_sms = check_int("num_sms", num_sms)

    base = max(1, num_queries * heads_blocks)
    cu = max(1, num_sms)
    mu = 0.04
    best_splits = 1
    best_cost = None
    for splits in range(1, 17):
        waves = (base * splits + cu - 1) // cu
        cost = waves * (1.0 / splits + mu)
        if best_cost is None or cost < best_cost - 1e-9:
            best_splits = splits
            best_cost = cost

    if best_splits > 1 and (avg_main_len > 0 or avg_extra_len > 0):
        target_waves = (base * best_splits + cu - 1) // cu
        target_iters = _decode_partial_iters(avg_main_len, avg_extra_len, best_splits, block_k)
        for splits in range(1, best_splits):
            waves = (base * splits + cu - 1) // cu
            iters = _decode_partial_iters(avg_main_len, avg_extra_len, splits, block_k)
            if waves == target_waves and iters == target_iters:
                best_splits = splits
                break
    return best_splits


def vllm_decode_gfx950_num_splits(num_queries: int, heads_blocks: int, avg_main_len: float = 0.0,
                                  avg_extra_len: float = 0.0, block_k: int = 32, *, num_sms: int) -> int:
    """vLLM ROCm ``_decode_gfx950_num_splits``: aim at ``2 * cu`` workgroups,
    ``ns = min(32, max(1, ceil(2 * cu / base)))``; return 4 if ``base >= 16``, ``ns > 4`` and 4 splits walk
    <= 3 iterations; for ``16 <= base < 64`` cap ``ns`` at one (or, above 9 iterations, two) waves; for
    ``base >= 16`` snap down to the first ``s < ns`` with the same waves and iterations. In [1, 32].

    Source: ``vllm-project/vllm`` ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py`` @
    ``002ef941eef9b1ca9adbe9c6c931e04787074c98``.
    """
    num_queries = check_int("num_queries", num_queries, minimum=0)
    heads_blocks = check_int("heads_blocks", heads_blocks, minimum=0)
    avg_main_len = _check_len("avg_main_len", avg_main_len)
    avg_extra_len = _check_len("avg_extra_len", avg_extra_len)
    block_k = check_int("block_k", block_k)
    num_sms = check_int("num_sms", num_sms)

    base = max(1, num_queries * heads_blocks)
    cu = max(1, num_sms)
    target_workgroups = 2 * cu
    num_splits = min(32, max(1, math.ceil(target_workgroups / base)))
    if base >= 16 and num_splits > 4 and _decode_partial_iters(avg_main_len, avg_extra_len, 4, block_k) <= 3:
        return 4
    if 16 <= base < 64:
        one_wave_splits = max(1, cu // base)
        one_wave_iters = _decode_partial_iters(avg_main_len, avg_extra_len, one_wave_splits, block_k)
        target_waves = 1 if one_wave_iters <= 9 else 2
        num_splits = min(num_splits, max(1, target_waves * cu // base))
    if base >= 16 and num_splits > 1:
        target_waves = (base * num_splits + cu - 1) // cu
        target_iters = _decode_partial_iters(avg_main_len, avg_extra_len, num_splits, block_k)
        for splits in range(1, num_splits):
            waves = (base * splits + cu - 1) // cu
            iters = _decode_partial_iters(avg_main_len, avg_extra_len, splits, block_k)
            if waves == target_waves and iters == target_iters:
                return splits
    return num_splits


@register("aiter", kinds=("sparse_mla",), source=AITER_SOURCE)
def plan_aiter(w: DecodeWorkload, dev: DeviceSpec) -> Plan:
    """aiter ``pa_decode_sparse`` gfx950 gluon driver, with seed 003's BLOCK_K rule.

    ``num_queries = batch`` (query tokens), ``heads_blocks = cdiv(H, 16)``, ``avg_main = topk`` (upstream's
    ``indices.numel() / num_queries`` with full index rows), no extra segment; ``num_splits`` from the cost
    model at ``block_k = 64`` as upstream computes it; then ``ctas = num_queries * num_splits * heads_blocks``
    and ``block_k = 32 if ctas > sm_count else 64``.
    """
    heads_blocks = cdiv(w.num_q_heads, BLOCK_M)
    num_queries = w.batch
    avg_main = float(w.topk)
    num_splits = decode_num_splits(num_queries, heads_blocks, avg_main, 0.0, BLOCK_K, num_sms=dev.sm_count)
    ctas = num_queries * num_splits * heads_blocks
    block_k = pa_decode_sparse_block_k(ctas, dev.sm_count)
    note = (f"gfx950 cost model at block_k=64 with num_queries={num_queries}, "
            f"heads_blocks=cdiv({w.num_q_heads},16)={heads_blocks}, avg_main=topk={w.topk}, "
            f"cu={dev.sm_count}; seed-003 BLOCK_K from "
            f"ctas={ctas} vs {dev.sm_count} CUs")
    if dev.arch != "gfx950":
        note += f"; upstream routes {dev.arch} to its Triton path (not this rule): computed as if gfx950"
    return Plan("aiter", num_splits, block_k=block_k, block_h=BLOCK_M, note=note,
                extra={"ctas": ctas, "heads_blocks": heads_blocks, "avg_main": avg_main})
