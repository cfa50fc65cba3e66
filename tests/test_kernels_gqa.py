"""The paged GQA split-K decode kernel against the fp64 reference, under Triton's interpreter."""

from __future__ import annotations

import math

import pytest
import torch

import splitlab.kernels.gqa as gqa
from splitlab import waves, workloads
from splitlab.errors import SplitlabError
from splitlab.kernels import reference
from splitlab.kernels._launch import VALIDATE_ENV
from splitlab.kernels.accuracy import TOLERANCE, assert_matches_reference, assert_same_nonfinite, rel_err
from splitlab.kernels.gqa import gqa_decode, gqa_launch_facts
from splitlab.kernels.inputs import gqa_inputs, poison_unread_pages_, set_key_, strided_lens
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


def test_an_hnd_page_layout_is_read_through_its_strides():
    """A cache stored [num_pages, Hkv, page_size, D] (FlashInfer's HND: each kv head's page one contiguous block)
    passed as its [num_pages, page_size, Hkv, D] view: the kernel reads it through the strides, no copy (on the
    H200 it runs at the NHD layout's speed: BENCHMARKS.md, "Toward the frontier")."""
    inp = gqa_inputs(3, 8, 2, 32, [45, 0, 70], page_size=16, dtype=torch.bfloat16, seed=9)
    for name in ("k_cache", "v_cache"):
        inp[name] = inp[name].permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
        assert inp[name].stride()[1:3] == (32, 16 * 32)
    _check(inp, torch.bfloat16, num_splits=2, block_n=32)


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
    _check(inp, torch.float32)  # num_splits=None: planned as for the H200, for the batch as it is
    w = DecodeWorkload(kind="gqa", batch=3, num_q_heads=4, num_kv_heads=2, head_dim_qk=16, head_dim_v=16,
                       ctx_len=max(lens), page_size=16, dtype="fp32", seq_lens=tuple(lens))
    facts = gqa_launch_facts(w, device="h200")
    assert facts.num_splits == default_plan(w, "h200").num_splits
    assert spy.grids == [facts.grid]


@pytest.mark.parametrize("how", [None, "column"])
def test_a_ragged_batch_is_planned_with_its_lengths(planned, monkeypatch, how):
    """num_splits=None: the planner sees every request's length (read in the launcher's one sync, a strided
    seq_lens honoured), not only the longest; the launch is the plan for that workload and matches the reference."""
    spy = _Spy(gqa._gqa_partial_kernel)
    monkeypatch.setattr(gqa, "_gqa_partial_kernel", spy)
    lens = [300, 0, 120, 45]
    inp = gqa_inputs(4, 4, 2, 16, lens, page_size=16, dtype=torch.float32, seed=2)
    if how:
        inp["seq_lens"] = strided_lens(lens, how)
    _check(inp, torch.float32)
    [w] = planned
    assert (w.seq_lens, w.lengths, w.ctx_len, w.batch) == (tuple(lens), tuple(lens), 300, 4)
    assert spy.grids == [gqa_launch_facts(w, device="h200").grid]


def test_a_uniform_batch_plans_as_its_one_length(planned, monkeypatch):
    """A batch of one length is planned as the workload of that one length without seq_lens."""
    from splitlab.planners import plan

    spy = _Spy(gqa._gqa_partial_kernel)
    monkeypatch.setattr(gqa, "_gqa_partial_kernel", spy)
    inp = gqa_inputs(3, 8, 2, 32, 200, page_size=16, dtype=torch.float16, seed=3)
    _check(inp, torch.float16)
    plain = DecodeWorkload(kind="gqa", batch=3, num_q_heads=8, num_kv_heads=2, head_dim_qk=32, head_dim_v=32,
                           ctx_len=200, page_size=16, dtype="fp16")
    [w] = planned
    assert w.lengths == plain.lengths and plan(w, "h200", "splitlab") == plan(plain, "h200", "splitlab")
    assert spy.grids == [gqa_launch_facts(plain, device="h200").grid]


def test_a_batch_of_empty_requests_is_planned_as_one_key_each(planned):
    inp = gqa_inputs(2, 4, 2, 16, [0, 0], page_size=16, dtype=torch.float32, seed=4)
    out, lse = gqa_decode(**inp, return_lse=True)
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))
    assert [w.lengths for w in planned] == [(1, 1)]


def test_an_explicit_split_count_neither_reads_the_lengths_nor_plans(planned, monkeypatch):
    from splitlab.kernels import _launch

    def no_sync(*args, **kwargs):
        raise AssertionError("check_paged_values read seq_lens on the host")

    monkeypatch.setattr(_launch, "check_paged_values", no_sync)
    inp = gqa_inputs(3, 4, 2, 16, [30, 0, 90], page_size=16, dtype=torch.float32, seed=5)
    _check(inp, torch.float32, num_splits=3, validate=False)
    _check(inp, torch.float32, num_splits=2)  # the default there: no validation, no sync
    assert planned == []


def test_the_one_sync_returns_every_length():
    from splitlab.kernels._launch import check_paged_values

    lens = [30, 0, 90, 7]
    inp = gqa_inputs(4, 4, 2, 16, lens, page_size=16, dtype=torch.float32, seed=6)
    args = (inp["block_table"], strided_lens(lens, "every-other"), inp["k_cache"].shape[0], 16)
    assert check_paged_values(*args, lengths=True) == (0, 90, tuple(lens))
    assert check_paged_values(*args) == (0, 90, None)
    assert check_paged_values(*args, table=False, lengths=True) == (0, 90, tuple(lens))


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


# --- hostile inputs: strides, NaN / inf in a key, out-of-range table and lengths --------------------------------


@pytest.mark.parametrize("how", ["column", "every-other"])
@pytest.mark.parametrize("S", [None, 3])
def test_non_contiguous_seq_lens_are_honoured(how, S):
    """``seq_lens`` as a column of a [B, 2] tensor or ``t[::2]``, the memory beside each length holding 2^30:
    read through its stride, the right number (the kernel reading the neighbours would attend garbage)."""
    lens = [29, 0, 50]
    inp = gqa_inputs(3, 4, 2, 16, lens, page_size=16, dtype=torch.float32, seed=21)
    ref = reference.gqa_decode(**inp, return_lse=True)
    inp["seq_lens"] = strided_lens(lens, how)
    out, lse = gqa_decode(**inp, num_splits=S, block_n=16, return_lse=True)
    assert_matches_reference(out, lse, *ref, torch.float32, [1])


@pytest.mark.parametrize("cache,value,index", [
    ("k_cache", math.nan, (0, 5)),  # a NaN score: every head of kv head 0 attends it -> their rows NaN
    ("v_cache", math.nan, (1, 3)),  # a NaN value: column 3 of kv head 1's heads
    ("k_cache", math.inf, (0, 2)),  # +-inf scores: NaN rows where q[.., 2] > 0, the key ignored where < 0
    ("v_cache", -math.inf, (1, 4)),  # -inf in column 4 of kv head 1's heads
])
@pytest.mark.parametrize("S", [1, 2, 5])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter: inf - inf, 0 * inf
def test_nan_and_inf_in_a_key_reach_the_output(allocs, cache, value, index, S):
    """A non-finite entry in one key of request 0 (key 19 of 200, in one split of several) reaches the output
    exactly where the fp64 reference has it, split or not; request 1 and the other heads stay right. Before the
    merge propagated a NaN lse, a split launch dropped the NaN split and returned attention over the others."""
    inp = gqa_inputs(2, 4, 2, 16, [200, 70], page_size=16, dtype=torch.float32, seed=22)
    set_key_(inp[cache], inp["block_table"], 0, 19, value, *index)
    inp["q"][0, :2, index[1]] = torch.tensor([0.5, -0.5])  # kv head 0's two heads: one of each sign
    ref = reference.gqa_decode(**inp)
    assert not torch.isfinite(ref[0]).all() and torch.isfinite(ref[1]).all()
    assert_same_nonfinite(gqa_decode(**inp, num_splits=S, block_n=16), ref, torch.float32)


@pytest.mark.parametrize("path", ["planned", "validate", "env"])
def test_block_table_entries_out_of_range_are_refused(path, monkeypatch):
    """An entry a request reads outside [0, num_pages) is refused on the planned path (it syncs anyway) and with
    the switch on an explicit num_splits (``validate=True`` or ``SPLITLAB_VALIDATE=1``)."""
    inp = gqa_inputs(3, 4, 2, 16, [30, 50, 7], page_size=16, dtype=torch.float32, seed=23)
    knobs = {"planned": {}, "validate": dict(num_splits=2, validate=True), "env": dict(num_splits=2)}[path]
    if path == "env":
        monkeypatch.setenv(VALIDATE_ENV, "1")
    for bad_page in (inp["k_cache"].shape[0], 10**6, -1):
        inp["block_table"][1, 3] = bad_page  # request 1's last page (50 keys: 4 pages of 16)
        with pytest.raises(SplitlabError, match=rf"^block_table\[1, 3\] = {bad_page} is outside \[0, num_pages"):
            gqa_decode(**inp, **knobs)


def test_unvalidated_bad_entries_are_never_read_and_give_nan():
    """Without validation (explicit num_splits, the default there) a page out of range is never dereferenced:
    the request that reads it comes out NaN (not a finite wrong number, not a crash), the others right. An entry
    a request does not read may hold anything, on every path."""
    inp = gqa_inputs(3, 4, 2, 16, [30, 50, 7], page_size=16, dtype=torch.float32, seed=24)
    ref = reference.gqa_decode(**inp)
    inp["block_table"][2, 1:] = -(10**6)  # past request 2's one page: never read, accepted everywhere
    for knobs in ({}, dict(num_splits=2, validate=True)):
        assert rel_err(gqa_decode(**inp, **knobs), ref) <= TOLERANCE[torch.float32]
    inp["block_table"][1, 2] = 10**6
    for S in (1, 2):
        out = gqa_decode(**inp, num_splits=S, block_n=16)
        assert torch.isnan(out[1]).all()
        assert rel_err(out[[0, 2]], ref[[0, 2]]) <= TOLERANCE[torch.float32]


def test_lengths_past_the_table_are_refused_or_nan(monkeypatch):
    """A length beyond the block table (or negative) with an explicit num_splits: refused with the switch, and
    without it the request is NaN (it used to attend memory past the table: rel err 3.5e15)."""
    inp = gqa_inputs(3, 4, 2, 16, [30, 50, 7], page_size=16, dtype=torch.float32, seed=25)
    ref = reference.gqa_decode(**inp)
    for bad_len in (4 * 16 + 1, 10**9, -3):
        x = dict(inp, seq_lens=inp["seq_lens"].clone())
        x["seq_lens"][0] = bad_len
        with pytest.raises(SplitlabError, match=r"^seq_lens has values in"):
            gqa_decode(**x, num_splits=2, validate=True)
        out = gqa_decode(**x, num_splits=2)
        assert torch.isnan(out[0]).all() and rel_err(out[1:], ref[1:]) <= TOLERANCE[torch.float32]
    monkeypatch.setenv(VALIDATE_ENV, "0")  # off everywhere: the planned path still checks the lengths it reads
    with pytest.raises(SplitlabError, match=r"^seq_lens has values in"):
        gqa_decode(**x)
    x["seq_lens"][0] = 30
    x["block_table"][0, 0] = 10**6
    assert torch.isnan(gqa_decode(**x)[0]).all()  # the table is not checked: the kernel gives NaN


def test_the_switch_refuses_bad_values(monkeypatch):
    inp = gqa_inputs(1, 2, 1, 16, [9], dtype=torch.float32)
    with pytest.raises(SplitlabError, match=r"^validate='yes' is not allowed"):
        gqa_decode(**inp, num_splits=1, validate="yes")
    monkeypatch.setenv(VALIDATE_ENV, "true")
    with pytest.raises(SplitlabError, match=rf"^{VALIDATE_ENV}='true' is not allowed"):
        gqa_decode(**inp, num_splits=1)
    assert gqa_decode(**inp, num_splits=1, validate=False).shape == (1, 2, 16)  # the argument wins


def test_layouts_the_kernel_cannot_address_are_refused(monkeypatch):
    """A dimension the kernel indexes in 32 bits spanning 2^31 elements or more is refused before any launch
    (meta tensors: no memory; the device check is lifted for them)."""
    from splitlab.kernels import _launch

    monkeypatch.setattr(_launch, "check_launch_device", lambda *a: None)
    meta = dict(device="meta", dtype=torch.float32)
    inp = dict(q=torch.empty_strided((2, 4, 16), (1, 2**30, 4), **meta),  # heads 2^30 apart: 3 * 2^30 >= 2^31
               k_cache=torch.empty(3, 16, 2, 16, **meta), v_cache=torch.empty(3, 16, 2, 16, **meta),
               block_table=torch.empty(2, 1, dtype=torch.int32, device="meta"),
               seq_lens=torch.empty(2, dtype=torch.int32, device="meta"))
    with pytest.raises(SplitlabError, match=r"^q has shape \(2, 4, 16\) and strides .* dimension 1 spans"):
        gqa_decode(**inp, num_splits=1)
