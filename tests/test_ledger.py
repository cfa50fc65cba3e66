"""The gap ledger (``splitlab.ledger``) on synthetic timelines whose every part is known by construction, the sum
identity, the peer form, and the cost model's error per program."""

from __future__ import annotations

import pytest

from splitlab import devices, ledger
from splitlab.errors import SplitlabError
from splitlab.planners import schedulers as S
from splitlab.planners.timeline import modelled_timeline
from splitlab.workloads import DecodeWorkload

T0 = 5_000_000  # ns: the clock's origin is arbitrary


def rec(program, sm, a_us, b_us):
    return dict(program=program, sm=sm, start_ns=T0 + round(a_us * 1e3), end_ns=T0 + round(b_us * 1e3), slot=program,
                group=0, item=program, items=1)


# 4 SMs: SM 0 and 1 busy 0-10 us (SM 0 by two overlapping programs), SM 2 0-5 us, SM 3 nothing; merge 12-14 us.
PARTIAL = [rec(0, 0, 0, 6), rec(1, 0, 4, 10), rec(2, 1, 0, 10), rec(3, 2, 0, 5)]
MERGE = [rec(0, 1, 12, 13), rec(1, 3, 12.5, 14)]
KW = dict(wall_us=20.0, floor_us=4.0, sm_count=4, bandwidth_gbps=1000.0, partial_bytes=5e6)  # 5e6 B: 5 us at peak


def test_each_part_is_what_the_synthetic_timeline_holds():
    led = ledger.ledger(PARTIAL, MERGE, **KW)
    busy = (10 + 10 + 5 + 0) / 4  # mean busy SM-time, us
    want = dict(launch=20 - 10 - 2, idle=10 - busy, merge=2.0, below_peak=busy - 5, extra_bytes=5 - 4.0,
                unexplained=0.0)
    assert list(led.parts) == list(ledger.PARTS)
    assert led.parts == pytest.approx(want, abs=1e-9)
    assert sum(led.parts.values()) == pytest.approx(led.gap_us) and led.gap_us == 16.0


def test_an_anchor_separates_the_launch_from_what_follows_the_last_program():
    led = ledger.ledger(PARTIAL, MERGE, **KW, anchor_ns=T0 - 3000)  # marker ended 3 us before the first program
    assert led.parts["launch"] == pytest.approx(3 + 2)  # before the first program, and between the kernels
    assert led.parts["unexplained"] == pytest.approx(20 - (14 + 3))  # the wall after the last program ends
    assert sum(led.parts.values()) == pytest.approx(16.0)


def test_no_merge_and_perfect_streaming():
    full = [rec(i, i, 0, 8) for i in range(4)]
    led = ledger.ledger(full, [], wall_us=10.0, floor_us=8.0, sm_count=4, bandwidth_gbps=1000.0, partial_bytes=8e6)
    assert led.parts == pytest.approx(dict(launch=2.0, idle=0.0, merge=0.0, below_peak=0.0, extra_bytes=0.0,
                                           unexplained=0.0), abs=1e-12)


def test_busy_time_is_the_union_per_sm():
    assert ledger.busy_ns([(0, 0, 10), (0, 5, 20), (0, 30, 31), (1, 2, 3)]) == {0: 21, 1: 1}


def test_unmeasured_records_are_refused():
    absent = [dict(rec(0, 0, 0, 1), sm=-1, start_ns=-1, end_ns=-1)]
    with pytest.raises(SplitlabError, match="expected a measured timeline"):
        ledger.ledger(absent, [], **KW)
    with pytest.raises(SplitlabError, match="the device has 4"):
        ledger.ledger([rec(0, 7, 0, 1)], [], **KW)
    with pytest.raises(SplitlabError, match="no partial-kernel records"):
        ledger.ledger([], MERGE, **KW)


def test_the_peer_ledger_models_waves_and_sums():
    led = ledger.peer_ledger(wall_us=50.0, floor_us=20.0, programs=300, slots=264, launch_us=5.0)
    assert led.parts["idle"] == pytest.approx(45 * (1 - 300 / 528))
    assert led.modelled == ("launch", "idle") and list(led.parts) == list(ledger.PEER_PARTS)
    assert sum(led.parts.values()) == pytest.approx(30.0)
    one_wave = ledger.peer_ledger(wall_us=50.0, floor_us=20.0, programs=264, slots=264, launch_us=5.0)
    assert one_wave.parts["idle"] == 0.0


def test_a_broken_ledger_is_caught():
    with pytest.raises(SplitlabError, match="expected the gap"):
        ledger.Ledger(10.0, 4.0, dict(launch=1.0, idle=1.0)).check()


def test_model_error_per_program():
    dev = devices.get("h200")
    w = DecodeWorkload("gqa", 4, 32, 8, 128, 128, 2048, page_size=16)
    s = S.uniform(list(w.lengths), 2)
    m = modelled_timeline(s, w, dev)
    # a "measurement" that is the model itself at 2 ns a unit: every program's error is 0
    recs = [dict(program=p.program, sm=p.sm, start_ns=T0 + round(p.start * 2000), end_ns=T0 + round(p.end * 2000))
            for p in m.programs]
    errs = ledger.program_errors(m, recs)
    assert len(errs) == len(m.programs)
    assert max(abs(e["rel_err"]) for e in errs) < 1e-3
    slow = [dict(r, end_ns=r["start_ns"] + 2 * (r["end_ns"] - r["start_ns"])) if r["program"] == 0 else r
            for r in recs]
    # program 0 ran twice as long: the measured span doubles, so the model (scaled to the span) has it right and
    # every other program twice too long
    e = ledger.program_errors(m, slow)
    assert abs(e[0]["rel_err"]) < 1e-3 and all(x["rel_err"] == pytest.approx(1.0, abs=1e-3) for x in e[1:])
