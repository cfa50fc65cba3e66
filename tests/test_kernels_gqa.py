"""The paged GQA split-K decode kernel against the fp64 reference, under Triton's interpreter."""

from __future__ import annotations

import math

import pytest
import torch

import splitlab.kernels.gqa as gqa
from splitlab import waves, workloads
from splitlab.errors import SplitlabError
from splitlab.kernels import reference
from splitlab.kernels.gqa import gqa_decode, gqa_launch_facts
from splitlab.kernels.testing import (
    TOLERANCE,
    assert_matches_reference,
    gqa_inputs,
    poison_unread_pages_,
    rel_err,
)
from splitlab.workloads import DecodeWorkload


def _check(inp, dtype, sm_scale=None, **knobs):
    out, lse = gqa_decode(**inp, sm_scale=sm_scale, return_lse=True, **knobs)
    ref, ref_lse = reference.gqa_decode(**inp, sm_scale=sm_scale, return_lse=True)
    empty = [b for b, n in enumerate(inp["seq_lens"].tolist()) if n == 0]
    assert_matches_reference(out, lse, ref, ref_lse, dtype, empty)
    return out, lse


# (dtype, B, Hq, Hkv, D, seq_lens, page_size, num_splits, block_n)
CASES = [
    (torch.float32, 2, 4, 4, 16, [5, 33], 16, 1, 16),  # MHA, one split, one-page tiles
    (torch.float32, 3, 6, 2, 32, [37, 0, 100], 1, 3, 16),  # group 3, page size 1, empty request
    (torch.float16, 2, 5, 1, 64, [70, 1], 64, 2, 32),  # MQA with 5 heads, tile inside a page
    (torch.float16, 2, 4, 2, 32, [20, 3], 16, 8, 16),  # more splits than key tiles
    (torch.bfloat16, 3, 8, 2, 32, [0, 50, 129], 16, 4, 32),  # tile spans two pages
    (torch.bfloat16, 2, 6, 2, 32, [45, 64], 64, 1, 64),  # bf16 written by the partial kernel
    (torch.float32, 2, 4, 2, 40, [23, 48], 16, 2, 16),  # head dim not a power of two (masked to 64)
    (torch.float16, 1, 2, 1, 8, [30], 10, 2, 16),  # head dim < 16, page size 10
    (torch.float32, 1, 32, 1, 16, [77], 16, 2, 128),  # group 32; block_n beyond the keys
]


@pytest.mark.parametrize("dtype,B,Hq,Hkv,D,lens,page_size,S,block_n", CASES)
def test_matches_reference(allocs, dtype, B, Hq, Hkv, D, lens, page_size, S, block_n):
    inp = gqa_inputs(B, Hq, Hkv, D, lens, page_size=page_size, dtype=dtype, seed=B + Hq + D)
    _check(inp, dtype, num_splits=S, block_n=block_n)
    assert len(allocs) == (2 if S == 1 else 4)
    for t in allocs:  # the partial buffers too: every element written (an empty split writes 0 / -inf)
        assert not torch.isnan(t).any()


def test_custom_scale_and_knobs():
    inp = gqa_inputs(2, 4, 2, 32, [40, 17], page_size=16, dtype=torch.float32, seed=3)
    _check(inp, torch.float32, sm_scale=0.3, num_splits=2, block_n=32, num_warps=2, num_stages=3)


@pytest.mark.parametrize("page_size,block_n", [(16, 16), (16, 64), (64, 32)])
def test_rows_no_request_reads_are_never_read(page_size, block_n):
    """NaN in every K/V row past a request's end and in every page no request uses changes nothing."""
    lens = [37, 0, 90]
    inp = gqa_inputs(3, 8, 2, 32, lens, page_size=page_size, dtype=torch.float32, seed=12)
    ref = reference.gqa_decode(**inp)
    for cache in (inp["k_cache"], inp["v_cache"]):
        poison_unread_pages_(cache, inp["block_table"], lens, page_size)
    assert torch.isnan(inp["k_cache"]).any()
    assert torch.equal(reference.gqa_decode(**inp), ref)  # only unread rows were poisoned
    _check(inp, torch.float32, num_splits=3, block_n=block_n)


def test_non_contiguous_views():
    g = torch.Generator().manual_seed(5)
    B, Hq, Hkv, D, ps, lens = 2, 6, 3, 16, 16, [29, 40]
    base = gqa_inputs(B, Hq, Hkv, D, lens, page_size=ps, dtype=torch.float16, seed=5)
    num_pages = base["k_cache"].shape[0]
    # K and V interleaved in one buffer, head dim padded: strides of neither are contiguous.
    kv = torch.randn(num_pages, ps, Hkv, 2, D + 8, generator=g).half()
    # q laid out [Hq, B, D] and viewed as [B, Hq, D]; the block table is a column slice of a wider one.
    q = torch.randn(Hq, B, D, generator=g).half().transpose(0, 1)
    wide = torch.zeros(B, base["block_table"].shape[1] + 3, dtype=torch.int32)
    wide[:, 1:1 + base["block_table"].shape[1]] = base["block_table"]
    inp = dict(q=q, k_cache=kv[..., 0, :D], v_cache=kv[..., 1, 4:D + 4], block_table=wide[:, 1:-2],
               seq_lens=base["seq_lens"])
    assert not inp["k_cache"].is_contiguous() and not inp["block_table"].is_contiguous()
    _check(inp, torch.float16, num_splits=3, block_n=16)


def test_zero_length_batch():
    inp = gqa_inputs(2, 4, 2, 16, [1, 1], dtype=torch.float32)
    inp["seq_lens"].zero_()
    for S in (1, 2):
        out, lse = gqa_decode(**inp, num_splits=S, return_lse=True)
        assert torch.all(out == 0) and torch.all(torch.isneginf(lse))


def test_return_lse_false_gives_tensor():
    inp = gqa_inputs(1, 2, 1, 16, [9], dtype=torch.float32)
    out = gqa_decode(**inp, num_splits=2)
    assert isinstance(out, torch.Tensor) and out.shape == (1, 2, 16)


def test_nan_never_passes():
    inp = gqa_inputs(1, 2, 1, 16, [9], dtype=torch.float32)
    ref = reference.gqa_decode(**inp)
    bad = ref.clone()
    bad[0, 1, 3] = float("nan")
    assert rel_err(bad, ref) == math.inf and not rel_err(bad, ref) <= TOLERANCE[torch.float32]


class _Spy:
    """Stands in for the jitted kernel and records the grid of each launch."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


def test_default_num_splits_on_cpu(monkeypatch):
    from splitlab.planners import default_plan

    spy = _Spy(gqa._gqa_partial_kernel)
    monkeypatch.setattr(gqa, "_gqa_partial_kernel", spy)
    lens = [300, 0, 120]
    inp = gqa_inputs(3, 4, 2, 16, lens, page_size=16, dtype=torch.float32, seed=1)
    _check(inp, torch.float32)  # num_splits=None: planned as for the H200
    w = DecodeWorkload(kind="gqa", batch=3, num_q_heads=4, num_kv_heads=2, head_dim_qk=16, head_dim_v=16,
                       ctx_len=max(lens), page_size=16, dtype="fp32")
    facts = gqa_launch_facts(w, device="h200")
    assert facts.num_splits == default_plan(w, "h200").num_splits
    assert spy.grids == [facts.grid]


@pytest.mark.parametrize("S", [1, 4])
def test_launch_grid_matches_facts(monkeypatch, S):
    spy = _Spy(gqa._gqa_partial_kernel)
    monkeypatch.setattr(gqa, "_gqa_partial_kernel", spy)
    inp = gqa_inputs(2, 6, 3, 16, [10, 50], dtype=torch.float32)
    gqa_decode(**inp, num_splits=S, block_n=32, num_warps=2)
    w = DecodeWorkload(kind="gqa", batch=2, num_q_heads=6, num_kv_heads=3, head_dim_qk=16, head_dim_v=16,
                       ctx_len=50, dtype="fp32")
    facts = gqa_launch_facts(w, num_splits=S, block_n=32, num_warps=2)
    assert spy.grids == [facts.grid] and facts.ctas == waves.ctas(w, S)
    assert facts.block_n == 32 and facts.num_warps == 2 and facts.num_stages == 2


@pytest.mark.parametrize("name", ["llama-3-8b", "llama-3-70b", "mqa-128"])
@pytest.mark.parametrize("batch,S", [(1, 1), (4, 16), (64, 2)])
def test_launch_facts_match_waves(name, batch, S):
    w = workloads.get(name, batch=batch, ctx_len=8192)
    facts = gqa_launch_facts(w, num_splits=S)
    assert facts.ctas == waves.ctas(w, S)
    assert facts.grid == (batch * w.num_kv_heads, S)
    assert (facts.combine_grid is None) == (S == 1)
    assert facts.block_n in (32, 64) and facts.block_h == max(16, w.group)
    planned = gqa_launch_facts(w, device="h200")
    assert planned.ctas == waves.ctas(w, planned.num_splits)


def test_launch_facts_rejects_other_kinds():
    with pytest.raises(SplitlabError, match="kind"):
        gqa_launch_facts(workloads.get("deepseek-v3-mla"), num_splits=2)


def _bad_inputs():
    """(case id, argument the message must name, mutate(inp, knobs))."""

    def setk(key, value):
        return lambda inp, kn: kn.__setitem__(key, value)

    def seti(key, fn):
        return lambda inp, kn: inp.__setitem__(key, fn(inp))

    return [
        ("q-2d", "q", seti("q", lambda i: i["q"][0])),
        ("q-int", "q", seti("q", lambda i: i["q"].to(torch.int32))),
        ("k-dtype", "k_cache", seti("k_cache", lambda i: i["k_cache"].half())),
        ("v-dtype", "v_cache", seti("v_cache", lambda i: i["v_cache"].double())),
        ("k-3d", "k_cache", seti("k_cache", lambda i: i["k_cache"][0])),
        ("k-headdim", "k_cache", seti("k_cache", lambda i: i["k_cache"][..., :8])),
        ("v-shape", "v_cache", seti("v_cache", lambda i: i["v_cache"][:, :, :1])),
        ("heads", "q", seti("q", lambda i: i["q"][:, :3])),
        ("page-size-0", "page_size", lambda i, k: i.update(k_cache=i["k_cache"][:, :0],
                                                           v_cache=i["v_cache"][:, :0])),
        ("table-int64", "block_table", seti("block_table", lambda i: i["block_table"].long())),
        ("table-batch", "block_table", seti("block_table", lambda i: i["block_table"][:1])),
        ("table-device", "block_table", seti("block_table", lambda i: i["block_table"].to("meta"))),
        ("lens-int64", "seq_lens", seti("seq_lens", lambda i: i["seq_lens"].long())),
        ("lens-shape", "seq_lens", seti("seq_lens", lambda i: i["seq_lens"][:1])),
        ("splits-0", "num_splits", setk("num_splits", 0)),
        ("splits-float", "num_splits", setk("num_splits", 1.5)),
        ("splits-bool", "num_splits", setk("num_splits", True)),
        ("block-n-8", "block_n", setk("block_n", 8)),
        ("block-n-48", "block_n", setk("block_n", 48)),
        ("block-n-512", "block_n", setk("block_n", 512)),
        ("warps-3", "num_warps", setk("num_warps", 3)),
        ("warps-32", "num_warps", setk("num_warps", 32)),
        ("stages-0", "num_stages", setk("num_stages", 0)),
        ("stages-9", "num_stages", setk("num_stages", 9)),
        ("scale", "sm_scale", setk("sm_scale", -1.0)),
    ]


@pytest.mark.parametrize("name,arg,mutate", _bad_inputs(), ids=[c[0] for c in _bad_inputs()])
def test_validation(name, arg, mutate):
    inp = gqa_inputs(2, 4, 2, 16, [5, 9], dtype=torch.float32)
    knobs: dict = {"num_splits": 2}
    mutate(inp, knobs)
    with pytest.raises(SplitlabError) as exc:
        gqa_decode(**inp, **knobs)
    assert isinstance(exc.value, ValueError)
    assert str(exc.value).startswith(arg), str(exc.value)  # the message names the argument first


def test_memoised_knobs_still_refuse_bools():
    inp = gqa_inputs(1, 2, 1, 16, [9], dtype=torch.float32)
    gqa_decode(**inp, num_splits=1)
    with pytest.raises(SplitlabError, match="num_splits"):
        gqa_decode(**inp, num_splits=True)
    with pytest.raises(SplitlabError, match="num_splits"):
        gqa_decode(**inp, num_splits=[2])


def test_planned_launch_refuses_lengths_past_the_block_table():
    x = gqa_inputs(2, 4, 2, 16, [10, 5], page_size=4, dtype=torch.float32)
    x["seq_lens"][1] = 4 * x["block_table"].shape[1] + 1  # one key past the last page
    with pytest.raises(SplitlabError, match=r"^seq_lens has values in \[10, 13\]"):
        gqa_decode(**x)
    x["seq_lens"][1] = -1
    with pytest.raises(SplitlabError, match=r"^seq_lens"):
        gqa_decode(**x)
