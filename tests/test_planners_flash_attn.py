"""FlashAttention FA2 / FA3 / FA4 split heuristics, their float32 semantics, and the ``flash_attn`` adapter.

Golden values are derived by hand from planners.md 4.1-4.3 (derivations in the comments).
"""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitlab import workloads
from splitlab.devices import DeviceSpec
from splitlab.intmath import cdiv
from splitlab.planners import plan
from splitlab.planners.flash_attn import (
    num_splits_heuristic,
    num_splits_heuristic_fa3,
    num_splits_heuristic_fa4,
    prepare_varlen_num_splits,
    round_up_headdim,
    round_up_headdimv,
    tile_size_fwd_sm90,
)

MiB = 1 << 20
# An sm_80 card with the H100's 132 SMs, so the FA2 path can be checked with the same numbers (FA2 doubles the
# SM count to 264 for its 128-thread CTAs).
SM80_132 = DeviceSpec("sm80-132", "nvidia", "sm_80", 132, 2000, 40, 300, "test device")
# An sm_90 card with 256 SMs (FA3's path with a roomy wave).
SM90_256 = DeviceSpec("sm90-256", "nvidia", "sm_90", 256, 4800, 60, 989, "test device")


def _exact_fa2(bnm, num_sms, n_blocks, max_splits):
    """The FA2 rule in exact rationals (what the C++ would do without float rounding)."""
    if 5 * bnm >= 4 * num_sms:
        return 1
    max_splits = min(max_splits, num_sms, n_blocks)

    def eligible(s):
        return s == 1 or cdiv(n_blocks, s) != cdiv(n_blocks, s - 1)

    eff = [Fraction(bnm * s, num_sms) / math.ceil(Fraction(bnm * s, num_sms)) if eligible(s) else Fraction(0)
           for s in range(1, max_splits + 1)]
    best = max(eff, default=Fraction(0))
    chosen = (s for s in range(1, max_splits + 1) if eligible(s) and eff[s - 1] >= Fraction(85, 100) * best)
    return next(chosen, 1)


# --- FA2 ----------------------------------------------------------------------------------------------------

def test_fa2_llama3_8b_single_request_on_132_sms():
    # llama-3-8b decode (32 q heads, 8 kv heads, hdim 128), batch 1, 8192 keys, H100/H200 (132 SMs -> 264).
    # GQA swap: seqlen_q = 4, num_heads = 8 -> bnm = 1 * 8 * cdiv(4, 64) = 8; block_n = 128 -> 64 n-blocks.
    # 8 < 0.8 * 264 = 211.2; max_splits = min(128, 264, 64) = 64. n_waves = 8 s / 264 < 1 up to s = 33, so
    # eff = s / 33 there. Eligible s (cdiv(64, s) changes): 1..10, 11, 13, 16, 22, 32, 64 (33 is not: cdiv = 2
    # as for 32). max eff = 32/33 (s = 32; s = 64 gives 1.939/2, the same); 0.85 * 32/33 = 0.824;
    # s = 22 gives 0.667, so the first eligible s reaching it is 32.
    assert num_splits_heuristic(8, 264, 64, 128) == 32
    assert plan(workloads.get("llama-3-8b", batch=1, ctx_len=8192), SM80_132, "flash_attn").num_splits == 32


def test_fa2_llama3_8b_batch_8():
    # bnm = 8 * 8 = 64; n_waves = 64 s / 264 = 8 s / 33. s = 1, 2, 3: 0.24, 0.48, 0.73; s = 4: 32/33 = 0.970.
    # The best eligible efficiency is 32/33 (s = 37 would reach 0.997 but cdiv(64, 37) == cdiv(64, 36));
    # 0.85 * 32/33 = 0.824 -> the first eligible s is 4.
    assert num_splits_heuristic(64, 264, 64, 128) == 4
    assert plan(workloads.get("llama-3-8b", batch=8, ctx_len=8192), SM80_132, "flash_attn").num_splits == 4


def test_fa2_eighty_percent_gate():
    # 0.8f * 264 = 211.2: 212 blocks never split; 211 do.
    assert num_splits_heuristic(212, 264, 64, 128) == 1
    # 211: n_waves = 211 s / 264; s = 1..4 all give 0.799 (s/s waves), s = 5: 1055/264 = 3.996 -> 0.999;
    # threshold 0.85 * 0.999 = 0.849 > 0.799, and 5 is eligible (cdiv(64,5) = 13 != 16) -> 5.
    assert num_splits_heuristic(211, 264, 64, 128) == 5


def test_fa2_float32_decides_an_exact_85_percent_tie():
    # bnm = 11, 264 SMs, 100 n-blocks: n_waves = 11 s / 264 = s / 24.
    # Eligible s: 1..10, 12, 13, 15, 17, 20, 25, 34, 50, 100. Best eff = 20/24 (s = 20; s = 100 ties at
    # 4.1667/5). 0.85 * 20/24 = 17/24 = eff(17) exactly.
    # Exact (and double) arithmetic take s = 17. In float32, eff(17) = fl(187/264) = 17/24 - 2**-25.6 and
    # max = fl(220/264) = 20/24 - 2**-25.6, so 0.85 * max = 17/24 - 0.85 * 2**-25.6 > eff(17): the C++ rule
    # (float n_waves/eff, double 0.85) skips 17 and returns 20.
    assert num_splits_heuristic(11, 264, 100, 128) == 20
    assert _exact_fa2(11, 264, 100, 128) == 17


def test_fa2_no_keys_and_no_blocks():
    assert num_splits_heuristic(0, 264, 64, 128) == 1  # 0/0 efficiencies are NaN in C++: never chosen
    assert num_splits_heuristic(8, 264, 0, 128) == 1  # no candidate split at all


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 4000), st.integers(1, 1200), st.integers(1, 5000), st.integers(1, 256))
def test_fa2_bounds(bnm, num_sms, n_blocks, max_splits):
    s = num_splits_heuristic(bnm, num_sms, n_blocks, max_splits)
    assert 1 <= s <= max(1, min(max_splits, num_sms, n_blocks))
    if s > 1:  # only eligible counts are returned
        assert cdiv(n_blocks, s) != cdiv(n_blocks, s - 1)


@given(st.integers(1, 1 << 21))
def test_eighty_percent_gate_never_flips_against_exact_arithmetic(num_sms):
    # The gate `n >= 0.8f * num_SMs` in float32 against exact 5 n >= 4 S, at the two integers around 0.8 S:
    # 0.8f = 0.8 * (1 + 1.49e-8) stays within half an ulp, so it rounds back to 0.8 S when that is an integer,
    # and no integer can fall between the two below 2**21.
    lo = (4 * num_sms - 1) // 5  # the largest n with 5 n < 4 S
    for n in (lo, lo + 1):
        assert (np.float32(n) >= np.float32(0.8) * np.float32(num_sms)) == (5 * n >= 4 * num_sms)
    # and the ports take the gate (return 1) on its passing side, however many blocks there are
    assert num_splits_heuristic(lo + 1, num_sms, 10**6, 256) == 1
    assert num_splits_heuristic_fa3(lo + 1, num_sms, 10**6, 1, 0, False, 256) == 1


# --- FA3 ----------------------------------------------------------------------------------------------------

def test_fa3_long_context():
    # llama-3-8b, 131072 keys on an H200 (132 SMs, not doubled), FA3 paged hdim 128: kBlockM 128, kBlockN 128.
    # seqlen_q_packgqa = 4 -> 1 m-block; varlen counts the batch as 1: total_mblocks = 1 * 8 * 1 = 8;
    # n-blocks = 131072 / 128 = 1024; 8 < 0.8 * 132 = 105.6 (the 64 MiB-per-head L2 rule is never reached).
    # max_splits = min(128, 132, 1024) = 128; eff = 8 s / 132 = 2 s / 33 below one wave, 1.0 at s = 33;
    # 0.85 * 1.0: s = 14 gives 28/33 = 0.848, s = 15 gives 0.909 -> 15.
    assert num_splits_heuristic_fa3(8, 132, 1024, 1, 131072 * 256 * 2, True, 128) == 15
    p = plan(workloads.get("llama-3-8b", batch=1, ctx_len=131072), "h200", "flash_attn")
    # Dynamic split: 1 * 1024 blocks, blocks_per_sm = ceil(1024 * 1.1 * 8 / 132) = ceil(68.27) = 69,
    # cdiv(1024, 69) = 15 (<= the static 15).
    assert (p.num_splits, p.block_n, p.per_request, p.extra["num_splits_static"]) == (15, 128, (15,), 15)


def test_fa3_l2_rule_for_long_prefill_like_calls():
    # total_mblocks 300 >= 105.6: split only if one KV head exceeds 50 MiB, num_m_blocks >= 264 and no mask.
    assert num_splits_heuristic_fa3(300, 132, 1000, 300, 120 * MiB, False, 128) == 3  # cdiv(120, 50)
    assert num_splits_heuristic_fa3(300, 132, 1000, 300, 120 * MiB, True, 128) == 1  # causal
    assert num_splits_heuristic_fa3(300, 132, 1000, 263, 120 * MiB, False, 128) == 1  # too few m-blocks
    assert num_splits_heuristic_fa3(300, 132, 1000, 300, 50 * MiB, False, 128) == 1  # fits the 50 MiB L2
    assert num_splits_heuristic_fa3(300, 132, 1000, 300, 10_000 * MiB, False, 128) == 128  # max_splits cap


def test_fa3_few_blocks_never_split():
    assert num_splits_heuristic_fa3(8, 132, 4, 1, 0, False, 128) == 1
    assert num_splits_heuristic_fa3(8, 132, 5, 1, 0, False, 128) > 1


def test_fa3_float32_decides_an_exact_85_percent_tie():
    # total_mblocks 1 (MQA/MLA, varlen), 132 SMs, 100 n-blocks: eff = s/132, max = 100/132,
    # 0.85 * max = 85/132 = eff(85) exactly. Exact arithmetic returns 85; float32
    # eff(85) = 0.64393937588 < 0.85 * fl(100/132) = 0.64393938780 -> 86.
    assert num_splits_heuristic_fa3(1, 132, 100, 1, 0, False, 128) == 86
    # The same case through the adapter: kimi-k2.5 (16 heads) MLA, 6400 keys: q_v path (d 64, dv 512) ->
    # kBlockM 64, kBlockN 64 -> 100 n-blocks, one m-block; dynamic: blocks_per_sm = ceil(100 * 1.1 / 132) = 1.
    p = plan(workloads.get("kimi-k2.5-mla-tp4", batch=1, ctx_len=6400), "h200", "flash_attn")
    assert (p.num_splits, p.block_n) == (86, 64)


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 4000), st.integers(1, 1200), st.integers(0, 5000), st.integers(0, 5000),
       st.integers(0, 1 << 31), st.booleans(), st.integers(1, 256))
def test_fa3_bounds(total, num_sms, n_blocks, m_blocks, size, masked, max_splits):
    s = num_splits_heuristic_fa3(total, num_sms, n_blocks, m_blocks, size, masked, max_splits)
    l2_branch = 5 * total >= 4 * num_sms and size > 50 * MiB and m_blocks >= 2 * num_sms and not masked
    if l2_branch:
        assert s == min(cdiv(size, 50 * MiB), max_splits)
    else:
        assert 1 <= s <= max(1, min(max_splits, num_sms, n_blocks))


# --- FA4 ----------------------------------------------------------------------------------------------------

def test_fa4():
    assert num_splits_heuristic_fa4(8, 132, 100, 128) == 16  # min(132 // 8, 128, 100)
    assert num_splits_heuristic_fa4(8, 132, 4, 128) == 1  # <= 4 n-blocks
    assert num_splits_heuristic_fa4(0, 132, 100, 128) == 1  # total_mblocks == 0 guard
    assert num_splits_heuristic_fa4(200, 132, 100, 128) == 0  # 132 // 200: upstream returns 0 (runs unsplit)


@given(st.integers(0, 4000), st.integers(1, 1200), st.integers(0, 5000), st.integers(1, 256))
def test_fa4_bounds(total, num_sms, n_blocks, max_splits):
    s = num_splits_heuristic_fa4(total, num_sms, n_blocks, max_splits)
    assert 0 <= s <= max(1, min(max_splits, num_sms, n_blocks))
    assert (s == 0) == (n_blocks > 4 and total > num_sms)


# --- FA3 tiles and the dynamic split ------------------------------------------------------------------------

def test_tile_sizes():
    assert tile_size_fwd_sm90(128, 128, False, False)[:2] == (128, 176)
    assert tile_size_fwd_sm90(128, 128, True, False)[:2] == (128, 128)  # causal
    assert tile_size_fwd_sm90(128, 128, False, False, 2, False, True)[:2] == (128, 128)  # paged, no TMA
    assert tile_size_fwd_sm90(64, 512, False, False)[:2] == (64, 64)  # MLA q_v path
    assert tile_size_fwd_sm90(128, 128, False, False, 1, False, True)[:2] == (128, 160)  # fp8 paged
    assert (round_up_headdim(576), round_up_headdimv(512), round_up_headdim(100)) == (256, 512, 128)


def test_tile_sizes_hdim_64_are_mains():
    # hopper/tile_size.h @ 0251105a (main), bf16 hdim <= 64: dv 512 -> 64 x 64; dv 256 -> 128 x 96; else
    # use_blockN_128 = causal || local || paged_kv_non_TMA -> {192, 128 or 192, use_blockN_128, true}.
    # (The unmerged PR head 07602adc has 192 x 160 for local / paged non-TMA and 128 x 112 for dv 256.)
    assert tile_size_fwd_sm90(64, 64, False, False) == (192, 192, False, True)
    assert tile_size_fwd_sm90(64, 64, True, False) == (192, 128, True, True)  # causal
    assert tile_size_fwd_sm90(64, 64, False, True) == (192, 128, True, True)  # local
    assert tile_size_fwd_sm90(64, 64, False, False, 2, False, True) == (192, 128, True, True)  # paged, no TMA
    assert tile_size_fwd_sm90(64, 128, False, False, 2, False, True) == (192, 128, True, True)
    assert tile_size_fwd_sm90(64, 256, False, False) == (128, 96, True, False)
    assert tile_size_fwd_sm90(64, 512, False, False, 2, False, True) == (64, 64, False, False)
    assert tile_size_fwd_sm90(64, 64, False, False, 1, False, True) == (192, 160, True, True)  # fp8


def test_fa3_hdim_64_split_follows_mains_tiles():
    # batch 7, 48 q heads / 1 kv head, head dim 64, 1924 keys, page 64, 256 SMs (sm_90).
    # d = 64 is not in (64, 128]: causal dropped. get_pagedkv_tma: tile 192 x 192, 64 % 192 != 0 -> non-TMA,
    # so kBlockM x kBlockN = 192 x 128 (main; the PR head 07602adc gives 192 x 160).
    # seqlen_k = cdiv(1924, 64) * 64 = 1984 -> cdiv(1984, 128) = 16 n-blocks; m-blocks cdiv(48, 192) = 1;
    # varlen counts the batch as 1: total_mblocks = 1 * 1 * 1 = 1 < 0.8 * 256. max_splits = min(128, 256, 16)
    # = 16; eff(s) = s / 256, max 16 / 256; the first s with s / 256 >= 0.85 * 16 / 256 = 13.6 / 256 is 14.
    # (With 160-key tiles: 13 n-blocks, 0.85 * 13 = 11.05 -> 12.)
    # Dynamic: 7 * 16 = 112 blocks, blocks_per_sm = ceil(112 * 1.1 * 1 / 256) = 1 -> min(16, 14) = 14 each.
    w = workloads.DecodeWorkload("gqa", 7, 48, 1, 64, 64, 1924, page_size=64)
    p = plan(w, SM90_256, "flash_attn")
    assert (p.num_splits, p.block_n, p.per_request) == (14, 128, (14,) * 7)
    assert (p.extra["kBlockM"], p.extra["num_n_blocks"], p.extra["num_splits_static"]) == (192, 16, 14)
    assert p.extra["pagedkv_tma"] is False


def test_fa3_past_992_requests_every_split_is_one():
    # b > 992: mha_fwd still sets num_splits_dynamic_ptr (varlen), so get_num_splits counts the batch as 1;
    # prepare_varlen_num_blocks then runs as cdiv(b, 992) > 1 CTAs and sets every request's split to 1.
    # llama-3-8b shape (32/8 heads, d 128 -> causal kept, paged 16 -> non-TMA 128 x 128), 4096 keys on 132
    # SMs: 32 n-blocks, 1 m-block, total_mblocks 8; eff(s) = 8 s / 132 up to s = 16 (0.970), and s = 32 ties
    # it; 0.85 * 0.970 = 0.824: s = 13 gives 0.788, s = 14 gives 0.848 -> static 14.
    w = workloads.DecodeWorkload("gqa", 1000, 32, 8, 128, 128, 4096, page_size=16)
    p = plan(w, "h200", "flash_attn")
    assert (p.num_splits, p.per_request, p.extra["num_splits_static"]) == (1, None, 14)
    p = plan(w.with_(batch=992), "h200", "flash_attn")  # one prepare CTA: the dynamic split runs
    assert p.per_request is not None and p.extra["num_splits_static"] == 14


def test_prepare_varlen_num_splits():
    # 4 requests of 32768 keys, 8 kv heads, group 4 packed: 1 m-block and 256 n-blocks each -> 1024 blocks;
    # blocks_per_sm = ceil(1024 * 1.1 * 8 / 132) = ceil(68.27) = 69; cdiv(256, 69) = 4 (static bound 15).
    assert prepare_varlen_num_splits([1] * 4, [32768] * 4, 8, 4, 132, 15, 128, 128) == [4, 4, 4, 4]
    # ragged: lengths 128 and 65536 -> 1 + 512 blocks, blocks_per_sm = ceil(513 * 1.1 * 8 / 132) = 35:
    # cdiv(1, 35) = 1 and cdiv(512, 35) = 15, capped at the static 8.
    assert prepare_varlen_num_splits([1, 1], [128, 65536], 8, 4, 132, 8, 128, 128) == [1, 8]


# --- adapter ------------------------------------------------------------------------------------------------

GQA = ["llama-3-8b", "llama-3-70b", "qwen3-32b", "mqa-128"]
MLA = ["deepseek-v3-mla", "deepseek-v3-mla-tp8", "kimi-k2.5-mla-tp4"]


@pytest.mark.parametrize("preset", GQA + MLA)
@pytest.mark.parametrize("device", ["h200", "h100", "b200", "rtx5090", "mi300x"])
@pytest.mark.parametrize("batch,ctx", [(1, 1024), (4, 32768), (64, 8192), (1024, 4096)])
def test_adapter_on_presets(preset, device, batch, ctx):
    w = workloads.get(preset, batch=batch, ctx_len=ctx)
    p = plan(w, device, "flash_attn")
    assert p.planner == "flash_attn" and 1 <= p.num_splits <= 128 and p.note
    fa3 = device in ("h200", "h100")
    assert p.extra["version"] == ("FA3" if fa3 else "FA2")
    if fa3:
        assert p.block_n == (128 if w.kind == "gqa" else 64)
        assert p.num_splits <= p.extra["num_splits_static"]
        assert (p.per_request is None) == (batch > 992)
    else:
        assert p.block_n == (128 if w.kind == "gqa" else 64)
        assert p.per_request is None
    if w.kind == "mla":
        assert "MQA" in p.note and "576" in p.note
