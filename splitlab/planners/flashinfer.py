"""FlashInfer decode split-K planners, ported to pure Python.

Two upstream sources (docs/planners.md section 2):

* ``flashinfer/mla/_sparse_mla_sm120/_cake_dsv4_nvfp4.py`` in ``flashinfer-ai/flashinfer``, the newest
  stored text ("v3": index file id 70274826827; the index does not expose its commit; the older stored
  versions are v1 @ ``843559caa3951af76c85c2a817d5df6607701ccc`` and v2 @
  ``38eff709c89ffff6ac96e6c928be8f5bb5d0c2ee``). Seed 001 is its ``plan_splits`` docstring. Ported:
  ``cake_sparse_mla_sm120_dsv4_nvfp4_num_chunks``, ``..._plan_head_tiles``, ``..._plan_splits`` and
  ``..._select_kernel``, with the manifest constants of
  ``csrc/cake_dsv4/sm_120a/cake_sparse_mla_dsv4_nvfp4_manifest.json`` @
  ``14dc8abbfd09f3e13557636fb429669cb2dc7adb``.

  The released FlashInfer 0.7.4 (the ``flashinfer-python`` wheel on PyPI, built from commit
  ``77039051b0be921788dc2784ec41423b558878ec`` as its ``flashinfer/_build_meta.py`` says) changes one of
  these functions: its ``cake_sparse_mla_sm120_dsv4_nvfp4_plan_head_tiles`` adds an eight-wave upper bound to
  the small-die one-tile band and makes the 64-head sub-wave band inclusive at ``2/3 SMs`` on small dies
  (``plan_head_tiles_074``). Its ``num_chunks``, ``plan_splits``, ``select_kernel``, ``_resolve_plan``, the
  prefill policy entries used here and the manifest constants are the same as v3's. Both versions are
  registered: ``flashinfer`` (v3, the seed's) and ``flashinfer-0.7.4``; they differ only on dies under 64 SMs.
* ``include/flashinfer/attention/scheduler.cuh`` in ``flashinfer-ai/flashinfer`` @
  ``24fd9fc7a944723897cc46a60bf39703ab2813a6`` (identical in these functions to the stored text @
  ``00b1eec47586694311afa35194c93a5ffac9c482``): ``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch``,
  the decode work estimation shared by ``BatchDecodeWithPagedKVCacheWorkEstimationDispatched`` (and its
  ``MLA`` / ``MlaCuteSM80`` variants, which differ only in ``gdy`` and ``num_blocks_per_sm``),
  ``DecodeSplitKVIndptr`` and ``DecodePlan``'s padded batch size. FlashInfer 0.7.4's
  ``flashinfer/data/include/flashinfer/attention/scheduler.cuh`` has the same text in these functions.

Nothing here needs a GPU: where upstream queries the device (``num_sms``, the occupancy of the decode
kernel) the port takes the number as an argument. The ports keep upstream's own errors (``ValueError``
where the cake planner raises) and add none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from splitlab.devices import DeviceSpec
from splitlab.errors import SplitlabError
from splitlab.intmath import cdiv
from splitlab.planners.registry import Plan, register
from splitlab.workloads import DecodeWorkload

_SRC_CAKE = ("flashinfer-ai/flashinfer flashinfer/mla/_sparse_mla_sm120/_cake_dsv4_nvfp4.py "
             "(v3, index file id 70274826827; commit not exposed)")
_SRC_SCHED = ("flashinfer-ai/flashinfer include/flashinfer/attention/scheduler.cuh "
              "@ 24fd9fc7a944723897cc46a60bf39703ab2813a6")
#: The released FlashInfer the ``flashinfer-0.7.4`` planner follows (PyPI ``flashinfer-python``).
FLASHINFER_RELEASE = "0.7.4"
FLASHINFER_RELEASE_COMMIT = "77039051b0be921788dc2784ec41423b558878ec"  # the wheel's _build_meta.__git_commit__
_SRC_074 = f"flashinfer-python {FLASHINFER_RELEASE} (PyPI wheel, commit {FLASHINFER_RELEASE_COMMIT})"
_SRC_CAKE_074 = f"{_SRC_074} flashinfer/mla/_sparse_mla_sm120/_cake_dsv4_nvfp4.py"
_SRC_SCHED_074 = f"{_SRC_074} flashinfer/data/include/flashinfer/attention/scheduler.cuh"

# =====================================================================================================
# Cake SM120 DeepSeek-V4 NVFP4 sparse MLA (backend="cake")
# =====================================================================================================

_CHUNK = 64  # candidates per chunk (manifest "candidates_per_chunk")
# Below this SM count the planners follow the GB10 (SM121, 48 SMs) sweeps.
_SMALL_DIE_SMS = 64
# Manifest @ 14dc8abb: "heads_per_block", "max_chunks_per_block", "head_counts", "two_tile_head_counts".
HEADS_PER_BLOCK = 16
MAX_CHUNKS_PER_BLOCK = 16
HEAD_COUNTS = (8, 16, 32, 48, 64, 80, 96, 112, 128)
TWO_TILE_HEAD_COUNTS = (32, 64, 96, 128)
# The v3 module's prefill facts, as its docstrings state them (the manifest version read predates the
# prefill keys): an instance for 16..128 heads in multiples of 16, at most 16 chunks per token.
PREFILL_HEAD_COUNTS = (16, 32, 48, 64, 80, 96, 112, 128)
PREFILL_MAX_CHUNKS = 16
# v3 ``_PREFILL_POLICY`` entries used by ``select_kernel``.
_PREFILL_POLICY = {
    "wide_heads": 64,
    "large_sms": 180,
    "many_candidates": 512,
    "wide_decode_tokens_many": 8,
    "wide_decode_tokens_few": 16,
    "narrow_decode_tokens_many_large_sms": 8,
    "narrow_decode_tokens_many_small_sms": 32,
}


def num_chunks(topk: int, extra_topk: int = 0) -> int:
    """64-candidate chunks of one token, ``cdiv(topk, 64) + cdiv(extra_topk, 64)``: the upper bound on
    ``num_splits``.

    Source: flashinfer-ai/flashinfer flashinfer/mla/_sparse_mla_sm120/_cake_dsv4_nvfp4.py (v3, index file
    id 70274826827) ``cake_sparse_mla_sm120_dsv4_nvfp4_num_chunks``.
    """
    return cdiv(int(topk), _CHUNK) + cdiv(int(extra_topk), _CHUNK)


def plan_head_tiles(*, num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0,
                    num_sms: int) -> int:
    """Sixteen-head tiles per decode CTA, 1 or 2 (the v3 text, which the ``flashinfer`` planner follows).

    1 unless ``num_heads % 32 == 0``. With ``ctas = num_tokens * num_heads // 16``: a full wave
    (``ctas >= num_sms``) -> 2, except on a small die (``num_sms < 64``) with ``chunks <= 2``,
    ``num_heads > 32`` and ``ctas > 2 * num_sms`` -> 1. Below a wave (``third = sms // 3``,
    ``two_thirds = 2 * sms // 3``): H=32 -> 2 iff ``ctas >= two_thirds or (chunks >= 8 and ctas >=
    third)``; H=64 -> 2 iff ``chunks >= 8 and third <= ctas < two_thirds``; else 2 iff ``chunks >= 16 and
    ctas >= third``.

    Source: flashinfer-ai/flashinfer flashinfer/mla/_sparse_mla_sm120/_cake_dsv4_nvfp4.py (v3, index file
    id 70274826827) ``cake_sparse_mla_sm120_dsv4_nvfp4_plan_head_tiles``.
    """
    hpb = HEADS_PER_BLOCK
    num_heads = int(num_heads)
    num_sms = int(num_sms)
    if num_heads % (2 * hpb) != 0:
        return 1
    ctas = int(num_tokens) * (num_heads // hpb)
    chunks = num_chunks(topk, extra_topk)
    if ctas >= num_sms:
        if num_sms < _SMALL_DIE_SMS and chunks <= 2 and num_heads > 2 * hpb and ctas > 2 * num_sms:
            return 1
        return 2
    third = num_sms // 3
    two_thirds = (2 * num_sms) // 3
    if num_heads == 2 * hpb:
        return 2 if ctas >= two_thirds or (chunks >= 8 and ctas >= third) else 1
    if num_heads == 4 * hpb:
        return 2 if chunks >= 8 and third <= ctas < two_thirds else 1
    return 2 if chunks >= 16 and ctas >= third else 1


def plan_head_tiles_074(*, num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0,
                        num_sms: int) -> int:
    """Sixteen-head tiles per decode CTA, 1 or 2, as FlashInfer 0.7.4 plans them (the ``flashinfer-0.7.4``
    planner). The v3 rule (``plan_head_tiles``) with two changes, both on a small die (``num_sms < 64``):

    * at a full wave (``ctas >= num_sms``) the one-tile band for ``chunks <= 2`` and ``num_heads > 32`` is
      ``2 * num_sms < ctas <= 8 * num_sms`` (v3: no upper bound), so beyond eight one-tile waves the pair
      returns;
    * below a wave, 64 heads pair for ``chunks >= 8`` and ``third <= ctas <= two_thirds`` (v3: ``ctas <
      two_thirds``).

    Off a small die the two versions agree everywhere.

    Source: FlashInfer 0.7.4, the ``flashinfer-python`` 0.7.4 wheel on PyPI (built from
    ``flashinfer-ai/flashinfer`` @ ``77039051b0be921788dc2784ec41423b558878ec``),
    ``flashinfer/mla/_sparse_mla_sm120/_cake_dsv4_nvfp4.py`` lines 142-226,
    ``cake_sparse_mla_sm120_dsv4_nvfp4_plan_head_tiles``.
    """
    hpb = HEADS_PER_BLOCK
    num_heads = int(num_heads)
    num_sms = int(num_sms)
    if num_heads % (2 * hpb) != 0:
        return 1
    ctas = int(num_tokens) * (num_heads // hpb)
    chunks = num_chunks(topk, extra_topk)
    small_die = num_sms < _SMALL_DIE_SMS
    if ctas >= num_sms:
        if small_die and chunks <= 2 and num_heads > 2 * hpb and 2 * num_sms < ctas <= 8 * num_sms:
            return 1
        return 2
    third = num_sms // 3
    two_thirds = (2 * num_sms) // 3
    if num_heads == 2 * hpb:
        return 2 if ctas >= two_thirds or (chunks >= 8 and ctas >= third) else 1
    if num_heads == 4 * hpb:
        upper = ctas < two_thirds or (small_die and ctas == two_thirds)
        return 2 if chunks >= 8 and third <= ctas and upper else 1
    return 2 if chunks >= 16 and ctas >= third else 1


def cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits(*, num_tokens: int, num_heads: int, topk: int,
                                                 extra_topk: int = 0, num_sms: int, max_splits: int = 16,
                                                 head_tiles: int = 1) -> tuple[int, int]:
    """``(num_splits, chunks_per_block)`` for one cake sparse-MLA decode call (v3, with the GB10 rules).

    ``chunks < 1`` and ``cdiv(chunks, 16) > max_splits`` raise ``ValueError``. Start at ``min_splits =
    cdiv(chunks, 16)``; with more than two chunks and ``max_splits > 1``, and ``base = num_tokens *
    cdiv(num_heads, 16 * head_tiles)`` CTAs: if ``2 * base <= grid_cap`` (80 % of the SMs; ``sms // 3`` on
    a small die) double the split while it stays within ``max_splits``, the grid cap, the stream cap
    (``tokens * splits <= sms // 6`` on a small die) and at least ``min_cpb`` chunks per CTA (2; 1 for a
    lone CTA off the small die); else (not small) a full grid of >= 16 chunks splits in two when the
    doubled grid's last wave is empty or at least half full. Finally ``cpb = cdiv(chunks, splits)`` and
    ``splits = cdiv(chunks, cpb)``.

    Source: flashinfer-ai/flashinfer flashinfer/mla/_sparse_mla_sm120/_cake_dsv4_nvfp4.py (v3, index file
    id 70274826827; seed 001) ``cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits``; FlashInfer 0.7.4 (commit
    ``77039051``) has the same code.
    """
    hpb = HEADS_PER_BLOCK
    max_cpb = MAX_CHUNKS_PER_BLOCK
    chunks = num_chunks(topk, extra_topk)
    if chunks < 1:
        raise ValueError("topk must be at least 1")
    min_splits = cdiv(chunks, max_cpb)
    if min_splits > max_splits:
        raise ValueError(
            f"{chunks} chunks need at least {min_splits} splits (at most {max_cpb} "
            f"chunks per block), max_splits={max_splits}"
        )
    cta_heads = hpb * int(head_tiles)
    head_blocks = (int(num_heads) + cta_heads - 1) // cta_heads  # upstream's spelling, not cdiv
    base_ctas = int(num_tokens) * head_blocks
    splits = min_splits
    if chunks > 2 and max_splits > 1:
        num_sms = int(num_sms)
        small_die = num_sms < _SMALL_DIE_SMS
        grid_cap = num_sms // 3 if small_die else num_sms * 4 // 5
        # tokens * splits <= base_ctas * splits, so the stream cap is a no-op off the small die.
        stream_cap = num_sms // 6 if small_die else grid_cap
        if base_ctas * 2 <= grid_cap:
            min_cpb = 2 if small_die or base_ctas > 1 else 1
            want = min_splits
            while (
                want * 2 <= max_splits
                and base_ctas * want * 2 <= grid_cap
                and int(num_tokens) * want * 2 <= stream_cap
                and cdiv(chunks, want * 2) >= min_cpb
            ):
                want *= 2
            splits = want
        elif not small_die and base_ctas >= num_sms and chunks >= 16:
            tail = (base_ctas * 2) % num_sms
            if tail == 0 or tail * 2 >= num_sms:
                splits = max(splits, 2)
    cpb = cdiv(chunks, splits)
    splits = cdiv(chunks, cpb)
    return splits, cpb


plan_splits = cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits
cake_sparse_mla_sm120_dsv4_nvfp4_num_chunks = num_chunks
cake_sparse_mla_sm120_dsv4_nvfp4_plan_head_tiles = plan_head_tiles


def select_kernel(*, num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0, num_sms: int) -> str:
    """``"decode"`` or ``"prefill"``: the kernel upstream's public cake route (``functional_run``) runs.

    Decode for head counts without a prefill instance (8) and for more than 16 chunks; otherwise, with
    ``candidates = topk + extra_topk``: ``num_heads >= 64`` -> decode iff ``num_tokens <= (8 if candidates
    >= 512 else 16)``; ``num_heads < 64`` -> decode iff ``candidates >= 512`` and ``num_tokens <= (8 if
    num_sms >= 180 else 32)``. ``num_sms <= 0`` raises ``ValueError``.

    Source: flashinfer-ai/flashinfer flashinfer/mla/_sparse_mla_sm120/_cake_dsv4_nvfp4.py (v3, index file
    id 70274826827) ``cake_sparse_mla_sm120_dsv4_nvfp4_select_kernel`` (prefill head counts and chunk limit
    as the v3 docstrings state them); FlashInfer 0.7.4 (commit ``77039051``) has the same code, with those
    facts in its manifest.
    """
    num_tokens = int(num_tokens)
    num_heads = int(num_heads)
    topk = int(topk)
    extra_topk = int(extra_topk)
    num_sms = int(num_sms)
    if num_sms <= 0:
        raise ValueError(f"num_sms must be positive, got {num_sms}")
    chunks = num_chunks(topk, extra_topk)
    if num_heads not in PREFILL_HEAD_COUNTS or chunks > PREFILL_MAX_CHUNKS:
        return "decode"
    candidates = topk + extra_topk
    policy = _PREFILL_POLICY
    many = candidates >= policy["many_candidates"]
    large = num_sms >= policy["large_sms"]
    if num_heads >= policy["wide_heads"]:
        decode_tokens = policy["wide_decode_tokens_many" if many else "wide_decode_tokens_few"]
    elif many:
        decode_tokens = policy[
            "narrow_decode_tokens_many_large_sms" if large else "narrow_decode_tokens_many_small_sms"
        ]
    else:
        decode_tokens = 0
    return "decode" if num_tokens <= decode_tokens else "prefill"


# =====================================================================================================
# scheduler.cuh: the FA2-style (CUDA-core) paged decode partitioner
# =====================================================================================================

def partition_paged_kv_cache_binary_search_min_num_page_per_batch(
        max_grid_size: int, gdy: int, num_pages: Sequence[int],
        min_num_pages_per_batch: int = 1) -> tuple[int, int]:
    """``(max_num_pages_per_batch, new_batch_size)``: the smallest chunk (in pages, at least
    ``min_num_pages_per_batch``) whose chunk count times ``gdy`` fits ``max_grid_size``.

    Binary search ``low = min_num_pages_per_batch``, ``high = max(num_pages)`` (0 for none): while
    ``low < high``, ``mid = (low + high) // 2``; ``sum(cdiv(p, mid)) * gdy > max_grid_size`` -> ``low =
    mid + 1`` else ``high = mid`` (a zero-page request counts 0 here). Returns ``(low,
    sum(cdiv(max(p, 1), low)))`` (a zero-page request counts 1 chunk here). ``low`` may exceed every
    request's page count when the floor does.

    Source: flashinfer-ai/flashinfer include/flashinfer/attention/scheduler.cuh
    @ 24fd9fc7a944723897cc46a60bf39703ab2813a6 (``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch``).
    """
    low, high = min_num_pages_per_batch, 0
    for elem in num_pages:
        high = max(high, elem)
    while low < high:
        mid = (low + high) // 2
        new_batch_size = 0
        for elem in num_pages:
            new_batch_size += cdiv(elem, mid)
        if new_batch_size * gdy > max_grid_size:
            low = mid + 1
        else:
            high = mid
    new_batch_size = 0
    for elem in num_pages:
        new_batch_size += cdiv(max(elem, 1), low)
    return low, new_batch_size


PartitionPagedKVCacheBinarySearchMinNumPagePerBatch = (  # upstream's name
    partition_paged_kv_cache_binary_search_min_num_page_per_batch)


class DecodeWorkEstimate(NamedTuple):
    """What the decode work estimation returns (upstream's out-parameters)."""

    split_kv: bool
    chunk_pages: int  # upstream ``max_num_pages_per_batch`` (``kv_chunk_size_in_pages`` in DecodePlan)
    new_batch_size: int


def batch_decode_with_paged_kv_cache_work_estimation(*, max_grid_size: int, gdy: int,
                                                     num_pages: Sequence[int], page_size: int,
                                                     enable_cuda_graph: bool = False) -> DecodeWorkEstimate:
    """Split decision of FlashInfer's paged decode: ``(split_kv, chunk_pages, new_batch_size)``.

    ``max_grid_size = num_blocks_per_sm * num_sm`` (upstream: the decode kernel's occupancy from
    ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``; 1 hard-coded for ``MlaCuteSM80``); ``gdy`` is the
    grid's y extent (``num_kv_heads``; ``cdiv(num_qo_heads, 16)`` for the MLA variant). If
    ``batch * gdy >= max_grid_size``: no split, ``chunk = max(1, max(num_pages))``, ``new_batch_size =
    batch``. Otherwise the binary search with the floor ``max(128 // page_size, 1)`` pages, and
    ``split_kv = not (new_batch_size == batch and not enable_cuda_graph)``.

    Source: flashinfer-ai/flashinfer include/flashinfer/attention/scheduler.cuh
    @ 24fd9fc7a944723897cc46a60bf39703ab2813a6 (``BatchDecodeWithPagedKVCacheWorkEstimationDispatched``,
    ``...DispatchedMLA``, ``...DispatchedMlaCuteSM80``: the same steps after ``gdy`` and ``max_grid_size``).
    """
    batch_size = len(num_pages)
    if batch_size * gdy >= max_grid_size:
        split_kv = False
        max_num_pages_per_batch = 1
        for p in num_pages:
            max_num_pages_per_batch = max(max_num_pages_per_batch, p)
        new_batch_size = batch_size
    else:
        max_num_pages_per_batch, new_batch_size = (
            partition_paged_kv_cache_binary_search_min_num_page_per_batch(
                max_grid_size, gdy, num_pages, max(128 // page_size, 1)))
        # Without CUDA graphs, do not use the partition-kv kernel when nothing was split.
        split_kv = not (new_batch_size == batch_size and not enable_cuda_graph)
    return DecodeWorkEstimate(split_kv, max_num_pages_per_batch, new_batch_size)


BatchDecodeWithPagedKVCacheWorkEstimationDispatched = batch_decode_with_paged_kv_cache_work_estimation


def decode_split_kv_indptr(num_pages: Sequence[int], kv_chunk_size: int
                           ) -> tuple[list[int], list[int], list[int]]:
    """``(request_indices, kv_tile_indices, o_indptr)``: request ``i`` gets ``cdiv(max(pages_i, 1),
    kv_chunk_size)`` KV tiles (a zero-length request still gets one).

    Upstream takes the page indptr; this port takes the per-request page counts (its differences).

    Source: flashinfer-ai/flashinfer include/flashinfer/attention/scheduler.cuh
    @ 24fd9fc7a944723897cc46a60bf39703ab2813a6 (``DecodeSplitKVIndptr``).
    """
    request_indices: list[int] = []
    kv_tile_indices: list[int] = []
    o_indptr = [0]
    for batch_idx, p in enumerate(num_pages):
        num_tiles_kv = cdiv(max(p, 1), kv_chunk_size)
        for kv_tile_idx in range(num_tiles_kv):
            request_indices.append(batch_idx)
            kv_tile_indices.append(kv_tile_idx)
        o_indptr.append(o_indptr[-1] + num_tiles_kv)
    return request_indices, kv_tile_indices, o_indptr


def decode_padded_batch_size(*, split_kv: bool, max_grid_size: int, gdy: int, batch_size: int,
                             new_batch_size: int, enable_cuda_graph: bool = False) -> int:
    """``DecodePlan``'s grid x extent: with CUDA graphs ``max_grid_size // gdy`` when splitting else
    ``batch_size``; without, ``new_batch_size``.

    Source: flashinfer-ai/flashinfer include/flashinfer/attention/scheduler.cuh
    @ 24fd9fc7a944723897cc46a60bf39703ab2813a6 (``DecodePlan``).
    """
    if enable_cuda_graph:
        return max_grid_size // gdy if split_kv else batch_size
    return new_batch_size


# =====================================================================================================
# Adapter
# =====================================================================================================

ASSUMED_NUM_BLOCKS_PER_SM = 1  # the occupancy query needs the compiled kernel on a GPU


def _plan(w: DecodeWorkload, dev: DeviceSpec, planner: str, head_tiles_fn: Callable[..., int],
          cake_label: str) -> Plan:
    """The adapter both registered FlashInfer planners share; ``head_tiles_fn`` is their one difference."""
    if w.kind == "sparse_mla":
        if w.num_q_heads not in HEAD_COUNTS:
            raise SplitlabError(f"num_q_heads={w.num_q_heads} is not allowed for planner={planner!r} "
                                f"(cake sparse MLA); expected one of {', '.join(map(str, HEAD_COUNTS))}")
        ht = head_tiles_fn(num_tokens=w.batch, num_heads=w.num_q_heads, topk=w.topk, num_sms=dev.sm_count)
        try:
            splits, cpb = plan_splits(num_tokens=w.batch, num_heads=w.num_q_heads, topk=w.topk,
                                      num_sms=dev.sm_count, head_tiles=ht)
        except ValueError as e:
            raise SplitlabError(f"topk={w.topk} is not allowed for planner={planner!r}: {e}") from None
        kernel = select_kernel(num_tokens=w.batch, num_heads=w.num_q_heads, topk=w.topk, num_sms=dev.sm_count)
        note = (f"cake ({cake_label}) plan_head_tiles -> {ht}, plan_splits(num_tokens={w.batch}, "
                f"num_heads={w.num_q_heads}, topk={w.topk}, num_sms={dev.sm_count}, head_tiles={ht}) -> "
                f"({splits}, {cpb})")
        if kernel == "prefill":
            note += "; upstream's functional_run would pick the unsplit prefill kernel for this shape"
        if dev.arch not in ("sm_120", "sm_121"):
            note += f"; cake runs on sm_120/sm_121 only upstream (rule evaluated at {dev.arch}'s SM count)"
        return Plan(planner, splits, block_h=HEADS_PER_BLOCK * ht, note=note,
                    extra={"chunks_per_block": cpb, "head_tiles": ht, "num_chunks": num_chunks(w.topk),
                           "candidates_per_chunk": _CHUNK, "kernel": kernel})

    gdy = w.num_kv_heads if w.kind == "gqa" else cdiv(w.num_q_heads, 16)
    max_grid_size = ASSUMED_NUM_BLOCKS_PER_SM * dev.sm_count
    pages = [cdiv(n, w.page_size) for n in w.lengths]
    est = batch_decode_with_paged_kv_cache_work_estimation(
        max_grid_size=max_grid_size, gdy=gdy, num_pages=pages, page_size=w.page_size, enable_cuda_graph=False)
    _, _, o_indptr = decode_split_kv_indptr(pages, est.chunk_pages)
    per_request = tuple(o_indptr[i + 1] - o_indptr[i] for i in range(len(pages)))
    variant = "WorkEstimationDispatched" if w.kind == "gqa" else "WorkEstimationDispatchedMLA"
    note = (f"scheduler.cuh BatchDecodeWithPagedKVCache{variant}: gdy={gdy}, max_grid_size="
            f"{ASSUMED_NUM_BLOCKS_PER_SM}*{dev.sm_count} (num_blocks_per_sm=1 assumed; upstream queries the "
            f"kernel's occupancy on the GPU), page_size={w.page_size}, enable_cuda_graph=False -> "
            f"split_kv={est.split_kv}, chunk={est.chunk_pages} pages, new_batch_size={est.new_batch_size}")
    if dev.vendor != "nvidia":
        note += f"; FlashInfer is a CUDA library (rule evaluated at {dev.name}'s CU count)"
    padded = decode_padded_batch_size(split_kv=est.split_kv, max_grid_size=max_grid_size, gdy=gdy,
                                      batch_size=len(pages), new_batch_size=est.new_batch_size)
    return Plan(planner, max(per_request), kv_chunk=est.chunk_pages * w.page_size, per_request=per_request,
                note=note, extra={"split_kv": est.split_kv, "chunk_pages": est.chunk_pages,
                                  "new_batch_size": est.new_batch_size, "gdy": gdy, "max_grid_size": max_grid_size,
                                  "padded_batch_size": padded})


@register("flashinfer", kinds=("gqa", "mla", "sparse_mla"), source=f"{_SRC_CAKE}; {_SRC_SCHED}")
def plan_flashinfer(w: DecodeWorkload, dev: DeviceSpec) -> Plan:
    """FlashInfer's decode split count as the seed's text has it, mapped the way FlashInfer's callers map a
    decode call. Sources: ``flashinfer-ai/flashinfer`` ``flashinfer/mla/_sparse_mla_sm120/_cake_dsv4_nvfp4.py``
    v3 (index file id 70274826827, commit not exposed): ``cake_sparse_mla_sm120_dsv4_nvfp4_plan_head_tiles``
    (``plan_head_tiles``), ``..._plan_splits``, ``..._select_kernel``; ``include/flashinfer/attention/
    scheduler.cuh`` @ ``24fd9fc7a944723897cc46a60bf39703ab2813a6``. ``flashinfer-0.7.4`` is the released
    0.7.4's version of the same (it differs on dies under 64 SMs).

    * ``sparse_mla`` (the cake SM120 route's ``_resolve_plan``): ``head_tiles = plan_head_tiles(num_tokens=
      batch, num_heads=num_q_heads, topk=topk, extra_topk=0, num_sms=sm_count)``, then ``plan_splits(...,
      max_splits=16, head_tiles=head_tiles)``. ``block_h = 16 * head_tiles``; ``chunks_per_block`` goes to
      ``extra``. Head counts without a cake instance, and more than 16384 candidates, raise
      ``SplitlabError`` (upstream raises ``ValueError``). ``extra["kernel"]`` records ``select_kernel``:
      upstream's public route would run the (unsplit) prefill kernel for some shapes. Upstream runs this
      on sm_120 / sm_121 only; on other devices it is the rule at their SM count.
    * ``gqa`` / ``mla`` (the CUDA-core paged decode planner, ``use_tensor_cores=False``; the MLA variant of
      ``BatchDecodeMlaWithPagedKVCacheWrapper``): ``gdy = num_kv_heads`` (gqa) or ``cdiv(num_q_heads, 16)``
      (mla), ``max_grid_size = num_blocks_per_sm * sm_count`` with ``num_blocks_per_sm = 1`` assumed
      (upstream asks ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``, which needs a GPU),
      ``pages_i = cdiv(len_i, page_size)``, ``enable_cuda_graph=False``. ``per_request[i] =
      cdiv(max(pages_i, 1), chunk_pages)`` (``DecodeSplitKVIndptr``), ``num_splits = max(per_request)``,
      ``kv_chunk = chunk_pages * page_size`` tokens (the keys one split covers; not a kernel tile, so
      ``block_n`` stays unset).
    """
    return _plan(w, dev, "flashinfer", plan_head_tiles, "v3")


@register(f"flashinfer-{FLASHINFER_RELEASE}", kinds=("gqa", "mla", "sparse_mla"),
          source=f"{_SRC_CAKE_074}; {_SRC_SCHED_074}")
def plan_flashinfer_074(w: DecodeWorkload, dev: DeviceSpec) -> Plan:
    """FlashInfer 0.7.4's decode split count (registered as ``flashinfer-0.7.4``): ``plan_flashinfer``'s
    mapping with 0.7.4's cake head tiles (``plan_head_tiles_074``: an eight-wave upper bound on the small-die
    one-tile band and an inclusive 64-head sub-wave band on small dies), so the two differ only for
    ``sparse_mla`` on dies under 64 SMs (e.g. GB10).

    Sources: the ``flashinfer-python`` 0.7.4 wheel on PyPI (commit ``77039051b0be921788dc2784ec41423b558878ec``):
    ``flashinfer/mla/_sparse_mla_sm120/_cake_dsv4_nvfp4.py`` ``cake_sparse_mla_sm120_dsv4_nvfp4_plan_head_tiles``,
    ``..._plan_splits`` and ``..._select_kernel`` (the last two as v3), and
    ``flashinfer/data/include/flashinfer/attention/scheduler.cuh`` (the paged-decode functions as @ ``24fd9fc7``).
    """
    return _plan(w, dev, f"flashinfer-{FLASHINFER_RELEASE}", plan_head_tiles_074, FLASHINFER_RELEASE)
