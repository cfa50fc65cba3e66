"""The work-list kernels (``kernels.worklist``): every scheduler's schedule against the fp64 reference, under
Triton's interpreter, with poisoned outputs, unread pages poisoned, empty requests and NaN keys."""

from __future__ import annotations

import pytest
import torch

from splitlab.errors import SplitlabError
from splitlab.kernels import reference
from splitlab.kernels.accuracy import assert_matches_reference, assert_same_nonfinite
from splitlab.kernels.inputs import gqa_inputs, mla_inputs, poison_unread_pages_, set_key_
from splitlab.kernels.worklist import WorkList, gqa_decode_scheduled, mla_decode_scheduled
from splitlab.planners import schedulers as S


def schedules(lens: list[int], page_size: int) -> list:
    return [S.uniform(lens, 3), S.uniform(lens, 1), S.stream_k(lens, 4), S.balanced(lens, 7),
            S.flashinfer(lens, page_size=page_size, num_kv_heads=2, sm_count=4), S.flashmla(lens, 3)]


# (dtype, B, Hq, Hkv, D, lens, page_size, block_n)
GQA_CASES = [
    (torch.float32, 4, 6, 2, 32, [130, 0, 17, 64], 16, 64),  # group 3, an empty request, per-key pages
    (torch.float16, 3, 4, 1, 16, [200, 1, 65], 64, 64),  # MQA, tiles inside a page
    (torch.bfloat16, 2, 8, 2, 32, [0, 0], 16, 32),  # only empty requests
]


@pytest.mark.parametrize("dtype,B,Hq,Hkv,D,lens,page_size,block_n", GQA_CASES)
def test_gqa_every_schedule_matches_reference(allocs, dtype, B, Hq, Hkv, D, lens, page_size, block_n):
    x = gqa_inputs(B, Hq, Hkv, D, lens, page_size=page_size, dtype=dtype, seed=B + D)
    poison_unread_pages_(x["k_cache"], x["block_table"], lens, page_size)
    poison_unread_pages_(x["v_cache"], x["block_table"], lens, page_size)
    ref, ref_lse = reference.gqa_decode(**x, return_lse=True)
    empty = [b for b, n in enumerate(lens) if n == 0]
    for s in schedules(lens, page_size):
        bn = block_n if page_size % block_n or s.align % block_n == 0 else 16
        allocs.clear()
        out, lse = gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"],
                                        WorkList.from_schedule(s, "cpu"), block_n=bn, return_lse=True)
        assert_matches_reference(out, lse, ref, ref_lse, dtype, empty)
        assert not torch.isnan(allocs[0]).any() and not torch.isnan(allocs[1]).any(), s.scheduler


def test_mla_every_schedule_matches_reference(allocs):
    lens = [150, 0, 64, 1]
    x = mla_inputs(4, 16, 96, lens, page_size=64, dtype=torch.float32, seed=3)
    poison_unread_pages_(x["kv_cache"], x["block_table"], lens, 64)
    ref, ref_lse = reference.mla_decode(**x, head_dim_v=64, return_lse=True)
    for s in schedules(lens, 64):
        out, lse = mla_decode_scheduled(x["q"], x["kv_cache"], x["block_table"], WorkList.from_schedule(s, "cpu"),
                                        head_dim_v=64, return_lse=True)
        assert_matches_reference(out, lse, ref, ref_lse, torch.float32, [1])


def test_a_nan_key_reaches_its_request_only():
    lens = [300, 90]
    x = gqa_inputs(2, 4, 2, 16, lens, dtype=torch.float32, seed=5)
    set_key_(x["k_cache"], x["block_table"], 0, 250, float("nan"))
    ref = reference.gqa_decode(**x)
    for s in (S.stream_k(lens, 3), S.uniform(lens, 4)):
        out = gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"],
                                   WorkList.from_schedule(s, "cpu"))
        assert_same_nonfinite(out, ref, torch.float32)
        assert torch.isnan(out[0]).all() and not torch.isnan(out[1]).any()


def test_refusals_are_one_line():
    lens = [100, 5]
    x = gqa_inputs(2, 4, 2, 16, lens, page_size=64, dtype=torch.float32)
    q, k, v, bt = x["q"], x["k_cache"], x["v_cache"], x["block_table"]
    with pytest.raises(SplitlabError, match="expected a WorkList"):
        gqa_decode_scheduled(q, k, v, bt, S.uniform(lens, 2))
    with pytest.raises(SplitlabError, match="for 3 requests; q has 2"):
        gqa_decode_scheduled(q, k, v, bt, WorkList.from_schedule(S.uniform([1, 2, 3], 1), "cpu"))
    with pytest.raises(SplitlabError, match="block table holds"):
        gqa_decode_scheduled(q, k, v, bt, WorkList.from_schedule(S.uniform([100, 5000], 1), "cpu"))
    with pytest.raises(SplitlabError, match="multiples of 16 keys"):
        gqa_decode_scheduled(q, k, v, bt, WorkList.from_schedule(S.flashinfer(lens, page_size=16, num_kv_heads=2,
                                                                              sm_count=64), "cpu"))
