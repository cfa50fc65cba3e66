"""The default launchers' call through a cached plan (``kernels.default_call``: ``num_splits=None`` with
``SPLITLAB_DEFAULT_PLAN=1``): fp64 agreement, the split-count path's results, no host sync, capture, the cache and
the switch. Under Triton's interpreter (tiny shapes); what it costs is the H200's question
(``experiments/plan_run``)."""

from __future__ import annotations

import pytest
import torch
from triton.runtime.jit import KernelInterface

from splitlab.errors import SplitlabError
from splitlab.kernels import _launch, default_call, gqa_decode, mla_decode, reference
from splitlab.kernels.accuracy import assert_matches_reference
from splitlab.kernels.inputs import gqa_inputs, mla_inputs, poison_unread_pages_


@pytest.fixture
def via_plan(monkeypatch):
    monkeypatch.setattr(default_call, "VIA_PLAN", True)
    default_call.clear()
    yield
    default_call.clear()


def gqa_case(lens, dtype=torch.float32, hq=6, hkv=2, d=32, page=16, seed=0):
    x = gqa_inputs(len(lens), hq, hkv, d, lens, page_size=page, dtype=dtype, seed=seed)
    for name in ("k_cache", "v_cache"):
        poison_unread_pages_(x[name], x["block_table"], lens, page)
    return x


@pytest.mark.parametrize("dtype,hq,hkv,d,page,lens", [
    (torch.float32, 6, 2, 32, 16, [130, 0, 17, 64]),
    (torch.bfloat16, 4, 1, 16, 64, [200, 1, 65]),  # MQA
    (torch.float16, 8, 8, 16, 1, [0, 0]),  # MHA, only empty requests
])
def test_gqa_matches_reference(allocs, via_plan, dtype, hq, hkv, d, page, lens):
    x = gqa_case(lens, dtype, hq, hkv, d, page, seed=len(lens))
    ref, ref_lse = reference.gqa_decode(**x, return_lse=True)
    for _ in range(2):  # the plan made, then reused
        out, lse = gqa_decode(**x, return_lse=True)
        assert_matches_reference(out, lse, ref, ref_lse, dtype, [b for b, n in enumerate(lens) if n == 0])
        assert not torch.isnan(out).any()
    assert torch.equal(gqa_decode(**x), out)  # without lse: the plan's scratch rows, the same output
    assert len(default_call._plans) == 1


def test_mla_matches_reference(allocs, via_plan):
    lens = [150, 0, 64, 1]
    x = mla_inputs(4, 16, 96, lens, page_size=64, dtype=torch.float32, seed=3)
    poison_unread_pages_(x["kv_cache"], x["block_table"], lens, 64)
    ref, ref_lse = reference.mla_decode(**x, head_dim_v=64, return_lse=True)
    out, lse = mla_decode(**x, head_dim_v=64, return_lse=True)
    assert_matches_reference(out, lse, ref, ref_lse, torch.float32, [1])
    assert not torch.isnan(out).any()
    assert torch.equal(mla_decode(**x, head_dim_v=64), out)


def test_the_split_count_path_agrees_and_strided_lengths_are_read_as_given(monkeypatch):
    """Same inputs, both default paths: the same result within fp32 rounding; a ``seq_lens`` column of a wider
    tensor (stride 2) gives what its contiguous copy gives."""
    lens = [300, 5, 0, 129]
    x = gqa_case(lens, seed=7)
    monkeypatch.setattr(default_call, "VIA_PLAN", False)
    split_count = gqa_decode(**x)
    monkeypatch.setattr(default_call, "VIA_PLAN", True)
    default_call.clear()
    torch.testing.assert_close(gqa_decode(**x), split_count, rtol=2e-6, atol=2e-6)
    wide = torch.stack([x["seq_lens"], torch.full_like(x["seq_lens"], 10**6)], dim=1)
    torch.testing.assert_close(gqa_decode(**dict(x, seq_lens=wide[:, 0])), split_count, rtol=2e-6, atol=2e-6)
    default_call.clear()


def test_no_host_sync_and_capture(monkeypatch, via_plan):
    """Once the shape's plan exists, a call reads nothing back (every host read raises) and is allowed under
    capture; the first call of a shape under capture is refused in one line."""
    lens = [130, 0, 17, 64]
    x = gqa_case(lens)
    monkeypatch.setattr(_launch, "capturing", lambda t: True)
    with pytest.raises(SplitlabError, match=r"first call of this shape \(4 requests\) while a CUDA graph") as e:
        gqa_decode(**x)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(_launch, "capturing", lambda t: False)
    gqa_decode(**x)
    calls: list = []
    monkeypatch.setattr(KernelInterface, "__getitem__", lambda self, grid: lambda *a, **kw: calls.append(self))

    def sync(*a, **k):
        raise AssertionError("a host read")

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    monkeypatch.setattr(_launch, "capturing", lambda t: True)
    gqa_decode(**x)
    assert len(calls) == 3  # splitlab's pricing and schedule (one launch), the partial kernel, the merge


def test_validation_when_asked(via_plan):
    lens = [40, 20]
    x = gqa_case(lens)
    bad = x["seq_lens"].clone()
    bad[1] = x["block_table"].shape[1] * 16 + 1
    with pytest.raises(SplitlabError, match=r"seq_lens") as e:
        gqa_decode(**dict(x, seq_lens=bad), validate=True)
    assert "\n" not in str(e.value)
    out = gqa_decode(**dict(x, seq_lens=bad))  # unvalidated: the request past its table is NaN, the other is not
    assert torch.isnan(out[1]).all() and not torch.isnan(out[0]).any()


def test_cache_is_bounded(monkeypatch, via_plan):
    monkeypatch.setattr(default_call, "CACHE_PLANS", 2)
    for b in (1, 2, 3, 2):
        gqa_decode(**gqa_case([33] * b))
    assert [k[7] for k in default_call._plans] == [3, 2]  # the batch sizes, most recent last


def test_pdl_is_part_of_a_plans_key(monkeypatch, via_plan):
    """Switching ``PDL`` makes a new plan (asked for with or without ``pdl``; the interpreter runs the same launches
    without it)."""
    x = gqa_case([40, 7])
    ref = gqa_decode(**x)
    made = []
    real = default_call._plan
    monkeypatch.setattr(default_call, "_plan", lambda key, *a: made.append(key) or real(key, *a))
    flipped = not default_call.PDL
    monkeypatch.setattr(default_call, "PDL", flipped)
    torch.testing.assert_close(gqa_decode(**x), ref, rtol=0, atol=0)
    assert len(default_call._plans) == 2 and made[-1][-1] is flipped


def test_with_plan_switches_for_the_call_only(monkeypatch):
    monkeypatch.setattr(default_call, "VIA_PLAN", False)
    seen = default_call.with_plan(default_call.via_plan)()
    assert seen is True and default_call.VIA_PLAN is False


def test_switch(monkeypatch):
    monkeypatch.setattr(default_call, "VIA_PLAN", None)
    for env, want in (("", False), ("0", False), ("1", True)):
        monkeypatch.setenv(default_call.ENV, env)
        assert default_call.via_plan() is want
    monkeypatch.setenv(default_call.ENV, "yes")
    with pytest.raises(SplitlabError, match="SPLITLAB_DEFAULT_PLAN='yes' is not allowed") as e:
        default_call.via_plan()
    assert "\n" not in str(e.value)


def test_scales_and_an_fp8_cache_reach_the_plan(via_plan, monkeypatch):
    """``sm_scale`` (GQA, MLA) and an fp8 cache's ``kv_scale`` (MLA) mean through the plan what they mean on the
    split-count path: the same results within fp32 rounding (the fp8 cache: within bf16's tolerance of each other,
    the paths rounding q differently at 64 rows)."""
    lens = [130, 0, 64]
    x = gqa_case(lens, seed=4)
    got = gqa_decode(**x, sm_scale=0.3)
    monkeypatch.setattr(default_call, "VIA_PLAN", False)
    torch.testing.assert_close(got, gqa_decode(**x, sm_scale=0.3), rtol=2e-6, atol=2e-6)
    from splitlab.kernels.inputs import quantize_fp8

    m = mla_inputs(3, 16, 96, lens, page_size=64, dtype=torch.bfloat16, seed=5)
    m8 = dict(m, kv_cache=quantize_fp8(m["kv_cache"], 0.37))
    want = mla_decode(**m8, head_dim_v=64, sm_scale=0.2, kv_scale=0.37)
    monkeypatch.setattr(default_call, "VIA_PLAN", True)
    got = mla_decode(**m8, head_dim_v=64, sm_scale=0.2, kv_scale=0.37)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert not torch.isnan(got).any()
    with pytest.raises(SplitlabError, match="kv_scale=0.37 is not allowed"):  # a 16-bit cache: refused as there
        mla_decode(**m, head_dim_v=64, kv_scale=0.37)
