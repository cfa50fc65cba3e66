"""The sweep harness end to end on the CPU: grid expansion, check-then-time, error isolation, resume after a
kill (no row lost, none duplicated), the CLI. Implementations are ``tests/sweep_fixtures.py`` (fast,
reference-based) or splitlab's real kernels under Triton's interpreter on a handful of tiny points; times
come from the fake timer."""

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sweep_fixtures import tiny_card

from splitlab import planners, results
from splitlab.bench import cards, grid, sweep
from splitlab.bench.sweep import SweepOptions
from splitlab.bench.timing import FakeTimer
from splitlab.cli import main
from splitlab.devices import get as get_device
from splitlab.errors import SplitlabError

REPO = Path(__file__).resolve().parents[1]
H200 = get_device("h200")

def card_text(impl: str) -> str:
    """The test card for one implementation of tests/sweep_fixtures.py."""
    return tiny_card(f"t_{impl}", impl)


class CountingTimer(FakeTimer):
    """The fake timer, remembering what it was asked to time."""

    def __init__(self):
        super().__init__(H200)
        self.timed = []

    def measure(self, calls, *, set_bytes, workload, num_splits):
        self.timed.append((workload.batch, workload.ctx_len, num_splits))
        return super().measure(calls, set_bytes=set_bytes, workload=workload, num_splits=num_splits)


def card_for(tmp_path, impl):
    p = tmp_path / f"{impl}.toml"
    p.write_text(card_text(impl))
    return cards.load(p)


def opts(tmp_path, **kw):
    """Sweep options for these tests. Points are measured in the test's process unless ``isolate=True`` is
    given: the harness logic most tests check does not depend on where a point runs, and a worker process costs
    seconds to start; the isolation tests, the CLI tests (subprocesses, the default isolated path) and the
    real-kernel test run in point workers."""
    kw.setdefault("grid", "quick")
    kw.setdefault("timer", "fake")
    kw.setdefault("isolate", False)
    return SweepOptions(out=tmp_path / "runs", device="h200", quiet=True, **kw)


def rows_of(sweep_dir):
    """Every row event of every journal (duplicates would show here)."""
    return [e["row"] for j in results.journals(sweep_dir) for e in results.read_journal(j) if e["event"] == "row"]


# --- grid expansion ---------------------------------------------------------------------------------------

def test_expansion_counts_planner_choices_and_dedupe(tmp_path):
    card = card_for(tmp_path, "exact")
    exp = grid.expand(card, "quick", H200)
    shapes = {p.workload for p in exp.points}
    assert len(shapes) == 4
    assert sum(p.in_grid for p in exp.points) == 16  # 4 shapes x 4 split counts
    assert len({p.point_id for p in exp.points}) == len(exp.points)  # measured once
    gqa_planners = planners.names("gqa")
    for w in shapes:
        pts = [p for p in exp.points if p.workload == w]
        for name in gqa_planners:  # every planner's choice is a point of every shape, exactly once
            chosen = [p for p in pts if name in p.planners]
            assert len(chosen) == 1, (name, w)
            assert chosen[0].facts["num_splits"] == planners.plan(w, H200, name).num_splits
        # A planner's choice that equals a grid point is that point (in_grid), not a second one.
        for p in pts:
            if p.facts["num_splits"] in (1, 2, 4, 8):
                assert p.in_grid
    # Default knobs resolved explicitly; shape-major order.
    assert all(p.knobs["block_n"] == p.facts["block_n"] for p in exp.points)
    order = [p.workload for p in exp.points]
    assert all(order.index(w) <= i for i, w in enumerate(order)) and \
        sum(1 for a, b in zip(order, order[1:], strict=False) if a != b) == 3
    # Point ids do not depend on the grid or the run; they do on what is measured.
    again = grid.expand(card, "quick", H200)
    assert [p.point_id for p in again.points] == [p.point_id for p in exp.points]
    one = next(p for p in exp.points if p.workload.batch == 1 and p.workload.ctx_len == 64 and p.in_grid
               and p.facts["num_splits"] == 1)
    dflt = grid.expand(card, "default", H200).points
    assert one.point_id in {p.point_id for p in dflt}
    assert grid.point_id("t_exact", "t_exact", one.workload, {**one.facts, "block_n": 16}) != one.point_id


def test_shards_are_whole_shapes_and_partition_the_points(tmp_path):
    pts = grid.expand(card_for(tmp_path, "exact"), "quick", H200).points
    parts = [grid.shard(pts, i, 3) for i in range(3)]
    assert sorted(p.point_id for part in parts for p in part) == sorted(p.point_id for p in pts)
    for a in range(3):
        for b in range(a + 1, 3):
            assert not {p.workload for p in parts[a]} & {p.workload for p in parts[b]}


def test_planner_devices_and_planner_tile_knobs():
    sp = cards.load("sparse_mla_decode")
    exp = grid.expand(sp, "seed", H200)
    aiter = [p for p in exp.points if "aiter" in p.planners]
    for p in aiter:  # aiter's BLOCK_K rule: its own block_k and block_h (16) are measured
        plan = planners.plan(p.workload, H200, "aiter")
        assert (p.facts["num_splits"], p.facts["block_k"], p.facts["block_h"]) == \
            (plan.num_splits, plan.block_k, plan.block_h)
    assert any("aiter@mi355x" in p.planners for p in exp.points)
    assert any(n["planner"].startswith("flashmla") for n in exp.notes)  # refused 16 heads: a note, not a crash


# --- check, then time -------------------------------------------------------------------------------------

def test_wrong_points_are_stored_wrong_and_not_timed(tmp_path):
    timer = CountingTimer()  # measured in this process, so that the timer's record is here to read
    res = sweep.run(card_for(tmp_path, "broken"), opts(tmp_path), timer=timer)
    df = results.load(res.sweep_dir)
    wrong = df[df.status == "wrong"]
    assert len(wrong) == 4 and set(wrong.num_splits) == {2}
    assert wrong.p50_us.isna().all() and (wrong.rel_err > 0.1).all() and wrong.error.str.contains("tolerance").all()
    assert not any(s == 2 for _, _, s in timer.timed)
    ok = df[df.status == "ok"]
    assert len(ok) == len(df) - 4 == len(timer.timed)
    assert (ok.timing == "fake").all() and (ok.n_samples == 0).all() and ok.p50_us.notna().all()
    assert ok.timing_detail.str.contains("not measured").all() and (ok.rel_err < 1e-2).all()


def test_a_raising_point_is_an_error_and_the_sweep_goes_on(tmp_path):
    res = sweep.run(card_for(tmp_path, "raising"), opts(tmp_path), timer=CountingTimer())
    df = results.load(res.sweep_dir)
    err = df[df.status == "error"]
    assert len(err) == 4 and set(err.num_splits) == {4}
    assert err.error.str.contains("RuntimeError: simulated compile error").all()
    assert (df[df.num_splits != 4].status == "ok").all() and res.stopped == "finished" and res.left == 0
    # Points after the first error (later shapes) ran.
    assert df.batch.max() == 2 and (df[(df.batch == 2) & (df.ctx_len == 128)].status == "ok").any()


def test_real_kernels_under_the_interpreter(tmp_path):
    """splitlab's own kernels, genuinely checked under TRITON_INTERPRET=1: one tiny shape per family."""
    text = """name = "{name}"\nkind = "{kind}"\n[impl]\nimport = "splitlab.kernels.{mod}:{name}"
reference = "splitlab.kernels.reference:{name}"\nlaunch_facts = "splitlab.kernels.{mod}:{mod}_launch_facts"
[knobs]\nnum_splits = {{ min = 1, max = 4 }}\n[[grids.quick]]\n{shape}\nnum_splits = [1, 3]\nmin_keys_per_split = 1
[[grids.default]]\n{shape}\n"""
    families = [
        ("gqa_decode", "gqa", "gqa", "num_q_heads = 4\nnum_kv_heads = 2\nhead_dim_qk = 16\nbatch = 2\nctx_len = 40"),
        ("mla_decode", "mla", "mla", "num_q_heads = 4\nhead_dim_qk = 40\nhead_dim_v = 32\nbatch = 2\nctx_len = 40"),
        ("sparse_mla_decode", "sparse_mla", "sparse_mla",
         "num_q_heads = 4\nhead_dim_qk = 32\nhead_dim_v = 32\nbatch = 2\nctx_len = 64\ntopk = 24"),
    ]
    for name, kind, mod, shape in families:
        p = tmp_path / f"{name}.toml"
        p.write_text(text.format(name=name, kind=kind, mod=mod, shape=shape))
        card = cards.load(p)
        # Only the grid points (planners would add a few more interpreter runs each).
        card = dataclasses.replace(card, planner_knobs=())
        res = sweep.run(card, opts(tmp_path, isolate=True), timer=CountingTimer())  # as on a GPU node
        df = results.load(res.sweep_dir)
        assert len(df) == 2 and (df.status == "ok").all(), df[["num_splits", "status", "error"]]
        assert (df.rel_err < 2e-2).all() and set(df.num_splits) == {1, 3}
        assert (df.ctas > 0).all() and (df.waves > 0).all()


def test_peers_without_a_gpu_are_skipped_with_the_reason(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    res = sweep.run(cards.load("sdpa_flash"), opts(tmp_path, isolate=True), timer=CountingTimer())
    df = results.load(res.sweep_dir)
    assert len(df) == 4 and (df.status == "skipped").all() and df.error.str.contains("needs a CUDA GPU").all()
    assert df.num_splits.isna().all() and df.ctas.isna().all()


# --- isolation: a point that crashes or hangs costs that point only -----------------------------------------

def _workers_of(session_pid):
    """Live point workers started by the session process ``session_pid`` (Linux: read from /proc)."""
    from splitlab.bench.worker import WORKER_ENV

    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if f"{WORKER_ENV}={session_pid}".encode() in env and stat.split(") ", 1)[-1][:1] not in ("Z", "X"):
            out.append(int(d.name))
    return out


def test_a_crashing_or_hanging_point_is_an_error_and_the_session_goes_on(tmp_path):
    from sweep_fixtures import FAULTS

    card = card_for(tmp_path, "faulty")
    n = len(grid.expand(card, "quick", H200).points)
    res = sweep.run(card, opts(tmp_path, point_timeout_s=2.0, isolate=True), timer=CountingTimer())
    assert res.stopped == "finished" and res.left == 0 and len(results.journals(res.sweep_dir)) == 1  # one session
    df = _check_complete(res.sweep_dir, n)
    where = df.num_splits.astype(str) + "," + df.batch.astype(str) + "," + df.ctx_len.astype(str)
    bad = df[where.isin(list(FAULTS))].set_index(where[where.isin(list(FAULTS))])
    assert len(bad) == 3 and (bad.status == "error").all() and bad.p50_us.isna().all()
    assert bad.error["2,1,64"] == "worker died with SIGSEGV during this point; not retried"
    assert bad.error["4,1,128"] == "worker died with SIGABRT during this point; not retried"
    assert bad.error["8,2,64"] == "timed out after 2 s (the worker was killed); not retried"
    assert 2.0 <= bad.elapsed_s["8,2,64"] < 30
    assert (df[~where.isin(list(FAULTS))].status == "ok").all() and res.statuses == {"ok": n - 3, "error": 3}
    assert _workers_of(os.getpid()) == []  # the session's last worker was stopped with it
    # A resume has nothing left to do: the failed points are finished (error), not retried.
    again = sweep.run(card, opts(tmp_path, resume=True, point_timeout_s=2.0, isolate=True), timer=CountingTimer())
    assert again.statuses == {} and again.left == 0


def test_the_point_worker_is_kept_and_replaced_only_after_it_dies(tmp_path):
    from splitlab.bench.worker import PointWorker

    card = card_for(tmp_path, "faulty")
    pts = {f"{p.facts['num_splits']},{p.workload.batch},{p.workload.ctx_len}": p
           for p in grid.expand(card, "quick", H200).points if p.in_grid}
    w = PointWorker(card.impl, "fake", H200, 1, timeout_s=30)
    try:
        first = [w.measure(pts[k], {"point_id": k}) for k in ("1,1,64", "4,1,64", "8,1,64")]
        pid = w.proc.pid
        assert [r["status"] for r in first] == ["ok"] * 3 and w.starts == 1  # one worker, kept between points
        assert w.measure(pts["2,1,64"], {"point_id": "x"})["error"].startswith("worker died with SIGSEGV")
        assert w.measure(pts["1,1,128"], {"point_id": "y"})["status"] == "ok" and w.starts == 2
        assert w.proc.pid != pid
    finally:
        w.close()
    assert w.proc is None


def test_sigterm_while_a_point_hangs_stops_the_session_and_its_worker(tmp_path):
    cmd, env = _cli(tmp_path, "faulty")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sweep_dir = tmp_path / "runs" / "t_faulty-quick"
    deadline = time.time() + 120
    hung = None
    while time.time() < deadline and hung is None and proc.poll() is None:
        time.sleep(0.1)
        events = [e for j in results.journals(sweep_dir) for e in results.read_journal(j)] if sweep_dir.exists() else []
        starts = {e["point_id"]: e["row"] for e in events if e["event"] == "start"}
        done = {e["row"]["point_id"] for e in events if e["event"] == "row"}
        hung = next((r for pid, r in starts.items() if pid not in done and
                     (r["num_splits"], r["batch"], r["ctx_len"]) == (8, 2, 64)), None)
    assert hung is not None, proc.communicate(timeout=5)
    assert len(_workers_of(proc.pid)) == 1
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "stopped: interrupted" in out, err  # the work kept, the exit says it stopped
    assert _workers_of(proc.pid) == []  # killed with the session, not left hanging
    abandoned = [e for j in results.journals(sweep_dir) for e in results.read_journal(j) if e["event"] == "abandon"]
    assert [e["point_id"] for e in abandoned] == [hung["point_id"]]


# --- durability: resume, kills, limits ------------------------------------------------------------------

def _cli(tmp_path, impl, *extra, env=None):
    card = tmp_path / f"{impl}.toml"
    if not card.exists():
        card.write_text(card_text(impl))
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]), TRITON_INTERPRET="1",
             **(env or {}))
    return [sys.executable, "-m", "splitlab", "sweep", str(card), "--grid", "quick", "--out", str(tmp_path / "runs"),
            "--timer", "fake", "--device", "h200", "--quiet", *extra], e


def _check_complete(sweep_dir, n_points):
    """Every point exactly once: in the journals' finished rows and in the Parquet."""
    rows = rows_of(sweep_dir)
    ids = [r["point_id"] for r in rows]
    assert len(ids) == len(set(ids)) == n_points
    df = results.load(sweep_dir)
    assert len(df) == n_points and df.point_id.is_unique
    return df


def test_resume_after_the_process_dies_mid_point(tmp_path):
    """The session's own process dies (kill -9, the OOM killer): its point worker dies with it."""
    cmd, env = _cli(tmp_path, "killer", env={"SWEEP_KILL_AT": "4,1,128"})
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    card = card_for(tmp_path, "killer")
    n = len(grid.expand(card, "quick", H200).points)
    sweep_dir = tmp_path / "runs" / "t_killer-quick"
    before = rows_of(sweep_dir)
    assert 0 < len(before) < n and not (sweep_dir / "results.parquet").exists()
    # The journal alone already reads as results (what a killed sweep leaves).
    assert len(results.load(sweep_dir)) == len(before)
    # Resume (the kill switch still on: the dead point must not be retried, or it would kill us again).
    os.environ["SWEEP_KILL_AT"] = "4,1,128"
    try:
        res = sweep.run(card, opts(tmp_path, resume=True), timer=CountingTimer())
    finally:
        del os.environ["SWEEP_KILL_AT"]
    df = _check_complete(sweep_dir, n)
    died = df[df.status == "error"]
    assert len(died) == 1 and "process died" in died.error.iloc[0]
    assert (died.num_splits.iloc[0], died.batch.iloc[0], died.ctx_len.iloc[0]) == (4, 1, 128)
    assert res.statuses.get("error") == 1 and res.left == 0
    # Resuming a finished sweep runs nothing and writes no row.
    again = sweep.run(card, opts(tmp_path, resume=True), timer=CountingTimer())
    assert again.statuses == {} and again.done == n
    _check_complete(sweep_dir, n)
    side = json.loads((sweep_dir / "sweep.json").read_text())
    assert len(side["sessions"]) == 3 and side["sweep_id"] == df.sweep_id.iloc[0]
    for key in ("name", "uuid", "sm_count", "l2_bytes"):
        assert key in side["env"]["device"]
    for key in ("driver", "cuda", "torch", "triton", "splitlab", "git", "host", "argv"):
        assert key in side["env"]
    assert side["env"]["argv"][:2] == ["splitlab", "sweep"]
    # A finished sweep may ship without its journals: the Parquet holds every row, and a resume adds none.
    for j in results.journals(sweep_dir):
        j.unlink()
    assert len(results.load(sweep_dir)) == n
    assert sweep.run(card, opts(tmp_path, resume=True), timer=CountingTimer()).statuses == {}
    assert len(results.load(sweep_dir)) == n and results.load(sweep_dir).point_id.is_unique


def test_resume_after_sigkill_from_outside_loses_nothing(tmp_path):
    cmd, env = _cli(tmp_path, "slow", env={"SWEEP_SLOW_S": "0.15"})
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sweep_dir = tmp_path / "runs" / "t_slow-quick"
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if sweep_dir.exists() and len(rows_of(sweep_dir)) >= 5:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()
    time.sleep(0.07)  # most likely inside a point
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for _ in range(50):  # the point worker dies with its session (PR_SET_PDEATHSIG)
        if not _workers_of(proc.pid):
            break
        time.sleep(0.1)
    assert _workers_of(proc.pid) == []
    events = [e for j in results.journals(sweep_dir) for e in results.read_journal(j)]
    in_flight = {e["point_id"] for e in events if e["event"] == "start"} - \
        {e["row"]["point_id"] for e in events if e["event"] == "row"}
    assert len(in_flight) <= 1  # at most the point in flight is lost
    card = card_for(tmp_path, "slow")
    n = len(grid.expand(card, "quick", H200).points)
    sweep.run(card, opts(tmp_path, resume=True), timer=CountingTimer())
    df = _check_complete(sweep_dir, n)
    assert set(df[df.status == "error"].point_id) == in_flight and (df.status == "ok").sum() == n - len(in_flight)


def test_sigterm_marks_the_point_abandoned_and_it_is_retried(tmp_path):
    cmd, env = _cli(tmp_path, "slow", env={"SWEEP_SLOW_S": "0.3"})
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sweep_dir = tmp_path / "runs" / "t_slow-quick"
    deadline = time.time() + 60
    while time.time() < deadline and not (sweep_dir.exists() and len(rows_of(sweep_dir)) >= 2):
        time.sleep(0.05)
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip().endswith("splitlab: interrupted; run the same command with --resume "
                                                           "to go on"), err
    assert "stopped: interrupted" in out and (sweep_dir / "results.parquet").exists()
    card = card_for(tmp_path, "slow")
    n = len(grid.expand(card, "quick", H200).points)
    sweep.run(card, opts(tmp_path, resume=True), timer=CountingTimer())
    df = _check_complete(sweep_dir, n)
    assert (df.status == "ok").all()


def test_limit_max_minutes_and_resume_in_chunks(tmp_path):
    card = card_for(tmp_path, "exact")
    n = len(grid.expand(card, "quick", H200).points)
    r1 = sweep.run(card, opts(tmp_path, limit=5), timer=CountingTimer())
    assert (r1.done, r1.left, r1.stopped) == (5, n - 5, "limit")
    with pytest.raises(SplitlabError, match="already holds sweep .*pass --resume"):
        sweep.run(card, opts(tmp_path, limit=5), timer=CountingTimer())
    with pytest.raises(SplitlabError, match="timer='events' is not allowed .*expected 'fake'"):
        sweep.Runner(card, opts(tmp_path, resume=True, timer="events")).run()
    r2 = sweep.run(card, opts(tmp_path, resume=True, max_minutes=1e-9), timer=CountingTimer())
    assert r2.stopped == "time" and r2.done == 6  # one point, then the budget is spent
    r3 = sweep.run(card, opts(tmp_path, resume=True), timer=CountingTimer())
    assert r3.left == 0 and r3.stopped == "finished"
    _check_complete(r3.sweep_dir, n)


def test_a_live_session_on_the_same_points_is_refused(tmp_path):
    card = card_for(tmp_path, "exact")
    sweep.run(card, opts(tmp_path, limit=1), timer=CountingTimer())
    sweep_dir = tmp_path / "runs" / "t_exact-quick"
    live = sweep.Journal(sweep_dir / "journal-29990101T000000Z-1-aaaa.jsonl")  # holds its lock, like a live run
    live.write(dict(event="session", session="x", shard=None, env={"pid": 1}))
    try:
        with pytest.raises(SplitlabError, match="live session"):
            sweep.run(card, opts(tmp_path, resume=True), timer=CountingTimer())
        # A shard of a sharded sweep may run beside another shard, not beside an unsharded session.
        with pytest.raises(SplitlabError, match="live session"):
            sweep.run(card, opts(tmp_path, resume=True, shard=(0, 2)), timer=CountingTimer())
    finally:
        live.close()
    res = sweep.run(card, opts(tmp_path, resume=True, shard=(0, 2)), timer=CountingTimer())
    res2 = sweep.run(card, opts(tmp_path, resume=True, shard=(1, 2)), timer=CountingTimer())
    assert res.left == res2.left == 0
    _check_complete(sweep_dir, len(grid.expand(card, "quick", H200).points))


def test_a_torn_journal_line_is_ignored(tmp_path):
    card = card_for(tmp_path, "exact")
    res = sweep.run(card, opts(tmp_path, limit=4), timer=CountingTimer())
    j = results.journals(res.sweep_dir)[0]
    with open(j, "ab") as f:
        f.write(b'{"event":"row","row":{"point_id":"abc","stat')  # the process died mid-write
    assert len(results.load(res.sweep_dir)) == 4
    res = sweep.run(card, opts(tmp_path, resume=True), timer=CountingTimer())
    _check_complete(res.sweep_dir, len(grid.expand(card, "quick", H200).points))


# --- damaged folders: the journals are the source of truth ----------------------------------------------------

def _started(tmp_path, capsys=None, limit=5):
    """A sweep of the exact card with ``limit`` points done (Parquet, CSV and sidecar written)."""
    card = card_for(tmp_path, "exact")
    res = sweep.run(card, opts(tmp_path, limit=limit), timer=CountingTimer())
    return card, res.sweep_dir, res.sweep_id


def _dry_run(tmp_path, capsys):
    code = main(["sweep", str(tmp_path / "exact.toml"), "--grid", "quick", "--out", str(tmp_path / "runs"),
                 "--dry-run", "--device", "h200"])
    out = capsys.readouterr()
    return code, out.out, out.err


DAMAGES = {
    "truncated results.parquet": ("results.parquet", lambda b: b[: len(b) // 2]),
    "garbled results.parquet": ("results.parquet", lambda b: b[:100] + bytes(len(b) - 100)),
    "truncated sweep.json": ("sweep.json", lambda b: b[: len(b) // 3]),
    "non-object sweep.json": ("sweep.json", lambda b: b"[1, 2, 3]"),
    "non-UTF-8 sweep.json": ("sweep.json", lambda b: b"\xff\xfe" + b[2:]),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_resume_and_dry_run_from_intact_journals_whatever_happened_to_parquet_or_sidecar(tmp_path, capsys, damage):
    card, sweep_dir, sweep_id = _started(tmp_path)
    n = len(grid.expand(card, "quick", H200).points)
    name, harm = DAMAGES[damage]
    (sweep_dir / name).write_bytes(harm((sweep_dir / name).read_bytes()))
    code, out, err = _dry_run(tmp_path, capsys)
    assert code == 0, err
    assert f"(sweep {sweep_id}): 5 done, {n - 5} left" in out and f"warning: {sweep_dir / name}" in out
    assert not list(sweep_dir.glob("*.damaged-*"))  # --dry-run writes nothing
    with pytest.warns(UserWarning, match="reading the sweep from its journals") if "parquet" in name else \
            contextlib.nullcontext():
        assert len(results.load(sweep_dir)) == 5
    res = sweep.run(card, opts(tmp_path, resume=True), timer=CountingTimer())
    assert res.sweep_id == sweep_id and res.left == 0 and "damaged" in capsys.readouterr().err
    df = _check_complete(sweep_dir, n)
    assert (df.sweep_id == sweep_id).all() and (df.status == "ok").all()
    assert len(list(sweep_dir.glob(f"{name}.damaged-*"))) == 1  # kept for inspection
    side = json.loads((sweep_dir / "sweep.json").read_text())
    assert side["sweep_id"] == sweep_id and side["timer"] == "fake" and side["rows"] == n
    assert ("rebuilt_from" in side) == (name == "sweep.json") and "recovered_from" not in side
    again = sweep.run(card, opts(tmp_path, resume=True), timer=CountingTimer())  # sound again: nothing moved
    assert again.statuses == {} and len(list(sweep_dir.glob("*.damaged-*"))) == 1


def test_a_sweep_of_a_newer_schema_is_never_written_to(tmp_path, capsys):
    card, sweep_dir, _ = _started(tmp_path)
    side = json.loads((sweep_dir / "sweep.json").read_text())
    (sweep_dir / "sweep.json").write_text(json.dumps({**side, "schema_version": results.SCHEMA_VERSION + 1}))
    before = sorted(p.name for p in sweep_dir.iterdir())
    sizes = {j.name: j.stat().st_size for j in results.journals(sweep_dir)}
    for args in (["--resume"], ["--dry-run"]):
        code = main(["sweep", str(tmp_path / "exact.toml"), "--grid", "quick", "--out", str(tmp_path / "runs"),
                     "--timer", "fake", "--quiet", "--device", "h200", *args])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert f"schema_version={results.SCHEMA_VERSION + 1} is not allowed" in err
    assert sorted(p.name for p in sweep_dir.iterdir()) == before
    assert {j.name: j.stat().st_size for j in results.journals(sweep_dir)} == sizes
    # A journal holding newer rows (its sidecar sound) is refused the same way.
    (sweep_dir / "sweep.json").write_text(json.dumps(side))
    j = results.journals(sweep_dir)[0]
    row = dict(rows_of(sweep_dir)[0], schema_version=results.SCHEMA_VERSION + 1, point_id="f" * 16)
    with open(j, "a") as f:
        f.write(json.dumps({"event": "row", "row": row}) + "\n")
    with pytest.raises(results.SchemaError, match="is not allowed"):
        sweep.run(card, opts(tmp_path, resume=True), timer=CountingTimer())
    assert len(results.journals(sweep_dir)) == 1


@pytest.mark.parametrize(("field", "value", "word"), [
    ("device", {"name": "h200", "sm_count": "abc"}, "device.sm_count='abc' is not allowed"),
    ("env", {"device": {"name": "cpu", "sm_count": "abc"}}, "env.device.sm_count='abc' is not allowed"),
    ("sweep_id", 5, "sweep_id=5 is not allowed"),
    ("env", [], "env=[] is not allowed"),
])
def test_a_sidecar_field_of_the_wrong_type_is_one_line(tmp_path, capsys, field, value, word):
    card, sweep_dir, _ = _started(tmp_path, limit=1)
    side = json.loads((sweep_dir / "sweep.json").read_text())
    (sweep_dir / "sweep.json").write_text(json.dumps({**side, field: value}))
    for args in (["--resume"], ["--dry-run"]):
        code = main(["sweep", str(tmp_path / "exact.toml"), "--grid", "quick", "--out", str(tmp_path / "runs"),
                     "--timer", "fake", "--quiet", "--device", "h200", *args])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and word in err and "sweep.json" in err, err


def test_resume_for_another_device_is_refused(tmp_path):
    card, sweep_dir, _ = _started(tmp_path, limit=1)
    with pytest.raises(SplitlabError, match="device='b200' is not allowed .*expected 'h200-sxm'"):
        sweep.run(card, dataclasses.replace(opts(tmp_path, resume=True), device="b200"), timer=CountingTimer())


# --- leftovers ----------------------------------------------------------------------------------------------------

def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporary_files_are_removed_on_resume_and_none_are_left(tmp_path):
    card, sweep_dir, _ = _started(tmp_path)
    assert not list(sweep_dir.glob(".*.tmp"))  # a normal exit leaves none
    dead, host = _dead_pid(), results._HOST
    stale = [f".results.parquet.{dead}.tmp", f".results.parquet.{dead}@{host}.tmp", f".results.csv.{dead}.tmp",
             f".sweep.json.{dead}.a1b2c3.tmp", f".sweep.json.{dead}@{host}.a1b2c3.tmp"]
    kept = [f".results.parquet.{os.getppid()}@{host}.tmp",  # a live process's
            f".results.parquet.{dead}@other-host.tmp",  # another machine's (a shared folder): maybe alive there
            ".notes.1.tmp"]  # not ours
    for name in stale + kept:
        (sweep_dir / name).write_bytes(b"x")
    sweep.run(card, opts(tmp_path, resume=True, limit=1), timer=CountingTimer())
    assert sorted(p.name for p in sweep_dir.glob(".*.tmp")) == sorted(kept)


def test_an_interrupted_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    df = results.frame([])
    real = os.replace

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        results.write_parquet(df, tmp_path / "results.parquet")
    with pytest.raises(KeyboardInterrupt):
        sweep._write_json_atomic(tmp_path / "sweep.json", {"a": 1})
    monkeypatch.setattr(os, "replace", real)
    assert list(tmp_path.iterdir()) == []


# --- CLI ------------------------------------------------------------------------------------------------

def test_cli_dry_run_and_run(tmp_path, capsys):
    p = tmp_path / "exact.toml"
    p.write_text(card_text("exact"))
    out_dir = tmp_path / "runs"
    code = main(["sweep", str(p), "--grid", "quick", "--out", str(out_dir), "--dry-run", "--device", "h200"])
    out = capsys.readouterr().out
    n = len(grid.expand(cards.load(p), "quick", H200).points)
    assert code == 0 and f"{n} points over 4 shapes: 16 from the grid" in out and "num_splits" in out
    assert "planners" in out and not out_dir.exists()
    code = main(["sweep", str(p), "--grid", "quick", "--out", str(out_dir), "--timer", "fake", "--quiet",
                 "--device", "h200", "--limit", "3"])
    out = capsys.readouterr().out
    assert code == 0 and f"3/{n} points done" in out and "--resume" in out
    main(["sweep", str(p), "--grid", "quick", "--out", str(out_dir), "--dry-run", "--device", "h200"])
    assert f"3 done, {n - 3} left" in capsys.readouterr().out
    code = main(["sweep", str(p), "--grid", "quick", "--out", str(out_dir), "--timer", "fake", "--quiet",
                 "--device", "h200", "--resume"])
    assert code == 0 and f"{n}/{n} points done" in capsys.readouterr().out
    assert main(["sweep", str(p), "--shard", "2/2", "--dry-run"]) == 2
    assert "--shard" in capsys.readouterr().err


def test_cli_point_timeout_reaches_the_sweep(tmp_path, capsys, monkeypatch):
    p = tmp_path / "exact.toml"
    p.write_text(card_text("exact"))
    seen = []
    monkeypatch.setattr(sweep.Runner, "describe", lambda self, rows: seen.append(self.opts.point_timeout_s) or "")
    base = ["sweep", str(p), "--grid", "quick", "--out", str(tmp_path / "runs"), "--dry-run"]
    assert main(base + ["--point-timeout", "2.5"]) == 0 and main(base) == 0
    assert seen == [2.5, sweep.POINT_TIMEOUT_S]
    for bad in ("0", "-1", "nan", "soon"):
        assert main(base + ["--point-timeout", bad]) == 2
        err = capsys.readouterr().err
        assert "--point-timeout" in err and err.count("\n") == 1, err


def test_cli_refuses_gpu_timers_without_a_gpu(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    p = tmp_path / "exact.toml"
    p.write_text(card_text("exact"))
    code = main(["sweep", str(p), "--grid", "quick", "--out", str(tmp_path / "runs"), "--timer", "graph"])
    err = capsys.readouterr().err
    assert code == 2 and "timer='graph' needs a CUDA GPU" in err and err.count("\n") == 1


# --- pieces that run on the GPU, exercised here as far as a CPU allows -------------------------------------

class CallingTimer(FakeTimer):
    """Runs every call on three rotated input sets (what the graph timer captures) before faking a time."""

    def __init__(self):
        super().__init__(H200)
        self.outputs = []

    def measure(self, calls, *, set_bytes, workload, num_splits):
        self.outputs.append([c() for c in calls(3)])
        assert set_bytes > 0
        return super().measure(calls, set_bytes=set_bytes, workload=workload, num_splits=num_splits)


def test_timers_get_working_calls_on_distinct_input_sets(tmp_path):
    timer = CallingTimer()
    card = dataclasses.replace(card_for(tmp_path, "exact"), planner_knobs=())
    sweep.run(card, opts(tmp_path, limit=2), timer=timer)
    assert len(timer.outputs) == 2
    for outs in timer.outputs:
        assert len(outs) == 3 and all((o == outs[0]).all() for o in outs)  # same values, other addresses


def test_quantiles_match_torch():
    import torch

    from splitlab.bench.timing import quantiles

    xs = [5.0, 1.0, 3.0, 9.0, 7.0, 2.0]
    assert quantiles(xs) == pytest.approx(torch.tensor(xs).quantile(torch.tensor([0.2, 0.5, 0.8])).tolist())


def test_peer_reference_is_attention_over_the_contiguous_cache():
    import torch

    from splitlab.bench.peers import SDPA_FLASH
    from splitlab.workloads import DecodeWorkload

    w = DecodeWorkload("gqa", 2, 4, 2, 16, 16, 24)
    g = torch.Generator().manual_seed(0)
    shapes = ((2, 4, 1, 16), (2, 2, 24, 16), (2, 2, 24, 16))
    q, k, v = (torch.randn(s, generator=g, dtype=torch.float64) for s in shapes)
    ref = SDPA_FLASH.reference(w, dict(q=q, k=k, v=v))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)[:, :, 0]
    torch.testing.assert_close(ref, want)
    if not torch.cuda.is_available():
        assert "needs a CUDA GPU" in SDPA_FLASH.unavailable()


def test_inputs_drawn_on_the_device_have_the_same_layout():
    from splitlab.kernels.inputs import workload_inputs
    from splitlab.workloads import DecodeWorkload

    for w in (DecodeWorkload("gqa", 2, 4, 2, 16, 16, 40), DecodeWorkload("mla", 2, 4, 1, 40, 32, 40),
              DecodeWorkload("sparse_mla", 2, 4, 1, 32, 32, 64, page_size=1, topk=24)):
        a, b = workload_inputs(w, seed=3), workload_inputs(w, seed=3, draw_on="device")
        assert {k: (v.shape, v.dtype) for k, v in a.items()} == {k: (v.shape, v.dtype) for k, v in b.items()}
    with pytest.raises(ValueError, match="draw_on='gpu' is not allowed"):
        workload_inputs(w, draw_on="gpu")


def test_each_planners_regret_reads_off_the_sweep(tmp_path):
    from splitlab import analysis

    res = sweep.run(card_for(tmp_path, "exact"), opts(tmp_path), timer=CountingTimer())
    df = results.load(res.sweep_dir)
    with pytest.raises(SplitlabError, match="not measurements"):
        analysis.regret(df)  # fake times are never taken for measurements
    reg = analysis.regret(df, allow_fake=True)
    assert set(reg.planner) == set(planners.names("gqa")) and len(reg) == 4 * len(planners.names("gqa"))
    assert (reg.regret >= 1.0).all() and len(analysis.summary(reg)) == len(planners.names("gqa"))


def test_parallel_shards_share_one_sweep(tmp_path):
    """Two processes (as on two GPUs) start the same sweep at once, one shard each (with --resume: "continue it
    or start it", since each may find the other's fresh sweep): one sweep id, every point exactly once."""
    procs = []
    for i in range(2):
        cmd, env = _cli(tmp_path, "slow", "--shard", f"{i}/2", "--resume", env={"SWEEP_SLOW_S": "0.02"})
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    card = card_for(tmp_path, "slow")
    df = _check_complete(tmp_path / "runs" / "t_slow-quick", len(grid.expand(card, "quick", H200).points))
    assert df.sweep_id.nunique() == 1 and df.session.nunique() == 2 and (df.status == "ok").all()


def test_the_graph_timer_rotates_by_the_bytes_a_call_reads(monkeypatch):
    """A sparse MLA set is a 65536-token pool of which one call gathers its top-k rows: the rotation is sized by
    those rows (up to 64 sets), not by the pool (3 sets), memory permitting; a dense set is read whole."""
    import torch

    from splitlab import workloads
    from splitlab.bench.timing import GraphTimer, rotations

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (100 * 2**30, 140 * 2**30))
    l2 = 50 * 2**20
    timer = GraphTimer(l2_bytes=l2)
    w = workloads.get("deepseek-v4-sparse-mla", batch=1, topk=736, ctx_len=65536).with_(num_q_heads=64)
    pool = 65536 * 512 * 2
    assert rotations(pool, l2) == 3
    assert timer.sets_for(pool, w.kv_bytes) == 64  # 736 rows of 1 KiB: 3 x L2 needs more sets than the cap
    assert timer.sets_for(pool) == 3
    assert timer.sets_for(40 * 2**20, 10 * 2**40) == 4  # a dense set: read whole (never more than the set)
    assert GraphTimer(l2_bytes=l2, mem_fraction=0.0).sets_for(pool, w.kv_bytes) == 1  # no memory for copies
