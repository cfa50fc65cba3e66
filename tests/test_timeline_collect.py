"""``experiments/timelines/collect.py --dry-run``: the H200 collection's code paths on the CPU (Triton's interpreter,
tiny shapes): every point checked against fp64, its programs recorded (one record each, no clock), the modelled
timeline beside each partial program, and nothing timed or ledgered (the rows say so)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

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
