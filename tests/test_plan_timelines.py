"""A plan's ``run(..., timelines=t)`` (``kernels.decode_plan``), under Triton's interpreter: the records are the
work-list launchers' for the plan's schedule (one per program that ran, the merge's too; SM and clock absent here),
the results bit for bit the plain run's, a capacity grid's slots past the plan's count leave no record (stale ones
of an earlier, larger plan included: the buffers are refilled on the device), the buffers are allocated once and
reused, and what cannot work is refused in one line (anything but a ``Timelines``; a capture before the buffers
exist)."""

from __future__ import annotations

import pytest
import torch
from sm90 import WORKLIST

from splitlab.errors import SplitlabError
from splitlab.kernels import _launch, timeline
from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan
from splitlab.kernels.inputs import gqa_inputs, mla_inputs
from splitlab.kernels.worklist import WorkList, gqa_decode_scheduled, mla_decode_scheduled

LENS = [130, 0, 17, 64]


def gqa_args(lens, seed=0):
    x = gqa_inputs(len(lens), 6, 2, 32, lens, page_size=16, dtype=torch.float32, seed=seed)
    return x["q"], x["k_cache"], x["v_cache"], x["block_table"]


def one_line(e) -> None:
    assert "\n" not in str(e.value), str(e.value)


def poisoned(like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, float("nan"))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_gqa_plan_records_the_launchers_records_and_leaves_results_bit_identical(graph):
    p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="uniform", num_splits=3,
                      use_cuda_graph=graph, max_batch=4, max_ctas=24, max_items=24)
    s = p.plan(LENS)
    assert s.partial_rows > 0
    args = gqa_args(LENS)
    plain_out, plain_lse = p.run(*args, return_lse=True)
    t = timeline.Timelines()
    out, lse = p.run(*args, out=poisoned(plain_out), lse=poisoned(plain_lse), return_lse=True, timelines=t)
    assert torch.equal(out, plain_out) and torch.equal(lse, plain_lse)
    recs = t.read()
    _, want = timeline.record(lambda tt: gqa_decode_scheduled(*args, WorkList.from_schedule(s, "cpu"),
                                                               timelines=tt))
    # The capacity grid's slots past the count exit unrecorded: the records are the exact grid's, in order.
    assert recs["partial"] == want["partial"] and len(recs["partial"]) == s.ctas * 2
    assert recs["merge"] == want["merge"] and recs["merge"]
    assert all(r["sm"] == r["start_ns"] == r["end_ns"] == timeline.ABSENT for k in recs for r in recs[k])
    if graph:
        assert t.buffers["partial"].shape[0] == 24 * 2  # the capacity's programs: one buffer for every plan


def test_a_smaller_plan_leaves_no_stale_record_and_reuses_the_buffers():
    """Plan A (more slots, a merge) then plan B (fewer slots, no partial rows) on one capacity plan and one
    ``Timelines``: B's records only, in the same buffers."""
    p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="uniform", num_splits=4,
                      use_cuda_graph=True, max_batch=4, max_ctas=16, max_items=16)
    a, b = [700, 300, 2, 0], [64, 5, 0, 0]
    t = timeline.Timelines()
    sa = p.plan(a)
    p.run(*gqa_args(a), timelines=t)
    ptrs = {k: v.data_ptr() for k, v in t.buffers.items()}
    assert len(t.read()["partial"]) == sa.ctas * 2 and t.read()["merge"]
    sb = p.plan(b)
    assert sb.ctas < sa.ctas and sb.partial_rows == 0
    p.run(*gqa_args(b), timelines=t)
    recs = t.read()
    assert [r["program"] for r in recs["partial"]] == list(range(sb.ctas * 2))
    assert all(r["items"] == 0 for r in recs["merge"])  # the graph's merge runs whatever: no request had rows
    assert {k: v.data_ptr() for k, v in t.buffers.items()} == ptrs


def test_an_eager_plan_without_a_merge_drops_the_merge_records_of_the_run_before():
    p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="uniform", num_splits=4,
                      max_ctas=16, max_items=16)
    t = timeline.Timelines()
    p.plan([700, 300, 2, 0])
    p.run(*gqa_args([700, 300, 2, 0]), timelines=t)
    assert t.read()["merge"]
    sb = p.plan([64, 5, 0, 0])
    assert sb.partial_rows == 0  # no merge launched
    p.run(*gqa_args([64, 5, 0, 0]), timelines=t)
    recs = t.read()
    assert "merge" not in recs and [r["program"] for r in recs["partial"]] == list(range(sb.ctas * 2))


def test_mla_plan_records_the_launchers_records():
    lens = [90, 0, 33]
    x = mla_inputs(3, 16, 96, lens, page_size=64, dtype=torch.float32, seed=3)
    args = (x["q"], x["kv_cache"], x["block_table"])
    p = MLADecodePlan(16, 96, 64, 64, dtype=torch.float32, device="cpu", scheduler="uniform", num_splits=2,
                      max_ctas=16, max_items=16)
    s = p.plan(lens)
    plain = p.run(*args)
    t = timeline.Timelines()
    assert torch.equal(p.run(*args, timelines=t), plain)
    _, want = timeline.record(lambda tt: mla_decode_scheduled(*args, WorkList.from_schedule(s, "cpu"),
                                                               head_dim_v=64, timelines=tt))
    assert t.read() == want and len(want["partial"]) == s.ctas


def test_what_cannot_work_is_refused_in_one_line(monkeypatch):
    args = gqa_args(LENS)
    for graph in (False, True):
        p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", use_cuda_graph=graph, max_batch=4,
                          max_ctas=16, max_items=16)
        p.plan(LENS)
        with pytest.raises(SplitlabError, match=r"GQADecodePlan\.run: timelines=dict is not allowed; expected a "
                           r"kernels\.timeline\.Timelines") as e:
            p.run(*args, timelines={})
        one_line(e)
    # A capture (emulated: the stream says it is capturing) before the buffers exist is refused; after one run
    # with the same Timelines outside the capture, the captured run goes on with the same buffers.
    t = timeline.Timelines()
    monkeypatch.setattr(_launch, "capturing", lambda q: True)
    with pytest.raises(SplitlabError, match="no buffers for this plan's launches while a CUDA graph is captured") \
            as e:
        p.run(*args, timelines=t)
    one_line(e)
    assert t.buffers == {}
    monkeypatch.setattr(_launch, "capturing", lambda q: False)
    p.run(*args, timelines=t)
    ptrs = {k: v.data_ptr() for k, v in t.buffers.items()}
    monkeypatch.setattr(_launch, "capturing", lambda q: True)
    p.run(*args, timelines=t)
    assert {k: v.data_ptr() for k, v in t.buffers.items()} == ptrs


COMPILE = WORKLIST + r"""
from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan

kw = dict(dtype=torch.bfloat16, device="cpu", scheduler="uniform", num_splits=4, use_cuda_graph=True, max_batch=2,
          max_ctas=16, max_items=16)
gp, mp = GQADecodePlan(32, 8, 128, 16, **kw), MLADecodePlan(16, 576, 512, 64, **kw)
gp.plan(lens)
mp.plan(lens)
for name, launch in (
    ("gqa", lambda: gp.run(x["q"], x["k_cache"], x["v_cache"], x["block_table"], check=False,
                           timelines=timeline.Timelines())),
    ("mla", lambda: mp.run(m["q"], m["kv_cache"], m["block_table"], check=False, timelines=timeline.Timelines())),
):
    n0 = len(compiled)
    launch()
    for kernel, k in zip(("partial", "merge"), compiled[n0:n0 + 2], strict=True):
        ptx = k.asm["ptx"]
        assert ptx.count("%globaltimer") >= 2 and "%smid" in ptx, (name, kernel)
        print(f"ok {name} {kernel}")
"""


def test_a_plans_instrumented_capacity_kernels_compile_for_sm90_and_read_the_clock():
    """The BOUNDED (capacity-grid) work-list kernels with the timeline on, as a plan's run launches them, compile for
    sm_90 and read ``%globaltimer`` and ``%smid`` (tests/sm90.py's stand-in driver: no GPU, nothing launched)."""
    from sm90 import compile_in_child

    r = compile_in_child(COMPILE)
    assert r.stdout.count("ok ") == 4, r.stdout
