"""Result files: the schema, the Parquet round trip, reading many sweeps, refusing unknown schema versions."""

import json
import math

import pandas as pd
import pytest

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
        f.write(json.dumps({"event": "row", "row": row(5, p50_us=99.0)}) + "\n")  # a duplicate: first kept
    df = results.load(d)
    assert len(df) == 3 and df[df.num_splits == 6].p50_us.item() == 15.0


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
