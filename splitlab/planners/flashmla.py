"""FlashMLA's decode schedule: ``num_sm_parts`` and the greedy split scheduler of ``get_mla_metadata``.

Repository ``deepseek-ai/FlashMLA``; docs/planners.md section 7 cites commit
``9241ae3ef9bac614dd25e45e507e089f888280e0``, which the index does not store. Checked against the stored
texts:

* ``csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu`` @
  ``0e1bdd4915b0c9cbd8f9ce6cd35c00a98691caa8`` (index id 69739655693): the scheduler kernel;
* ``csrc/api/dense_decode.h`` @ ``1aeef780aa12f7cdc034050352f61f94f532c0e7`` (index id 52378388135):
  dense ``num_sm_parts``, ``block_size_n = 64``, ``fixed_overhead_num_blocks = 5``;
* ``csrc/api/sparse_decode.h`` @ ``4855c772bacb4d2cca413d6fb73cce396256a3c1`` (index id 52347378273): the
  sparse ``DecodeImplMeta`` per architecture.

All arithmetic is C++ ``int`` on non-negative values, so ``/`` is ``//``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from splitlab.devices import DeviceSpec
from splitlab.errors import SplitlabError, bad, check_int
from splitlab.intmath import cdiv
from splitlab.planners.registry import Plan, register
from splitlab.workloads import DecodeWorkload

FLASHMLA_SOURCE = ("deepseek-ai/FlashMLA csrc/api/{dense,sparse}_decode.h + "
                   "csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu @ "
                   "9241ae3ef9bac614dd25e45e507e089f888280e0")


def num_sm_parts(num_sms: int, h_q: int, h_k: int, s_q: int = 1) -> int:
    """Dense decode ``num_sm_parts = max(num_sms / h_k / ceil_div(s_q * h_q / h_k, 64), 1)`` (C++ ints, left
    to right): SM partitions per KV head, one per 64-row tile of the packed ``s_q * h_q / h_k`` queries.

    Source: ``deepseek-ai/FlashMLA`` ``csrc/api/dense_decode.h`` @ ``9241ae3e`` (checked @ ``1aeef780``). The
    original ``csrc/flash_api.cpp`` had no ``max(..., 1)``.
    """
    num_sms = check_int("num_sms", num_sms)
    h_q = check_int("h_q", h_q)
    h_k = check_int("h_k", h_k)
    s_q = check_int("s_q", s_q)
    return max(num_sms // h_k // cdiv(s_q * h_q // h_k, 64), 1)


class DecodeImplMeta(NamedTuple):
    """FlashMLA ``DecodeImplMeta``: the scheduler's knobs for one sparse-decode implementation."""

    num_sm_parts: int
    fixed_overhead_num_blocks: int
    block_size_topk: int


def sparse_num_sm_parts(num_sms: int, h_q: int, s_q: int = 1) -> int:
    """SM90 sparse decode ``num_sm_parts = max(num_sms / s_q / (h_q / 64), 1)`` (``Decode_Sm90_Impl``); the
    kernel takes ``h_q`` 64 or 128 only (one or two 64-head tiles).

    Source: ``deepseek-ai/FlashMLA`` ``csrc/api/sparse_decode.h`` @ ``9241ae3e`` (checked @ ``4855c772``).
    """
    num_sms = check_int("num_sms", num_sms)
    h_q = check_int("h_q", h_q)
    s_q = check_int("s_q", s_q)
    if h_q not in (64, 128):
        raise bad("h_q", h_q, "64 or 128 (FlashMLA sparse decode)")
    return max(num_sms // s_q // (h_q // 64), 1)


def sparse_decode_impl_meta(num_sms: int, h_q: int, s_q: int = 1, d_qk: int = 576,
                            arch: str = "sm_90") -> DecodeImplMeta:
    """The sparse-decode ``DecodeImplMeta`` the interface picks: SM90 ``{max(sms/s_q/(h_q/64), 1), 5, 64}``;
    SM100f with ``h_q = 64``, or ``h_q = 128`` and ``d_qk = 576`` (head64 twice),
    ``{max(sms/s_q, 1), 5, 64}``; SM100f with ``h_q = 128`` and ``d_qk = 512`` ``{max(sms/s_q/2, 1), 3, 64}``.
    ``arch`` is ``"sm_90"`` or ``"sm_100"``.

    Source: ``deepseek-ai/FlashMLA`` ``csrc/api/sparse_decode.h`` @ ``9241ae3e`` (checked @ ``4855c772``).
    """
    num_sms = check_int("num_sms", num_sms)
    s_q = check_int("s_q", s_q)
    if h_q not in (64, 128):
        raise bad("h_q", h_q, "64 or 128 (FlashMLA sparse decode)")
    if d_qk not in (576, 512):
        raise bad("d_qk", d_qk, "576 or 512 (FlashMLA sparse decode)")
    if arch == "sm_100":
        if h_q == 128 and d_qk == 512:
            return DecodeImplMeta(max(num_sms // s_q // 2, 1), 3, 64)
        return DecodeImplMeta(max(num_sms // s_q, 1), 5, 64)
    if arch == "sm_90":
        return DecodeImplMeta(sparse_num_sm_parts(num_sms, h_q, s_q), 5, 64)
    raise bad("arch", arch, "'sm_90' or 'sm_100' (FlashMLA sparse decode)")


def sparse_seqlens_k(batch: int, topk: int, topk_length: Sequence[int] | None = None, extra_topk: int = 0,
                     extra_topk_length: Sequence[int] | None = None, block_size_n: int = 64) -> list[int]:
    """Step 1 of the scheduler for sparse decode: ``s_k = topk_length[i]`` (or ``topk``), 0 becomes 1, and
    with an extra cache ``s_k = ceil_to_multiple(s_k, block_size_n) + extra_topk_length[i]`` (or
    ``extra_topk``)."""
    out = []
    for i in range(batch):
        cur_s_k = topk_length[i] if topk_length is not None else topk
        if cur_s_k == 0:
            cur_s_k = 1  # Ensure the main loop will never be empty
        if extra_topk:
            cur_s_k = cdiv(cur_s_k, block_size_n) * block_size_n
            cur_s_k += extra_topk_length[i] if extra_topk_length is not None else extra_topk
        out.append(cur_s_k)
    return out


@dataclass(frozen=True)
class DecodingSchedMeta:
    """One SM partition of ``tile_scheduler_metadata``: requests ``begin_req_idx..end_req_idx``, from block
    ``begin_block_idx`` of the first to block ``end_block_idx`` (exclusive) of the last; ``begin_split_idx``
    is the first request's split index. Empty when ``begin_req_idx > end_req_idx``."""

    begin_req_idx: int
    begin_block_idx: int
    begin_split_idx: int
    end_req_idx: int
    end_block_idx: int
    is_first_req_splitted: bool
    is_last_req_splitted: bool

    @property
    def empty(self) -> bool:
        return self.begin_req_idx > self.end_req_idx


def get_mla_metadata(seqlens_k: Sequence[int], num_sm_parts: int, block_size_n: int = 64,
                     fixed_overhead_num_blocks: int = 5) -> tuple[list[DecodingSchedMeta], list[int]]:
    """FlashMLA ``get_mla_metadata_kernel``: the greedy split schedule of a decode batch over ``num_sm_parts``
    SM partitions.

    1. ``num_blocks_i = max(s_k_i - 1, 0) // block_size_n + 1`` (a zero length still counts one block);
    2. ``total = sum(num_blocks_i + fixed_overhead)``,
       ``payload = cdiv(total, num_sm_parts) + fixed_overhead``;
    3. each partition starts with ``remain = payload`` and walks the requests: finish one if ``remain >=
       blocks_left + overhead`` (``remain -= blocks_left + overhead``); else take ``remain - overhead`` blocks
       as one split if positive and end the partition; else end the partition.

    Returns ``(tile_scheduler_metadata, num_splits)``: one ``DecodingSchedMeta`` per partition (trailing ones
    may be empty) and the prefix sums of the per-request split counts (length ``b + 1``,
    ``num_splits[0] = 0``; request ``i`` has ``num_splits[i+1] - num_splits[i]`` splits, the partitions it
    touches). ``seqlens_k`` are the dense lengths, or the sparse ``s_k`` of ``sparse_seqlens_k``.

    Source: ``deepseek-ai/FlashMLA`` ``csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu`` @
    ``9241ae3e`` (planners.md 7; checked @ ``0e1bdd49``).
    """
    seqlens_k = [check_int("seqlens_k[i]", s, minimum=0) for s in seqlens_k]
    num_sm_parts = check_int("num_sm_parts", num_sm_parts)
    block_size_n = check_int("block_size_n", block_size_n)
    fixed_overhead_num_blocks = check_int("fixed_overhead_num_blocks", fixed_overhead_num_blocks, minimum=0)
    batch_size = len(seqlens_k)
    if batch_size < 1:
        raise bad("seqlens_k", seqlens_k, "at least one request")

    num_blocks_shared = []
    total_num_blocks = 0
    for cur_s_k in seqlens_k:
        first_token_idx = 0
        last_token_idx = max(cur_s_k - 1, 0)
        cur_first_block_idx = first_token_idx // block_size_n
        cur_last_block_idx = last_token_idx // block_size_n
        num_blocks = cur_last_block_idx - cur_first_block_idx + 1
        total_num_blocks += num_blocks + fixed_overhead_num_blocks
        num_blocks_shared.append(num_blocks)

    payload = cdiv(total_num_blocks, num_sm_parts) + fixed_overhead_num_blocks
    now_req_idx, now_block, now_n_split_idx, cum_num_splits = 0, 0, 0, 0
    num_splits_shared = [0] * (batch_size + 1)
    metadata: list[DecodingSchedMeta] = []
    for _ in range(num_sm_parts):
        begin_req_idx, begin_block_idx, begin_split_idx = now_req_idx, now_block, now_n_split_idx
        is_first_req_splitted = now_block != 0
        remain_payload = payload
        while now_req_idx < batch_size:
            num_blocks = num_blocks_shared[now_req_idx]
            now_remain_blocks = num_blocks - now_block
            if remain_payload >= now_remain_blocks + fixed_overhead_num_blocks:
                cum_num_splits += now_n_split_idx + 1
                num_splits_shared[now_req_idx + 1] = cum_num_splits
                remain_payload -= now_remain_blocks + fixed_overhead_num_blocks
                now_req_idx += 1
                now_block = 0
                now_n_split_idx = 0
            else:
                if remain_payload - fixed_overhead_num_blocks > 0:
                    now_block += remain_payload - fixed_overhead_num_blocks
                    now_n_split_idx += 1
                    remain_payload = 0
                break
        if now_req_idx == 0 and now_block == 0:  # cannot happen: payload > overhead always makes progress
            raise SplitlabError("FlashMLA scheduler made no progress in a partition")
        end_req_idx = now_req_idx if now_block > 0 else now_req_idx - 1
        if now_block > 0:
            end_block_idx = now_block
        else:
            end_block_idx = 0 if seqlens_k[now_req_idx - 1] == 0 else num_blocks_shared[now_req_idx - 1]
        is_last_req_splitted = (end_block_idx != num_blocks_shared[end_req_idx]
                                and seqlens_k[end_req_idx] != 0)
        if begin_req_idx == end_req_idx:
            is_first_req_splitted = is_last_req_splitted = is_first_req_splitted or is_last_req_splitted
        metadata.append(DecodingSchedMeta(begin_req_idx, begin_block_idx, begin_split_idx, end_req_idx,
                                          end_block_idx, is_first_req_splitted, is_last_req_splitted))
    # FLASH_DEVICE_ASSERT(now_req_idx == batch_size && now_block == 0 && now_n_split_idx == 0)
    if not (now_req_idx == batch_size and now_block == 0 and now_n_split_idx == 0):
        raise SplitlabError("FlashMLA scheduler left requests unscheduled (upstream device assert)")
    return metadata, num_splits_shared


def splits_per_request(num_splits: Sequence[int]) -> list[int]:
    """Per-request split counts from ``get_mla_metadata``'s prefix sums."""
    return [num_splits[i + 1] - num_splits[i] for i in range(len(num_splits) - 1)]


@register("flashmla", kinds=("mla", "sparse_mla"), source=FLASHMLA_SOURCE)
def plan_flashmla(w: DecodeWorkload, dev: DeviceSpec) -> Plan:
    """FlashMLA decode: the scheduler's per-request split counts, ``num_splits`` their maximum.

    ``mla`` (dense decode, ``h_k = 1``, ``s_q = 1``): ``num_sm_parts(sm_count, H, 1)``,
    ``seqlens_k = lengths``, 64-key blocks, overhead 5. ``sparse_mla``: each query token is a request
    (``b = batch``, ``s_q = 1``) whose ``s_k`` is ``topk``; ``DecodeImplMeta`` for SM90, or SM100 on
    ``sm_100`` devices. ``block_n`` is the scheduler block (64 keys); ``block_h`` the 64 query heads of one
    tile.
    """
    h_q = w.num_q_heads
    if w.kind == "mla":
        parts = num_sm_parts(dev.sm_count, h_q, 1, 1)
        block_size_n, overhead = 64, 5
        seqlens_k = list(w.lengths)
        note = (f"dense decode: num_sm_parts = max({dev.sm_count} // 1 // cdiv({h_q}, 64), 1) = {parts}, "
                "blocks of 64 keys, overhead 5")
        if dev.arch != "sm_90":
            note += f"; upstream dense decode is SM90a-only: computed with {dev.arch}'s SM count"
    else:
        arch = "sm_100" if dev.arch == "sm_100" else "sm_90"
        meta = sparse_decode_impl_meta(dev.sm_count, h_q, 1, w.head_dim_qk, arch)
        parts, overhead, block_size_n = meta
        seqlens_k = sparse_seqlens_k(w.batch, w.topk, block_size_n=block_size_n)
        note = (f"sparse decode ({arch} DecodeImplMeta): num_sm_parts={parts}, overhead {overhead}, "
                f"s_k = topk = {w.topk} per query token")
        if dev.arch not in ("sm_90", "sm_100"):
            note += f"; upstream sparse decode runs on SM90a/SM100f only: computed as {arch}"
    metadata, prefix = get_mla_metadata(seqlens_k, parts, block_size_n, overhead)
    per = splits_per_request(prefix)
    used = sum(not m.empty for m in metadata)
    return Plan("flashmla", max(per), block_n=block_size_n, block_h=64, per_request=tuple(per), note=note,
                extra={"num_sm_parts": parts, "partitions_used": used, "total_splits": prefix[-1]})
