"""FlashInfer planner ports: the cake SM120 sparse-MLA planners and the scheduler.cuh paged-decode
partitioner. Golden values are derived by hand in the comments from the upstream rule text (the v3 cake
module and seed 001's docstring; scheduler.cuh @ 24fd9fc7), not read back from the port.

Reference SM counts (seed 001): RTX PRO 6000 = 188 (grid cap 188*4//5 = 150), RTX 5090 = 170 (grid cap
136), GB10 = 48 (small die: grid cap 48//3 = 16, stream cap 48//6 = 8).
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from splitlab import workloads
from splitlab.errors import SplitlabError
from splitlab.intmath import cdiv
from splitlab.planners import names, plan
from splitlab.planners.flashinfer import (
    BatchDecodeWithPagedKVCacheWorkEstimationDispatched,
    PartitionPagedKVCacheBinarySearchMinNumPagePerBatch,
    batch_decode_with_paged_kv_cache_work_estimation,
    cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits,
    decode_padded_batch_size,
    decode_split_kv_indptr,
    num_chunks,
    partition_paged_kv_cache_binary_search_min_num_page_per_batch,
    plan_head_tiles,
    plan_head_tiles_074,
    plan_splits,
    select_kernel,
)

PRO6000, RTX5090, GB10 = 188, 170, 48


def splits(t, h, topk, sms, extra=0, max_splits=16, ht=1):
    return plan_splits(num_tokens=t, num_heads=h, topk=topk, extra_topk=extra, num_sms=sms,
                       max_splits=max_splits, head_tiles=ht)


def test_names():
    assert plan_splits is cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits
    assert PartitionPagedKVCacheBinarySearchMinNumPagePerBatch is \
        partition_paged_kv_cache_binary_search_min_num_page_per_batch
    assert BatchDecodeWithPagedKVCacheWorkEstimationDispatched is \
        batch_decode_with_paged_kv_cache_work_estimation


def test_num_chunks():
    assert num_chunks(1) == 1
    assert num_chunks(64) == 1
    assert num_chunks(65) == 2
    assert num_chunks(2048) == 32
    assert num_chunks(2048, 128) == 34  # 32 + 2
    assert num_chunks(0, 0) == 0


# ----------------------------------------------------------------------------------------------------
# plan_splits: seed 001's claims as concrete cases
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sms", [PRO6000, RTX5090, GB10])
def test_two_chunks_never_split(sms):
    # chunks = 2 (or 1): the split loop needs chunks > 2, so splits = min_splits = 1 and cpb = chunks.
    assert splits(1, 16, 128, sms) == (1, 2)
    assert splits(1, 16, 65, sms) == (1, 2)
    assert splits(1, 128, 64, sms) == (1, 1)
    assert splits(1, 16, 64, sms, extra=64) == (1, 2)


def test_gb10_one_token_128_heads_two_splits():
    # GB10, 1 token, 128 heads, 512 candidates (8 chunks): base = 1 * cdiv(128, 16) = 8 CTAs;
    # 2 * 8 = 16 <= grid cap 16 -> sub-wave; want 1 -> 2 (8*2 = 16 <= 16, 1*2 <= 8, cdiv(8,2) = 4 >= 2);
    # 4 fails (8*4 = 32 > 16) -> 2 splits, cpb 4.
    assert splits(1, 128, 512, GB10) == (2, 4)
    # 1024 candidates (16 chunks): same loop -> 2, cpb 8.
    assert splits(1, 128, 1024, GB10) == (2, 8)
    # 2048 candidates (32 chunks): min_splits 2 already, 4 fails the grid cap -> (2, 16).
    assert splits(1, 128, 2048, GB10) == (2, 16)


@pytest.mark.parametrize("heads", [32, 64])
def test_gb10_one_token_le_64_heads_four_splits(heads):
    # GB10, 1 token, <= 64 heads, 512 candidates (8 chunks): base 2 (H=32) or 4 (H=64);
    # want 1 -> 2 -> 4 (base*4 <= 16, 4 streams <= 8, cdiv(8,4) = 2 >= 2); 8 fails (H=64: 32 > 16;
    # H=32: cdiv(8, 8) = 1 < 2) -> 4 splits, cpb 2.
    assert splits(1, heads, 512, GB10) == (4, 2)


def test_gb10_eight_distinct_tokens_never_split():
    # GB10, 8 tokens, 16 heads, 8 chunks: base 8, 16 <= 16 -> sub-wave, but 8 tokens * 2 = 16 > stream
    # cap 8 -> 1 split. The same shape on RTX PRO 6000 (grid cap 150, no stream cap): 1 -> 2 -> 4
    # (cdiv(8, 4) = 2 >= 2); 8 fails min_cpb 2 -> (4, 2).
    assert splits(8, 16, 512, GB10) == (1, 8)
    assert splits(8, 16, 512, PRO6000) == (4, 2)


def test_lone_cta_chunks_per_block():
    # 1 token, 16 heads -> base 1. GB10 keeps >= 2 chunks per CTA also for a lone CTA: 8 chunks ->
    # 1 -> 2 -> 4 (cdiv(8,4) = 2) ; 8 fails (1 < 2) -> (4, 2).
    assert splits(1, 16, 512, GB10) == (4, 2)
    # RTX PRO 6000: a lone CTA takes min_cpb 1: 1 -> 2 -> 4 -> 8 -> 16 (max_splits); cpb = cdiv(8, 16)
    # = 1, renormalised splits = cdiv(8, 1) = 8 -> (8, 1).
    assert splits(1, 16, 512, PRO6000) == (8, 1)
    # 3 chunks on RTX PRO 6000: the loop reaches 16, cpb = cdiv(3, 16) = 1 -> splits 3: no empty split.
    assert splits(1, 16, 192, PRO6000) == (3, 1)
    # 3 chunks on GB10: 1 -> 2 (cdiv(3,2) = 2 >= 2); 4 fails (cdiv(3,4) = 1) -> (2, 2).
    assert splits(1, 16, 192, GB10) == (2, 2)


def test_sub_wave_pro6000_vs_5090():
    # 1 token, 128 heads, 32 chunks: base 8; min_splits 2; 2 -> 4 -> 8 -> 16 (8*16 = 128 <= 150 and <=
    # 136; cdiv(32, 16) = 2 >= 2) -> (16, 2) on both SKUs.
    assert splits(1, 128, 2048, PRO6000) == (16, 2)
    assert splits(1, 128, 2048, RTX5090) == (16, 2)
    # 9 tokens, 16 heads, 32 chunks: base 9; 2 -> 4 -> 8 -> 16 needs 9*16 = 144 <= grid cap:
    # yes on PRO 6000 (150) -> (16, 2); no on RTX 5090 (136) -> 8, cpb 4.
    assert splits(9, 16, 2048, PRO6000) == (16, 2)
    assert splits(9, 16, 2048, RTX5090) == (8, 4)


def test_full_wave_split_in_two():
    # 16 chunks (1024 candidates), 16 heads -> base = tokens.
    # PRO 6000, 188 tokens: base 188 >= 188 and 2*188 > 150; tail = 376 % 188 = 0 -> 2 splits, cpb 8.
    assert splits(188, 16, 1024, PRO6000) == (2, 8)
    # 235 tokens: tail = 470 % 188 = 94, 94*2 = 188 >= 188 (half full) -> (2, 8).
    assert splits(235, 16, 1024, PRO6000) == (2, 8)
    # 200 tokens: tail = 400 % 188 = 24, 48 < 188 -> unsplit.
    assert splits(200, 16, 1024, PRO6000) == (1, 16)
    # RTX 5090, 188 tokens: tail = 376 % 170 = 36, 72 < 170 -> unsplit.
    assert splits(188, 16, 1024, RTX5090) == (1, 16)
    # 15 chunks never take the full-wave split.
    assert splits(188, 16, 960, PRO6000) == (1, 15)
    # GB10: no wave-quantization split on a full grid (48 tokens, tail 0 would split elsewhere).
    assert splits(48, 16, 1024, GB10) == (1, 16)
    # Between 40 % and one wave: 100 tokens on PRO 6000 (2*100 > 150, 100 < 188) -> unsplit.
    assert splits(100, 16, 1024, PRO6000) == (1, 16)


def test_more_than_1024_candidates_force_splits():
    # 64 tokens, 128 heads, 2048 candidates on PRO 6000: min_splits = cdiv(32, 16) = 2; base 512 is a
    # full grid; tail = 1024 % 188 = 84, 168 < 188 -> no extra split; stays at 2 -> (2, 16).
    assert splits(64, 128, 2048, PRO6000) == (2, 16)
    # 4096 candidates: 64 chunks -> min_splits 4 -> (4, 16).
    assert splits(64, 128, 4096, PRO6000) == (4, 16)
    # The extra (compressed) cache counts too: 1024 + 64 -> 17 chunks -> min 2, cpb 9.
    assert splits(64, 128, 1024, PRO6000, extra=64) == (2, 9)
    # max_splits below ceil(chunks / 16) raises.
    with pytest.raises(ValueError, match="need at least 2 splits"):
        splits(1, 16, 2048, PRO6000, max_splits=1)
    with pytest.raises(ValueError, match="need at least 4 splits"):
        splits(1, 16, 4096, PRO6000, max_splits=3)
    # No candidates raises.
    with pytest.raises(ValueError, match="topk must be at least 1"):
        splits(1, 16, 0, PRO6000)
    # max_splits caps the sub-wave doubling: 1 token, 16 heads, 8 chunks on PRO 6000 with max 4 ->
    # 1 -> 2 -> 4 -> (4, 2).
    assert splits(1, 16, 512, PRO6000, max_splits=4) == (4, 2)


def test_head_tiles_count_the_grid_in_32_head_ctas():
    # 4 tokens, 128 heads, 32 chunks on PRO 6000. ht=1: base 32; 2 -> 4 (128 <= 150); 8 fails (256)
    # -> (4, 8). ht=2: base 16; 2 -> 4 -> 8 (128 <= 150); 16 fails -> (8, 4).
    assert splits(4, 128, 2048, PRO6000, ht=1) == (4, 8)
    assert splits(4, 128, 2048, PRO6000, ht=2) == (8, 4)


# ----------------------------------------------------------------------------------------------------
# plan_head_tiles
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("t", "h", "topk", "sms", "want"), [
    # Head counts not divisible by 32 have no two-tile instance.
    (12, 48, 1024, PRO6000, 1), (100, 16, 1024, PRO6000, 1), (100, 8, 1024, PRO6000, 1),
    # PRO 6000: third = 62, two_thirds = 125. A full wave (ctas = T*H/16 >= 188) -> 2.
    (24, 128, 128, PRO6000, 2),
    # H=128 below a wave: 2 iff chunks >= 16 and ctas >= 62. T=12 -> ctas 96.
    (12, 128, 1024, PRO6000, 2), (12, 128, 512, PRO6000, 1),
    # H=96: T=10 -> ctas 60 < 62 -> 1; T=11 -> 66 -> 2.
    (10, 96, 1024, PRO6000, 1), (11, 96, 1024, PRO6000, 2),
    # H=32: ctas >= 125 -> 2 (T=84, ctas 168); or chunks >= 8 and ctas >= 62 (T=40, ctas 80).
    (84, 32, 128, PRO6000, 2), (40, 32, 512, PRO6000, 2), (40, 32, 256, PRO6000, 1),
    # H=64: 2 only for chunks >= 8 and 62 <= ctas < 125: T=20 -> 80 -> 2; T=32 -> 128 -> 1.
    (20, 64, 512, PRO6000, 2), (32, 64, 512, PRO6000, 1), (20, 64, 256, PRO6000, 1),
    # GB10 full wave with <= 2 chunks, H > 32 and ctas > 2*48 = 96 -> 1 (H=64, T=32: ctas 128).
    (32, 64, 128, GB10, 1),
    # ... but with 4 chunks -> 2; up to two waves (H=128, T=8: ctas 64 <= 96) -> 2; H=32 always -> 2.
    (32, 64, 256, GB10, 2), (8, 128, 128, GB10, 2), (64, 32, 128, GB10, 2),
    # The same H=64/T=32 two-chunk shape on PRO 6000 is below a wave (128 < 188): chunks < 8 -> 1.
    (32, 64, 128, PRO6000, 1),
    # GB10 one token, 128 heads: ctas 8 < third 16 -> 1.
    (1, 128, 512, GB10, 1),
])
def test_plan_head_tiles(t, h, topk, sms, want):
    assert plan_head_tiles(num_tokens=t, num_heads=h, topk=topk, num_sms=sms) == want


# FlashInfer 0.7.4 (wheel commit 77039051) against the seed's v3 text, by hand. GB10: 48 SMs, third 16,
# two_thirds 32, two waves 96 one-tile CTAs, eight waves 384.
@pytest.mark.parametrize(("t", "h", "topk", "sms", "v3", "v074"), [
    # 127 tokens x 64 heads = 508 CTAs, 1 chunk: v3's band has no upper bound -> 1; 0.7.4: 508 > 384 -> 2.
    (127, 64, 1, GB10, 1, 2),
    # Eight waves exactly (96 x 4 = 384) is still inside 0.7.4's band; one token more (388) is not.
    (96, 64, 128, GB10, 1, 1), (97, 64, 128, GB10, 1, 2),
    # H=128, 2 chunks: 128 tokens x 8 = 1024 CTAs > 384 -> 0.7.4 pairs again; 32 tokens (256) stays 1 on both.
    (128, 128, 128, GB10, 1, 2), (32, 128, 128, GB10, 1, 1),
    # Up to two waves both pair (H=128, T=8: 64 CTAs); 3 chunks is outside the band on both.
    (8, 128, 128, GB10, 2, 2), (127, 64, 192, GB10, 2, 2),
    # Sub-wave H=64, 8 chunks: 8 tokens x 4 = 32 CTAs == two_thirds: v3 < 32 -> 1; 0.7.4 inclusive on GB10 -> 2.
    (8, 64, 512, GB10, 1, 2),
    # ... 7 tokens (28 CTAs) pairs on both; 7 chunks never pairs H=64 below a wave.
    (7, 64, 512, GB10, 2, 2), (8, 64, 448, GB10, 1, 1),
    # Off a small die the two agree: RTX 5090 (170 SMs, third 56, two_thirds 113), H=64, 8 chunks: 28 tokens
    # (112 CTAs) -> 2 on both, 29 tokens (116) -> 1 on both.
    (28, 64, 512, RTX5090, 2, 2), (29, 64, 512, RTX5090, 1, 1),
    # PRO 6000 two_thirds = 125 (not a multiple of 4); a full wave far past eight waves (1600 tokens x 4) -> 2.
    (1600, 64, 64, PRO6000, 2, 2),
])
def test_plan_head_tiles_074_against_v3(t, h, topk, sms, v3, v074):
    assert plan_head_tiles(num_tokens=t, num_heads=h, topk=topk, num_sms=sms) == v3
    assert plan_head_tiles_074(num_tokens=t, num_heads=h, topk=topk, num_sms=sms) == v074


@given(t=st.integers(1, 4096), h=st.sampled_from([8, 16, 32, 48, 64, 80, 96, 112, 128]),
       topk=st.integers(1, 4096), extra=st.integers(0, 1024), sms=st.integers(1, 256))
def test_plan_head_tiles_074_differs_from_v3_only_where_0_7_4_changed_it(t, h, topk, extra, sms):
    kw = dict(num_tokens=t, num_heads=h, topk=topk, extra_topk=extra, num_sms=sms)
    old, new = plan_head_tiles(**kw), plan_head_tiles_074(**kw)
    ctas, chunks = t * h // 16, num_chunks(topk, extra)
    past_eight_waves = h % 32 == 0 and h > 32 and chunks <= 2 and ctas > 8 * sms
    h64_at_two_thirds = h == 64 and chunks >= 8 and sms // 3 <= ctas == 2 * sms // 3 < sms
    if sms >= 64 or not (past_eight_waves or h64_at_two_thirds):
        assert new == old
    else:  # both changes turn one tile into two
        assert (old, new) == (1, 2)


# ----------------------------------------------------------------------------------------------------
# select_kernel
# ----------------------------------------------------------------------------------------------------

def test_select_kernel():
    def sk(t, h, topk, sms=PRO6000, extra=0):
        return select_kernel(num_tokens=t, num_heads=h, topk=topk, extra_topk=extra, num_sms=sms)

    assert sk(1000, 8, 256) == "decode"  # 8 heads: no prefill instance
    assert sk(1000, 64, 2048) == "decode"  # 32 chunks > 16
    assert sk(8, 128, 1024) == "decode" and sk(9, 128, 1024) == "prefill"  # wide, >= 512 candidates
    assert sk(16, 128, 256) == "decode" and sk(17, 128, 256) == "prefill"  # wide, < 512
    assert sk(8, 32, 512) == "decode" and sk(9, 32, 512) == "prefill"  # narrow, >= 512, >= 180 SMs
    assert sk(32, 32, 512, RTX5090) == "decode" and sk(33, 32, 512, RTX5090) == "prefill"
    assert sk(1, 32, 256) == "prefill"  # narrow, < 512 candidates
    assert sk(1, 32, 448, extra=64) == "decode"  # candidates = topk + extra = 512
    with pytest.raises(ValueError):
        sk(1, 32, 512, 0)


# ----------------------------------------------------------------------------------------------------
# scheduler.cuh: binary search, work estimation, indptr
# ----------------------------------------------------------------------------------------------------

def test_binary_search_by_hand():
    # 4 requests x 64 pages, gdy 8, grid 132, floor 8. low 8, high 64:
    # mid 36: 4*2 = 8 chunks -> 64 <= 132 -> high 36; mid 22: 4*3 = 12 -> 96 -> high 22;
    # mid 15: 4*5 = 20 -> 160 > 132 -> low 16; mid 19: 4*4 -> 128 -> high 19; mid 17 -> high 17;
    # mid 16: 16 chunks -> 128 -> high 16. Result (16, 4 * cdiv(64, 16) = 16).
    assert partition_paged_kv_cache_binary_search_min_num_page_per_batch(132, 8, [64] * 4, 8) == (16, 16)
    # pages [10, 30, 3], gdy 4, grid 40 (at most 10 chunks), floor 1: low 1, high 30;
    # mid 15: 1+2+1 = 4 -> high 15; mid 8: 2+4+1 = 7 -> high 8; mid 4: 3+8+1 = 12 -> 48 > 40 -> low 5;
    # mid 6: 2+5+1 = 8 -> high 6; mid 5: 2+6+1 = 9 -> 36 -> high 5. Result (5, 9).
    assert partition_paged_kv_cache_binary_search_min_num_page_per_batch(40, 4, [10, 30, 3]) == (5, 9)
    # The floor above every request: the loop never runs (low 8 >= high 4) -> (8, 2 * cdiv(4, 8) = 2).
    assert partition_paged_kv_cache_binary_search_min_num_page_per_batch(132, 8, [4, 4], 8) == (8, 2)
    # A zero-page request counts 0 during the search but 1 in the result: pages [0, 100], gdy 1,
    # grid 132: every mid down to 1 fits (0 + 100 <= 132) -> low 1; result 1 + 100 = 101.
    assert partition_paged_kv_cache_binary_search_min_num_page_per_batch(132, 1, [0, 100]) == (1, 101)
    # No request fits even at the largest chunk: [50] * 10, gdy 32, grid 132 -> low climbs to high 50;
    # result (50, 10).
    assert partition_paged_kv_cache_binary_search_min_num_page_per_batch(132, 32, [50] * 10) == (50, 10)


def test_work_estimation_by_hand():
    est = batch_decode_with_paged_kv_cache_work_estimation
    # 4 x 64 pages, gdy 8, grid 132, page 16: 4*8 = 32 < 132 -> search with floor max(128 // 16, 1) = 8
    # -> (16, 16); 16 != 4 -> split.
    assert est(max_grid_size=132, gdy=8, num_pages=[64] * 4, page_size=16) == (True, 16, 16)
    # Short requests: floor 8 > 4 pages -> (8, 2); new_batch_size == batch, no CUDA graph -> no split;
    # with CUDA graphs it always takes the partition-kv kernel.
    assert est(max_grid_size=132, gdy=8, num_pages=[4, 4], page_size=16) == (False, 8, 2)
    assert est(max_grid_size=132, gdy=8, num_pages=[4, 4], page_size=16,
               enable_cuda_graph=True) == (True, 8, 2)
    # A full grid: 32 * 8 = 256 >= 132 -> no split, chunk = max(1, max pages) = 512, batch unchanged.
    assert est(max_grid_size=132, gdy=8, num_pages=[512] * 32, page_size=16) == (False, 512, 32)
    # ... and all-empty requests keep the chunk at 1.
    assert est(max_grid_size=4, gdy=8, num_pages=[0, 0], page_size=16) == (False, 1, 2)
    # page_size > 128: the floor is max(128 // 256, 1) = 1. 1 x 20 pages, gdy 1, grid 8 -> smallest chunk
    # with cdiv(20, c) <= 8 is 3 (cdiv(20, 2) = 10 > 8) -> (3, 7), split.
    assert est(max_grid_size=8, gdy=1, num_pages=[20], page_size=256) == (True, 3, 7)
    # page_size 64 -> floor 2.
    assert est(max_grid_size=132, gdy=8, num_pages=[128], page_size=64) == (True, 8, 16)


def test_split_kv_indptr_and_padded_batch():
    req, tile, o_indptr = decode_split_kv_indptr([10, 30, 3], 5)
    # tiles per request: cdiv(10,5) = 2, cdiv(30,5) = 6, cdiv(3,5) = 1.
    assert o_indptr == [0, 2, 8, 9]
    assert req == [0, 0, 1, 1, 1, 1, 1, 1, 2]
    assert tile == [0, 1, 0, 1, 2, 3, 4, 5, 0]
    assert decode_split_kv_indptr([0, 7], 8)[2] == [0, 1, 2]  # a zero-length request still gets a tile
    # DecodePlan: CUDA graph + split -> max_grid_size // gdy; CUDA graph, no split -> batch; else new.
    kw = dict(max_grid_size=132, gdy=8, batch_size=4, new_batch_size=16)
    assert decode_padded_batch_size(split_kv=True, enable_cuda_graph=True, **kw) == 16
    assert decode_padded_batch_size(split_kv=False, enable_cuda_graph=True, **kw) == 4
    assert decode_padded_batch_size(split_kv=True, **kw) == 16


# ----------------------------------------------------------------------------------------------------
# Properties
# ----------------------------------------------------------------------------------------------------

@given(t=st.integers(1, 1024), h=st.integers(1, 256), topk=st.integers(1, 16384), extra=st.integers(0, 4096),
       sms=st.integers(1, 256), ht=st.sampled_from([1, 2]), slack=st.integers(0, 48))
def test_plan_splits_bounds(t, h, topk, extra, sms, ht, slack):
    chunks = num_chunks(topk, extra)
    max_splits = cdiv(chunks, 16) + slack
    s, cpb = splits(t, h, topk, sms, extra=extra, max_splits=max_splits, ht=ht)
    assert 1 <= s <= max_splits
    assert 1 <= cpb <= 16
    assert s == cdiv(chunks, cpb)
    assert s <= chunks
    if chunks <= 2:
        assert s == 1


@given(t=st.integers(1, 1024), h=st.integers(1, 256), topk=st.integers(1, 65536), sms=st.integers(1, 256),
       short=st.integers(1, 8))
def test_plan_splits_raises_below_min_splits(t, h, topk, sms, short):
    min_splits = cdiv(num_chunks(topk), 16)
    assume(min_splits - short >= 0)
    with pytest.raises(ValueError):
        splits(t, h, topk, sms, max_splits=min_splits - short)


@given(t=st.integers(1, 4096), h=st.integers(1, 256), topk=st.integers(0, 16384), extra=st.integers(0, 4096),
       sms=st.integers(1, 256))
def test_plan_head_tiles_bounds(t, h, topk, extra, sms):
    ht = plan_head_tiles(num_tokens=t, num_heads=h, topk=topk, extra_topk=extra, num_sms=sms)
    assert ht in (1, 2)
    if h % 32:
        assert ht == 1


@given(pages=st.lists(st.integers(0, 5000), min_size=1, max_size=64), gdy=st.integers(1, 64),
       grid=st.integers(1, 2048), floor=st.integers(1, 16))
def test_binary_search_properties(pages, gdy, grid, floor):
    chunk, nb = partition_paged_kv_cache_binary_search_min_num_page_per_batch(grid, gdy, pages, floor)

    def fits(c):
        return sum(cdiv(p, c) for p in pages) * gdy <= grid

    assert floor <= chunk <= max(floor, max(pages))
    assert nb == sum(cdiv(max(p, 1), chunk) for p in pages)
    if chunk > floor:
        assert not fits(chunk - 1)  # minimal
        assert fits(chunk) or chunk == max(pages)  # fits, unless no chunk does


@given(pages=st.lists(st.integers(0, 5000), min_size=1, max_size=64), gdy=st.integers(1, 64),
       grid=st.integers(1, 2048), page_size=st.sampled_from([1, 8, 16, 32, 64, 128, 256]),
       graph=st.booleans())
def test_work_estimation_properties(pages, gdy, grid, page_size, graph):
    split_kv, chunk, nb = batch_decode_with_paged_kv_cache_work_estimation(
        max_grid_size=grid, gdy=gdy, num_pages=pages, page_size=page_size, enable_cuda_graph=graph)
    assert chunk >= 1
    if len(pages) * gdy >= grid:
        assert (split_kv, chunk, nb) == (False, max(1, max(pages)), len(pages))
    else:
        assert chunk >= max(128 // page_size, 1)
        assert nb >= len(pages)
        assert split_kv == (graph or nb != len(pages))
    tiles = decode_split_kv_indptr(pages, chunk)[2]
    if not split_kv:
        assert tiles[-1] == len(pages)  # unsplit: one tile per request


# ----------------------------------------------------------------------------------------------------
# Adapter
# ----------------------------------------------------------------------------------------------------

def test_adapter_sparse_mla():
    # DeepSeek-V4-style (64 heads, top-k 2048 = 32 chunks), 1 token on GB10: head tiles 1 (ctas 4 <
    # third 16); min_splits 2, base 4: 2 -> 4 (16 <= 16, 4 streams <= 8, cdiv(32, 4) = 8); 8 fails -> (4, 8).
    w = workloads.get("deepseek-v4-sparse-mla", batch=1, ctx_len=65536)
    p = plan(w, "gb10", "flashinfer")
    assert (p.num_splits, p.block_h, p.extra["chunks_per_block"], p.extra["head_tiles"]) == (4, 16, 8, 1)
    assert p.block_k is None and p.extra["kernel"] == "decode"
    # DeepSeek-V3.2 (128 heads), 1 token on RTX PRO 6000: head tiles 1 (8 < 62); (16, 2) (see above).
    w = workloads.get("deepseek-v3.2-sparse-mla", batch=1, ctx_len=65536)
    p = plan(w, "rtx-pro-6000", "flashinfer")
    assert (p.num_splits, p.block_h, p.extra["chunks_per_block"]) == (16, 16, 2)
    # 64 tokens: ctas 512 >= 188 -> 2 head tiles (block_h 32); base 64 * 4 = 256, a full grid;
    # tail = 512 % 188 = 136, 272 >= 188 -> max(min_splits 2, 2) = 2 -> (2, 16).
    p = plan(w.with_(batch=64), "rtx-pro-6000", "flashinfer")
    assert (p.num_splits, p.block_h, p.extra["chunks_per_block"]) == (2, 32, 16)
    # Off sm_120/121 the rule still evaluates (at the device's SM count) and says so.
    assert "sm_120" in plan(w, "h200", "flashinfer").note


def test_adapter_sparse_mla_refusals():
    w = workloads.DecodeWorkload(kind="sparse_mla", batch=1, num_q_heads=20, num_kv_heads=1, head_dim_qk=512,
                                 head_dim_v=512, ctx_len=4096, page_size=1, topk=512)
    with pytest.raises(SplitlabError):
        plan(w, "rtx5090", "flashinfer")  # no cake instance for 20 heads
    w = workloads.get("deepseek-v4-sparse-mla", batch=1, ctx_len=65536, topk=20000)
    with pytest.raises(SplitlabError):
        plan(w, "rtx5090", "flashinfer")  # 313 chunks need 20 > max_splits 16 splits


def test_adapter_gqa():
    # llama-3-8b (8 kv heads), 4 x 1024 tokens, page 16 on H100 (132 SMs): 64 pages each; gdy 8,
    # grid 1 * 132 -> (split, 16 pages, 16) -> 4 tiles per request, kv chunk 256 tokens.
    w = workloads.get("llama-3-8b", batch=4, ctx_len=1024)
    p = plan(w, "h100", "flashinfer")
    assert (p.num_splits, p.kv_chunk, p.per_request) == (4, 256, (4, 4, 4, 4))
    assert p.block_n is None  # a chunk length, not a kernel tile
    assert p.extra["split_kv"] is True and "num_blocks_per_sm=1 assumed" in p.note
    # 32 requests: 256 >= 132 -> unsplit, chunk = 8192 / 16 = 512 pages.
    p = plan(w.with_(batch=32, ctx_len=8192), "h100", "flashinfer")
    assert (p.num_splits, p.kv_chunk, p.per_request) == (1, 8192, (1,) * 32)
    # Ragged (100, 1000, 0) tokens: pages (7, 63, 0), floor 8; every mid down to 8 fits (1+8+0 chunks * 8
    # <= 132) -> chunk 8; tiles (1, 8, 1) (the empty request still gets one).
    wr = workloads.get("llama-3-8b", batch=3, ctx_len=1000).with_(seq_lens=(100, 1000, 0), ctx_len=1000)
    p = plan(wr, "h100", "flashinfer")
    assert (p.num_splits, p.kv_chunk, p.per_request) == (8, 128, (1, 8, 1))
    assert p.extra["new_batch_size"] == 10


def test_adapter_mla():
    # deepseek-v3-mla (128 heads, page 64), 1 x 8192 on H200 (132): gdy = cdiv(128, 16) = 8, 128 pages,
    # floor max(128 // 64, 1) = 2; smallest chunk with cdiv(128, c) * 8 <= 132 is 8 (cdiv(128, 7) = 19
    # -> 152) -> 16 tiles of 512 tokens.
    w = workloads.get("deepseek-v3-mla", batch=1, ctx_len=8192)
    p = plan(w, "h200", "flashinfer")
    assert (p.num_splits, p.kv_chunk, p.block_n, p.extra["gdy"]) == (16, 512, None, 8)


def test_adapter_0_7_4_beside_the_seeds_version():
    # The stated case: 127 tokens, 64 heads, top-k 1 on GB10 (48 SMs): head tiles 1 (v3) against 2 (0.7.4).
    # One chunk never splits (chunks > 2 fails): (1, 1) on both; block_h = 16 * head_tiles.
    w = workloads.DecodeWorkload(kind="sparse_mla", batch=127, num_q_heads=64, num_kv_heads=1, head_dim_qk=512,
                                 head_dim_v=512, ctx_len=4096, page_size=1, topk=1)
    seed, rel = plan(w, "gb10", "flashinfer"), plan(w, "gb10", "flashinfer-0.7.4")
    assert (seed.planner, seed.num_splits, seed.block_h, seed.extra["head_tiles"]) == ("flashinfer", 1, 16, 1)
    assert (rel.planner, rel.num_splits, rel.block_h, rel.extra["head_tiles"]) == ("flashinfer-0.7.4", 1, 32, 2)
    assert "cake (v3)" in seed.note and "cake (0.7.4)" in rel.note
    # 8 tokens, 64 heads, top-k 512 (8 chunks), GB10: 32 CTAs == two_thirds -> 1 (v3) / 2 (0.7.4); the grid
    # (32 or 16 CTAs) is never <= grid cap 16 / 2 -> unsplit either way: (1, 8).
    w8 = w.with_(batch=8, topk=512)
    assert (plan(w8, "gb10", "flashinfer").block_h, plan(w8, "gb10", "flashinfer-0.7.4").block_h) == (16, 32)
    assert plan(w8, "gb10", "flashinfer").num_splits == plan(w8, "gb10", "flashinfer-0.7.4").num_splits == 1
    # Off a small die and for the paged-decode planner the two are the same plan (but for its name).
    for wl, dev in [(workloads.get("deepseek-v4-sparse-mla", batch=64, ctx_len=65536), "rtx-pro-6000"),
                    (workloads.get("llama-3-8b", batch=4, ctx_len=1024), "h100"),
                    (workloads.get("deepseek-v3-mla", batch=1, ctx_len=8192), "h200")]:
        a, b = plan(wl, dev, "flashinfer"), plan(wl, dev, "flashinfer-0.7.4")
        assert (a.num_splits, a.block_h, a.kv_chunk, a.per_request) == (b.num_splits, b.block_h, b.kv_chunk,
                                                                         b.per_request)
    assert "flashinfer-0.7.4" in names("gqa") and "flashinfer-0.7.4" in names("sparse_mla")


def test_adapter_kinds():
    assert "flashinfer" in names("sparse_mla") and "modular" not in names("sparse_mla")
    with pytest.raises(SplitlabError):
        plan(workloads.get("llama-3-8b"), "h100", "flashinfer-typo")
