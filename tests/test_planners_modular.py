"""Modular MAX planner ports: golden values derived by hand from the upstream rule text, properties
over the valid input space, and the ``modular`` adapter.

Every expected value below is worked out in its comment from the rule as the upstream text states it
(modularml/mojo mha_decode_partition_heuristic.mojo @ 5d09008, sm100/mla_decode_dispatch.mojo @ 0eeb9c14),
not read back from the port.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitlab import workloads
from splitlab.errors import SplitlabError
from splitlab.planners import plan
from splitlab.planners.modular import (
    BUCKET_LADDER,
    _bucket_num_partitions,
    _bucket_partitions,
    _compute_num_partitions,
    _compute_num_partitions_64,
    _compute_num_partitions_128,
    compute_mla_dispatch_scalars,
    cuda_mha_decoding_max_num_partitions,
    cuda_mha_decoding_num_partitions,
    hip_mha_decoding_num_partitions,
    mha_decoding_max_num_partitions,
    mha_decoding_num_partitions,
)

# ----------------------------------------------------------------------------------------------------
# _bucket_partitions
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "want"), [
    (0, 1), (1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32), (32, 32),  # n <= 32: next power of two
    (33, 48), (48, 48), (49, 64), (64, 64), (65, 96), (96, 96),          # then 48, 64, 96,
    (97, 128), (128, 128), (129, 192), (192, 192), (193, 256), (10_000, 256),  # 128, 192, else 256
])
def test_bucket_ladder(n, want):
    assert _bucket_partitions(n) == want


def test_bucket_ladder_values_map_to_themselves():
    assert [_bucket_partitions(v) for v in BUCKET_LADDER] == list(BUCKET_LADDER)


# ----------------------------------------------------------------------------------------------------
# hip_mha_decoding_num_partitions (V3)
# ----------------------------------------------------------------------------------------------------

# Seed 000's Phase 0 table: sm_count=256, heads_per_group=64, is_mla=True. MLA: ctas = cdiv(64, 32) * bs
# = 2 * bs, pages = cdiv(nk, 256), one_wave = 256 // ctas, two_wave = 512 // ctas, work_floor =
# cdiv(pages, 5); h=64 > 16 so np_target = clamp(work_floor, one_wave, two_wave); cap 256.
PHASE0 = [
    # bs=1 131072: pages 512, ctas 2, one 128, two 256, wf 103 -> clamp 128 -> min(128,512,256)=128 -> 128
    (1, 131072, 128),
    # bs=2 65536: pages 256, ctas 4, one 64, two 128, wf 52 -> clamp 64 -> 64
    (2, 65536, 64),
    # bs=2 80K = 81920: pages 320, wf 64, one 64, two 128 -> 64 ("work_floor 64" pins 80K = 81920)
    (2, 81920, 64),
    # bs=2 131072: pages 512, wf 103, one 64, two 128 -> 103 -> bucket 128
    (2, 131072, 128),
    # bs=8 81920: ctas 16, one 16, two 32, wf 64 -> clamp 32 -> 32
    (8, 81920, 32),
    # bs=8 131072: wf 103 -> capped by two_wave 32 -> 32
    (8, 131072, 32),
    # bs=16 131072: ctas 32, one 8, two 16, wf 103 -> 16
    (16, 131072, 16),
]


@pytest.mark.parametrize(("bs", "nk", "want"), PHASE0)
def test_hip_phase0_table(bs, nk, want):
    assert hip_mha_decoding_num_partitions(bs, nk, 64, 256, is_mla=True) == want


def test_hip_worked_example_planners_md():
    # hip(7, 51200, 8, 256): MHA, 8 kv heads, work_items 56 < 256 -> falls through. ctas = 1 * 7 = 7,
    # pages 200, one 36, two 73, wf 40 -> clamp(40, 36, 73) = 40, cap 64 -> min(40,200,64)=40 -> bucket 48.
    assert hip_mha_decoding_num_partitions(7, 51200, 8, 256) == 48


def test_hip_short_cache_is_unsplit():
    # num_keys <= 256 -> 1.
    assert hip_mha_decoding_num_partitions(1, 256, 8, 256) == 1
    assert hip_mha_decoding_num_partitions(1, 256, 128, 256, is_mla=True) == 1
    # 257 keys, 8 kv heads, bs 1: ctas 1, pages 2, one 256, two 512, wf 1 -> clamp 256 -> min(256,2,64)=2.
    assert hip_mha_decoding_num_partitions(1, 257, 8, 256) == 2


@pytest.mark.parametrize(("bs", "nk", "want"), [
    # 16 kv heads, 16*16 = 256 >= 256: cdiv(4096, 256) = 16 pages >= 8 -> bucket(min(16,16)) = 16.
    # (V2 has no such rule: HIGH_OCC occ = 256 // 64 = 4, cdiv(4096, 1024) = 4 -> 4.)
    (16, 4096, 16),
    # 8 pages -> bucket(8) = 8.
    (16, 2048, 8),
    # 9 pages -> bucket(9) = 16 (upstream's "9 pages launches 16 partitions with 7 key-empty").
    (16, 2304, 16),
    # 7 pages < 8: rule off. work_items 256 >= 256 -> HIGH_OCC with cap 32 (16 kv heads, bs >= 8):
    # occ = 4, min(cdiv(1792, 1024), 32) = 2 -> 2.
    (16, 1792, 2),
])
def test_hip_16_kv_head_rule(bs, nk, want):
    assert hip_mha_decoding_num_partitions(bs, nk, 16, 256) == want


def test_hip_16_kv_head_cap_32_from_batch_8():
    # bs 8, 16 kv heads, 65536 keys: 16*8 = 128 < 256 so the key-stream rule is off; work_items 128 < 256
    # so no HIGH_OCC. ctas = 1 * 8 = 8, pages 256, one 32, two 64, wf 52 -> clamp 52; V3 cap 32 ->
    # min(52, 256, 32) = 32 -> 32. (V2's fixed MHA cap 64 gives min(52,256,64) = 52 -> bucket 64.)
    assert hip_mha_decoding_num_partitions(8, 65536, 16, 256) == 32
    # bs 7 keeps cap 64: ctas 7, one 36, two 73, wf 52 -> 52 -> bucket 64.
    assert hip_mha_decoding_num_partitions(7, 65536, 16, 256) == 64


@pytest.mark.parametrize(("bs", "nk", "want"), [
    # Single kv head, 2048 keys, bs 4: floor 128 -> pages 16; ctas 4, two 128; underfills ->
    # min(128, 16) = 16; cap 64 -> 16. (V2: floor 256 -> pages 8, clamp(cdiv(8,5)=2, 64, 128) = 64,
    # min(64, 8, 64) = 8 -> 8: the "256-key floor allows just 8 partitions at 2048 keys".)
    (4, 2048, 16),
    # bs 32, 8192 keys: pages 64, ctas 32, two 16 -> min(16, 64) = 16. (V2: pages 32, wf 7,
    # clamp(7, 8, 16) = 8 -> 8.)
    (32, 8192, 16),
    # bs 1, 65536 keys: pages 512, two 512 -> 512, cap 64 -> min(512, 512, 64) = 64 -> 64.
    (1, 65536, 64),
    # HIGH_OCC precedes the single-head floor: bs 256 -> work_items 256 >= 256, occ 4,
    # cdiv(8192, 1024) = 8 -> 8.
    (256, 8192, 8),
])
def test_hip_single_kv_head(bs, nk, want):
    assert hip_mha_decoding_num_partitions(bs, nk, 1, 256) == want


def test_hip_two_wave_exception_mla_16_heads():
    # MLA, 16 heads, bs 4, 32768 keys: ctas = cdiv(16,32) * 4 = 4, pages 128, one 64, two 128;
    # h <= 16 -> np_target = min(128, 128) = 128; cap 256 -> 128.
    # (V1: no exception; work_items 64 < 256 so no MHA branch; clamp(cdiv(128,5)=26, 64, 128) = 64 -> 64.)
    assert hip_mha_decoding_num_partitions(4, 32768, 16, 256, is_mla=True) == 128
    # MLA bs 1 is unchanged by the exception: two_wave 512 -> min(512, 512) -> cap 256 -> 256
    # (the one-wave clamp would give clamp(103, 256, 512) = 256 too).
    assert hip_mha_decoding_num_partitions(1, 131072, 16, 256, is_mla=True) == 256
    # MLA 32 heads takes the clamp: bs 4, 32768: ctas 4, one 64, two 128, wf 26 -> 64.
    assert hip_mha_decoding_num_partitions(4, 32768, 32, 256, is_mla=True) == 64
    # is_mla=False at 16 heads is MHA with 16 kv heads: at bs 16, 16*16 = 256 >= 256 and
    # cdiv(32768, 256) = 128 >= 8 pages, so the key-stream rule returns bucket(min(128, 16)) = 16.
    assert hip_mha_decoding_num_partitions(16, 32768, 16, 256) == 16


def test_hip_mha_32_kv_heads_skips_mha_branch():
    # 32 kv heads is not < BM=32: wave formula. bs 8, 65536: ctas = 1 * 8 = 8, pages 256, one 32,
    # two 64, wf 52 -> 52, MHA cap 64 -> bucket(52) = 64.
    assert hip_mha_decoding_num_partitions(8, 65536, 32, 256) == 64
    # bs 16: work_items 512 >= 256 but no HIGH_OCC: ctas 16, one 16, two 32, wf 52 -> 32.
    assert hip_mha_decoding_num_partitions(16, 65536, 32, 256) == 32


def test_hip_high_occ():
    # 8 kv heads, bs 64: work_items 512 >= 256: occ = 512 // 64 = 8; cdiv(131072, 2048) = 64 -> 64.
    assert hip_mha_decoding_num_partitions(64, 131072, 8, 256) == 64
    # bs 32 on MI300X (304 CUs): work_items 256 < 304 -> wave formula: ctas 32, pages 128, one 9,
    # two 19, wf 26 -> clamp 19 -> bucket 32, within the cap 64 -> 32.
    assert hip_mha_decoding_num_partitions(32, 32768, 8, 304) == 32


# ----------------------------------------------------------------------------------------------------
# cuda
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("bs", "nk", "hpg", "sm", "want"), [
    (1, 4096, 8, 132, 8),      # clamp(132 // 8 = 16, 1, 32) = 16; 4096 // 512 = 8 -> 8
    (1, 65536, 1, 132, 32),    # clamp(132, 1, 32) = 32; 128 -> 32
    (2, 65536, 8, 132, 8),     # 132 // 16 = 8 -> 8
    (1, 65536, 8, 148, 18),    # 148 // 8 = 18, no power-of-two rounding (V0/V1 would give 32)
    (64, 65536, 8, 132, 1),    # 132 // 512 = 0 -> clamp to 1
    (1, 511, 8, 132, 1),       # 511 // 512 = 0 -> max(1, 0) = 1
    (1, 1024, 8, 132, 2),      # 1024 // 512 = 2
])
def test_cuda_rule(bs, nk, hpg, sm, want):
    assert cuda_mha_decoding_num_partitions(bs, nk, hpg, sm) == want


def test_cuda_max():
    assert cuda_mha_decoding_max_num_partitions(1, 8, 132) == 16
    assert cuda_mha_decoding_max_num_partitions(1, 1, 132) == 32
    assert cuda_mha_decoding_max_num_partitions(100, 8, 132) == 1


def test_dispatch():
    assert mha_decoding_num_partitions(7, 51200, 8, "hip", 256) == 48
    assert mha_decoding_num_partitions(1, 4096, 8, "cuda", 132) == 8
    # is_mla only reaches the hip rule: 4 x 32768 x 16 heads -> 128 as MLA; as MHA (16 kv heads,
    # bs 4): 64 < 256 so no key-stream rule, work_items 64 < 256; ctas 4, pages 128, one 64, two 128,
    # wf 26 -> 64, cap 64 -> 64.
    assert mha_decoding_num_partitions(4, 32768, 16, "hip", 256, is_mla=True) == 128
    assert mha_decoding_num_partitions(4, 32768, 16, "hip", 256) == 64
    assert mha_decoding_num_partitions(4, 32768, 16, "cuda", 132, is_mla=True) == 2  # 132 // 64 = 2
    assert mha_decoding_num_partitions(7, 51200, 8, "metal", 256) == 1
    # max: cuda ignores num_keys; elsewhere max == actual, called without is_mla.
    assert mha_decoding_max_num_partitions(1, 100, 8, "cuda", 132) == 16
    assert mha_decoding_max_num_partitions(7, 51200, 8, "hip", 256) == 48
    assert mha_decoding_max_num_partitions(4, 32768, 16, "hip", 256) == 64
    assert mha_decoding_max_num_partitions(4, 32768, 16, "metal", 256) == 1


# ----------------------------------------------------------------------------------------------------
# SM100 MLA (mla_decode_dispatch.mojo)
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("n", "want"), [
    (0, 1), (1, 1), (3, 3), (5, 8), (9, 9), (10, 16), (17, 18), (19, 20), (21, 32), (33, 37), (38, 64),
    (65, 72), (73, 74), (74, 74), (75, 74), (200, 74),
])
def test_sm100_bucket(n, want):
    assert _bucket_num_partitions(n, 74) == want


def _np_h8(batch, cache, q, page, cost_optimal):
    return _compute_num_partitions(batch, cache, q, page, 148, cost_optimal_split=cost_optimal,
                                   num_heads=8, is_fp8_kv=True, half_sms=74)


# Upstream's own pins (max/kernels/test/gpu/nn/test_mla_decode_split_policy.mojo @ 5d09008,
# test_cost_model_split_is_pinned), SM_COUNT=148, 8 heads, fp8 KV.
# Hand check of the first: ctas = cdiv(8,64) * 6 * 8 = 48, split_len 2048, max np = min(74, 32) = 32;
# np 1: 1 * (187 + 2048) = 2235; np 2: 1 * (187 + 1024) = 1211 (121100 < 2235*98); np 3: cdiv(144,148)=1,
# 187 + 683 = 870 (taken); np 4: 2 waves * 699 = 1398; np 8: 3 * 443; np 9: 3 * 415; np 16: 6 * 315 -> 3.
@pytest.mark.parametrize(("batch", "cache", "q", "page", "want"), [
    (8, 2048, 6, 64, 3), (1, 2048, 6, 64, 20), (2, 2048, 6, 64, 9), (4, 2048, 6, 64, 4),
    (16, 2048, 6, 64, 3), (32, 2048, 6, 64, 3), (128, 2048, 6, 64, 1),
    (8, 2048, 2, 64, 9), (8, 2048, 3, 64, 4), (8, 2048, 5, 64, 3), (8, 2048, 7, 64, 2), (8, 2048, 8, 64, 2),
    (8, 512, 6, 128, 3), (8, 2048, 6, 128, 3), (8, 4096, 6, 128, 3),
])
def test_sm100_cost_model_upstream_pins(batch, cache, q, page, want):
    assert _np_h8(batch, cache, q, page, True) == want


def test_sm100_cost_model_off_upstream_pin():
    # Upstream pin 8 (production shape, cost model off). By hand: fold (q 6 > 1, 8*6 <= 64) -> ctas 8;
    # floor 18, 18*8*20 = 2880 >= 2516 -> target 18; pages 32 // 4 = 8 -> 8; min_partitions 2 -> 8.
    assert _np_h8(8, 2048, 6, 64, False) == 8


@pytest.mark.parametrize(("batch", "cache", "fp8", "want"), [
    # 64 heads, q=1, sm 148, half 74, eff = cache + 1.
    # bs 4, eff 32768: split 128 -> pages 256; ctas 4; floor 37, 37*4*20 = 2960 >= 2516 -> 37;
    # 256 // 4 = 64 -> 37; min_partitions 2 -> 37 -> bucket 37.
    (4, 32767, False, 37),
    # bs 1: floor 148 -> min(148, 74) = 74; 64 -> 64 -> bucket 64.
    (1, 32767, False, 64),
    # bs 3: floor 49 (2940 >= 2516) -> 49 -> bucket 64.
    (3, 32767, False, 64),
    # bs 64, eff 256: split 64 (eff <= 512, bs >= 32) -> pages 4; ctas 64, floor 2 (2560 >= 2516);
    # 4 // 4 = 1 -> 1; eff <= 256 and bs >= 64 -> min 1 -> 1.
    (64, 255, False, 1),
    # bs 64, eff 300, bf16: pages cdiv(300, 64) = 5; np min(2, 5 // 4 = 1) = 1; 300 > 256; 64*5 = 320 <
    # 592; pages >= 2 -> min 2 -> clamp(1, 2, 5) = 2.
    (64, 299, False, 2),
    # fp8 KV: the np=1 threshold is 512 -> min 1 -> 1.
    (64, 299, True, 1),
])
def test_sm100_64_heads(batch, cache, fp8, want):
    got = compute_mla_dispatch_scalars(batch, cache, 1, 148, num_heads=64, is_fp8_kv=fp8, half_sms=74)
    assert got == (batch, 1, want)


@pytest.mark.parametrize(("batch", "cache", "want"), [
    # 128 heads (2 head groups), bf16, q=1, sm 148, half 74, eff = cache + 1.
    # bs 8, eff 65536: pages 512, ctas 16, wq = min(148 // gcd(16,148)=37, 74) = 37; floor 9,
    # 9*16*10 = 1440 >= 1332 -> target 9; bs in 4..8 -> wq = 9; min_work 16; mpps 4 -> 4*2//2*2 = 8;
    # waves cdiv(16, 9) = 2 -> aligned 18; np = max(9, min(18, 64)) = 18; min 2 -> 18 (FlashInfer's 18).
    (8, 65535, 18),
    # bs 1, eff 4096: pages 32, ctas 2, wq 74, target 74; aligned 74; np = max(74, min(74, 32//8 = 4))
    # = 74; clamp(74, 2, min(74, 32)) = 32 -> 32.
    (1, 4095, 32),
    # bs 128: ctas 256 >= 148 -> np 1.
    (128, 4095, 1),
    # bs 64, eff 2048: pages 16, ctas 128, wq min(37, max(target 2, 1)) = 2; mpps 8 -> 16; aligned 2;
    # np = max(2, min(2, 1)) = 2; bs >= 64 and eff <= 2176 -> target 1, np = max(1, min(2, 1)) = 1 -> 1.
    (64, 2047, 1),
])
def test_sm100_128_heads(batch, cache, want):
    got = compute_mla_dispatch_scalars(batch, cache, 1, 148, num_heads=128, half_sms=74)
    assert got == (batch, 1, want)
    # The 128-head path ignores the cost model and the floor relaxation (upstream's
    # test_multi_head_group_ignores_the_cost_model).
    eff = cache + 1
    page = 64 if (eff <= 512 and batch >= 32) else 128
    assert _compute_num_partitions(batch, eff, 1, page, 148, True, True, num_heads=128) == want
    assert _compute_num_partitions_128(batch, eff, 1, page, 148, num_heads=128) == want


def test_sm100_accurate_length_and_relaxed_floor():
    # _is_cache_length_accurate=True: eff = 255 (q not added): split 64, pages 4, ctas 64, floor 2;
    # 4 // 4 = 1 -> np 1; eff <= 256 and bs >= 64 -> min 1 -> 1.
    assert compute_mla_dispatch_scalars(64, 255, 1, 148, num_heads=64, _is_cache_length_accurate=True) \
        == (64, 1, 1)
    # relax_split_floor: bs 8, 64 heads, eff 2048, page 128 -> pages 16; ctas 8, target 18;
    # floor 4 -> 16 // 4 = 4 -> 4 (bucket 4); relaxed floor 1 -> min(18, 16) = 16 -> 16.
    assert _compute_num_partitions_64(8, 2048, 1, 128, 148, num_heads=64) == 4
    assert _compute_num_partitions_64(8, 2048, 1, 128, 148, relax_split_floor=True, num_heads=64) == 16


# ----------------------------------------------------------------------------------------------------
# Properties over the valid input space
# ----------------------------------------------------------------------------------------------------

pos = st.integers(min_value=1, max_value=4096)
keys = st.integers(min_value=1, max_value=2_000_000)
sms = st.integers(min_value=1, max_value=512)


@given(bs=pos, nk=keys, hpg=st.integers(min_value=1, max_value=256), sm=sms, is_mla=st.booleans())
def test_hip_bounds(bs, nk, hpg, sm, is_mla):
    n = hip_mha_decoding_num_partitions(bs, nk, hpg, sm, is_mla=is_mla)
    assert n in BUCKET_LADDER
    assert 1 <= n <= (256 if is_mla else 64)
    if nk <= 256:
        assert n == 1
    if not is_mla and hpg == 16 and bs >= 8:
        assert n <= 32  # the key-stream rule gives at most 16, the rest is capped at 32


@given(bs=pos, nk=keys, hpg=st.integers(min_value=1, max_value=256), sm=sms)
def test_cuda_bounds(bs, nk, hpg, sm):
    n = cuda_mha_decoding_num_partitions(bs, nk, hpg, sm)
    assert 1 <= n <= 32
    assert n <= cuda_mha_decoding_max_num_partitions(bs, hpg, sm)
    assert n <= max(1, nk // 512)


@given(bs=st.integers(min_value=1, max_value=512), cache=st.integers(min_value=1, max_value=500_000),
       q=st.integers(min_value=1, max_value=8), heads=st.sampled_from([8, 12, 16, 24, 32, 48, 64, 128]),
       fp8=st.booleans(), relax=st.booleans(), cost=st.booleans(), fold=st.booleans(),
       sm=st.sampled_from([132, 148, 160, 188]))
def test_sm100_every_split_is_a_bucket(bs, cache, q, heads, fp8, relax, cost, fold, sm):
    # Upstream's test_every_split_has_a_combine_kernel as a property: the count is a bucket in [1, half].
    half = sm // 2
    buckets = {1, 2, 3, 4, 8, 9, 16, 18, 20, 32, 37, 64, 72, half}
    for page in (64, 128):
        n = _compute_num_partitions(bs, cache, q, page, sm, relax, cost, num_heads=heads, is_fp8_kv=fp8,
                                    half_sms=half, fold_shared_index=fold)
        assert n in buckets
        assert n >= 1
    _, _, n = compute_mla_dispatch_scalars(bs, cache, q, sm, num_heads=heads, is_fp8_kv=fp8, half_sms=half)
    assert n in buckets


# ----------------------------------------------------------------------------------------------------
# Adapter
# ----------------------------------------------------------------------------------------------------

def test_adapter_phase0_on_mi355x():
    # The Phase-0 shapes through plan(): deepseek-v3-mla with 64 heads on MI355X (256 CUs).
    for bs, nk, want in PHASE0:
        w = workloads.get("deepseek-v3-mla", batch=bs, ctx_len=nk).with_(num_q_heads=64)
        p = plan(w, "mi355x", "modular")
        assert p.planner == "modular" and p.num_splits == want
        assert "is_mla=True" in p.note


def test_adapter_gqa():
    # llama-3-8b (8 kv heads) bs 7 at 51200 on MI355X -> hip(7, 51200, 8, 256) = 48.
    w = workloads.get("llama-3-8b", batch=7, ctx_len=51200)
    assert plan(w, "mi355x", "modular").num_splits == 48
    # On H100 (132 SMs): cuda(7, 51200, 8, 132): clamp(132 // 56 = 2, 1, 32) = 2; 100 -> 2.
    assert plan(w, "h100", "modular").num_splits == 2
    # Ragged batch: num_keys is the longest request.
    wr = workloads.get("llama-3-8b", batch=2, ctx_len=4096).with_(seq_lens=(100, 4096), ctx_len=4096)
    assert plan(wr, "h100", "modular").num_splits == 8  # 132 // 16 = 8; 4096 // 512 = 8


def test_adapter_mla_nvidia():
    w = workloads.get("deepseek-v3-mla", batch=8, ctx_len=65535)
    # H200 is not SM10x: Modular's MLA call site uses 1.
    p = plan(w, "h200", "modular")
    assert p.num_splits == 1 and "non-SM10x" in p.note
    # B200 (148 SMs, half 74): SM100 path with eff = 65535 + 1 -> 18 (see test_sm100_128_heads).
    p = plan(w, "b200", "modular")
    assert p.num_splits == 18 and p.extra["split_page_size"] == 128


def test_adapter_rejects_sparse_mla():
    w = workloads.get("deepseek-v3.2-sparse-mla", batch=4, ctx_len=65536)
    with pytest.raises(SplitlabError):
        plan(w, "mi355x", "modular")
    with pytest.raises(SplitlabError):
        plan(w, "mi355x", "no-such-planner")
