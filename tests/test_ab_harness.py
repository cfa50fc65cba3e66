"""``splitlab.bench.abharness``, the harness the kernel A/B scripts share, without a GPU: the command line, the checks
in child processes (one that fails, one that hangs, one that passes), the budget, a timed row (``time_graph`` stood
in for), the summary's pieces; and what the harness leans on: ``kernels.accuracy.verdict`` on CPU tensors and
``kernels.inputs.poisoned_allocs``. The scripts' own tests: ``test_mla_ws_ab.py``, ``test_mqa_ws_ab.py``."""

from __future__ import annotations

import math
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from splitlab.bench import abharness as harness
from splitlab.bench.csvrows import CsvRows, read_rows
from splitlab.kernels.accuracy import verdict

FIELDS = ["phase", "impl", "variant", "case", "batch", "status", "error", "rel_err", "lse_err", "us", "p20_us",
          "p80_us", "roofline", "splits", "ctas", "items", "elapsed_s"]


def _parse(argv):
    def own(p, name):
        if name != "check":
            p.add_argument("--budget-s", type=float, default=10.0)
            p.add_argument("--kinds", type=harness.split_list, default=["a"])
            p.add_argument("--sizes", type=harness.int_list, default=[1])
        else:
            p.add_argument("--kind", default="a")

    return harness.parse_ab_args(argv, "an A/B", own, 30.0, {"kinds": ("a", "b")})


def test_the_command_line():
    a = _parse(["all", "--out", "o", "--kinds", "b,a,", "--sizes", "3,1"])
    assert (a.cmd, a.out, a.kinds, a.sizes, a.replays, a.check_timeout_s) == ("all", "o", ["b", "a"], [3, 1], 20, 30.0)
    a = _parse(["check", "--out", "o", "--kind", "b"])
    assert a.kind == "b" and not hasattr(a, "replays") and not hasattr(a, "check_timeout_s")
    assert not hasattr(_parse(["run", "--out", "o"]), "check_timeout_s")
    assert _parse(["summary", "x.csv"]).csv == "x.csv"


@pytest.mark.parametrize("argv", [["run", "--out", "o", "--kinds", "c"], ["run", "--out", "o", "--sizes", "x"],
                                  ["run"], ["summary"], []])
def test_refuses_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit):
        _parse(argv)
    if argv[-1:] == ["c"]:
        assert "kind 'c': expected one of a, b" in capsys.readouterr().err


def test_run_command_dispatches_and_prints_the_summary(tmp_path, capsys):
    path = tmp_path / "ab.csv"
    rows = CsvRows(path, FIELDS)
    rows.write(phase="check", impl="x", case="c", status="ok", rel_err="1.00e-03")
    rows.close()
    did = []
    cmds = dict(check=lambda a: did.append("check"), run=lambda a: did.append("run"),
                run_all=lambda a: did.append("all"))
    for argv in (["check", "--out", "o"], ["run", "--out", "o"], ["all", "--out", "o"]):
        assert harness.run_command(_parse(argv), harness.check_lines, **cmds) == 0
    assert did == ["check", "run", "all"]
    harness.run_command(_parse(["summary", str(path)]), harness.check_lines, **cmds)
    assert capsys.readouterr().out == "check x: 1/1 ok, largest rel_err 1.00e-03\n"


def test_error_text_and_checks_passed():
    assert harness.error_text(ValueError("x" * 500)) == "ValueError: " + "x" * harness.ERROR_CHARS
    rows = [dict(phase="check", impl="a", status="ok"), dict(phase="check", impl="b", status="wrong"),
            dict(phase="check", impl="b", status="ok"), dict(phase="time", impl="c", status="ok")]
    assert harness.checks_passed(rows, "impl", "a") is True
    assert harness.checks_passed(rows, "impl", "b") is False
    assert harness.checks_passed(rows, "impl", "c") is False  # no check row: not passed


# A check child: ``good`` writes an ok row, ``bad`` exits 2, ``slow`` never finishes in time.
CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from splitlab.bench.csvrows import CsvRows
kind = sys.argv[sys.argv.index("--kind") + 1]
out = sys.argv[sys.argv.index("--out") + 1]
assert sys.argv[1] == "check"
if kind == "bad":
    sys.exit(2)
if kind == "slow":
    time.sleep(60)
rows = CsvRows(out + "/ab.csv", {fields!r})
rows.write(phase="check", impl=kind, case="c", status="ok")
rows.close()
"""


def test_checks_run_in_children_at_once_with_a_time_limit(tmp_path):
    root = str(Path(harness.__file__).resolve().parents[2])
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD.format(root=root, fields=FIELDS)))
    t0 = time.time()
    rows = harness.check_in_children(str(script), tmp_path, tmp_path / "ab.csv", FIELDS,
                                     {k: ["--kind", k] for k in ("good", "bad", "slow")}, 8.0, t0,
                                     lambda name: dict(impl=name, variant=f"v-{name}"))
    assert time.time() - t0 < 30  # the hung child is killed at the limit
    got = {r["impl"]: r for r in rows}
    assert set(got) == {"good", "bad", "slow"} and len(rows) == 3
    assert got["good"]["status"] == "ok" and got["good"]["variant"] == ""
    assert (got["bad"]["status"], got["bad"]["variant"]) == ("error", "v-bad")
    assert got["bad"]["error"] == "the check process exited with code 2"
    assert got["slow"]["status"] == "timeout" and got["slow"]["error"] == "the check did not finish in 8 s"
    assert rows == read_rows(tmp_path / "ab.csv")
    assert (tmp_path / "ab.csv").read_text().splitlines()[0] == ",".join(FIELDS)


def test_check_rows_budget_and_schedule_fields(tmp_path, capsys):
    from splitlab.planners import schedulers

    rows = CsvRows(tmp_path / "ab.csv", FIELDS)
    row = dict(phase="check", impl="k", case="odd", **harness.verdict_fields(1.234e-3, 0.0, "ok", ""))
    harness.write_check(rows, row, time.time())
    assert capsys.readouterr().out == "check k odd: ok 1.23e-03 \n"
    assert not harness.budget_spent(rows, time.time(), 100.0, 5, 2)
    assert harness.budget_spent(rows, time.time() - 10, 5.0, 5, 2)
    assert capsys.readouterr().out == "budget spent: 3 of 5 batches not run\n"
    s = schedulers.uniform([1000, 0, 77], 3)
    fields = harness.schedule_fields(s)
    assert fields == dict(splits=max(s.partials), ctas=s.ctas, items=len(s.items)) and fields["splits"] == 3
    rows.write(phase="time", impl="t", **fields)
    rows.close()
    got = read_rows(tmp_path / "ab.csv")
    assert (got[0]["rel_err"], got[0]["lse_err"], got[0]["status"]) == ("1.23e-03", "0.00e+00", "ok")
    assert float(got[0]["elapsed_s"]) >= 0
    assert (got[1]["impl"], got[1]["status"], got[1]["error"]) == ("-", "budget", "3 batches not run")


def test_ab_workload_draws_each_batch_its_own_lengths():
    a = harness.ab_workload("gqa", 8, 128, 128, 128, 4096, 16, "longtail")
    assert (a.batch, a.num_q_heads, a.num_kv_heads, a.head_dim_qk, a.ctx_len, a.page_size, a.length_dist) == (
        8, 128, 1, 128, 4096, 16, "longtail")
    assert a.lengths == harness.ab_workload("gqa", 8, 128, 128, 128, 4096, 16, "longtail").lengths
    assert a.lengths != harness.ab_workload("gqa", 8, 128, 128, 128, 8192, 16, "longtail").lengths
    assert harness.ab_workload("mla", 4, 64, 576, 512, 4096, 64, "uniform").length_seed == 0


def test_time_row_checks_before_it_times(monkeypatch):
    from splitlab.bench import timing
    from splitlab.kernels import _launch

    timed = []

    def fake_graph(fns, replays):  # stands in for CUDA-graph replay: no GPU here
        timed.append((len(fns), replays))
        return SimpleNamespace(p50_us=10.0, p20_us=9.0, p80_us=12.0)

    monkeypatch.setattr(timing, "time_graph", fake_graph)
    ref = torch.randn(2, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def make(scale, write=True):
        def launch():
            out = _launch.alloc(2, 4, 8, dtype=torch.float64, device="cpu")  # NaN inside time_row
            if write:
                out.copy_(ref * scale)
            return out
        return lambda x: launch

    row = {}
    harness.time_row(row, make(1.0), [0, 1, 2], ref, 5.0, 1e-2, 7)
    assert row == dict(rel_err="0.00e+00", us=10.0, p20_us=9.0, p80_us=12.0, roofline=0.5, status="ok")
    assert timed == [(3, 7)]
    row = {}
    harness.time_row(row, make(1.1), [0, 1], ref, 5.0, 1e-2, 7)  # 10% off: wrong, not timed
    assert row["status"] == "wrong" and float(row["rel_err"]) > 1e-2 and "us" not in row and len(timed) == 1
    row = {}
    harness.time_row(row, make(1.0, write=False), [0], ref, 5.0, 1e-2, 7)  # never written: NaN, wrong
    assert row["status"] == "wrong" and len(timed) == 1
    line = []
    rows = SimpleNamespace(written=[], write=lambda **r: rows.written.append(r))
    harness.write_timed(rows, dict(impl="a", status="ok", us=10.0), time.time(), line)
    harness.write_timed(rows, dict(impl="b", status="wrong"), time.time(), line)
    assert line == ["a 10.0", "b wrong"] and all("elapsed_s" in r for r in rows.written)


def test_summary_pieces():
    assert math.isclose(harness.geomean([1.25, 4.0]), math.sqrt(5)) and math.isnan(harness.geomean([0, -1]))
    assert harness.geomean([2.0, math.inf, 8.0]) == pytest.approx(4.0)
    assert harness.ratio_texts(("a", [1.25, 4.0]), ("b", [])) == ["vs a 2.236 (worst 1.250)"]

    def t(impl, g, dist, batch, us, status="ok"):
        return dict(phase="time", impl=impl, page=str(g), dist=dist, batch=str(batch), longest="8192", us=str(us),
                    status=status, error="" if status == "ok" else "why")

    rows = [t("x", 64, "uniform", 8, 10), t("y", 64, "uniform", 8, 20), t("x", 64, "uniform", 16, 30),
            t("x", 16, "longtail", 8, 40), t("y", 16, "uniform", 8, 1, status="wrong"),
            dict(phase="check", impl="x", case="c1", status="ok", rel_err="1.00e-03", error=""),
            dict(phase="check", impl="x", case="c2", status="timeout", rel_err="", error="hung"),
            dict(phase="check", impl="y", case="c1", status="error", rel_err="", error="")]
    groups = harness.timed_groups(rows, "page")
    assert [(k, len(g), impls) for k, g, impls in groups] == [((16, "longtail"), 1, ["x"]),
                                                              ((64, "uniform"), 2, ["x", "y"])]
    assert [k for k, *_ in harness.timed_groups(rows, "page", order=lambda k: (-k[0], k[1]))] == [
        (64, "uniform"), (16, "longtail")]
    assert harness.check_lines(rows) == ["check x: 1/2 ok, largest rel_err 1.00e-03; c2: timeout hung",
                                         "check y: 0/1 ok; c1: error"]
    assert harness.not_ok_lines(rows, lambda r: f"p{r['page']}") == ["time y p16: wrong why"]
    lines = harness.summary_lines(rows, "page", lambda k, n: f"page {k[0]} {k[1]} ({n})",
                                  lambda impl, mine: f"  {impl} {sum(float(v[impl]['us']) for v in mine)}",
                                  lambda r: f"p{r['page']}")
    assert lines == ["page 16 longtail (1)", "  x 40.0", "page 64 uniform (2)", "  x 40.0", "  y 20.0",
                     *harness.check_lines(rows), "time y p16: wrong why"]


def test_verdict_on_cpu_tensors():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(3, 4, 8, generator=g, dtype=torch.float64)
    ref_lse = torch.randn(3, 4, generator=g, dtype=torch.float64)
    ref[1], ref_lse[1] = 0.0, -math.inf  # an empty request
    out, lse = ref.to(torch.bfloat16), ref_lse.float()
    err, lerr, status, why = verdict(out, lse, ref, ref_lse, torch.bfloat16)
    assert status == "ok" and why == "" and err < 1e-2 and lerr < 1e-6
    noisy = (ref * 1.1).to(torch.bfloat16)
    assert verdict(noisy, lse, ref, ref_lse, torch.bfloat16)[2] == "wrong"
    one_nan = out.clone()
    one_nan[0, 2, 5] = float("nan")  # one NaN where a finite row is due: wrong, never a pass
    assert verdict(one_nan, lse, ref, ref_lse, torch.bfloat16)[2] == "wrong"
    nan_out, nan_lse = out.clone(), lse.clone()
    nan_out[0], nan_lse[0] = float("nan"), float("nan")
    assert verdict(nan_out, nan_lse, ref, ref_lse, torch.bfloat16)[2] == "wrong"  # NaN where none is due
    assert verdict(nan_out, nan_lse, ref, ref_lse, torch.bfloat16, nan_rows=(0,))[2] == "ok"
    assert verdict(out, lse, ref, ref_lse, torch.bfloat16, nan_rows=(0,))[2] == "wrong"  # NaN due, none
    half = nan_out.clone()
    half[0, 0] = 1.0  # a row due NaN that is only partly NaN
    assert verdict(half, nan_lse, ref, ref_lse, torch.bfloat16, nan_rows=(0,))[2] == "wrong"
    unwritten = out.clone()
    unwritten[1, 2] = float("nan")  # an empty request's row left as the poisoned buffer was
    assert verdict(unwritten, lse, ref, ref_lse, torch.bfloat16)[2] == "wrong"


def test_poisoned_allocs_fill_new_buffers_with_nan():
    from splitlab.kernels import _launch
    from splitlab.kernels.inputs import poisoned_allocs

    with poisoned_allocs():
        t = _launch.alloc(2, 3, dtype=torch.float32, device="cpu")
        i = _launch.alloc(2, dtype=torch.int32, device="cpu")
    assert torch.isnan(t).all() and i.dtype == torch.int32
    assert not torch.isnan(_launch.alloc(2, dtype=torch.float32, device="cpu").fill_(0)).any()


def test_the_harness_imports_only_the_standard_library_at_module_level():
    # The scripts import it beside their argument parsing, where no GPU (and possibly no torch) is.
    import ast

    tree = ast.parse(Path(harness.__file__).read_text())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert top <= set(sys.stdlib_module_names) | {"__future__", "splitlab"}
    splitlab_mods = {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(
        "splitlab")}
    assert splitlab_mods == {"splitlab.bench.csvrows"}
