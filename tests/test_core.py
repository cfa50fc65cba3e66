"""Devices, workloads and the wave model."""

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitlab import devices, waves, workloads
from splitlab.errors import SplitlabError
from splitlab.workloads import DecodeWorkload


def test_device_lookup_is_case_insensitive_and_by_alias():
    assert devices.get("H200").name == "h200-sxm"
    assert devices.get("h200-sxm").sm_count == 132
    assert devices.get("MI355X").sm_count == 256
    assert devices.get("mi300x").sm_count == 304
    assert devices.get("rtx-pro-6000").sm_count == 188
    assert devices.get("RTX5090").sm_count == 170
    assert devices.get("gb10").sm_count == 48


def test_every_required_preset_exists_with_a_source():
    for name in ["h100-sxm", "h200-sxm", "b200", "rtx5090", "rtx-pro-6000", "gb10", "mi300x", "mi325x", "mi355x"]:
        d = devices.get(name)
        assert d.sm_count > 0 and d.hbm_gbps > 0 and d.l2_mb > 0 and d.source


def test_h200_roofline_uses_measured_ceilings():
    d = devices.get("h200")
    assert (d.roofline_gbps, d.roofline_tflops) == (4500, 790)
    assert d.hbm_gbps == 4800  # the datasheet stays in its own field


def test_unknown_device_names_the_allowed_values():
    with pytest.raises(SplitlabError, match="device='a100' is not allowed; expected one of h100-sxm"):
        devices.get("a100")


def test_detect_without_gpu_is_a_clear_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(SplitlabError, match="needs a GPU"):
        devices.detect()


def test_workload_rebuilds_from_its_row():
    w = workloads.get("llama-3-70b", batch=4, ctx_len=32768)
    assert DecodeWorkload(**w.row()) == w
    assert (w.num_q_heads, w.num_kv_heads, w.head_dim_qk, w.group) == (64, 8, 128, 8)
    r = DecodeWorkload(kind="gqa", batch=3, num_q_heads=8, num_kv_heads=2, head_dim_qk=64, head_dim_v=64,
                       ctx_len=100, seq_lens=(100, 0, 7))
    assert DecodeWorkload(**r.row()) == r and r.keys_per_request == 100


def test_presets_cover_the_models():
    for name in ["llama-3-8b", "llama-3-70b", "qwen3-32b", "deepseek-v3-mla", "deepseek-v3-mla-tp8",
                 "kimi-k2.5-mla-tp4", "deepseek-v4-sparse-mla"]:
        assert workloads.get(name).kind in workloads.KINDS
    assert workloads.get("deepseek-v3-mla-tp8").num_q_heads == 16
    assert workloads.get("deepseek-v4-sparse-mla").topk == 2048


def test_bytes_and_flops_count_unique_kv_once():
    w = workloads.get("llama-3-8b", batch=2, ctx_len=1024)
    assert w.kv_bytes == 2 * 1024 * 8 * (128 + 128) * 2
    assert w.flops == 2 * 2 * 1024 * 32 * 256
    m = workloads.get("deepseek-v3-mla", batch=1, ctx_len=1000)
    assert m.kv_bytes == 1000 * 576 * 2  # one latent row serves K and V
    assert m.flops / m.kv_bytes == pytest.approx(128 * (576 + 512) / 576)  # ~242 FLOP/byte
    s = workloads.get("deepseek-v4-sparse-mla", batch=3, ctx_len=100000)
    assert s.kv_bytes == 3 * 2048 * 512 * 2


@pytest.mark.parametrize("changes, arg", [
    (dict(batch=0), "batch=0"), (dict(batch=-1), "batch=-1"), (dict(batch=1.5), "batch=1.5"),
    (dict(num_q_heads=12, num_kv_heads=8), "num_q_heads=12"), (dict(kind="dense"), "kind='dense'"),
    (dict(dtype="int4"), "dtype='int4'"), (dict(ctx_len=0), "ctx_len=0"),
    # Past the documented bounds (LIMITS): a batch of 10**12 was a MemoryError, 1e30 an OverflowError, 10**8 a
    # planner that walked the batch for minutes.
    (dict(batch=10**12), "batch=1000000000000 is not allowed; expected an integer in [1, 65536]"),
    (dict(batch=1e30), "batch=1e+30 is not allowed"), (dict(batch=float("inf")), "batch=inf"),
    (dict(batch=float("nan")), "batch=nan"), (dict(batch=65537), "batch=65537"),
    (dict(num_q_heads=8192, num_kv_heads=8), "num_q_heads=8192"), (dict(head_dim_qk=4096), "head_dim_qk=4096"),
    (dict(head_dim_v=1025), "head_dim_v=1025"), (dict(ctx_len=1 << 31), "ctx_len=2147483648"),
    (dict(page_size=1 << 17), "page_size=131072"), (dict(topk=4), "topk=4 is not allowed for kind='gqa'"),
    (dict(seq_lens=(8,)), "seq_lens has 1 entries; expected batch=2"),
])
def test_bad_workloads_name_the_argument(changes, arg):
    base = dict(kind="gqa", batch=2, num_q_heads=32, num_kv_heads=8, head_dim_qk=128, head_dim_v=128, ctx_len=8)
    with pytest.raises(SplitlabError, match=re.escape(arg)):
        DecodeWorkload(**(base | changes))




def test_the_limits_are_accepted_and_documented():
    w = DecodeWorkload("sparse_mla", workloads.LIMITS["batch"], 4096, 1, 1024, 1024, workloads.LIMITS["ctx_len"],
                       page_size=workloads.LIMITS["page_size"], topk=workloads.LIMITS["topk"])
    assert w.batch == 1 << 16 and w.keys_per_request == 1 << 20
    assert "LIMITS[field]" in DecodeWorkload.__doc__
    assert set(workloads.LIMITS) == {"batch", "num_q_heads", "num_kv_heads", "head_dim_qk", "head_dim_v", "ctx_len",
                                     "page_size", "topk"}


def test_check_int_takes_an_upper_bound():
    from splitlab.errors import check_int

    assert check_int("n", 8, maximum=8) == 8 and check_int("n", 4.0, minimum=0, maximum=8) == 4
    with pytest.raises(SplitlabError, match=re.escape("n=9 is not allowed; expected an integer in [1, 8]")):
        check_int("n", 9, maximum=8)
    with pytest.raises(SplitlabError, match=re.escape("n=inf is not allowed; expected an integer in [1, 8]")):
        check_int("n", float("inf"), maximum=8)


def test_modular_refuses_where_its_sm100_rule_divides_by_zero():
    from splitlab import planners

    w = workloads.get("deepseek-v3-mla", batch=1).with_(num_q_heads=1024)
    with pytest.raises(SplitlabError, match="num_q_heads=1024 is not allowed for planner='modular'"):
        planners.plan(w, "b200", "modular")
    assert planners.plan(w.with_(num_q_heads=512), "b200", "modular").num_splits >= 1  # 8 head groups: defined
    assert planners.plan(w, "mi355x", "modular").num_splits >= 1  # the AMD rule has no such floor


def test_mla_needs_one_kv_head_and_sparse_needs_topk():
    with pytest.raises(SplitlabError, match="num_kv_heads=2"):
        DecodeWorkload("mla", 1, 16, 2, 576, 512, 128)
    with pytest.raises(SplitlabError, match="topk=0"):
        DecodeWorkload("sparse_mla", 1, 16, 1, 576, 512, 128)


def test_ctas_per_family():
    assert waves.ctas(workloads.get("llama-3-8b", batch=4), 8) == 4 * 8 * 8
    assert waves.ctas(workloads.get("deepseek-v3-mla", batch=4), 8) == 4 * 2 * 8  # 128 heads / 64 per tile
    assert waves.ctas(workloads.get("deepseek-v3-mla-tp8", batch=4), 8) == 4 * 1 * 8
    assert waves.ctas(workloads.get("deepseek-v4-sparse-mla", batch=3), 2, block_h=16) == 3 * 4 * 2
    assert [waves.default_block_h(h) for h in (1, 16, 20, 64, 128)] == [16, 16, 32, 64, 64]


def test_wave_stats_worked_example():
    s = waves.WaveStats(ctas=200, sm_count=132)
    assert s.num_waves == 2
    assert s.last_wave_fill == pytest.approx(68 / 132)
    assert s.efficiency == pytest.approx(200 / 264)
    assert waves.WaveStats(264, 132).efficiency == 1.0
    assert waves.WaveStats(300, 132, ctas_per_sm=2).num_waves == 2


@given(st.integers(1, 100_000), st.integers(1, 1024), st.integers(1, 8))
def test_wave_stats_bounds(ctas, sms, per_sm):
    s = waves.WaveStats(ctas, sms, per_sm)
    assert 0 < s.last_wave_fill <= 1 and 0 < s.efficiency <= 1
    assert s.num_waves == math.ceil(ctas / (sms * per_sm))
    assert (s.num_waves - 1) * s.slots < ctas <= s.num_waves * s.slots


def test_wave_stats_rejects_bad_counts():
    with pytest.raises(SplitlabError, match="ctas=0"):
        waves.WaveStats(0, 132)
    with pytest.raises(SplitlabError, match="num_splits=0"):
        waves.ctas(workloads.get("llama-3-8b"), 0)


def test_wave_fill_splits_fill_whole_waves():
    mla16 = workloads.get("deepseek-v3-mla", batch=6).with_(num_q_heads=16)  # 6 x 1 head tile = 6 CTAs
    assert waves.wave_fill_splits(mla16, 132, 256) == (22, 44, 66, 88, 110, 132, 154, 176)
    assert waves.wave_fill_splits(mla16, 132, 64) == (22, 44)  # clipped to the split range
    sparse = workloads.get("deepseek-v4-sparse-mla", batch=4)  # 64 heads: 4 CTAs at BLOCK_H 64, 16 at 16
    assert waves.wave_fill_splits(sparse, 132, 64) == (33,)
    assert waves.wave_fill_splits(sparse, 132, 64, block_h=16) == (8, 16, 24, 33, 41, 49, 57)
    big = workloads.get("llama-3-8b", batch=256)  # 2048 CTAs unsplit: more than 8 slots per SM already
    assert waves.wave_fill_splits(big, 132, 64) == ()
    for s in waves.wave_fill_splits(workloads.get("llama-3-8b", batch=3), 132, 64):  # 24 CTAs
        assert waves.ctas(workloads.get("llama-3-8b", batch=3), s) <= 8 * 132
