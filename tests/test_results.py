"""Result files: the schema, the Parquet round trip, reading many sweeps, refusing unknown schema versions."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitlab import analysis, planners, results
from splitlab.bench.grid import point_id
from splitlab.errors import SplitlabError
from splitlab.results import SchemaError
from splitlab.workloads import DecodeWorkload

REQUIRED = ("schema_version, sweep_id, point_id, kernel, impl, kind, batch, num_q_heads, num_kv_heads, head_dim_qk, "
            "head_dim_v, ctx_len, page_size, topk, dtype, num_splits, block_n, block_k, block_h, num_warps, "
            "num_stages, ctas, waves, timing, p20_us, p50_us, p80_us, n_samples, kv_bytes, gbps, rel_err, status, "
            "error").split(", ")


def row(i, *, sweep="s1", status="ok", version=results.SCHEMA_VERSION, **kw):
    w = DecodeWorkload("gqa", 1 + i, 32, 8, 128, 128, 8192)
    r = dict.fromkeys(results.COLUMNS)
    r.update(schema_version=version, sweep_id=sweep, point_id=point_id("gqa_decode", "x", w, {"num_splits": i}),
             kernel="gqa_decode", impl="splitlab-triton", **{k: v for k, v in w.row().items() if k != "seq_lens"},
             num_splits=1 + i, block_n=64, num_warps=4, num_stages=3, block_h=16, ctas=8 * (1 + i), waves=0.5,
             timing="graph", p20_us=9.0, p50_us=10.0 + i, p80_us=11.0, n_samples=30, kv_bytes=w.kv_bytes,
             gbps=w.kv_bytes / 1e4, rel_err=0.003, status=status, planners="splitlab,flex" if i == 0 else "",
             in_grid=True)
    r.update(kw)
    return r


def sweep_folder(tmp_path, name, rows, *, parquet=True):
    d = tmp_path / name
    d.mkdir(parents=True)
    (d / "sweep.json").write_text(json.dumps({"sweep_id": rows[0]["sweep_id"]}))
    j = d / "journal-20260101T000000Z-1-abcd.jsonl"
    j.write_text("".join(json.dumps({"event": "row", "row": r}) + "\n" for r in rows))
    if parquet:
        results.write_parquet(results.frame(rows), d / "results.parquet", journal_sizes={j.name: j.stat().st_size})
    return d


def test_schema_has_the_required_columns():
    assert list(results.REQUIRED) == REQUIRED
    assert set(REQUIRED) <= set(results.COLUMNS)


def test_parquet_round_trip_keeps_types_and_missing_values(tmp_path):
    rows = [row(0), row(1, status="wrong", p20_us=None, p50_us=None, p80_us=None, gbps=None, rel_err=math.inf,
                        error="rel_err inf > tolerance"), row(2, status="error", error="RuntimeError: boom")]
    df = results.frame(rows)
    results.write_parquet(df, tmp_path / "r.parquet")
    back = results.load(tmp_path / "r.parquet")
    assert list(back.columns[: len(results.COLUMNS)]) == list(results.COLUMNS)
    pd.testing.assert_frame_equal(back, df)
    assert back.block_k.isna().all() and str(back.block_k.dtype) == "Int64" and str(back.in_grid.dtype) == "boolean"
    assert back.rel_err.iloc[1] == math.inf and pd.isna(back.p50_us.iloc[1]) and back.error.iloc[2].startswith("Run")
    assert results.parquet_meta(tmp_path / "r.parquet")["schema_version"] == results.SCHEMA_VERSION
    # CSV for eyes.
    out = results.to_csv(tmp_path / "r.parquet", tmp_path / "r.csv")
    assert len(pd.read_csv(out)) == 3


def test_load_reads_many_sweeps_into_one_frame(tmp_path):
    a = sweep_folder(tmp_path / "data", "gqa_decode-default", [row(i, sweep="A") for i in range(3)])
    sweep_folder(tmp_path / "data", "mla_decode-default", [row(i, sweep="B") for i in range(2)], parquet=False)
    df = results.load(tmp_path / "data")
    assert len(df) == 5 and sorted(df.sweep_id.unique()) == ["A", "B"]
    # The same sweep named twice is read once.
    assert len(results.load(tmp_path / "data", a)) == 5
    assert len(results.load(a, a / "results.parquet")) == 3


def test_a_stale_parquet_gives_way_to_the_journal(tmp_path):
    d = sweep_folder(tmp_path, "s", [row(i) for i in range(2)])
    j = next(d.glob("journal-*.jsonl"))
    with open(j, "a") as f:  # the sweep went on after the last Parquet refresh
        f.write(json.dumps({"event": "row", "row": row(5)}) + "\n")
        f.write(json.dumps({"event": "row", "row": row(5, p50_us=99.0)}) + "\n")  # a duplicate: the later kept
    df = results.load(d)
    assert len(df) == 3 and df[df.num_splits == 6].p50_us.item() == 99.0


def test_unknown_schema_versions_are_refused(tmp_path):
    d = sweep_folder(tmp_path, "new", [row(0, version=2)], parquet=False)
    with pytest.raises(SchemaError, match=r"schema_version=2 is not allowed; expected one of 1"):
        results.load(d)
    df = results.frame([row(0)])
    df["schema_version"] = pd.array([7], dtype="Int64")
    df.to_parquet(tmp_path / "future.parquet")
    with pytest.raises(SchemaError, match="future.parquet: schema_version=7"):
        results.load(tmp_path / "future.parquet")
    pd.DataFrame({"x": [1]}).to_parquet(tmp_path / "alien.parquet")
    with pytest.raises(SchemaError, match="alien.parquet: no schema_version column"):
        results.load(tmp_path / "alien.parquet")
    partial = results.frame([row(0)]).drop(columns=["gbps", "status"])
    partial.to_parquet(tmp_path / "partial.parquet")
    with pytest.raises(SchemaError, match="columns gbps, status are missing"):
        results.load(tmp_path / "partial.parquet")
    with pytest.raises(SplitlabError, match="is not allowed"):
        results.load(tmp_path / "nowhere")


def test_journal_reading():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as t:
        j = Path(t) / "journal-x.jsonl"
        j.write_text('{"event":"start","point_id":"a"}\n{"event":"row","row":{"point_id":"a"}}\n{"event":"st')
        assert [e["event"] for e in results.read_journal(j)] == ["start", "row"]  # torn tail ignored
        j.write_text('{"event":"start"}\nnot json\n{"event":"row","row":{}}\n')
        with pytest.raises(SplitlabError, match="line 2 is not JSON"):
            results.read_journal(j)


def test_helpers_for_analysis():
    df = results.frame([row(0), row(1)])
    w = results.workload(df.iloc[0])
    assert w == DecodeWorkload("gqa", 1, 32, 8, 128, 128, 8192)
    assert planners.plan(w, "h200", "splitlab").num_splits >= 1  # ask a planner after the fact
    ch = analysis.planner_choices(df)  # the columns analysis reads
    assert sorted(ch.planner) == ["flex", "splitlab"] and (ch.num_splits == 1).all()


# --- one row per measurement --------------------------------------------------------------------------------

T0, T1 = "2026-01-01T10:00:00+0000", "2026-01-01T12:00:00+0100"  # T1 is an hour after T0 (UTC)


def test_duplicates_keep_the_best_row_deterministically(tmp_path):
    """ok over wrong over error over skipped; then the newest finished_at (rows without one count as oldest);
    then the row read last. A wrong row never hides an ok one, whatever the order."""
    ok_old, ok_new = row(0, finished_at=T0, p50_us=1.0), row(0, finished_at=T1, p50_us=2.0)
    wrong = row(0, status="wrong", finished_at=T1, p50_us=None, error="rel_err 1 > tolerance")
    err = row(0, status="error", finished_at=T1, p50_us=None, error="boom")
    undated = row(0, finished_at=None, p50_us=3.0)
    cases = [([wrong, ok_old], 1.0), ([ok_old, wrong], 1.0), ([ok_new, ok_old], 2.0), ([ok_old, ok_new], 2.0),
             ([ok_old, undated], 1.0), ([err, wrong, undated], 3.0)]
    for i, (rows, p50) in enumerate(cases):
        d = sweep_folder(tmp_path, f"s{i}", rows, parquet=False)
        df = results.load(d)
        assert len(df) == 1 and df.p50_us.item() == p50, (i, df[["status", "p50_us"]])
        assert results.sweep_state(d).duplicates == len(rows) - 1
        best = results.best_rows(results.frame(rows))
        assert len(best) == 1 and best.p50_us.item() == p50 and best.attrs["duplicates"] == len(rows) - 1
    d = sweep_folder(tmp_path, "wrong-only", [err, wrong], parquet=False)
    assert results.load(d).status.item() == "wrong"


def test_rows_are_keyed_by_device_and_point_id(tmp_path):
    """point_id names a configuration, the same on every device; a measurement is (device, point_id)."""
    h200 = [row(i, sweep="A", device="h200") for i in range(3)]
    b200 = [row(i, sweep="B", device="b200", p50_us=5.0) for i in range(3)]
    assert [r["point_id"] for r in h200] == [r["point_id"] for r in b200]
    both = results.best_rows(results.frame(h200 + b200))
    assert len(both) == 6 and both.attrs["duplicates"] == 0
    assert len(results.best_rows(results.frame(h200 + b200), ["point_id"])) == 3  # what a point_id key would do
    sweep_folder(tmp_path / "data", "a", h200)
    sweep_folder(tmp_path / "data", "b", b200)
    df = results.load(tmp_path / "data")
    assert len(df) == 6 and sorted(df.device.unique()) == ["b200", "h200"]
    # A folder holding one point of each device (journals + Parquet extras) keeps both.
    d = sweep_folder(tmp_path, "mixed", [h200[0]])
    results.write_parquet(results.frame([b200[0]]), d / "results.parquet")  # only the Parquet holds the b200 row
    assert sorted(results.load(d).device) == ["b200", "h200"]


def test_an_unknown_status_is_refused(tmp_path):
    d = sweep_folder(tmp_path, "s", [row(0), row(1, status="fine")], parquet=False)
    with pytest.raises(SchemaError, match=r"journal-.*: status='fine' is not allowed; expected one of ok, wrong"):
        results.load(d)
    df = results.frame([row(0)])
    df["status"] = pd.array([None], dtype="string")
    df.to_parquet(tmp_path / "nostatus.parquet")
    with pytest.raises(SchemaError, match="nostatus.parquet: status=None is not allowed"):
        results.load(tmp_path / "nostatus.parquet")


# --- damaged inputs: one SplitlabError naming the file ---------------------------------------------------------

def _journal(d):
    return next(d.glob("journal-*.jsonl"))


def _edit_row(d, **kw):
    j = _journal(d)
    lines = j.read_text().splitlines()
    ev = json.loads(lines[0])
    ev["row"].update(kw)
    j.write_text("\n".join([json.dumps(ev), *lines[1:]]) + "\n")


def _truncate_parquet_alone(d):
    _journal(d).unlink()
    (d / "results.parquet").write_bytes((d / "results.parquet").read_bytes()[:99])


DAMAGED = {
    "truncated parquet, no journal": (_truncate_parquet_alone, "results.parquet: not a readable Parquet file"),
    "a journal line that is a list": (
        lambda d: _journal(d).write_text("[1, 2]\n" + _journal(d).read_text()), "line 1 is a JSON list"),
    "a row that is a number": (
        lambda d: _journal(d).write_text('{"event": "row", "row": 5}\n' + _journal(d).read_text()),
        "line 1: a row event whose row is int"),
    "a start without a point_id": (
        lambda d: _journal(d).write_text('{"event": "start"}\n' + _journal(d).read_text()),
        "line 1: a start event with point_id=None"),
    "a bad line in the middle": (
        lambda d: _journal(d).write_text('{"event": "row", "ro\n' + _journal(d).read_text()), "line 1 is not JSON"),
    "a non-UTF-8 line": (
        lambda d: _journal(d).write_bytes(b"\xff\xfe{}\n" + _journal(d).read_bytes()), "line 1 is not JSON"),
    "an integer column holding text": (lambda d: _edit_row(d, batch="abc"), "column batch holds 'abc'; expected Int64"),
    "an integer column holding 1.5": (lambda d: _edit_row(d, ctas=1.5), "column ctas holds 1.5; expected Int64"),
    "a float column holding text": (lambda d: _edit_row(d, p50_us="fast"), "column p50_us holds 'fast'"),
    "a string column holding an object": (lambda d: _edit_row(d, kernel={"a": 1}), "column kernel holds {'a': 1}"),
    "a boolean column holding text": (lambda d: _edit_row(d, in_grid="yes"), "column in_grid holds 'yes'"),
    "a huge integer": (lambda d: _edit_row(d, batch=10**30), "column batch holds 1000000000000000000000000000000"),
    "a schema_version that is text": (lambda d: _edit_row(d, schema_version="one"), "schema_version='one' is not"),
    "a row without a point_id": (lambda d: _edit_row(d, point_id=None), "a row event with point_id=None"),
    "a journal that is a folder": (
        lambda d: (d / "journal-29990101T000000Z-1-ffff.jsonl").mkdir(), "journal-29990101T000000Z-1-ffff.jsonl"),
}


@pytest.mark.parametrize("damage", list(DAMAGED))
def test_damaged_inputs_are_one_splitlab_error_naming_the_file(tmp_path, damage):
    harm, words = DAMAGED[damage]
    d = sweep_folder(tmp_path, "s", [row(i) for i in range(3)])
    harm(d)
    with pytest.raises(SplitlabError) as e:
        results.load(d)
    msg = str(e.value)
    assert words in msg and "\n" not in msg and str(d) in msg, msg


def test_a_damaged_parquet_beside_intact_journals_is_read_from_them(tmp_path):
    d = sweep_folder(tmp_path, "s", [row(i) for i in range(3)])
    good = (d / "results.parquet").read_bytes()
    pages = len(good) - 8 - int.from_bytes(good[-8:-4], "little")  # where the footer (schema, metadata) starts
    for damaged in (b"PAR1 not really", good[:4] + bytes(pages - 4) + good[pages:]):  # footer intact, pages not
        (d / "results.parquet").write_bytes(damaged)
        with pytest.warns(UserWarning, match="results.parquet: not a readable Parquet file.*reading the sweep from"):
            df = results.load(d)
        assert len(df) == 3
    with pytest.raises(SplitlabError, match="results.parquet: not a readable Parquet file"):
        results.load(d / "results.parquet")


def test_load_refuses_unreadable_paths_in_one_line(tmp_path):
    with pytest.raises(SplitlabError, match="cannot be read .*File name too long") as e:
        results.load(tmp_path / ("x" * 5000))
    assert "\n" not in str(e.value) and len(str(e.value)) < 500


def test_read_sidecar_checks_what_it_holds(tmp_path):
    p = tmp_path / "sweep.json"
    assert results.read_sidecar(p) is None
    for text, exc, words in [("{", results.DamagedFile, "not JSON"), ("[1]", results.DamagedFile, "a JSON list"),
                             (json.dumps({"schema_version": 2}), SchemaError, "schema_version=2 is not allowed"),
                             (json.dumps({"device": {"sm_count": "abc"}}), SplitlabError, "device.sm_count='abc'"),
                             (json.dumps({"device": {"sm_count": 0}}), SplitlabError, "device.sm_count=0"),
                             (json.dumps({"env": {"device": {"sm_count": None}}, "sweep_id": "x"}), None, "")]:
        p.write_text(text)
        if exc is None:
            assert results.read_sidecar(p)["sweep_id"] == "x"
            continue
        with pytest.raises(exc, match=words):
            results.read_sidecar(p)
    shipped = sorted(Path(__file__).resolve().parents[1].glob("data/*/*/sweep.json"))
    assert shipped and all(results.read_sidecar(s)["sweep_id"] for s in shipped)


# --- fuzz: damaged folders never give a traceback -------------------------------------------------------------

def _base_folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("base")
    rows = [row(i) for i in range(3)] + [row(1, status="wrong", p50_us=None, error="rel_err 1 > tolerance")]
    src = sweep_folder(d, "s", rows)
    with open(_journal(src), "a") as f:
        f.write(json.dumps({"event": "start", "point_id": "abc", "row": rows[0]}) + "\n")
        f.write(json.dumps({"event": "session", "session": "x"}) + "\n")
    return {p.name: p.read_bytes() for p in src.iterdir()}


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory):
    return _base_folder(tmp_path_factory)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids,
                                                                                     max_size=3), max_leaves=6)


@st.composite
def damages(draw):
    """A list of (file, kind, parameters) edits to a sweep folder's files."""
    ops = []
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(["results.parquet", "journal", "sweep.json"]))
        kind = draw(st.sampled_from(["truncate", "garble", "delete", "insert-line", "edit-row"]))
        ops.append((target, kind, draw(st.floats(0, 1)), draw(st.binary(min_size=1, max_size=16)),
                    draw(json_values), draw(st.sampled_from(list(results.COLUMNS) + ["event", "row"]))))
    return ops


def _apply(folder, ops):
    journal = next(folder.glob("journal-*.jsonl"))
    for target, kind, at, junk, value, column in ops:
        path = journal if target == "journal" else folder / target
        if not path.exists():
            continue
        data = path.read_bytes()
        cut = int(at * len(data))
        if kind == "truncate":
            path.write_bytes(data[:cut])
        elif kind == "garble":
            path.write_bytes(data[:cut] + junk + data[cut + len(junk):])
        elif kind == "delete":
            path.unlink()
        elif kind == "insert-line":
            lines = data.split(b"\n")
            i = int(at * len(lines))
            lines.insert(i, json.dumps(value).encode() if column != "row" else junk)
            path.write_bytes(b"\n".join(lines))
        else:  # a field of one event (or of its row) set to any JSON value
            lines = data.split(b"\n")
            i = min(int(at * len(lines)), len(lines) - 1)
            try:
                ev = json.loads(lines[i])
            except ValueError:
                continue
            if isinstance(ev, dict) and isinstance(ev.get("row"), dict) and column not in ("event", "row"):
                ev["row"][column] = value
            elif isinstance(ev, dict):
                ev[column] = value
            else:
                continue
            lines[i] = json.dumps(ev).encode()
            path.write_bytes(b"\n".join(lines))


@settings(max_examples=150, deadline=None)
@given(ops=damages())
def test_fuzz_load_of_damaged_folders_gives_a_frame_or_one_splitlab_error(base_folder, ops):
    import tempfile
    import warnings

    with tempfile.TemporaryDirectory() as t:
        folder = Path(t) / "s"
        folder.mkdir()
        for name, data in base_folder.items():
            (folder / name).write_bytes(data)
        _apply(folder, ops)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                df = results.load(folder)
        except SplitlabError as e:
            assert "\n" not in str(e) and str(folder) in str(e), str(e)
            return
        assert set(df.status) <= set(results.STATUSES)
        assert not df.duplicated(["sweep_id", *results.KEY]).any()
        assert [str(df[c].dtype) for c in results.COLUMNS] == [
            {"string": str(pd.StringDtype())}.get(t, t) for t in results.COLUMNS.values()]
