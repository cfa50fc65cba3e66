"""``planners.fitted_range``: the range of the data the splitlab planner's constants were fitted on, and the plans
that lie outside it (``splitlab plan``'s ``fitted_range`` column)."""

import pandas as pd
import pytest

from splitlab import devices, workloads
from splitlab.planners import fitted_range as fr

H200 = devices.get("h200")


def _rows(**cols) -> pd.DataFrame:
    n = len(next(iter(cols.values())))
    base = dict(kernel=["gqa_decode"] * n, status=["ok"] * n, timing=["graph"] * n, device=["h200-sxm"] * n,
                dtype=["bf16"] * n, num_q_heads=[32] * n, ctx_len=[8192] * n, topk=[0] * n, batch=[1] * n)
    df = pd.DataFrame(base | cols)
    df["kv_bytes"] = [workloads.DecodeWorkload(kind="gqa", batch=b, num_q_heads=h, num_kv_heads=8, head_dim_qk=128,
                                               head_dim_v=128, ctx_len=c).kv_bytes
                      for b, h, c in zip(df["batch"], df["num_q_heads"], df["ctx_len"], strict=True)]
    return df


def test_ranges_span_the_correct_measurements_only():
    df = _rows(batch=[1, 32, 128, 512, 4], ctx_len=[131072, 131072, 4096, 4096, 2048],
               status=["ok", "ok", "ok", "wrong", "ok"], timing=["graph", "graph", "events", "graph", "fake"],
               num_q_heads=[32, 64, 32, 32, 16])
    got = fr.ranges_from_rows(df)
    assert list(got) == ["gqa"]
    r = got["gqa"]
    assert r["batch"] == [1, 128] and r["ctx_len"] == [4096, 131072] and r["heads"] == [32, 64]  # not wrong, not fake
    assert r["devices"] == ["h200-sxm"] and r["dtypes"] == ["bf16"]
    assert r["kv_bytes"] == [int(df["kv_bytes"][:3].min()), int(df["kv_bytes"][:3].max())]
    sparse = fr.ranges_from_rows(_rows(kernel=["sparse_mla_decode"], topk=[2048], batch=[8]))["sparse_mla"]
    assert sparse["topk"] == [2048, 2048] and "ctx_len" not in sparse  # its keys are the top-k, not the pool


def test_outside_names_each_field_that_lies_outside():
    r = fr.ranges_from_rows(_rows(batch=[1, 32, 128, 1], ctx_len=[131072, 131072, 4096, 4096]))["gqa"]

    def why(**kw):
        w = workloads.get("llama-3-8b", **{"batch": 1, "ctx_len": 8192} | kw)
        return fr.outside(w, H200, r)

    assert why() == [] and why(batch=32, ctx_len=131072) == [] and why(batch=128, ctx_len=4096) == []
    assert why(batch=256) == ["batch 256 > 128 fitted"]
    assert why(ctx_len=1024) == ["ctx_len 1024 < 4096 fitted"]
    assert why(ctx_len=4096) == [] and why(ctx_len=2048, batch=2) == ["ctx_len 2048 < 4096 fitted"]
    assert why(dtype="fp8_e4m3") == ["dtype fp8_e4m3 not fitted (bf16)"]
    # each field inside, but not together: the data thin out at long contexts (the KV a call reads)
    assert why(batch=64, ctx_len=131072)[0].startswith("batch 64 > 32 fitted at ctx_len 131072 (KV read ")
    assert fr.outside(workloads.get("llama-3-8b"), devices.get("b200"), r) == ["device b200 not fitted (h200-sxm)"]
    # and below the smallest call measured
    r = fr.ranges_from_rows(_rows(batch=[1, 128], ctx_len=[131072, 4096]))["gqa"]
    small = workloads.get("llama-3-8b", batch=1, ctx_len=4096)
    assert fr.outside(small, H200, r) == ["KV read 0.0168 < 0.537 GB fitted"]


def test_check_on_the_shipped_data_marks_the_issues_example():
    w = workloads.get("llama-3-70b", batch=64, ctx_len=131072)
    assert fr.check(w, H200) == "outside: batch 64 > 32 fitted at ctx_len 131072 (KV read 34.4 > 17.2 GB)"
    assert fr.check(w.with_(batch=32), H200) == "ok"
    assert fr.check(workloads.get("deepseek-v3-mla", batch=8, ctx_len=81920), H200) == "ok"
    assert fr.check(workloads.get("deepseek-v3.2-sparse-mla", batch=8, ctx_len=65536), H200) == "ok"
    assert fr.check(w.with_(batch=32), devices.get("mi355x")).startswith("outside: device mi355x not fitted")
    assert fr.check(w, H200, planner="flashinfer") is None  # an upstream rule: fitted on nothing here


def test_the_shipped_range_is_the_fit_sets_range():
    """The range the shipped constants record is what the catalog's fit sets cover (computed from the data)."""
    pytest.importorskip("pyarrow")
    from splitlab import catalog, results

    names = catalog.names("fit")
    assert names, f"{catalog.CATALOG} names no fit set"
    computed = fr.ranges_from_rows(results.load_points(*names))
    for kind in ("gqa", "mla", "sparse_mla"):
        recorded = fr.fitted_range(kind, H200)
        assert {k: v for k, v in recorded.items() if k != "source"} == computed[kind], kind


def test_a_users_constants_file_brings_its_own_range(tmp_path, capsys):
    """``splitlab plan --constants FILE``: the range is the one FILE records for its device; a file without that
    record has none (``unknown``), not the shipped data's."""
    import json
    import re

    from splitlab.cli import main
    from splitlab.planners import fitted

    text = (fitted.SHIPPED_DIR / "h200-sxm.toml").read_text().replace('"h200-sxm"', '"mi355x"')
    with_range, without = tmp_path / "mi355x.toml", tmp_path / "bare.toml"
    with_range.write_text(text)
    without.write_text(re.sub(r"(?ms)^\[(gqa|mla|sparse_mla)\.range\]\n.*?(?=^\[|\Z)", "", text))
    argv = ["plan", "--workload", "llama-3-8b", "--batch", "4", "--ctx", "32k", "--device", "mi355x", "--planner",
            "splitlab", "--json", "--constants"]
    got = {}
    for f in (with_range, without):
        assert main([*argv, str(f)]) == 0
        got[f] = json.loads(capsys.readouterr().out)[0]["fitted_range"]
    assert got[with_range] == "ok"
    assert got[without] == "unknown: the constants record no range of their data"
