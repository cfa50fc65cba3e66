"""PyTorch FlexDecoding, SGLang's Triton decode splits and FlashMLA's scheduler, with their adapters.

Golden values are derived by hand from planners.md sections 5, 6.1 and 7 (derivations in the comments).
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitlab import workloads
from splitlab.errors import SplitlabError
from splitlab.planners import plan
from splitlab.planners.flashmla import (
    get_mla_metadata,
    num_sm_parts,
    sparse_decode_impl_meta,
    sparse_num_sm_parts,
    sparse_seqlens_k,
    splits_per_request,
)
from splitlab.planners.flex import get_split_k
from splitlab.planners.sglang import get_num_kv_splits, mla_decode_kv_splits_cap

# --- Flex ---------------------------------------------------------------------------------------------------


def test_flex_get_split_k():
    assert get_split_k(1, 8, 132) == 32  # (132 // 8) * 2
    assert get_split_k(4, 1, 132) == 66  # (132 // 4) * 2
    assert get_split_k(0, 8, 132) == 264  # bh = max(0, 1) = 1
    assert get_split_k(200, 8, 132) == 1  # 132 // 1600 = 0 -> max(0, 1)
    assert get_split_k(1, 2, 133) == 132  # floor first: (133 // 2) * 2, not 133 * 2 // 2 = 133


@given(st.integers(0, 10_000), st.integers(0, 256), st.integers(0, 4096))
def test_flex_bounds(b, h, num_sms):
    s = get_split_k(b, h, num_sms)
    assert s >= 1 and (s == 1 or s % 2 == 0)


def test_flex_adapter():
    p = plan(workloads.get("llama-3-8b", batch=1), "h200", "flex")
    assert p.num_splits == 32 and p.extra["BLOCK_M"] == 16  # H = Hkv = 8; group 4 padded to 16 rows
    p = plan(workloads.get("deepseek-v3-mla", batch=4), "h200", "flex")
    assert p.num_splits == 66 and p.extra["BLOCK_M"] == 128  # MLA as MQA: H = 1
    # group 6 is not a power of two: flex decoding is not used (main kernel, no split-K)
    w = workloads.DecodeWorkload("gqa", 1, 48, 8, 128, 128, 4096)
    p = plan(w, "h200", "flex")
    assert p.num_splits == 1 and not p.extra["flex_decoding"]


# --- SGLang -------------------------------------------------------------------------------------------------
# llama-3-8b: 32 heads, 8 kv heads -> group 4, block_h = min(16, 4) = 4, token_grid = num_seq * cdiv(32, 4).


def test_sglang_single_long_sequence():
    # [4096]: max = min, so ms1 = 1, chunk1 = 4096. ext = int(132 * log2(4096 / 64)) = 132 * 6 = 792;
    # token_grid = 1 * 8 = 8 -> ms2 = min(cdiv(792, 8) = 99, 8) = 8, chunk2 = 512 -> max(1, 8) = 8.
    assert get_num_kv_splits([4096], 1, 32, 8, 8, 132) == [8]


def test_sglang_large_batch_splits_less():
    # 32 x 1024: ext = 132 * log2(16) = 528; token_grid = 32 * 8 = 256 -> ms2 = cdiv(528, 256) = 3,
    # chunk2 = cdiv(1024, 3) = 342 -> cdiv(1024, 342) = 3.
    assert get_num_kv_splits([1024] * 32, 1, 32, 8, 8, 132) == [3] * 32


def test_sglang_ragged_batch():
    # [1000, 4000]: 4000 * 8 = 32000 >= 1000 * 10, so min stays 1000: ms1 = min(cdiv(4000, 1000), 8) = 4,
    # chunk1 = 1000. ext = int(132 * log2(62.5)) = int(787.48) = 787; token_grid = 2 * 8 = 16 ->
    # ms2 = min(cdiv(787, 16) = 50, 8) = 8, chunk2 = 500. seq 1000: max(1, 2) = 2; seq 4000: max(4, 8) = 8.
    assert get_num_kv_splits([1000, 4000], 1, 32, 8, 8, 132) == [2, 8]
    # lengths within 25 % (1000 * 8 < 900 * 10) are treated as uniform: ms1 = 1
    assert get_num_kv_splits([900, 1000], 1, 32, 8, 8, 132) == [8, 8]


def test_sglang_group_slot_layout():
    # num_group = 2 (speculative topk 2): token_grid doubles to 32, ms2 = min(cdiv(787, 32) = 25, 8) = 8
    # still; slot i * num_group + g holds sequence i.
    assert get_num_kv_splits([1000, 4000], 2, 32, 8, 8, 132) == [2, 2, 8, 8]


def test_sglang_mha_group_one():
    # 32 heads, 32 kv heads: token_grid = 4 * 32 = 128; ext = 132 * log2(32) = 660 -> cdiv(660, 128) = 6;
    # chunk2 = cdiv(2048, 6) = 342 -> cdiv(2048, 342) = 6.
    assert get_num_kv_splits([2048] * 4, 1, 32, 32, 8, 132) == [6] * 4


def test_sglang_float32_ext_cores():
    # MLA with 16 heads (cap 256), 25 requests of 13996 keys: 132 * log2(13996 / 64) = 1025.99996 in exact
    # arithmetic (double truncates to 1025), but the float32 product rounds to 1026.0: ext = 1026.
    # token_grid = 25 * cdiv(16, 16) = 25 -> ms2 = cdiv(1026, 25) = 42 (double: 41),
    # chunk2 = cdiv(13996, 42) = 334 -> cdiv(13996, 334) = 42 (double: 342 -> 41). (A GPU's approximate
    # log2 may land either side.)
    assert int(132 * math.log2(13996 / 64)) == 1025
    assert get_num_kv_splits([13996] * 25, 1, 16, 1, 256, 132) == [42] * 25


def test_sglang_host_paths():
    assert get_num_kv_splits([4096, 10], 1, 32, 8, 8, 0) == [8, 8]  # no core count: static max
    assert get_num_kv_splits([4096, 10], 1, 32, 8, 8, 132, static_kv_splits=True) == [8, 8]
    assert get_num_kv_splits([4096, 10], 2, 32, 8, 64, 132, split_tile_size=256,
                             enable_deterministic=True) == [16, 16, 1, 1]
    with pytest.raises(SplitlabError, match=r"seq_lens\[i\]=0 is not allowed"):
        get_num_kv_splits([0, 10], 1, 32, 8, 8, 132)


def test_sglang_mla_cap():
    assert mla_decode_kv_splits_cap(8, 132, 32768) == 256  # max(8, min(np2(132) = 256, np2(1024) = 1024))
    assert mla_decode_kv_splits_cap(8, 132, 1000) == 32  # np2(cdiv(1000, 32) = 32) = 32
    assert mla_decode_kv_splits_cap(8, 132, 100) == 8  # np2(4) = 4 < base 8
    assert mla_decode_kv_splits_cap(8, 0, 32768) == 8  # no core count
    assert mla_decode_kv_splits_cap(8, 304, 1 << 20) == 512  # gfx942: the adapter pins this to 256


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 1 << 20), min_size=1, max_size=64), st.integers(1, 4), st.integers(1, 16),
       st.sampled_from([1, 2, 4, 8, 16, 32]), st.integers(1, 512), st.integers(-4, 1024))
def test_sglang_bounds(seq_lens, num_group, kv_heads, group, max_kv_splits, cores):
    out = get_num_kv_splits(seq_lens, num_group, kv_heads * group, kv_heads, max_kv_splits, cores)
    assert len(out) == len(seq_lens) * num_group
    assert all(1 <= s <= max_kv_splits for s in out)
    assert all(out[i * num_group + g] == out[i * num_group]
               for i in range(len(seq_lens)) for g in range(num_group))


def test_sglang_adapter():
    p = plan(workloads.get("llama-3-8b", batch=1, ctx_len=4096), "h200", "sglang")
    assert (p.num_splits, p.per_request, p.block_h, p.extra["max_kv_splits"]) == (8, (8,), 4, 8)
    w = workloads.get("llama-3-8b").with_(batch=2, ctx_len=4000, seq_lens=(1000, 4000))
    assert plan(w, "h200", "sglang").per_request == (2, 8)
    p = plan(workloads.get("deepseek-v3-mla", batch=4, ctx_len=32768), "mi300x", "sglang")
    assert p.extra["max_kv_splits"] == 256  # 512 from the cap, pinned to 256 on gfx942


# --- FlashMLA -----------------------------------------------------------------------------------------------


def test_flashmla_num_sm_parts():
    assert num_sm_parts(132, 128, 1, 1) == 66  # 132 // 1 // cdiv(128, 64)
    assert num_sm_parts(132, 16, 1, 1) == 132  # one 64-row tile
    assert num_sm_parts(132, 128, 1, 2) == 33  # s_q 2: cdiv(256, 64) = 4
    assert num_sm_parts(132, 128, 2, 1) == 66  # 132 // 2 // cdiv(64, 64)
    assert num_sm_parts(1, 128, 1, 1) == 1  # floor at 1
    assert sparse_num_sm_parts(132, 128) == 66 and sparse_num_sm_parts(132, 64) == 132
    assert sparse_num_sm_parts(132, 128, 2) == 33
    assert tuple(sparse_decode_impl_meta(148, 128, 1, 512, "sm_100")) == (74, 3, 64)
    assert tuple(sparse_decode_impl_meta(148, 128, 1, 576, "sm_100")) == (148, 5, 64)
    with pytest.raises(SplitlabError, match="h_q=16 is not allowed"):
        sparse_num_sm_parts(132, 16)


def test_flashmla_greedy_schedule_by_hand():
    # seqlens [100, 500, 40], 4 partitions, 64-key blocks, overhead 5:
    #   blocks = [99 // 64 + 1, 499 // 64 + 1, 39 // 64 + 1] = [2, 8, 1]; total = 7 + 13 + 6 = 26;
    #   payload = cdiv(26, 4) + 5 = 12.
    # P0: remain 12: req0 needs 2 + 5 = 7 -> done (splits 1), remain 5; req1 needs 13 > 5, 5 - 5 = 0 -> end.
    # P1: remain 12: req1 needs 13 > 12 -> take 12 - 5 = 7 blocks (split 1 of req1), end.
    # P2: req1 needs 1 + 5 = 6 <= 12 -> done (splits 2), remain 6; req2 needs 1 + 5 = 6 -> done, remain 0.
    # P3: nothing left: begin 3 > end 2 (empty).
    meta, prefix = get_mla_metadata([100, 500, 40], 4)
    assert prefix == [0, 1, 3, 4]
    assert splits_per_request(prefix) == [1, 2, 1]
    got = [(m.begin_req_idx, m.begin_block_idx, m.begin_split_idx, m.end_req_idx, m.end_block_idx,
            m.is_first_req_splitted, m.is_last_req_splitted) for m in meta]
    assert got == [
        (0, 0, 0, 0, 2, False, False),
        (1, 0, 0, 1, 7, True, True),  # one request, cut at its end: both flags set
        (1, 7, 1, 2, 1, True, False),
        (3, 0, 0, 2, 1, False, False),
    ]
    assert [m.empty for m in meta] == [False, False, False, True]


def test_flashmla_zero_length_requests():
    # A zero length still counts one block; as the last request of a partition its end block is 0.
    meta, prefix = get_mla_metadata([64, 0], 1)
    assert prefix == [0, 1, 2]
    assert (meta[0].end_req_idx, meta[0].end_block_idx, meta[0].is_last_req_splitted) == (1, 0, False)
    assert sparse_seqlens_k(2, 0) == [1, 1]  # sparse: 0 becomes 1
    assert sparse_seqlens_k(1, 100, extra_topk=30) == [128 + 30]  # ceil to 64, then the extra top-k


def _segments(meta, num_blocks):
    """(request, start, stop) block ranges each non-empty partition covers."""
    segs = []
    for m in meta:
        if m.empty:
            continue
        for r in range(m.begin_req_idx, m.end_req_idx + 1):
            start = m.begin_block_idx if r == m.begin_req_idx else 0
            stop = m.end_block_idx if r == m.end_req_idx else num_blocks[r]
            segs.append((r, start, stop))
    return segs


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 20_000), min_size=1, max_size=48), st.integers(1, 200),
       st.sampled_from([16, 64]), st.integers(0, 8))
def test_flashmla_schedule_invariants(seqlens, parts, block_n, overhead):
    meta, prefix = get_mla_metadata(seqlens, parts, block_n, overhead)
    per = splits_per_request(prefix)
    assert len(meta) == parts and len(prefix) == len(seqlens) + 1 and prefix[0] == 0
    assert all(s >= 1 for s in per)
    used = sum(not m.empty for m in meta)
    assert used <= parts
    assert prefix[-1] <= len(seqlens) + parts - 1  # each extra split starts a new partition
    if all(s > 0 for s in seqlens):
        # the partitions tile every request's blocks exactly once, in order, in `per` pieces
        num_blocks = [(s - 1) // block_n + 1 for s in seqlens]
        segs = _segments(meta, num_blocks)
        for r, n in enumerate(num_blocks):
            mine = [(a, b) for q, a, b in segs if q == r]
            assert len(mine) == per[r]
            assert mine[0][0] == 0 and mine[-1][1] == n
            assert all(mine[i][1] == mine[i + 1][0] for i in range(len(mine) - 1))
            assert all(a < b for a, b in mine)


def test_flashmla_adapter_dense():
    # deepseek-v3-mla (128 heads), 4 x 32768 keys on an H200: num_sm_parts = 66; 512 blocks per request;
    # total = 4 * 517 = 2068, payload = cdiv(2068, 66) + 5 = 37 -> 32 blocks per partition: each request spans
    # 16 partitions (the 16th ends exactly with 32 + 5 = 37) -> 16 splits each, 64 partitions used.
    p = plan(workloads.get("deepseek-v3-mla", batch=4, ctx_len=32768), "h200", "flashmla")
    assert (p.num_splits, p.per_request, p.block_n, p.extra["num_sm_parts"]) == (16, (16,) * 4, 64, 66)
    assert p.extra["partitions_used"] == 64


def test_flashmla_adapter_sparse():
    # deepseek-v3.2 sparse (128 heads, topk 2048), 4 query tokens, SM90: num_sm_parts = 132 // 1 // 2 = 66;
    # 32 blocks each, total = 4 * 37 = 148, payload = cdiv(148, 66) + 5 = 8 -> 3 blocks per partition:
    # a request needs cdiv(32, 3) = 11 partitions (10 x 3 = 30, then 2 + 5 = 7 <= 8 finishes it) -> 11 splits.
    p = plan(workloads.get("deepseek-v3.2-sparse-mla", batch=4), "h200", "flashmla")
    assert (p.num_splits, p.per_request, p.extra["num_sm_parts"]) == (11, (11,) * 4, 66)
    with pytest.raises(SplitlabError, match="h_q=16 is not allowed"):
        plan(workloads.get("deepseek-v3.2-sparse-mla").with_(num_q_heads=16), "h200", "flashmla")


@pytest.mark.parametrize("preset", ["deepseek-v3-mla", "deepseek-v3-mla-tp8", "kimi-k2.5-mla-tp4",
                                    "deepseek-v3.2-sparse-mla", "deepseek-v4-sparse-mla"])
@pytest.mark.parametrize("device", ["h200", "b200", "mi355x"])
@pytest.mark.parametrize("batch,ctx", [(1, 1024), (8, 65536), (128, 4096)])
def test_adapters_on_mla_presets(preset, device, batch, ctx):
    w = workloads.get(preset, batch=batch, ctx_len=ctx)
    p = plan(w, device, "flashmla")
    assert p.num_splits == max(p.per_request) >= 1 and len(p.per_request) == batch
    assert p.extra["partitions_used"] <= p.extra["num_sm_parts"]
    assert p.extra["total_splits"] <= batch + p.extra["num_sm_parts"]
    for name in ("sglang", "flex") if w.kind == "mla" else ("aiter",):
        q = plan(w, device, name)
        assert q.num_splits >= 1 and q.note
    if w.kind == "mla":
        q = plan(w, device, "sglang")
        assert 1 <= q.num_splits <= q.extra["max_kv_splits"] and len(q.per_request) == batch
