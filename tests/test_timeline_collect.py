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
