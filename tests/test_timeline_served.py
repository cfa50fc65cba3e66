"""``experiments/timelines/served.py`` on the CPU: ``graph --dry-run`` (Triton's interpreter, tiny shapes: a capacity
plan's records after a new plan, no clock, the output the plain run's bit for bit) and ``check-sweep`` on a sweep
recorded with ``--timelines`` (no problem), then on the same folder with one point's records doubled and another's
lost (each named)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pandas as pd
from test_sweep_schedules import card_text, load

from splitlab import results, sweep_timelines
from splitlab.bench import sweep
from splitlab.bench.sweep import SweepOptions

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "timelines" / "served.py"


def served():
    spec = importlib.util.spec_from_file_location("served", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_graph_dry_run_records_the_new_plans_programs(tmp_path):
    mod = served()
    assert mod.main(["graph", "--dry-run", "--out", str(tmp_path)]) == 0
    rows = [json.loads(x) for x in (tmp_path / "served.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["gqa", "mla"]
    for r in rows:
        assert r["problems"] == [] and r["bit_identical"], r
        assert 0 < r["programs"] and r["merge_programs"] > 0 and "plain_us" not in r  # nothing timed on the CPU


def test_check_sweep_passes_a_recorded_sweep_and_names_what_is_wrong(tmp_path, capsys):
    mod = served()
    text = card_text(knobs='scheduler = { values = ["uniform", "balanced"] }\n',
                     block='scheduler = ["uniform", "balanced"]\nnum_splits = [2]\n')
    card = dataclasses.replace(load(tmp_path, text), planner_knobs=())
    res = sweep.run(card, SweepOptions(out=tmp_path / "runs", device="h200", quiet=True, grid="quick", timer="fake",
                                       isolate=False, timelines=True))
    folder = res.sweep_dir
    assert mod.main(["check-sweep", str(folder)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["checked"] == 2 and summary["problems"] == []
    # One point's records doubled (another session's), the other's lost: both named.
    path = folder / sweep_timelines.FILE
    table = sweep_timelines.load(folder)
    a, b = results.load(folder).point_id
    twice = table[table.point_id == a].assign(session="other")
    bad = pd.concat([table[table.point_id != b], twice], ignore_index=True)
    results.write_parquet(bad, path, journal_sizes=results.parquet_meta(path)["journals"])
    assert mod.main(["check-sweep", str(folder)]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert any(p.startswith(f"{a}: records of 2 sessions") for p in problems), problems
    assert any(p.startswith(f"{b} (balanced): partial programs 0") for p in problems), problems
