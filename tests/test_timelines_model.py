"""Modelled timelines (``planners.timeline``): the cost model's schedule of a launch, program by program, whose
makespan is ``schedulers.modelled_time``'s launch where the two models coincide (below SCHEDULE_WAVES waves)."""

from __future__ import annotations

import pytest

from splitlab import devices
from splitlab.planners import schedulers as S
from splitlab.planners import splitlab as rule
from splitlab.planners.timeline import modelled_timeline
from splitlab.workloads import DecodeWorkload

DEV = devices.get("h200")


def _workloads():
    yield DecodeWorkload("gqa", 16, 32, 8, 128, 128, 8192, page_size=16, length_dist="longtail", length_seed=3)
    yield DecodeWorkload("gqa", 8, 128, 1, 128, 128, 32768, page_size=16, length_dist="spread16", length_seed=4)
    yield DecodeWorkload("mla", 16, 16, 1, 576, 512, 8192, page_size=64, length_dist="longtail", length_seed=5)
    yield DecodeWorkload("mla", 4, 128, 1, 576, 512, 4096, page_size=64)


def _schedules(w):
    c = rule.constants_for(DEV, w.kind).constants
    lens = list(w.lengths)
    yield S.splitlab(w, DEV)
    yield S.uniform(lens, 4, request_major=rule.REQUEST_MAJOR[w.kind])
    yield S.balanced(lens, S.slots_per_group(w, DEV, c))
    yield S.stream_k(lens, S.slots_per_group(w, DEV, c))  # persistent: several items a slot


@pytest.mark.parametrize("w", list(_workloads()), ids=lambda w: f"{w.kind}-{w.num_q_heads}-{w.batch}")
def test_makespan_is_modelled_times_launch(w):
    c = rule.constants_for(DEV, w.kind).constants
    h = S.head_groups(w)
    for s in _schedules(w):
        assert s.ctas * h < rule.SCHEDULE_WAVES * DEV.sm_count  # the scheduled regime, not the closed form
        m = modelled_timeline(s, w, DEV)
        assert m.total == pytest.approx(S.modelled_time(s, w, DEV.sm_count, c, DEV.arch), rel=1e-12)
        busy = [i for i in range(s.ctas) if s.cta_offsets[i + 1] > s.cta_offsets[i]]
        assert sorted(p.program for p in m.programs) == sorted(b * h + g for b in busy for g in range(h))
        assert m.launch == max(p.end for p in m.programs)
        by_place: dict[int, list] = {}
        for p in m.programs:
            assert p.sm == p.place % DEV.sm_count and 0 <= p.start < p.end
            assert (p.slot, p.group) == divmod(p.program, h)
            by_place.setdefault(p.place, []).append((p.start, p.end))
        for spans in by_place.values():  # a place runs one program at a time
            spans.sort()
            assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:], strict=False))


def test_issue_order_and_scaling():
    w = DecodeWorkload("gqa", 4, 32, 8, 128, 128, 2048, page_size=16)
    s = S.uniform(list(w.lengths), 2)
    m = modelled_timeline(s, w, DEV)
    # one wave: every program starts at 0, each on its own place, in issue order
    assert [p.place for p in m.programs] == list(range(len(m.programs)))
    assert all(p.start == 0 for p in m.programs)
    u = m.scaled(100.0)
    assert u.units == "us" and u.total == pytest.approx(100.0)
    assert [p.end / q.end for p, q in zip(u.programs, m.programs, strict=True)] == pytest.approx(
        [100.0 / m.total] * len(m.programs))


def test_a_later_program_waits_for_a_place():
    # more programs than places: the first ones to end hand their places to the next in issue order
    w = DecodeWorkload("mla", 64, 128, 1, 576, 512, 8192, page_size=64, length_dist="longtail", length_seed=9)
    s = S.uniform(list(w.lengths), 4, request_major=True)
    m = modelled_timeline(s, w, DEV)
    c = rule.constants_for(DEV, "mla").constants
    slots = DEV.sm_count * S.ctas_per_sm(w, c)
    late = [p for p in m.programs if p.start > 0]
    assert len(m.programs) > slots and len(late) == len(m.programs) - slots
    ended = sorted(p.end for p in m.programs)
    assert min(p.start for p in late) == pytest.approx(ended[0])
