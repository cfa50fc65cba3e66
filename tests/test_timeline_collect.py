"""``experiments/timelines/collect.py --dry-run``: the H200 collection's code paths on the CPU (Triton's interpreter,
tiny shapes): every point checked against fp64, its programs recorded (one record each, no clock), the modelled
timeline beside each partial program, and nothing timed or ledgered (the rows say so); the peers' path, the replay
check and the peers' launch (timing faked), the sets counted against the sets rotated, and ``reledger`` against the
shipped set's ledgers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from splitlab.kernels.timeline import ABSENT

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "timelines" / "collect.py"


def test_dry_run_writes_points_and_one_record_per_program(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "run", "--dry-run", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    pts = pd.read_csv(tmp_path / "points.csv", dtype={"shape": str})
    tl = pd.read_csv(tmp_path / "timelines.csv", dtype={"shape": str})
    assert len(pts) >= 4 and set(pts["kind"]) == {"gqa", "mla"}
    assert (pts["status"] == "dry-run").all() and pts["plain_us"].isna().all() and pts["unexplained_us"].isna().all()
    assert (pts["rel_err"].astype(float) < 1e-2).all()
    for _, p in pts.iterrows():
        mine = tl[tl["schedule_hash"] == p["schedule_hash"]]
        part, merge = mine[mine["kernel"] == "partial"], mine[mine["kernel"] == "merge"]
        assert sorted(part["program"]) == list(range(p["programs"]))
        assert len(merge) == p["merge_programs"] and (len(merge) > 0) == (p["partial_rows"] > 0)
        assert (mine[["sm", "start_ns", "end_ns"]] == ABSENT).all().all()
        assert part["model_end"].notna().all() and part["model_end"].max() == p["model_launch"]
    assert (tmp_path / "peers.csv").read_text().startswith("shape,")


def test_peers_are_checked_through_the_launch_their_call_returns(monkeypatch):
    """``peers``: a peer's ``call`` plans and returns its launch; the output checked against fp64 is the launch's
    (once a callable was compared, and every peer row of the H200 run was an error), then timed and ledgered."""
    import importlib.util
    import io
    import types

    import torch

    from splitlab import devices
    from splitlab.bench import peers_flashinfer, timing
    from splitlab.workloads import DecodeWorkload

    spec = importlib.util.spec_from_file_location("collect", SCRIPT)
    collect = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(collect)
    ref = torch.ones(2, 4, 16, dtype=torch.float64)
    launched = []
    fake = types.SimpleNamespace(unavailable=lambda: None,
                                 call=lambda w, x, knobs: (lambda: launched.append(x["name"]) or ref.float()))
    monkeypatch.setattr(peers_flashinfer, "FLASHINFER_DECODE", fake)
    monkeypatch.setattr(timing, "time_graph", lambda calls: types.SimpleNamespace(p50_us=50.0, p20_us=49.0,
                                                                                  p80_us=51.0))
    w = DecodeWorkload("gqa", 2, 4, 2, 16, 16, 64, page_size=16)
    buf = io.StringIO()
    writer = collect.csv.DictWriter(buf, collect.PEER_FIELDS)
    sets = [dict(q=torch.zeros(2, 4, 16), name=n) for n in ("x0", "x1")]
    collect.peers(w, devices.get("h200"), dict(shape="4/2", batch=2, longest=64, dist="uniform"), sets[0], sets,
                  ref, 10.0, 2.0, writer)
    row = next(collect.csv.DictReader(io.StringIO(buf.getvalue()), collect.PEER_FIELDS))
    assert row["status"] == "ok", row["note"]
    assert float(row["us"]) == 50.0 and launched == ["x0"]


def _collect():
    import importlib.util

    spec = importlib.util.spec_from_file_location("collect", SCRIPT)
    collect = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(collect)
    return collect


def test_the_sets_counted_are_the_sets_rotated():
    """``sets_of`` (what ``reledger`` takes for a set written without its ``sets`` column) is how many input sets
    ``rotated_inputs`` makes: the calls a timing's graph replay holds, and the ``n`` of the replay part."""
    from splitlab.bench.decode import rotated_inputs
    from splitlab.workloads import DecodeWorkload

    collect = _collect()
    for w in (DecodeWorkload("gqa", 3, 4, 2, 16, 16, 200, page_size=16, length_dist="longtail", length_seed=1),
              DecodeWorkload("mla", 2, 16, 1, 96, 64, 128, page_size=64)):
        for l2 in (w.kv_bytes, 5 * w.kv_bytes - 1):  # 3 and 15 sets
            assert len(rotated_inputs(w, device="cpu", l2_bytes=l2)) == collect.sets_of(w, l2) > 2


def test_the_shipped_ledgers_are_what_reledger_makes(tmp_path):
    """The shipped set's ledger columns are ``reledger``'s (the recording and replay parts; the replay's cost from
    the timer check, labelled so): made again they are the same bytes; another replay cost changes the ledger
    columns only, never a measured one."""
    import shutil

    collect = _collect()
    shipped = SCRIPT.parents[2] / "data" / "bench" / "h200" / "timelines"
    shutil.copytree(shipped, tmp_path / "again")
    got = collect.reledger(tmp_path / "again")
    assert got == dict(points=63, explained=62)
    for name in ("points.csv", "peers.csv"):
        assert (tmp_path / "again" / name).read_bytes() == (shipped / name).read_bytes(), name
    pts = pd.read_csv(shipped / "points.csv", dtype={"shape": str})
    assert (pts["replay_cost_source"] == "timer_check").all() and (pts["replay_cost_us"] == 5.9).all()
    parts = [f"{p}_us" for p in collect._ledger.PARTS]
    assert (pts[parts].sum(axis=1) - pts["gap_us"]).abs().max() < 5e-3
    shutil.copytree(shipped, tmp_path / "other")
    collect.reledger(tmp_path / "other", replay_cost_us=4.0)
    for name, derived in (("points.csv", collect.POINT_LEDGER), ("peers.csv", collect.PEER_LEDGER)):
        a = pd.read_csv(shipped / name, dtype=str)
        b = pd.read_csv(tmp_path / "other" / name, dtype=str)
        kept = [c for c in a.columns if c not in derived]
        assert a[kept].equals(b[kept]), name
        assert not a["replay_us"].equals(b["replay_us"])


def test_the_replay_check_and_the_peers_launch(monkeypatch):
    """``replay_check`` (GPU only, so faked here): empty launches timed at 1, 8 and 64 calls a replay give the
    replay's fixed cost; the peers' launch is the pair at 8 a replay less the 1/8 of that cost it held."""
    import types

    from splitlab.bench import timing

    collect = _collect()
    pair_us, cost_us = 0.9, 6.0
    monkeypatch.setattr(timing, "time_graph", lambda calls, replays=30, warmup=3: types.SimpleNamespace(
        p50_us=pair_us + cost_us / len(calls)))
    got = collect.replay_check(lambda: None)
    assert got["replay_cost_us"] == pytest.approx(cost_us) and got["launch_pair_us"] == pytest.approx(0.9 + 6 / 8)
    parts = collect.peer_parts(got["launch_pair_us"], 3, got["replay_cost_us"])
    assert parts == pytest.approx(dict(launch_us=pair_us, replay_us=2.0))
    assert collect.peer_parts(1.5, 3, None) == dict(launch_us=1.5, replay_us=None)


def test_ledgers_with_the_replay_measured_at_each_point(tmp_path):
    """The H200 run whose ledgers take each point's own replay exposure (``AT_POINT``: its plain timing less the same
    graph's behind a GPU spin, times its sets; ``experiments/timelines/h200/``, records not kept): ``reledger`` makes
    the same bytes from the stored parts, and explains 61 of the 63 points to 5%; the peers keep the run's estimate
    from empty launches (``env.json``)."""
    import shutil

    collect = _collect()
    explained = {}
    for fam in ("gqa", "mla"):
        shipped = SCRIPT.parent / "h200" / fam
        shutil.copytree(shipped, tmp_path / fam)
        (tmp_path / fam / "timelines.csv").write_text(",".join(collect.TIMELINE_FIELDS) + "\n")
        explained[fam] = collect.reledger(tmp_path / fam)
        for name in ("points.csv", "peers.csv"):
            assert (tmp_path / fam / name).read_bytes() == (shipped / name).read_bytes(), (fam, name)
        pts = pd.read_csv(shipped / "points.csv", dtype={"shape": str})
        assert (pts["replay_cost_source"] == collect.AT_POINT).all() and (pts["replay_cost_us"] >= 0).all()
    assert explained == dict(gqa=dict(points=43, explained=42), mla=dict(points=20, explained=19))
