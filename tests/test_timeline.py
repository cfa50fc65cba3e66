"""Per-program timelines of the work-list kernels (``kernels.timeline``) under Triton's interpreter: one record per
program, the slot, head group and items each ran, the SM and clock marked absent (no inline PTX here), the results
bit for bit those of the plain launch, and the plain launch given no timeline argument at all. The sm_90a build's
clock reads: ``test_compile_sm90.py``'s ``test_timeline_kernels_read_the_clock``."""

from __future__ import annotations

import pytest
import torch

from splitlab.errors import SplitlabError
from splitlab.kernels import timeline, workitems, worklist
from splitlab.kernels.inputs import gqa_inputs, mla_inputs
from splitlab.kernels.worklist import WorkList, gqa_decode_scheduled, mla_decode_scheduled
from splitlab.planners import schedulers as S

TIMELINE_ARGS = {"timeline_ptr", "TIMELINE", "CLOCK"}


def _check_partial(recs: list[dict], s, groups: int) -> None:
    assert [r["program"] for r in recs] == list(range(s.ctas * groups))  # one record a program, in order
    for r in recs:
        assert (r["slot"], r["group"]) == divmod(r["program"], groups)
        first, end = s.cta_offsets[r["slot"]], s.cta_offsets[r["slot"] + 1]
        if s.persistent:
            assert (r["item"], r["items"]) == (first, end - first)
        else:
            assert (r["item"], r["items"]) == (r["slot"], 1)
        assert r["sm"] == r["start_ns"] == r["end_ns"] == timeline.ABSENT  # no clock under the interpreter


def _check_merge(recs: list[dict], s, heads: int) -> None:
    if s.partial_rows == 0:
        assert recs == []  # no merge launched
        return
    blocks = len(recs) // (s.batch * heads)
    assert blocks >= 1 and [r["program"] for r in recs] == list(range(s.batch * heads * blocks))
    for r in recs:
        pid0, block = divmod(r["program"], blocks)
        assert (r["slot"], r["group"], r["item"]) == (pid0 // heads, pid0 % heads, block)
        n = s.partials[r["slot"]]
        assert r["items"] == (n if n > 1 else 0)


@pytest.mark.parametrize("persistent", [False, True])
def test_gqa_records_one_per_program_and_leaves_results_bit_identical(persistent):
    lens = [130, 0, 17, 70]
    x = gqa_inputs(4, 6, 2, 16, lens, page_size=16, dtype=torch.float32, seed=11)
    s = S.stream_k(lens, 3) if persistent else S.uniform(lens, 3)
    work = WorkList.from_schedule(s, "cpu")
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_table"], work)
    plain, plain_lse = gqa_decode_scheduled(*args, return_lse=True)
    (out, lse), recs = timeline.record(lambda t: gqa_decode_scheduled(*args, return_lse=True, timelines=t))
    assert torch.equal(out, plain) and torch.equal(lse, plain_lse)
    _check_partial(recs["partial"], s, groups=2)
    _check_merge(recs.get("merge", []), s, heads=6)
    assert s.partial_rows > 0  # the merge was exercised


def test_mla_records_one_per_program_and_leaves_results_bit_identical():
    lens = [150, 0, 64]
    x = mla_inputs(3, 16, 96, lens, page_size=64, dtype=torch.float32, seed=3)
    s = S.uniform(lens, 2, request_major=True)
    work = WorkList.from_schedule(s, "cpu")
    args = (x["q"], x["kv_cache"], x["block_table"], work)
    plain = mla_decode_scheduled(*args, head_dim_v=64)
    out, recs = timeline.record(lambda t: mla_decode_scheduled(*args, head_dim_v=64, timelines=t))
    assert torch.equal(out, plain)
    _check_partial(recs["partial"], s, groups=1)
    _check_merge(recs["merge"], s, heads=16)


class _Spy:
    """A jitted kernel whose launches record their keyword arguments, then run."""

    def __init__(self, kernel, seen: list):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        def run(*a, **kw):
            self.seen.append(set(kw))
            return self.kernel[grid](*a, **kw)
        return run


def _spied_launch(monkeypatch) -> tuple[list, tuple]:
    """The partial kernel and the merge spied on (``seen``: each launch's keyword names) and the arguments of a
    two-request GQA work-list launch that runs both."""
    seen: list = []
    for mod, name in ((worklist, "_gqa_worklist_kernel"), (workitems, "_merge_kernel")):
        monkeypatch.setattr(mod, name, _Spy(getattr(mod, name), seen))
    lens = [100, 40]
    x = gqa_inputs(2, 4, 2, 16, lens, page_size=16, dtype=torch.float32, seed=2)
    return seen, (x["q"], x["k_cache"], x["v_cache"], x["block_table"], WorkList.from_schedule(S.uniform(lens, 2),
                                                                                              "cpu"))


def test_the_plain_launch_passes_no_timeline_argument(monkeypatch):
    seen, args = _spied_launch(monkeypatch)
    gqa_decode_scheduled(*args)
    assert len(seen) == 2 and all(not (kw & TIMELINE_ARGS) for kw in seen)
    seen.clear()
    timeline.record(lambda t: gqa_decode_scheduled(*args, timelines=t))
    assert len(seen) == 2 and all(TIMELINE_ARGS <= kw for kw in seen)


def test_a_buffer_is_reused_and_unwritten_records_are_dropped():
    t = timeline.Timelines()
    a = t.args("partial", 5, torch.device("cpu"))
    assert a["CLOCK"] is False and a["TIMELINE"] is True  # the CPU has no clock to read
    assert t.args("partial", 5, torch.device("cpu"))["timeline_ptr"] is a["timeline_ptr"]
    buf = a["timeline_ptr"]
    buf[2] = torch.arange(len(timeline.FIELDS)) + 2
    assert timeline.read(buf) == [dict(zip(timeline.FIELDS, range(2, 2 + len(timeline.FIELDS)), strict=True))]
    t.reset()
    assert timeline.read(buf) == []
    with pytest.raises(SplitlabError, match="kernel='combine' is not allowed; expected one of partial, merge"):
        t.args("combine", 1, torch.device("cpu"))


def test_anything_but_timelines_is_refused_in_one_line():
    lens = [40]
    x = gqa_inputs(1, 2, 1, 16, lens, page_size=16, dtype=torch.float32)
    work = WorkList.from_schedule(S.uniform(lens, 1), "cpu")
    with pytest.raises(SplitlabError, match=r"timelines=dict is not allowed; expected a kernels\.timeline"):
        gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work, timelines={})


def test_a_timelines_of_one_kernel_records_that_kernel_alone(monkeypatch):
    seen, args = _spied_launch(monkeypatch)
    plain = gqa_decode_scheduled(*args)
    for only in ("partial", "merge"):
        seen.clear()
        t = timeline.Timelines(kernels=(only,))
        assert torch.equal(gqa_decode_scheduled(*args, timelines=t), plain)
        assert [bool(kw & TIMELINE_ARGS) for kw in seen] == [only == "partial", only == "merge"]
        assert set(t.read()) == {only} and len(t.read()[only]) > 0
        other = "merge" if only == "partial" else "partial"
        assert t.ready(other, 7, "cpu") and t.args(other, 7, torch.device("cpu")) == {}
    with pytest.raises(SplitlabError, match=r"kernels=\('combine',\) is not allowed; expected one or more of"):
        timeline.Timelines(kernels=("combine",))


@pytest.mark.parametrize("persistent", [False, True])
def test_a_held_start_gives_the_same_records_and_results(persistent):
    """``Timelines(hold_start=True)`` builds (``TIMELINE = HOLD_START``: the start time stored at the end) write the
    records the default builds write, partial kernel and merge, GQA and MLA, and leave the results bit-identical."""
    lens = [130, 0, 17, 70]
    x = gqa_inputs(4, 6, 2, 16, lens, page_size=16, dtype=torch.float32, seed=11)
    s = S.stream_k(lens, 3) if persistent else S.uniform(lens, 3)
    work = WorkList.from_schedule(s, "cpu")
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_table"], work)
    m = mla_inputs(4, 16, 96, lens, page_size=64, dtype=torch.float32, seed=3)
    margs = (m["q"], m["kv_cache"], m["block_table"], work)
    for launch in (lambda t: gqa_decode_scheduled(*args, timelines=t),
                   lambda t: mla_decode_scheduled(*margs, head_dim_v=64, timelines=t)):
        t, held = timeline.Timelines(), timeline.Timelines(hold_start=True)
        assert held.args("partial", 3, torch.device("cpu"))["TIMELINE"] == timeline.HOLD_START
        assert torch.equal(launch(t), launch(held))
        for buf in held.buffers.values():  # every field written again by the second launch, the start too
            buf.fill_(7)
        assert torch.equal(launch(held), launch(t))
        assert t.read() == held.read() and t.read()["partial"] and t.read()["merge"]
        assert all(r["start_ns"] == timeline.ABSENT for k in ("partial", "merge") for r in held.read()[k])
