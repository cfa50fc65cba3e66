"""``splitlab sweep --timelines`` (issue 38): every work-list point that passed its check and was timed records its
per-program timeline (under Triton's interpreter: identities and work, SM and clock -1), journalled with its row and
kept in ``timelines.parquet`` by point id (``splitlab.sweep_timelines``); split-count points record nothing; a
resumed sweep keeps exactly one record set a point (the one of the row ``best_rows`` keeps); what cannot record is
refused in one line."""

from __future__ import annotations

import dataclasses
import json

import pytest
from sweep_fixtures import tiny_card
from test_sweep_schedules import card_text, load

from splitlab import results, sweep_timelines
from splitlab.bench import impls, sweep
from splitlab.bench.sweep import SweepOptions
from splitlab.cli import main
from splitlab.errors import SplitlabError
from splitlab.families import ALL

OPTS = dict(device="h200", quiet=True, grid="quick", timer="fake")


def check_point(recs: dict, row) -> None:
    """One scheduled point's records against its row: one record a program of the partial kernel (its slots x the
    2 kv heads), the slot and head group each ran, the merge's programs where requests were split; no clock."""
    part = recs["partial"]
    assert [r["program"] for r in part] == list(range(int(row.sched_ctas) * 2)), row.scheduler
    assert all((r["slot"], r["group"]) == divmod(r["program"], 2) for r in part)
    assert sum(r["items"] for r in part) == int(row.sched_items) * 2
    assert bool(recs.get("merge")) == (row.partial_rows > 0), row.scheduler
    assert all(r[f] == -1 for rs in recs.values() for r in rs for f in ("sm", "start_ns", "end_ns"))


def test_scheduled_points_record_split_count_points_do_not_and_a_resume_keeps_one_set(tmp_path, capsys):
    path = tmp_path / "card.toml"
    path.write_text(card_text())
    # The card's planners add split-count points to the quick grid's five schedules: those record nothing.
    out = tmp_path / "runs"
    argv = ["sweep", str(path), "--out", str(out), "--grid", "quick", "--timer", "fake", "--device", "h200",
            "--quiet", "--timelines"]
    assert main([*argv, "--dry-run"]) == 0
    assert "--timelines: 5 work-list points record" in capsys.readouterr().out
    assert main([*argv, "--limit", "2"]) == 0  # in a point worker, as a sweep runs
    folder = next(out.iterdir())
    first = sweep_timelines.load(folder)
    assert first["point_id"].nunique() == 2 and (folder / sweep_timelines.FILE).is_file()
    card = load(tmp_path, card_text(), "card.toml")
    res = sweep.run(card, SweepOptions(out=out, **OPTS, resume=True, isolate=False, timelines=True))
    assert res.done == res.total and set(res.statuses) == {"ok"}
    df = results.load(folder)
    sched, plain = df[df.scheduler != ""], df[df.scheduler == ""]
    assert len(sched) == 5 and len(plain) >= 1 and (df.status == "ok").all()
    table = sweep_timelines.load(folder)
    assert set(table.point_id) == set(sched.point_id)  # split-count points: none
    assert list(table.columns[:4]) == list(sweep_timelines.KEY_COLUMNS)
    for _, row in sched.iterrows():
        recs = sweep_timelines.records(folder, row.point_id)
        check_point(recs, row)
        mine = table[table.point_id == row.point_id]
        assert set(mine.session) == {row.session} and set(mine.device) == {row.device}
    for pid in plain.point_id:
        assert sweep_timelines.records(folder, pid) == {}
    # The first session's records are the ones it journalled (not recorded again by the resume).
    assert set(first.point_id) <= set(table.point_id)
    assert first.equals(table[table.point_id.isin(set(first.point_id))].reset_index(drop=True))

    # A resume without --timelines runs nothing and keeps every record, once.
    again = sweep.run(card, SweepOptions(out=out, **OPTS, resume=True, isolate=False))
    assert again.statuses == {}
    side = json.loads((folder / "sweep.json").read_text())
    assert [x["timelines"] for x in side["sessions"]] == [True, True, False]  # which sessions recorded
    assert sweep_timelines.load(folder).equals(table)
    # A damaged table is read past (the journals hold every record), then moved aside and rebuilt by a session.
    (folder / sweep_timelines.FILE).write_bytes(b"not parquet")
    with pytest.warns(UserWarning, match="timelines.parquet: not a readable Parquet file"):
        assert sweep_timelines.load(folder).equals(table)
    with pytest.warns(UserWarning, match="moved to timelines.parquet.damaged-"):
        sweep.run(card, SweepOptions(out=out, **OPTS, resume=True, isolate=False))
    assert sweep_timelines.load(folder).equals(table)
    assert len(list(folder.glob("timelines.parquet.damaged-*"))) == 1
    # A journal read again (a second session's copy of one point's line, newer, another session): the point keeps
    # one record set, the newer row's.
    line = next(json.loads(x) for j in results.journals(folder) for x in j.read_text().splitlines()
                if '"timeline"' in x)
    pid = line["row"]["point_id"]
    line["row"].update(session="z-copy", finished_at="2999-01-01T00:00:00+0000")
    (folder / "journal-zzzz-copy.jsonl").write_text(json.dumps(line) + "\n")
    before = table
    table = sweep_timelines.load(folder)  # stale Parquet: rebuilt from the journals
    assert set(table[table.point_id == pid].session) == {"z-copy"}
    assert table.groupby("point_id").size().equals(before.groupby("point_id").size())
    assert table.groupby("point_id")["session"].nunique().max() == 1
    # The Parquet alone (journals gone) still holds them; without it, the journals rebuild it.
    sweep.run(card, SweepOptions(out=out, **OPTS, resume=True, isolate=False))
    kept = sweep_timelines.load(folder)
    assert kept.equals(table)
    for j in results.journals(folder):
        j.unlink()
    assert sweep_timelines.load(folder).equals(kept)
    capsys.readouterr()


def test_an_instrumented_launch_that_fails_is_an_error_row_naming_it(tmp_path, monkeypatch):
    card = dataclasses.replace(load(tmp_path, card_text()), planner_knobs=())

    def boom(self, *a, **k):
        raise RuntimeError("no room for the records")

    monkeypatch.setattr(impls.KernelImpl, "timeline", boom)
    res = sweep.run(card, SweepOptions(out=tmp_path / "runs", **OPTS, isolate=False, timelines=True, limit=1))
    df = results.load(res.sweep_dir)
    assert list(df.status) == ["error"] and df.p50_us.notna().all()
    assert "the instrumented launch (--timelines) failed: RuntimeError: no room" in df.error[0]
    assert sweep_timelines.load(res.sweep_dir).empty


def test_what_cannot_record_is_refused_in_one_line(tmp_path, capsys):
    card = load(tmp_path, tiny_card("t_exact"), "exact.toml")  # a launcher without a work-list twin
    opts = SweepOptions(out=tmp_path / "runs", **OPTS, timelines=True)
    for call in (lambda: sweep.run(card, opts), lambda: sweep.Runner(card, opts).describe()):
        with pytest.raises(SplitlabError, match="timelines=True is not allowed for card 't_exact'") as e:
            call()
        assert "\n" not in str(e.value)
    assert not (tmp_path / "runs").exists()  # refused before anything was written
    code = main(["sweep", str(tmp_path / "exact.toml"), "--out", str(tmp_path / "runs"), "--grid", "quick",
                 "--timer", "fake", "--timelines"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and "timelines=True is not allowed" in err
    # Which families' work-list launchers record: every family's.
    fns = {f.kind: impls.resolve(f.launcher) for f in ALL if f.worklist is not None}
    records = {k: impls.KernelImpl(fn, fn, fn).records_timelines for k, fn in fns.items()}
    assert records == {"gqa": True, "mla": True, "sparse_mla": True}, records
