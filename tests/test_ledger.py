"""The gap ledger (``splitlab.ledger``) on synthetic timelines whose every part is known by construction, the sum
identity, the recording and replay parts, a merge under PDL, a launch that would go negative, the replay cost's
source, the peer form, and the cost model's error per program."""

from __future__ import annotations

import csv
from pathlib import Path

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
                recording=0.0, replay=0.0, unexplained=0.0)
    assert list(led.parts) == list(ledger.PARTS)
    assert led.parts == pytest.approx(want, abs=1e-9)
    assert sum(led.parts.values()) == pytest.approx(led.gap_us) and led.gap_us == 16.0
    # without an anchor the time after the last program is in launch; without the timings, no recording or replay
    assert led.unmeasured == ("recording", "replay", "unexplained")
    assert led.row()["unmeasured"] == "recording,replay,unexplained"


def test_an_anchor_separates_the_launch_from_what_follows_the_last_program():
    led = ledger.ledger(PARTIAL, MERGE, **KW, anchor_ns=T0 - 3000)  # marker ended 3 us before the first program
    assert led.parts["launch"] == pytest.approx(3 + 2)  # before the first program, and between the kernels
    assert led.parts["unexplained"] == pytest.approx(20 - (14 + 3))  # the wall after the last program ends
    assert sum(led.parts.values()) == pytest.approx(16.0)
    assert led.unmeasured == ("recording", "replay")


def test_recording_carries_the_instrumented_wall_to_the_plain_one():
    """The records are the instrumented build's: the parts explain its wall T (here 18 us: 1 us after the last
    program), and ``recording`` = W - T takes them to the plain wall W."""
    for wall in (20.0, 16.5):  # the plain build slower, and faster, than the instrumented one
        led = ledger.ledger(PARTIAL, MERGE, **dict(KW, wall_us=wall), anchor_ns=T0 - 3000, timed_us=18.0)
        assert led.parts["recording"] == pytest.approx(wall - 18.0)
        assert led.parts["unexplained"] == pytest.approx(18 - (14 + 3))
        assert led.parts["launch"] == pytest.approx(5.0) and led.gap_us == pytest.approx(wall - 4.0)
        assert "recording" not in led.unmeasured


def test_replay_is_the_graph_replays_fixed_cost_over_its_calls():
    """``time_graph`` divides a replay by its n calls: each carries c / n of the replay's own start and end,
    which was in ``unexplained`` and is now its part."""
    plain = ledger.ledger(PARTIAL, MERGE, **KW, anchor_ns=T0 - 3000, timed_us=20.0)
    led = ledger.ledger(PARTIAL, MERGE, **KW, anchor_ns=T0 - 3000, timed_us=20.0, sets=4, replay_cost_us=6.0)
    assert led.parts["replay"] == pytest.approx(1.5) == ledger.replay_share(6.0, 4)
    assert led.parts["unexplained"] == pytest.approx(plain.parts["unexplained"] - 1.5) == pytest.approx(1.5)
    assert led.unmeasured == () and led.check()
    half = ledger.ledger(PARTIAL, MERGE, **KW, anchor_ns=T0 - 3000, sets=4)  # no cost given: 0, labelled
    assert half.parts["replay"] == 0.0 and half.unmeasured == ("recording", "replay")
    # without an anchor the replay's share is taken out of the launch, not left in it
    no_anchor = ledger.ledger(PARTIAL, MERGE, **KW, timed_us=20.0, sets=4, replay_cost_us=6.0)
    assert no_anchor.parts["launch"] == pytest.approx(8 - 1.5) and no_anchor.parts["unexplained"] == 0.0


def test_the_replay_cost_from_few_and_many_calls():
    t = lambda k: 3.0 + 5.9 / k  # noqa: E731  (a call of 3 us, a replay's fixed cost of 5.9 us)
    assert ledger.replay_cost(t(1), t(64)) == pytest.approx(5.9)
    assert ledger.replay_cost(t(3), t(24), few=3, many=24) == pytest.approx(5.9)
    with pytest.raises(SplitlabError, match="few < many"):
        ledger.replay_cost(1.0, 2.0, few=8, many=8)


def test_the_replay_cost_constant_is_the_timer_checks_median():
    """``REPLAY_COST_US`` is defined once, from the H200's timer check (docs/history.md, "The graph timer,
    checked"): two estimates a row (with and without a spin kernel ahead), K sets against 8K."""
    path = Path(__file__).resolve().parents[1] / "data" / "archive" / "bench" / "h200-kernel-v6" / "timer_check.csv"
    rows = list(csv.DictReader(path.open()))
    costs = ledger.timer_check_costs(rows)
    assert len(costs) == 2 * len(rows) == 8
    assert round(ledger.timer_check_median(rows), 1) == ledger.REPLAY_COST_US == 5.9
    assert 2.5 < min(costs) and max(costs) < 8.0


def test_a_merge_under_pdl_is_counted_after_the_partial_kernel_only():
    """With programmatic dependent launch the merge's programs start (and record it) while the partial kernel still
    runs, then wait: the merge part is its time after the partial kernel's last program, not twice the overlap."""
    early = [rec(0, 1, 8, 13), rec(1, 3, 9, 14)]  # started at 8-9 us; the partial kernel ends at 10
    led = ledger.ledger(PARTIAL, early, **KW, anchor_ns=T0 - 3000)
    assert led.parts["merge"] == pytest.approx(14 - 10)
    assert led.parts["launch"] == pytest.approx(3.0)  # no gap between the kernels
    assert led.parts["unexplained"] == pytest.approx(20 - (14 + 3))  # the same wall after the last program
    no_anchor = ledger.ledger(PARTIAL, early, **KW)
    assert no_anchor.parts["launch"] == pytest.approx(20 - 14) and no_anchor.parts["unexplained"] == 0.0


def test_a_launch_below_zero_is_left_unexplained_not_hidden():
    """Without an anchor the launch is the wall outside the programs; where the programs outlast the wall (here the
    timed wall 12 us, the programs 14 us) it would go negative and force ``unexplained`` to 0. The wait is 0
    instead, the gap between the kernels (2 us) stays the launch's, and the 2 us excess is unexplained."""
    led = ledger.ledger(PARTIAL, MERGE, **dict(KW, wall_us=12.0))
    assert led.parts["launch"] == pytest.approx(2.0)
    assert led.parts["unexplained"] == pytest.approx(12 - 14)
    assert "unexplained" not in led.unmeasured and led.gap_us == pytest.approx(8.0)
    # a marker that read the clock after the first program started: no wait, the wall counted from that program
    late = ledger.ledger(PARTIAL, MERGE, **KW, anchor_ns=T0 + 1000)
    assert late.parts["launch"] == pytest.approx(2.0) and late.parts["unexplained"] == pytest.approx(20 - 14)


def test_the_ledger_from_stored_parts_is_the_ledger():
    """``ledger_from_parts``: a points table's timeline parts (records not kept) give the ledger the records do."""
    timings = dict(wall_us=21.0, floor_us=4.0, timed_us=20.0, sets=3, replay_cost_us=6.0)
    full = ledger.ledger(PARTIAL, MERGE, sm_count=4, bandwidth_gbps=1000.0, partial_bytes=5e6, anchor_ns=T0 - 3000,
                         **timings)
    again = ledger.ledger_from_parts({k: full.parts[k] for k in ledger.TIMELINE_PARTS}, **timings)
    assert again == full
    with pytest.raises(SplitlabError, match="no idle"):
        ledger.ledger_from_parts(dict(launch=1.0), **timings)


def test_no_merge_and_perfect_streaming():
    full = [rec(i, i, 0, 8) for i in range(4)]
    led = ledger.ledger(full, [], wall_us=10.0, floor_us=8.0, sm_count=4, bandwidth_gbps=1000.0, partial_bytes=8e6)
    assert led.parts == pytest.approx(dict(launch=2.0, idle=0.0, merge=0.0, below_peak=0.0, extra_bytes=0.0,
                                           recording=0.0, replay=0.0, unexplained=0.0), abs=1e-12)


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
    assert led.parts["replay"] == 0.0 and led.unmeasured == ("replay",)
    one_wave = ledger.peer_ledger(wall_us=50.0, floor_us=20.0, programs=264, slots=264, launch_us=5.0)
    assert one_wave.parts["idle"] == 0.0
    # the replay's share of the peer's own timing, out of what its waves are modelled over
    rep = ledger.peer_ledger(wall_us=50.0, floor_us=20.0, programs=300, slots=264, launch_us=5.0, replay_us=3.0)
    assert rep.parts["replay"] == 3.0 and rep.parts["idle"] == pytest.approx(42 * (1 - 300 / 528))
    assert rep.unmeasured == () and sum(rep.parts.values()) == pytest.approx(30.0)


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
