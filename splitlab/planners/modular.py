"""Modular MAX (Mojo) decode split-K planners, ported to pure Python.

Two upstream files, ported function by function with upstream's names and branch order:

* ``max/kernels/src/nn/attention/gpu/mha_decode_partition_heuristic.mojo`` in ``modularml/mojo`` @
  ``5d09008209efcecb12ae979dc05346d441662189`` (the newest stored text, "V3" in
  docs/planners.md section 1; seed 000 is its ``hip_mha_decoding_num_partitions`` docstring):
  ``_bucket_partitions``, ``cuda_mha_decoding_max_num_partitions``, ``cuda_mha_decoding_num_partitions``,
  ``hip_mha_decoding_num_partitions``, ``mha_decoding_num_partitions``, ``mha_decoding_max_num_partitions``.
* ``max/kernels/src/nn/attention/gpu/nvidia/sm100/mla_decode_dispatch.mojo`` in ``modularml/mojo`` @
  ``0eeb9c145e2539cb5aab8a3085b4853d27440d26`` (planners.md section 1.5): the SM100 MLA decode planner
  ``_bucket_num_partitions``, ``_cost_optimal_partition_bucket``, ``_compute_num_partitions_64``,
  ``_compute_num_partitions_128``, ``_compute_num_partitions``, ``compute_mla_dispatch_scalars``.

Mojo's ``ctx: DeviceContext`` is replaced by plain ``api`` / ``sm_count`` arguments, and Mojo compile-time
parameters (``num_heads``, ``is_fp8_kv``, ``half_sms``, ...) become keyword-only arguments. Mojo ``Int``
arithmetic is Python ``int`` arithmetic here (``//`` floors in both). The ports do not validate their
inputs: where upstream would divide by zero, so does the port.
"""

from __future__ import annotations

from math import gcd

from splitlab.devices import DeviceSpec
from splitlab.errors import SplitlabError
from splitlab.intmath import cdiv, clamp, next_power_of_two
from splitlab.planners.registry import Plan, register
from splitlab.workloads import DecodeWorkload

_SRC_HEURISTIC = ("modularml/mojo max/kernels/src/nn/attention/gpu/mha_decode_partition_heuristic.mojo "
                  "@ 5d09008209efcecb12ae979dc05346d441662189")
_SRC_SM100 = ("modularml/mojo max/kernels/src/nn/attention/gpu/nvidia/sm100/mla_decode_dispatch.mojo "
              "@ 0eeb9c145e2539cb5aab8a3085b4853d27440d26")

# --- hip_mha_decoding_num_partitions tunables (upstream `comptime` constants) -------------------------
BM = 32  # MLA decode block-M on MI355
SPLIT_PAGE_SIZE = 256  # min keys per partition (128 for single-kv-head MHA)
MAX_PAGES_PER_SPLIT = 5
MAX_HIP_PARTITIONS = 256  # the MLA reducer's MAX_PARTITIONS limit
MHA_OCC_SCALE_DIVISOR = 64  # HIGH_OCC divisor; empirical, not WARP_SIZE

# The hip ladder, for callers and tests (``_bucket_partitions`` returns only these values).
BUCKET_LADDER = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)


def _bucket_partitions(n: int) -> int:
    """Round a partition count up to the ladder 1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256.

    ``n <= 32`` -> ``next_power_of_two(n)`` (1 for ``n <= 1``); otherwise the first of 48, 64, 96, 128, 192
    that is ``>= n``; above 192 -> 256.

    Source: modularml/mojo max/kernels/src/nn/attention/gpu/mha_decode_partition_heuristic.mojo
    @ 5d09008209efcecb12ae979dc05346d441662189 (``_bucket_partitions``).
    """
    if n <= 32:
        return next_power_of_two(n)
    if n <= 48:
        return 48
    if n <= 64:
        return 64
    if n <= 96:
        return 96
    if n <= 128:
        return 128
    if n <= 192:
        return 192
    return 256


def cuda_mha_decoding_max_num_partitions(batch_size: int, heads_per_group: int, sm_count: int) -> int:
    """The num_keys-independent CUDA bound: ``clamp(sm_count // (batch_size * heads_per_group), 1, 32)``.

    One partition per idle SM, at least 1, at most 32 (the single-warp split-K reducer's WARP_SIZE
    limit); not rounded to a power of two. ``heads_per_group`` is the kv-head count for MHA.
    ``batch_size * heads_per_group == 0`` divides by zero, as upstream does.

    Source: modularml/mojo max/kernels/src/nn/attention/gpu/mha_decode_partition_heuristic.mojo
    @ 5d09008209efcecb12ae979dc05346d441662189 (``cuda_mha_decoding_max_num_partitions``).
    """
    return clamp(sm_count // (batch_size * heads_per_group), 1, 32)


def cuda_mha_decoding_num_partitions(batch_size: int, num_keys: int, heads_per_group: int,
                                     sm_count: int) -> int:
    """CUDA MHA decode partitions: ``min(cuda_mha_decoding_max_num_partitions(...), max(1, num_keys//512))``.

    The SM-fill bound, further limited so each partition spans at least 512 keys; always in [1, 32].

    Source: modularml/mojo max/kernels/src/nn/attention/gpu/mha_decode_partition_heuristic.mojo
    @ 5d09008209efcecb12ae979dc05346d441662189 (``cuda_mha_decoding_num_partitions``).
    """
    return min(
        cuda_mha_decoding_max_num_partitions(batch_size, heads_per_group, sm_count),
        max(1, num_keys // 512),
    )


def hip_mha_decoding_num_partitions(batch_size: int, num_keys: int, heads_per_group: int, sm_count: int,
                                    is_mla: bool = False) -> int:
    """Wave-aligned split-K target for MI355X MHA and MLA decode (V3).

    ``heads_per_group`` is the kv-head count for MHA and ``num_heads`` for MLA; ``num_keys`` is the batch's
    longest cache. In order: ``num_keys <= 256`` -> 1; the 16-kv-head key-stream rule (MHA, 16 kv heads,
    ``16 * batch >= sm_count`` and ``cdiv(num_keys, 256) >= 8``) -> ``bucket(min(pages, 16))``; the MHA
    HIGH_OCC branch (MHA, ``heads_per_group < 32``, ``work_items >= sm_count``) ->
    ``bucket(min(cdiv(num_keys, 256 * occ), cap))``; otherwise the wave formula: ``pages`` of 256 keys
    (128 for single-kv-head MHA), ``np_target = min(two_wave, pages)`` when one wave underfills (MLA with
    ``num_heads <= 16``, single-kv-head MHA) else ``clamp(cdiv(pages, 5), one_wave, two_wave)``, capped at
    256 (MLA) or 64 (MHA; 32 at 16 kv heads from batch 8), rounded up the ``_bucket_partitions`` ladder.

    Source: modularml/mojo max/kernels/src/nn/attention/gpu/mha_decode_partition_heuristic.mojo
    @ 5d09008209efcecb12ae979dc05346d441662189 (``hip_mha_decoding_num_partitions``; seed 000).
    """
    # No partitioning for very short caches.
    if num_keys <= SPLIT_PAGE_SIZE:
        return 1

    # MHA: the kv-head count; MLA: num_heads.
    kv_num_heads = heads_per_group

    # 16-kv-head key-stream rule: one partition per split page, at most 16, once a full unsplit wave
    # and 8 pages are reached.
    coarse_pages = cdiv(num_keys, SPLIT_PAGE_SIZE)
    if (not is_mla) and kv_num_heads == 16 and kv_num_heads * batch_size >= sm_count and coarse_pages >= 8:
        return _bucket_partitions(min(coarse_pages, 16))

    work_items = heads_per_group * batch_size

    # MHA-style reducer cap: 32 at exactly 16 kv heads from batch 8 up, 64 elsewhere.
    mha_partition_cap = 32 if (kv_num_heads == 16 and batch_size >= 8) else 64

    # MHA-style: kv_num_heads spawns CTAs directly in grid_y.
    if (not is_mla) and heads_per_group < BM:
        if work_items >= sm_count:
            # High occupancy: one partition already fills the GPU.
            occupancy_scale = max(1, work_items // MHA_OCC_SCALE_DIVISOR)
            np_mha = min(cdiv(num_keys, SPLIT_PAGE_SIZE * occupancy_scale), mha_partition_cap)
            return min(_bucket_partitions(np_mha), MAX_HIP_PARTITIONS)
        # Low-occupancy MHA falls through to the MLA-style formula.

    # MLA-style: also every MHA shape with 32+ kv heads, at any occupancy.
    ctas_per_partition = max(1, cdiv(heads_per_group, BM) * batch_size)

    # Single-kv-head MHA takes a finer split floor (128 keys).
    mha_single_kv_head = (not is_mla) and kv_num_heads == 1
    split_floor = SPLIT_PAGE_SIZE // 2 if mha_single_kv_head else SPLIT_PAGE_SIZE
    pages = cdiv(num_keys, split_floor)
    one_wave = max(1, sm_count // ctas_per_partition)
    two_wave = max(1, (2 * sm_count) // ctas_per_partition)
    work_floor = cdiv(pages, MAX_PAGES_PER_SPLIT)

    # One wave underfills for MLA at num_heads <= 16 and for single-kv-head MHA: target two waves.
    one_wave_underfills = (heads_per_group <= 16) if is_mla else mha_single_kv_head
    if one_wave_underfills:
        np_target = min(two_wave, pages)
    else:
        np_target = clamp(work_floor, one_wave, two_wave)

    partition_cap = MAX_HIP_PARTITIONS if is_mla else mha_partition_cap
    num_partitions = min(np_target, pages, partition_cap)

    return min(_bucket_partitions(num_partitions), partition_cap)


def mha_decoding_num_partitions(batch_size: int, num_keys: int, heads_per_group: int, api: str,
                                sm_count: int, is_mla: bool = False) -> int:
    """Backend dispatch: ``api == "hip"`` -> ``hip_mha_decoding_num_partitions(..., is_mla)``;
    ``api == "cuda"`` -> ``cuda_mha_decoding_num_partitions(...)`` (``is_mla`` unused); any other backend
    -> 1.

    Upstream reads ``api`` and ``sm_count`` (MULTIPROCESSOR_COUNT: SMs, or CUs on AMD) from a
    ``DeviceContext``; here they are arguments.

    Source: modularml/mojo max/kernels/src/nn/attention/gpu/mha_decode_partition_heuristic.mojo
    @ 5d09008209efcecb12ae979dc05346d441662189 (``mha_decoding_num_partitions``).
    """
    if api == "hip" or api == "cuda":
        if api == "hip":
            return hip_mha_decoding_num_partitions(batch_size, num_keys, heads_per_group, sm_count,
                                                   is_mla=is_mla)
        return cuda_mha_decoding_num_partitions(batch_size, num_keys, heads_per_group, sm_count)
    return 1


def mha_decoding_max_num_partitions(batch_size: int, num_keys: int, heads_per_group: int, api: str,
                                    sm_count: int) -> int:
    """Graph-stable grid bound: on ``"cuda"`` ``cuda_mha_decoding_max_num_partitions(batch, hpg, sm)``
    (independent of ``num_keys``); elsewhere ``mha_decoding_num_partitions(...)`` itself, called without
    ``is_mla`` (so with its default ``False``), as upstream does.

    Source: modularml/mojo max/kernels/src/nn/attention/gpu/mha_decode_partition_heuristic.mojo
    @ 5d09008209efcecb12ae979dc05346d441662189 (``mha_decoding_max_num_partitions``).
    """
    if api == "cuda":
        return cuda_mha_decoding_max_num_partitions(batch_size, heads_per_group, sm_count)
    return mha_decoding_num_partitions(batch_size, num_keys, heads_per_group, api, sm_count)


# =====================================================================================================
# NVIDIA SM100 MLA decode (mla_decode_dispatch.mojo)
# =====================================================================================================

# Partition buckets in upstream's table order; the last entry is ``half_sms`` (sm_count // 2).
_NUM_PARTITIONS_FIXED = (1, 2, 3, 4, 8, 9, 16, 18, 20, 32, 37, 64, 72)
_NUM_PARTITION_BUCKETS = 14
_CTA_FIXED_COST_IN_TOKENS = 187
_COST_TIE_MARGIN_PERCENT = 2


def _partition_buckets(half_sms: int) -> tuple[int, ...]:
    """Upstream's ``_get_partition_bucket[half_sms, i]`` for ``i`` in ``range(14)``, as a tuple."""
    return (*_NUM_PARTITIONS_FIXED, half_sms)


def _bucket_num_partitions(num_partitions: int, half_sms: int = 74) -> int:
    """Map ``num_partitions`` to the first bucket ``>= num_partitions`` of {1, 2, 3, 4, 8, 9, 16, 18, 20,
    32, 37, 64, 72, half_sms} (scanned in that order); ``half_sms`` when none is.

    Source: modularml/mojo max/kernels/src/nn/attention/gpu/nvidia/sm100/mla_decode_dispatch.mojo
    @ 0eeb9c145e2539cb5aab8a3085b4853d27440d26 (``_bucket_num_partitions[half_sms]``).
    """
    for v in _partition_buckets(half_sms):
        if num_partitions <= v:
            return v
    return half_sms


def _cost_optimal_partition_bucket(ctas_per_partition: int, split_len: int, sm_count: int,
                                   max_partitions: int, *, half_sms: int = 74) -> int:
    """The bucket ``np <= max_partitions`` minimising ``cdiv(ctas * np, sm_count) * (187 + cdiv(split_len,
    np))``, scanned in ascending order and taken only when ``cost * 100 < best * 98`` (ties keep the
    smaller split); 1 when no bucket qualifies.

    Source: modularml/mojo max/kernels/src/nn/attention/gpu/nvidia/sm100/mla_decode_dispatch.mojo
    @ 0eeb9c145e2539cb5aab8a3085b4853d27440d26 (``_cost_optimal_partition_bucket[half_sms]``).
    """
    best_np = 1
    best_cost = -1
    for np_ in _partition_buckets(half_sms):
        if np_ <= max_partitions:
            waves = cdiv(ctas_per_partition * np_, sm_count)
            cost = waves * (_CTA_FIXED_COST_IN_TOKENS + cdiv(split_len, np_))
            if best_cost < 0 or cost * 100 < best_cost * (100 - _COST_TIE_MARGIN_PERCENT):
                best_cost = cost
                best_np = np_
    return best_np


def _compute_num_partitions_64(batch_size: int, effective_max_cache_len: int, q_max_seq_len: int,
                               split_page_size: int, sm_count: int, relax_split_floor: bool = False,
                               cost_optimal_split: bool = False, *, num_heads: int, is_fp8_kv: bool = False,
                               half_sms: int = 74, fold_shared_index: bool = False) -> int:
    """SM100 MLA split count for one 64-head group (``cdiv(num_heads, 64) == 1``, e.g. Kimi K2.5).

    ``pages = cdiv(eff, split_page_size)``; with ``cost_optimal_split`` the cost-model bucket. Otherwise
    ``ctas = cdiv(H, 64) * (1 if fold else q) * B`` (fold: ``q > 1 and H * q <= 64``), an 85 %-fill wave
    target (``sm // ctas`` if it fills 85 % of the SMs, else ``cdiv(sm, ctas)``, at most ``half_sms``),
    capped at ``pages // min_pages`` (4; 1 with a folded shared index or ``relax_split_floor``), clamped
    to ``[min_partitions, min(half_sms, pages)]`` (1 for a short cache at batch >= 64 or when ``ctas``
    fill 80 % of the SMs, else 2 with >= 2 pages), then bucketed.

    Source: modularml/mojo max/kernels/src/nn/attention/gpu/nvidia/sm100/mla_decode_dispatch.mojo
    @ 0eeb9c145e2539cb5aab8a3085b4853d27440d26 (``_compute_num_partitions_64``; Mojo parameters
    ``num_heads, is_fp8_kv, half_sms, fold_shared_index`` are keyword-only here).
    """
    num_kv_cache_pages = cdiv(effective_max_cache_len, split_page_size)

    if cost_optimal_split:
        return _cost_optimal_partition_bucket(
            cdiv(num_heads, 64) * q_max_seq_len * batch_size,
            effective_max_cache_len,
            sm_count,
            min(half_sms, num_kv_cache_pages),
            half_sms=half_sms,
        )

    fold_active = (q_max_seq_len > 1) and (num_heads * q_max_seq_len <= 64)
    q_len_factor = 1 if fold_active else q_max_seq_len
    ctas_per_partition = cdiv(num_heads, 64) * q_len_factor * batch_size

    # Single head group: 85 % fill threshold.
    floor_target = sm_count // ctas_per_partition
    ceil_target = cdiv(sm_count, ctas_per_partition)
    if floor_target >= 1 and floor_target * ctas_per_partition * 20 >= sm_count * 17:
        target_partitions = floor_target
    else:
        target_partitions = ceil_target

    target_partitions = min(target_partitions, half_sms)

    _min_pages_per_split = 4
    _min_pages = 1 if ((fold_shared_index and fold_active) or relax_split_floor) else _min_pages_per_split
    max_np_for_min_pages = num_kv_cache_pages // _min_pages

    num_partitions = min(target_partitions, max_np_for_min_pages)

    _np1_cache_threshold = 512 if is_fp8_kv else 256
    if effective_max_cache_len <= _np1_cache_threshold and batch_size >= 64:
        min_partitions = 1
    elif ctas_per_partition * 5 >= sm_count * 4:
        min_partitions = 1
    elif num_kv_cache_pages >= 2:
        min_partitions = 2
    else:
        min_partitions = 1
    num_partitions = clamp(num_partitions, min_partitions, min(half_sms, num_kv_cache_pages))

    return _bucket_num_partitions(num_partitions, half_sms)


def _compute_num_partitions_128(batch_size: int, effective_max_cache_len: int, q_max_seq_len: int,
                                split_page_size: int, sm_count: int, *, num_heads: int,
                                is_fp8_kv: bool = False, half_sms: int = 74) -> int:
    """SM100 MLA split count for two or more 64-head groups (e.g. DeepSeek V3/R1, 128 heads).

    ``ctas = cdiv(H, 64) * q * B``; a wave quantum ``min(sm // gcd(ctas, sm), half_sms)`` (capped at the
    target for batch >= 16 and batch 4..8); a 90 %-fill wave target; ``np = max(target, min(wave-aligned
    cdiv(pages, 32), pages // min_pages_per_split))``; np=1 allowed at batch >= 64 with a short cache and
    forced when ``ctas >= sm``; clamped to ``[min_partitions, min(half_sms, pages)]``, then bucketed.

    Source: modularml/mojo max/kernels/src/nn/attention/gpu/nvidia/sm100/mla_decode_dispatch.mojo
    @ 0eeb9c145e2539cb5aab8a3085b4853d27440d26 (``_compute_num_partitions_128``).
    """
    num_kv_cache_pages = cdiv(effective_max_cache_len, split_page_size)

    ctas_per_partition = cdiv(num_heads, 64) * q_max_seq_len * batch_size
    wave_quantum = min(sm_count // gcd(ctas_per_partition, sm_count), half_sms)

    # Multiple head groups: 90 % fill threshold.
    floor_target = sm_count // ctas_per_partition
    ceil_target = cdiv(sm_count, ctas_per_partition)
    if floor_target >= 1 and floor_target * ctas_per_partition * 10 >= sm_count * 9:
        target_partitions = floor_target
    else:
        target_partitions = ceil_target

    target_partitions = min(target_partitions, half_sms)

    if batch_size >= 16:
        wave_quantum = min(wave_quantum, max(target_partitions, 1))

    if batch_size >= 4 and batch_size <= 8:
        wave_quantum = min(wave_quantum, target_partitions)

    _head_groups = cdiv(num_heads, 64)
    max_pages_per_split = 32
    min_partitions_for_work = cdiv(num_kv_cache_pages, max_pages_per_split)

    _min_pps_large_batch = 16 if is_fp8_kv else 8
    _min_pps_small_batch = 8 if is_fp8_kv else 4
    if batch_size >= 64:
        min_pages_per_split = _min_pps_large_batch
    elif batch_size <= 8 and is_fp8_kv:
        min_pages_per_split = 4
    else:
        min_pages_per_split = _min_pps_small_batch

    # Base thresholds are tuned for 2 head groups; apply 2/head_groups, then double.
    min_pages_per_split = min_pages_per_split * 2 // _head_groups
    min_pages_per_split = min_pages_per_split * 2

    num_waves = max(1, cdiv(min_partitions_for_work, wave_quantum))
    wave_aligned = num_waves * wave_quantum

    num_partitions = max(target_partitions, min(wave_aligned, num_kv_cache_pages // min_pages_per_split))

    _np1_cache_threshold = 512 if is_fp8_kv else 256
    if effective_max_cache_len <= _np1_cache_threshold and batch_size >= 64:
        min_partitions = 1
        target_partitions = 1
        num_partitions = max(target_partitions,
                             min(wave_aligned, num_kv_cache_pages // min_pages_per_split))
    elif batch_size >= 64 and effective_max_cache_len <= 2176:
        min_partitions = 1
        target_partitions = 1
        num_partitions = max(target_partitions,
                             min(wave_aligned, num_kv_cache_pages // min_pages_per_split))
    elif num_kv_cache_pages >= 2:
        min_partitions = 2
    else:
        min_partitions = 1

    # A single partition already fills the GPU: force np=1.
    if ctas_per_partition >= sm_count:
        num_partitions = 1
        min_partitions = 1

    num_partitions = clamp(num_partitions, min_partitions, min(half_sms, num_kv_cache_pages))

    return _bucket_num_partitions(num_partitions, half_sms)


def _compute_num_partitions(batch_size: int, effective_max_cache_len: int, q_max_seq_len: int,
                            split_page_size: int, sm_count: int, relax_split_floor: bool = False,
                            cost_optimal_split: bool = False, *, num_heads: int, is_fp8_kv: bool = False,
                            half_sms: int = 74, fold_shared_index: bool = False) -> int:
    """Route on ``cdiv(num_heads, 64)``: 1 -> ``_compute_num_partitions_64``, else
    ``_compute_num_partitions_128`` (which ignores ``relax_split_floor`` and ``cost_optimal_split``).

    Source: modularml/mojo max/kernels/src/nn/attention/gpu/nvidia/sm100/mla_decode_dispatch.mojo
    @ 0eeb9c145e2539cb5aab8a3085b4853d27440d26 (``_compute_num_partitions``).
    """
    if cdiv(num_heads, 64) == 1:
        return _compute_num_partitions_64(
            batch_size, effective_max_cache_len, q_max_seq_len, split_page_size, sm_count,
            relax_split_floor=relax_split_floor, cost_optimal_split=cost_optimal_split,
            num_heads=num_heads, is_fp8_kv=is_fp8_kv, half_sms=half_sms, fold_shared_index=fold_shared_index,
        )
    return _compute_num_partitions_128(
        batch_size, effective_max_cache_len, q_max_seq_len, split_page_size, sm_count,
        num_heads=num_heads, is_fp8_kv=is_fp8_kv, half_sms=half_sms,
    )


def compute_mla_dispatch_scalars(batch_size: int, max_cache_valid_length: int, q_max_seq_len: int,
                                 sm_count: int, *, num_heads: int, _is_cache_length_accurate: bool = False,
                                 is_fp8_kv: bool = False, half_sms: int = 74,
                                 fold_shared_index: bool = False) -> tuple[int, int, int]:
    """SM100 MLA decode dispatch scalars ``(batch_size, q_max_seq_len, num_partitions)``.

    ``eff = max_cache_valid_length + (0 if _is_cache_length_accurate else q_max_seq_len)``;
    ``split_page_size = 64 if (eff <= 512 and batch_size >= 32) else 128``; ``num_partitions =
    _compute_num_partitions(batch, eff, q, split_page_size, sm_count)``. Upstream's default ``half_sms`` is
    74 (B200); ``MLADispatchScalarArgs`` passes ``sm_count // 2`` of the compile target.

    Source: modularml/mojo max/kernels/src/nn/attention/gpu/nvidia/sm100/mla_decode_dispatch.mojo
    @ 0eeb9c145e2539cb5aab8a3085b4853d27440d26 (``compute_mla_dispatch_scalars``).
    """
    effective = max_cache_valid_length
    if not _is_cache_length_accurate:
        effective += q_max_seq_len

    split_page_size = 64 if (effective <= 512 and batch_size >= 32) else 128
    num_partitions = _compute_num_partitions(
        batch_size, effective, q_max_seq_len, split_page_size, sm_count,
        num_heads=num_heads, is_fp8_kv=is_fp8_kv, half_sms=half_sms, fold_shared_index=fold_shared_index,
    )
    return (batch_size, q_max_seq_len, num_partitions)


# =====================================================================================================
# Adapter
# =====================================================================================================

def _is_sm10x(dev: DeviceSpec) -> bool:
    """Upstream's ``_is_sm10x_gpu(ctx.default_device_info)``: the SM100-family data-center Blackwell
    parts (B200 / B300: ``sm_100`` / ``sm_103``)."""
    return dev.vendor == "nvidia" and dev.arch in ("sm_100", "sm_100a", "sm_103", "sm_103a")


@register("modular", kinds=("gqa", "mla"), source=f"{_SRC_HEURISTIC}; {_SRC_SM100}")
def plan_modular(w: DecodeWorkload, dev: DeviceSpec) -> Plan:
    """Modular MAX's decode split count, mapped the way Modular's callers map a decode call.

    * ``gqa`` (``get_mha_decoding_num_partitions`` in ``mha.mojo``, a forwarder to
      ``mha_decoding_num_partitions(batch, num_keys, num_heads // group, ctx)``): ``heads_per_group =
      num_kv_heads``, ``is_mla=False``, ``num_keys = w.keys_per_request`` (the batch's longest cache, as
      ``max_cache_valid_length``), ``sm_count = dev.sm_count``; ``api = "hip"`` on AMD, else ``"cuda"``.
    * ``mla`` on AMD (``flare_mla_decoding_dispatch`` in ``mla.mojo``): ``mha_decoding_num_partitions(batch,
      max_cache_valid_length, num_heads, ctx, is_mla=True)``, so ``heads_per_group = num_q_heads`` (one kv
      head) and the raw longest cache length.
    * ``mla`` on SM10x NVIDIA (B200/B300): the SM100 path, ``compute_mla_dispatch_scalars`` with
      ``num_heads = num_q_heads``, ``max_cache_valid_length = w.keys_per_request``, ``q_max_seq_len = 1``,
      ``_is_cache_length_accurate=False`` (the KV-cache caller, so ``eff = keys + 1``), ``is_fp8_kv`` from
      the dtype, ``half_sms = dev.sm_count // 2`` (as ``MLADispatchScalarArgs``); dense decode, no
      sliding window, no spec-decode fold.
    * ``mla`` on other NVIDIA: upstream uses 1 partition ("non-SM10x NVIDIA stays at 1").

    Where the SM100 rule divides by zero (more than 8 head groups of 64 below batch 64: its pages-per-split floor
    rounds to 0), the adapter raises ``SplitlabError`` naming ``num_q_heads``; the port itself is left as upstream.
    """
    api = "hip" if dev.vendor == "amd" else "cuda"
    keys = w.keys_per_request
    if w.kind == "gqa":
        n = mha_decoding_num_partitions(w.batch, keys, w.num_kv_heads, api, dev.sm_count)
        rule = "hip_mha_decoding_num_partitions" if api == "hip" else "cuda_mha_decoding_num_partitions"
        return Plan("modular", n, note=f"{rule}(batch={w.batch}, num_keys={keys}, "
                    f"heads_per_group=num_kv_heads={w.num_kv_heads}, sm_count={dev.sm_count})",
                    extra={"api": api})
    # mla
    if api == "hip":
        n = mha_decoding_num_partitions(w.batch, keys, w.num_q_heads, api, dev.sm_count, is_mla=True)
        return Plan("modular", n, note=f"hip_mha_decoding_num_partitions(batch={w.batch}, num_keys={keys}, "
                    f"heads_per_group=num_q_heads={w.num_q_heads}, sm_count={dev.sm_count}, is_mla=True)",
                    extra={"api": api})
    if _is_sm10x(dev):
        half_sms = dev.sm_count // 2
        is_fp8_kv = w.dtype == "fp8_e4m3"
        try:
            _, _, n = compute_mla_dispatch_scalars(w.batch, keys, 1, dev.sm_count, num_heads=w.num_q_heads,
                                                   is_fp8_kv=is_fp8_kv, half_sms=half_sms)
        except ZeroDivisionError:
            # _compute_num_partitions_128 scales its pages-per-split floor by 2 / head groups with integer
            # division: past 8 groups of 64 heads (16 at batch >= 64, more with an fp8 cache) the floor is 0 and
            # upstream divides by zero too. The rule has no answer there; say so instead of guessing one.
            raise SplitlabError(f"num_q_heads={w.num_q_heads} is not allowed for planner='modular' (SM100 MLA "
                                f"rule) at batch={w.batch}: its pages-per-split floor, 2 * base // cdiv(num_heads, "
                                "64), is 0 there and upstream divides by zero; expected fewer head groups of 64 "
                                "(at most 512 heads below batch 64)") from None
        eff = keys + 1
        split_page_size = 64 if (eff <= 512 and w.batch >= 32) else 128
        return Plan("modular", n, note=f"SM100 compute_mla_dispatch_scalars(batch={w.batch}, "
                    f"max_cache_valid_length={keys}, q_max_seq_len=1, num_heads={w.num_q_heads}, "
                    f"is_fp8_kv={is_fp8_kv}, half_sms={half_sms}); eff={eff} (KV-cache caller adds q)",
                    extra={"api": api, "split_page_size": split_page_size, "half_sms": half_sms})
    return Plan("modular", 1, note=f"MLA decode on non-SM10x NVIDIA ({dev.arch}): Modular's call site uses "
                "num_partitions=1 (only AMD and SM10x have split-K heuristics)", extra={"api": api})
