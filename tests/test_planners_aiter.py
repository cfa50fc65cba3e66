"""aiter gfx950 split cost model, seed 003's BLOCK_K rule, vLLM's ROCm sparse-MLA planners, and the adapter.

Golden values are derived by hand from the rule text (planners.md 3.1/3.2); the derivations are in comments.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitlab import devices, workloads
from splitlab.errors import SplitlabError
from splitlab.planners import plan
from splitlab.planners.aiter import (
    _decode_partial_iters,
    decode_num_splits,
    pa_decode_sparse_block_k,
    vllm_decode_gfx950_num_splits,
    vllm_decode_num_splits,
)

# Seed 003's shape: 64 heads -> heads_blocks = cdiv(64, 16) = 4, top-k 2048, MI355X (256 CUs), block_k 64.
# base = 4 * nq, waves = cdiv(base * s, 256), m_it = ceil(ceil(2048 / s) / 64), thr = 0.75 * 256 = 192,
# fill = max(0, 1 - base * s / 192) / s, cost = waves * m_it + 0.32 * s + 2 * fill.
#
# nq = 1 (base 4): waves = 1 for every s <= 16; fill = (1 - s/48)/s.
#   s=8: m=4 -> 4 + 2.56 + 2*(1/8 - 1/48) = 6.768;
#   s=11: m=ceil(187/64)=3 -> 3 + 3.52 + 2*(1/11 - 1/48) = 6.660;
#   s=12: 3 + 3.84 + 0.125 = 6.965;  s=16: 2 + 5.12 + 0.083 = 7.203;  s=9: 4 + 2.88 + 0.181 = 7.06  -> 11.
# nq = 8 (base 32): waves 1 for s <= 8, 2 above; fill 0 from s = 6.
#   s=6: 6 + 1.92 = 7.92;  s=7: 5 + 2.24 = 7.24;  s=8: 4 + 2.56 = 6.56;  s=11: 2*3 + 3.52 = 9.52;
#   s=16: 2*2 + 5.12 = 9.12  -> 8.
# nq = 16 (base 64): waves 1 (s<=4), 2 (5..8), 3 (9..12), 4 (13..16); fill 0 from s = 3.
#   s=3: 11 + 0.96 = 11.96;  s=4: 8 + 1.28 = 9.28;  s=8: 2*4 + 2.56 = 10.56;  s=16: 4*2 + 5.12 = 13.12  -> 4.
# nq = 24 (base 96): waves = cdiv(96 s, 256); fill 0 from s = 2.
#   s=2: 16 + 0.64 = 16.64;  s=5: 2*7 + 1.6 = 15.6;  s=8: 3*4 + 2.56 = 14.56;  s=11: 5*3 + 3.52 = 18.52;
#   s=16: 6*2 + 5.12 = 17.12  -> 8.
# nq = 32 (base 128): s=1: 32 + 0.32 + 2*(1/3) = 32.99;  s=2: waves 1, m 16 -> 16.64;
#   s=4: 2*8 + 1.28 = 17.28;  s=8: 4*4 + 2.56 = 18.56;  s=11: 6*3 + 3.52 = 21.52  -> 2.
# nq = 34 (base 136): s=2: waves 2 -> 32.64;  s=3: 2*11 + 0.96 = 22.96;  s=5: 3*7 + 1.6 = 22.6;
#   s=7: 4*5 + 2.24 = 22.24;  s=8: 5*4 + 2.56 = 22.56;
#   s=11: waves cdiv(1496,256)=6, m 3 -> 18 + 3.52 = 21.52;  s=12: 7*3 + 3.84 = 24.84;
#   s=16: 9*2 + 5.12 = 23.12  -> 11.
# nq = 64 (base 256): waves = s, s * m_it >= 32 for every s, so cost >= 32 + 0.32 s: s = 1 (32.32)  -> 1.
SEED_003 = [  # (num_queries, num_splits, ctas = nq * splits * 4, BLOCK_K = 32 if ctas > 256 else 64)
    (1, 11, 44, 64),
    (8, 8, 256, 64),
    (16, 4, 256, 64),
    (24, 8, 768, 32),
    (32, 2, 256, 64),
    (34, 11, 1496, 32),
    (64, 1, 256, 64),
]


@pytest.mark.parametrize("num_queries,splits,ctas,block_k", SEED_003)
def test_decode_num_splits_seed_003_shape(num_queries, splits, ctas, block_k):
    assert decode_num_splits(num_queries, 4, 2048, 0, 64, num_sms=256) == splits
    assert num_queries * splits * 4 == ctas
    assert pa_decode_sparse_block_k(ctas, 256) == block_k


def test_seed_003_ctas_not_monotonic_in_queries():
    # Seed 003: "32 queries can launch fewer CTAs than 34": 256 CTAs (one wave) against 1496.
    c32 = 32 * decode_num_splits(32, 4, 2048, num_sms=256) * 4
    c34 = 34 * decode_num_splits(34, 4, 2048, num_sms=256) * 4
    assert c32 == 256 < c34 == 1496


def test_block_k_rule_around_the_cu_count():
    assert pa_decode_sparse_block_k(255, 256) == 64
    assert pa_decode_sparse_block_k(256, 256) == 64  # ctas == num_sms: every CTA still has its own CU
    assert pa_decode_sparse_block_k(257, 256) == 32
    assert pa_decode_sparse_block_k(0, 256) == 64


def test_decode_num_splits_ties_go_to_the_smaller_split():
    # No work (avg lengths 0) and one wave for every s: cost = 0.32 s + 2 * fill(s) with
    # fill = (1 - s/thr)/s, so cost(s) = 0.32 s + 2/s - 2/thr, smallest at s = 3:
    # 0.64 + 1 (s = 2) = 1.64 > 0.96 + 0.667 (s = 3) = 1.627 < 1.28 + 0.5 (s = 4) = 1.78 -> 3.
    assert decode_num_splits(1, 1, num_sms=256) == 3
    # Saturated device: fill = 0 and waves * 0 iterations: cost = 0.32 s, strictly increasing -> 1.
    assert decode_num_splits(1000, 1, num_sms=256) == 1


def test_vllm_decode_partial_iters():
    # ceil(ceil(2048/3)/32) = ceil(683/32) = 22, plus ceil(ceil(100/3)/32) = ceil(34/32) = 2.
    assert _decode_partial_iters(2048, 100, 3, 32) == 24
    assert _decode_partial_iters(0, 0, 5, 32) == 0


def test_vllm_decode_num_splits_cost_and_snap_down():
    # base 1 on 304 CUs: waves = 1 for every s <= 16, cost = 1/s + 0.04 falls -> 16 without lengths.
    assert vllm_decode_num_splits(1, 1, num_sms=304) == 16
    # With avg_main 100: iters(16) = ceil(7/32) = 1; the first s with 1 wave and 1 iteration is s = 4
    # (ceil(25/32) = 1; s = 3 gives ceil(34/32) = 2) -> snap down to 4.
    assert vllm_decode_num_splits(1, 1, 100.0, 0.0, 32, num_sms=304) == 4
    # Docstring case: batch 224 on 256 CUs: s=1 costs 1.04, s=2 2*(0.5+0.04) = 1.08, s=8 7*0.165 = 1.155 -> 1.
    assert vllm_decode_num_splits(224, 1, num_sms=256) == 1


def test_vllm_decode_gfx950_num_splits():
    # base 4 (< 16): ns = min(32, ceil(512/4)) = 32 and no other step applies.
    assert vllm_decode_gfx950_num_splits(4, 1, 2048, num_sms=256) == 32
    # base 16, avg 256: ns = 32 > 4 and iters(4) = ceil(64/32) = 2 <= 3 -> 4.
    assert vllm_decode_gfx950_num_splits(16, 1, 256, num_sms=256) == 4
    # base 16, avg 2048: iters(4) = 16; one-wave splits 256//16 = 16 walk ceil(128/32) = 4 <= 9 iterations ->
    # one wave, ns = min(32, 16) = 16; no s < 16 walks 4 iterations (s = 15: ceil(137/32) = 5) -> 16.
    assert vllm_decode_gfx950_num_splits(16, 1, 2048, num_sms=256) == 16
    # base 64, avg 2048: ns = ceil(512/64) = 8, waves cdiv(512,256) = 2, iters(8) = 8;
    # s = 5..7 give 2 waves but 13/11/10 iterations -> 8.
    assert vllm_decode_gfx950_num_splits(64, 1, 2048, num_sms=256) == 8


def test_bad_arguments_are_refused():
    with pytest.raises(SplitlabError, match="num_sms=0 is not allowed"):
        decode_num_splits(1, 4, 2048, num_sms=0)
    with pytest.raises(SplitlabError, match="avg_main=-1 is not allowed"):
        decode_num_splits(1, 4, -1, num_sms=256)


lengths = st.one_of(st.just(0), st.integers(0, 1 << 20), st.floats(0, 1e6, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 4096), st.integers(0, 64), lengths, lengths, st.sampled_from([16, 32, 64, 128]),
       st.integers(1, 1024))
def test_split_counts_stay_in_bounds(nq, hb, avg_main, avg_extra, block_k, num_sms):
    assert 1 <= decode_num_splits(nq, hb, avg_main, avg_extra, block_k, num_sms=num_sms) <= 16
    assert 1 <= vllm_decode_num_splits(nq, hb, avg_main, avg_extra, block_k, num_sms=num_sms) <= 16
    assert 1 <= vllm_decode_gfx950_num_splits(nq, hb, avg_main, avg_extra, block_k, num_sms=num_sms) <= 32


@given(st.integers(0, 1 << 20), st.integers(1, 1024))
def test_block_k_is_32_or_64(ctas, num_sms):
    assert pa_decode_sparse_block_k(ctas, num_sms) == (32 if ctas > num_sms else 64)


@pytest.mark.parametrize("preset", ["deepseek-v3.2-sparse-mla", "deepseek-v4-sparse-mla"])
@pytest.mark.parametrize("device", ["mi355x", "h200"])
@pytest.mark.parametrize("batch", [1, 8, 32, 34, 64, 256])
def test_adapter_on_presets(preset, device, batch):
    w = workloads.get(preset, batch=batch, ctx_len=65536)
    p = plan(w, device, "aiter")
    hb = -(-w.num_q_heads // 16)
    assert p.planner == "aiter" and 1 <= p.num_splits <= 16
    assert p.block_h == 16 and p.block_k in (32, 64)
    assert p.extra["ctas"] == batch * p.num_splits * hb
    assert p.block_k == (32 if p.extra["ctas"] > devices.get(device).sm_count else 64)
    assert p.note


def test_adapter_reproduces_seed_003_on_mi355x():
    # deepseek-v4-sparse-mla: 64 heads, top-k 2048 -> the SEED_003 table above.
    for nq, splits, _, block_k in SEED_003:
        p = plan(workloads.get("deepseek-v4-sparse-mla", batch=nq), "mi355x", "aiter")
        assert (p.num_splits, p.block_k) == (splits, block_k)


def test_adapter_covers_only_sparse_mla():
    with pytest.raises(SplitlabError, match="does not cover kind='gqa'"):
        plan(workloads.get("llama-3-8b"), "mi355x", "aiter")
