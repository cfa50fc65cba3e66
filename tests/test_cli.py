"""The command line: tables, JSON, and one-line errors with exit code 2."""

import json
import os
from pathlib import Path

import pytest

from splitlab.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_devices_lists_presets(capsys):
    code, out, _ = run(capsys, "devices")
    assert code == 0 and "h200-sxm" in out and "mi355x" in out
    code, out, _ = run(capsys, "devices", "--json")
    assert {d["name"] for d in json.loads(out)} >= {"h100-sxm", "h200-sxm", "b200", "gb10", "mi325x"}


def test_plan_reproduces_seed_000_phase0_on_mi355x(capsys):
    # Seed 000's Phase 0 sweep (MLA-style, h=64, MI355X 256 CUs): (batch, ctx) -> np.
    phase0 = {(1, 131072): 128, (2, 65536): 64, (2, 81920): 64, (2, 131072): 128, (8, 81920): 32,
              (8, 131072): 32, (16, 131072): 16}
    code, out, _ = run(capsys, "plan", "--kind", "mla", "--heads", "64", "--batch", "1,2,8,16",
                       "--ctx", "65536,81920,131072", "--device", "MI355X", "--planner", "modular", "--json")
    assert code == 0
    got = {(r["batch"], r["ctx_len"]): r["num_splits"] for r in json.loads(out)}
    assert {k: got[k] for k in phase0} == phase0


def test_plan_table_for_every_planner(capsys):
    code, out, _ = run(capsys, "plan", "--workload", "deepseek-v3-mla", "--batch", "8", "--ctx", "81920",
                       "--device", "mi355x,h200,rtx5090")
    assert code == 0
    for name in ("modular", "flashmla", "splitlab", "last_wave_fill"):
        assert name in out
    code, out, _ = run(capsys, "plan", "--workload", "llama-3-8b", "--json", "--planner", "all")
    rows = json.loads(out)
    assert all(r["num_splits"] >= 1 and r["ctas"] >= 1 and 0 < r["last_wave_fill"] <= 1 for r in rows)


LONG = "x" * 300  # longer than a file name may be (255 bytes)


@pytest.mark.parametrize("argv, needle", [
    (["plan", "--workload", "llama-3-8b", "--batch", "0"], "--batch: '0' is not allowed; expected an integer in [1, "),
    (["plan", "--workload", "llama-3-8b", "--batch", "-3"], "--batch: '-3'"),
    (["plan", "--workload", "llama-3-8b", "--batch", "two"], "--batch: 'two' is not an integer"),
    (["plan", "--workload", "llama-3-8b", "--batch", "1000000000000"], "[1, 65536]"),  # was a MemoryError
    (["plan", "--workload", "llama-3-8b", "--batch", "1e30"], "--batch: '1e30' is not an integer"),
    (["plan", "--workload", "llama-3-8b", "--batch", "100000000"], "[1, 65536]"),  # hung in the per-request planners
    (["plan", "--workload", "llama-3-8b", "--batch", ""], "--batch: ''"),
    (["plan", "--workload", "llama-3-8b", "--batch", "1,,2"], "--batch: '1,,2'"),
    (["plan", "--workload", "llama-3-8b", "--ctx", "1.5"], "--ctx: '1.5' is not an integer"),
    (["plan", "--workload", "llama-3-8b", "--ctx", str(1 << 40)], "--ctx"),
    (["plan", "--workload", "llama-3-8b", "--heads", "12"], "num_q_heads=12"),
    # Ragged batches: a named distribution (and seed), or the lengths themselves.
    (["plan", "--kind", "gqa", "--lengths", "gauss"], "--lengths: 'gauss' is not allowed; expected DIST[:SEED], "
     "DIST one of uniform, spread4, "),
    (["plan", "--kind", "gqa", "--lengths", "uniform:3"], "--lengths: 'uniform:3' is not allowed: uniform lengths"),
    (["plan", "--kind", "gqa", "--lengths", "spread16:-1"], "--lengths: 'spread16:-1' is not allowed"),
    (["plan", "--kind", "gqa", "--lengths", "spread16:x"], "SEED an integer in [0, 2147483647]"),
    (["plan", "--kind", "gqa", "--lengths", "spread16:" + "9" * 5000], "(5009 characters) is not allowed"),
    (["plan", "--kind", "gqa", "--seq-lens", "-5"], "--seq-lens: '-5' is not allowed; expected an integer in [0, "),
    (["plan", "--kind", "gqa", "--seq-lens=40,-5"], "--seq-lens: '-5' is not allowed"),
    (["plan", "--kind", "gqa", "--seq-lens", "40,x"], "--seq-lens: 'x' is not an integer"),
    (["plan", "--kind", "gqa", "--seq-lens", "40,,2"], "--seq-lens: '40,,2' is not allowed"),
    (["plan", "--kind", "gqa", "--seq-lens", "0,0"], "--seq-lens: '0,0' is not allowed; expected at least one length"),
    (["plan", "--kind", "gqa", "--seq-lens", "40,5", "--batch", "3"],
     "--batch=3 is not allowed with --seq-lens of 2 lengths; expected --batch 2 or no --batch"),
    (["plan", "--kind", "gqa", "--seq-lens", "40,5", "--batch", "2,4"], "--batch=2,4 is not allowed with --seq-lens"),
    (["plan", "--kind", "gqa", "--seq-lens", "40,5", "--ctx", "40"], "--ctx=40 is not allowed with --seq-lens"),
    (["plan", "--kind", "gqa", "--seq-lens", "40,5", "--lengths", "spread4"],
     "--lengths=spread4 is not allowed with --seq-lens; expected one of them"),
    (["plan", "--kind", "sparse_mla", "--seq-lens", "40,5"], "--seq-lens is not allowed for kind sparse_mla"),
    # A flag given as 0 was replaced by the preset's value; now refused.
    (["plan", "--kind", "gqa", "--heads", "0"], "--heads: '0' is not allowed"),
    (["plan", "--kind", "gqa", "--kv-heads", "0"], "--kv-heads: '0' is not allowed"),
    (["plan", "--kind", "gqa", "--head-dim", "0"], "--head-dim: '0' is not allowed"),
    (["plan", "--kind", "mla", "--head-dim-v", "0"], "--head-dim-v: '0' is not allowed"),
    (["plan", "--kind", "gqa", "--page-size", "0"], "--page-size: '0' is not allowed"),
    (["plan", "--kind", "gqa", "--heads", "8192"], "--heads: '8192' is not allowed; expected an integer in [1, 4096]"),
    (["plan", "--kind", "sparse_mla", "--topk", "0"], "--topk: '0'"),
    (["plan", "--kind", "gqa", "--topk", "8"], "--topk=8 is not allowed for kind gqa"),
    (["plan", "--workload", "llama-3-8b", "--topk", "8"], "--topk=8 is not allowed for kind gqa"),
    (["plan", "--workload", "llama-3-8b", "--kind", "mla"], "--kind=mla is not allowed with --workload=llama-3-8b"),
    (["plan", "--workload", "llama-3-8b", "--device", "tpu"], "device='tpu'"),
    (["plan", "--workload", "llama-3-8b", "--device", ""], "--device=''"),
    (["plan", "--workload", "llama-3-8b", "--device", "h200,"], "--device='h200,'"),
    (["plan", "--workload", "llama-3-8b", "--planner", "magic"], "planner='magic'"),
    (["plan", "--workload", "llama-3-8b", "--planner", "modular,"], "--planner='modular,'"),
    (["plan", "--workload", "llama-3-8b", "--planner", "flashmla"], "--planner=flashmla is not allowed for kind gqa"),
    (["plan", "--kind", "mla", "--heads", "1024", "--device", "b200", "--planner", "modular"],
     "num_q_heads=1024 is not allowed for planner='modular'"),  # was a ZeroDivisionError
    (["plan", "--workload", "llama-3-8b", "--batch", ",".join(["1"] * 101), "--ctx", ",".join(["64"] * 100)],
     "make 90900 rows; expected at most 10000"),
    (["plan", "--workload", "gpt-5"], "workload='gpt-5'"),
    (["plan", "--kind", "dense"], "--kind"),
    (["plan"], "--workload or --kind"),
    (["frobnicate"], "frobnicate"),
    (["devices", "--bogus"], "unrecognized arguments: --bogus"),
    (["bench", "--suite", ""], "--suite=''"),
    (["bench", "--suite", "gqa,"], "--suite='gqa,'"),
    (["bench", "--out", "/dev/null"], "--out='/dev/null' is a file, not a folder"),
    (["report", "--only", ""], "only=['']"),
    (["report", "--only", ",,"], "only=[',,']"),
    (["report", "--data", ""], "--data=''"),
    (["report", "--out", "/dev/null"], "--out='/dev/null' is a file, not a folder"),
    (["report", "--out", "/proc/splitlab"], "under /proc, a pseudo file system"),
    (["report", "--out", LONG], "a name in it is 300 bytes long"),
    (["sweep", "gqa_decode", "--dry-run", "--device", ""], "device=''"),
    (["sweep", "gqa_decode", "--dry-run", "--rows", "-1"], "--rows: '-1' is not allowed"),
    (["sweep", "gqa_decode", "--dry-run", "--out", ""], "--out='' is not allowed"),
    (["sweep", "gqa_decode", "--dry-run", "--out", "/dev/null"], "--out='/dev/null' is a file, not a folder"),
    (["sweep", "gqa_decode", "--dry-run", "--out", "/proc/1"], "under /proc"),
    (["sweep", "gqa_decode", "--dry-run", "--out", LONG], "a name in it is 300 bytes long"),
    (["sweep", "gqa_decode", "--dry-run", "--max-minutes", "inf"], "--max-minutes: 'inf' is not allowed"),
    (["sweep", "gqa_decode", "--dry-run", "--max-minutes", "nan"], "--max-minutes: 'nan' is not allowed"),
    (["sweep", "gqa_decode", "--dry-run", "--workers", "0"], "--workers: '0'"),
    (["sweep", "gqa_decode", "--dry-run", "--workers", "100000"], "--workers: '100000'"),
    (["sweep", "gqa_decode", "--dry-run", "--dask-scheduler", "notaurl"], "--dask-scheduler: 'notaurl' is not allowed"),
    (["sweep", "gqa_decode", "--dry-run", "--dask-scheduler", "tcp://host"], "[scheme://]host:port"),
    (["sweep", "gqa_decode", "--dry-run", "--dask-scheduler", "http://host:8786"], "scheme one of tcp"),
    (["sweep", "gqa_decode", "--dry-run", "--dask-scheduler", "tcp://host:70000"], "--dask-scheduler"),
    (["sweep", "x" * 5000, "--dry-run"], "(5000 characters) is not allowed; expected a card file"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("splitlab: error:") and needle in err, err
    assert "Traceback" not in err


def test_a_file_as_out_is_refused_and_left_alone(tmp_path, capsys):
    f = tmp_path / "results.txt"
    f.write_text("keep me")
    for argv in (["sweep", "gqa_decode", "--dry-run", "--out", str(f)], ["report", "--out", str(f)],
                 ["sweep", "gqa_decode", "--dry-run", "--out", str(f / "below")]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and err.count("\n") == 1 and "is a file" in err and str(f) in err
    assert f.read_text() == "keep me"


def test_a_planner_that_refuses_a_workload_gets_a_row_saying_so(capsys):
    # 1024 heads: modular's SM100 MLA rule divides by zero (as upstream would); the other planners answer.
    code, out, _ = run(capsys, "plan", "--kind", "mla", "--heads", "1024", "--device", "b200", "--json")
    rows = {r["planner"]: r for r in json.loads(out)}
    assert code == 0 and rows["modular"]["num_splits"] is None
    assert rows["modular"]["note"].startswith("refused: num_q_heads=1024 is not allowed for planner='modular'")
    assert rows["splitlab"]["num_splits"] >= 1
    code, out, _ = run(capsys, "plan", "--kind", "sparse_mla", "--heads", "32")  # FlashMLA takes 64 or 128 heads
    assert code == 0 and "refused: h_q=32 is not allowed" in out and "note" in out.splitlines()[1]


def test_plan_takes_the_largest_documented_batch_at_once(capsys):
    import time

    from splitlab.workloads import LIMITS

    t0 = time.monotonic()
    code, out, _ = run(capsys, "plan", "--kind", "mla", "--batch", str(LIMITS["batch"]), "--device", "h200,mi355x",
                       "--json")
    assert code == 0 and all(r["num_splits"] for r in json.loads(out) if "refused" not in str(r.get("note")))
    assert time.monotonic() - t0 < 30  # generous: seconds on a loaded 2-core machine, never a hang


def test_scheduler_that_does_not_answer_fails_fast_in_one_line(tmp_path, capsys):
    pytest.importorskip("distributed")
    import time

    from sweep_fixtures import tiny_card

    card = tmp_path / "t.toml"
    card.write_text(tiny_card("t_sched"))
    t0 = time.monotonic()
    code, out, err = run(capsys, "sweep", str(card), "--grid", "quick", "--out", str(tmp_path / "runs"), "--timer",
                         "fake", "--device", "h200", "--quiet", "--dask-scheduler", "tcp://127.0.0.1:1")
    assert code == 2 and err.count("\n") == 1 and "--dask-scheduler='tcp://127.0.0.1:1'" in err, err
    assert time.monotonic() - t0 < 25  # the connect timeout is seconds (Dask's default waits 30)


def test_bench_without_gpu_is_a_clear_error(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    code, _, err = run(capsys, "bench", "--quick")
    assert code == 2 and "needs a GPU" in err


# --- report: interrupts and leftovers ------------------------------------------------------------------------

FIXTURE = Path(__file__).parent / "fixtures" / "sweeps"
DATA = str(Path(__file__).parents[1] / "data" / "h200")


def _old_report(out: Path) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    files = {"index.html": "PREVIOUS-INDEX", "waves.html": "PREVIOUS-WAVES", "waves.ipynb": "{}"}
    for name, text in files.items():
        (out / name).write_text(text)
    return files


def _leftovers(out: Path, pid: int) -> list[str]:
    import tempfile

    from splitlab import report

    tmp = [p.name for p in Path(tempfile.gettempdir()).glob(f"{report.TMP_PREFIX}{pid}-*")]
    return tmp + [p.name for p in out.glob(f"{report.STAGING_PREFIX}*")]


def test_ctrl_c_during_report_is_one_line_130_and_leaves_the_old_report_whole(tmp_path, capsys, monkeypatch):
    papermill = pytest.importorskip("papermill")
    pytest.importorskip("jupytext")
    out = tmp_path / "reports"
    before = _old_report(out)
    calls = []

    def interrupted(inp, outp, **kw):  # the first notebook runs (a stand-in), Ctrl-C lands in the second
        calls.append(outp)
        if len(calls) == 2:
            raise KeyboardInterrupt
        Path(outp).write_text(Path(inp).read_text())

    monkeypatch.setattr(papermill, "execute_notebook", interrupted)
    code, stdout, err = run(capsys, "report", "--data", str(FIXTURE), "--allow-fake", "--out", str(out), "--quiet")
    assert code == 130 and stdout == "" and err == "splitlab: interrupted (Ctrl-C)\n"
    assert len(calls) == 2 and Path(calls[0]).parent != out  # pages are staged, never written over the old ones
    assert {p.name: p.read_text() for p in out.iterdir()} == before  # the previous report, whole
    assert _leftovers(out, os.getpid()) == []


def test_a_finished_report_replaces_the_pages_it_ran(tmp_path, capsys, monkeypatch):
    papermill = pytest.importorskip("papermill")
    pytest.importorskip("jupytext")
    out = tmp_path / "reports"
    _old_report(out)
    (out / "seeds.html").write_text("another notebook's page")
    monkeypatch.setattr(papermill, "execute_notebook",
                        lambda inp, outp, **kw: Path(outp).write_text(Path(inp).read_text()))
    code, stdout, _ = run(capsys, "report", "--data", str(FIXTURE), "--allow-fake", "--out", str(out), "--quiet",
                          "--only", "waves")
    assert code == 0 and stdout.strip() == str(out.resolve() / "index.html")
    assert "PREVIOUS" not in (out / "index.html").read_text() + (out / "waves.html").read_text()
    assert (out / "seeds.html").read_text() == "another notebook's page"  # pages it did not run stay
    assert _leftovers(out, os.getpid()) == []


_SLOW_REPORT = """
import sys, time
from pathlib import Path
import papermill
from splitlab import cli

def slow(inp, outp, **kw):
    Path(sys.argv[2]).write_text("running")
    time.sleep(120)

papermill.execute_notebook = slow
sys.exit(cli.main(["report", "--data", sys.argv[1], "--allow-fake", "--out", sys.argv[3], "--quiet"]))
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_killed_report_exits_130_in_one_line_and_removes_its_folders(tmp_path, sig):
    pytest.importorskip("papermill")
    pytest.importorskip("jupytext")
    import signal
    import subprocess
    import sys
    import time

    out, marker = tmp_path / "reports", tmp_path / "running"
    before = _old_report(out)
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_REPORT, str(FIXTURE), str(marker), str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), proc.communicate()
    assert _leftovers(out, proc.pid)  # it has its temporary and staging folders now
    proc.send_signal(getattr(signal, sig))
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and stdout == ""
    assert err == f"splitlab: interrupted ({'Ctrl-C' if sig == 'SIGINT' else sig})\n"
    assert _leftovers(out, proc.pid) == []
    assert {p.name: p.read_text() for p in out.iterdir()} == before


def test_leftovers_of_a_report_killed_outright_go_on_the_next_run(tmp_path):
    import subprocess
    import sys
    import tempfile

    from splitlab import report

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # a process that has exited (its pid is not reused this quickly)
    out = tmp_path / "reports"
    out.mkdir()
    tmp = Path(tempfile.gettempdir())
    stale = [tmp / f"{report.TMP_PREFIX}{dead_pid}-test", out / f"{report.STAGING_PREFIX}{dead_pid}-test"]
    live = [tmp / f"{report.TMP_PREFIX}{os.getppid()}-test", out / f"{report.STAGING_PREFIX}{os.getppid()}-test",
            tmp / f"{report.TMP_PREFIX}nopid"]
    try:
        for d in stale + live:
            (d / "sub").mkdir(parents=True)
        removed = report.remove_stale(out)
        assert set(stale) <= set(removed) and not any(d.exists() for d in stale)
        assert all(d.exists() for d in live)  # a live process's folders, and any without a pid, stay
    finally:
        import shutil

        for d in stale + live:
            shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("side, needle", [
    ('{"sweep_id": "x", "kernel": "k", "schema_version": 1, "env": {"device": {"sm_count": "abc"}}}',
     "env.device.sm_count='abc' is not allowed"),
    ('{"sweep_id": "x", "kernel": "k", "schema_version": 1, "device": {"sm_count": 0}}', "device.sm_count=0"),
    ('{"sweep_id": "x", "kern', "not JSON"),
    ('[1, 2]', "expected the sidecar object"),
])
def test_report_on_a_damaged_sidecar_is_one_line_naming_it(tmp_path, capsys, side, needle):
    run_dir = tmp_path / "data" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "sweep.json").write_text(side)
    code, out, err = run(capsys, "report", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert str(run_dir / "sweep.json") in err and needle in err, err
    assert not (tmp_path / "out").exists()  # refused before anything was written


# --- python -m splitlab.fit -------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["/no/such/sweeps"], "data='/no/such/sweeps' does not exist"),
    ([""], "data='' is not allowed"),
    (["x" * 300], "a name in it is 300 bytes long"),
    ([DATA, "--confirm", "/no/such/confirm"], "--confirm='/no/such/confirm' does not exist"),
    ([DATA, "--confirm", ""], "--confirm='' is not allowed"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    ([DATA, "--head-tiles"], "--head-tiles: expected one argument"),
    ([DATA + "/flex_attention-default"], "no fit rows of gqa_decode, mla_decode, sparse_mla_decode"),
    ([str(FIXTURE / "gqa_decode-default" / "sweep.json")], "is not allowed; expected a sweep folder"),
])
def test_fit_bad_arguments_are_one_line_exit_2(capsys, tmp_path, argv, needle):
    from splitlab import fit

    code = fit.main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("python -m splitlab.fit: error: ") and needle in err, err


def test_fit_refuses_an_empty_folder_and_a_foreign_file(capsys, tmp_path):
    from splitlab import fit

    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a sweep")
    for path, needle in ((tmp_path / "empty", "no sweep results under it"), (tmp_path / "notes.txt", "notes.txt")):
        assert fit.main([str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err


# --- help, version, sizes, planners that do not cover a kind, plans outside the fitted data -------------------

def test_bare_splitlab_prints_the_help_and_version_prints_the_version(capsys):
    import splitlab

    code, out, err = run(capsys)
    assert code == 0 and err == "" and out.startswith("usage: splitlab")
    assert all(f"\n    {c} " in out for c in ("devices", "plan", "report", "sweep", "schema")), out
    code, out, err = run(capsys, "--version")
    assert code == 0 and err == "" and out == f"splitlab {splitlab.__version__}\n"


@pytest.mark.parametrize("given, keys", [("32k", [32768]), ("128K", [131072]), ("1M", [1 << 20]),
                                         ("8192,32k,64K", [8192, 32768, 65536])])
def test_ctx_takes_sizes(capsys, given, keys):
    code, out, _ = run(capsys, "plan", "--workload", "llama-3-8b", "--ctx", given, "--planner", "flashinfer",
                       "--json")
    assert code == 0 and [r["ctx_len"] for r in json.loads(out)] == keys


def test_plan_takes_a_named_length_distribution(capsys):
    from splitlab import workloads

    argv = ["plan", "--workload", "llama-3-8b", "--batch", "8", "--ctx", "32k", "--device", "h200"]
    code, out, _ = run(capsys, *argv, "--lengths", "spread16:3", "--json")
    rows = json.loads(out)
    w = workloads.get("llama-3-8b", batch=8, ctx_len=32768).with_(length_dist="spread16", length_seed=3)
    assert code == 0 and rows and len(set(w.lengths)) > 1
    for r in rows:
        assert (r["length_dist"], r["length_seed"], r["seq_lens"], r["ctx_len"]) == ("spread16", 3, None, 32768)
        assert (r["ctx_mean"], r["ctx_max"]) == (sum(w.lengths) / 8, 32768) and r["ctx_mean"] < 32768
    from splitlab import planners

    assert {r["planner"]: r["num_splits"] for r in rows}["splitlab"] == planners.plan(w, "h200", "splitlab").num_splits
    code, out, _ = run(capsys, *argv, "--lengths", "spread16", "--json")  # seed 0 by default
    assert code == 0 and json.loads(out)[0]["length_seed"] == 0
    code, out, _ = run(capsys, *argv, "--json")  # uniform: every request the longest
    assert code == 0 and all((r["length_dist"], r["ctx_mean"]) == ("uniform", 32768) for r in json.loads(out))
    code, out, _ = run(capsys, *argv, "--lengths", "spread16:3")
    header = next(x for x in out.splitlines() if x.lstrip().startswith("device "))
    assert code == 0 and "ctx_mean" in header.split() and f"{sum(w.lengths) / 8:.1f}" in out


def test_plan_takes_the_lengths_of_a_batch(capsys):
    from splitlab import planners
    from splitlab.workloads import DecodeWorkload

    code, out, _ = run(capsys, "plan", "--kind", "mla", "--seq-lens", "0,100k,3000,64k", "--device", "h200",
                       "--planner", "splitlab,flashmla", "--json")
    rows = json.loads(out)
    lens = (0, 100 * 1024, 3000, 64 * 1024)
    assert code == 0 and len(rows) == 2
    for r in rows:
        assert (r["batch"], r["ctx_len"], r["seq_lens"], r["ctx_max"]) == (4, 100 * 1024, list(lens), 100 * 1024)
        assert r["ctx_mean"] == sum(lens) / 4
    w = DecodeWorkload("mla", 4, 128, 1, 576, 512, 100 * 1024, seq_lens=lens)
    assert {r["planner"]: r["num_splits"] for r in rows} == {p: planners.plan(w, "h200", p).num_splits
                                                             for p in ("splitlab", "flashmla")}
    code, out, _ = run(capsys, "plan", "--kind", "gqa", "--seq-lens", "40,5", "--batch", "2", "--json")
    assert code == 0 and {(r["batch"], r["ctx_len"]) for r in json.loads(out)} == {(2, 40)}


def test_topk_and_page_size_take_sizes(capsys):
    code, out, _ = run(capsys, "plan", "--kind", "sparse_mla", "--topk", "2k", "--ctx", "64k", "--planner",
                       "splitlab", "--json")
    assert code == 0 and json.loads(out)[0]["topk"] == 2048 and json.loads(out)[0]["ctx_len"] == 65536
    code, out, _ = run(capsys, "plan", "--kind", "gqa", "--page-size", "1k", "--planner", "flashinfer", "--json")
    assert code == 0


@pytest.mark.parametrize("given", ["1.5k", "k", "32kb", "32 kk", "0k", "3G"])
def test_a_size_that_is_not_one_is_one_line(capsys, given):
    code, out, err = run(capsys, "plan", "--workload", "llama-3-8b", "--ctx", given)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("splitlab: error: argument --ctx: ")
    assert "sizes like 32k or 1M allowed" in err, err


def test_a_planner_that_does_not_cover_the_kind_says_so_in_one_line(capsys):
    code, out, err = run(capsys, "plan", "--workload", "llama-3-8b", "--planner", "aiter")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "--planner=aiter is not allowed for kind gqa; expected a planner covering it: " in err
    assert "splitlab" in err and "flashinfer" in err
    # --planner all leaves it out (the rows it has would be blank)
    code, out, _ = run(capsys, "plan", "--workload", "llama-3-8b", "--json")
    assert code == 0 and "aiter" not in {r["planner"] for r in json.loads(out)}


def test_a_plan_outside_the_fitted_data_is_marked_in_json_and_table(capsys):
    # The example: Llama-3-70B at 128K keys, batch 64 on the H200 (the data reach batch 32 there).
    argv = ["plan", "--workload", "llama-3-70b", "--batch", "32,64", "--ctx", "128k", "--device", "h200"]
    code, out, _ = run(capsys, *argv, "--json")
    rows = {(r["planner"], r["batch"]): r for r in json.loads(out)}
    assert code == 0 and rows["splitlab", 32]["fitted_range"] == "ok"
    assert rows["splitlab", 64]["fitted_range"].startswith("outside: batch 64 > 32 fitted at ctx_len 131072")
    assert rows["flashinfer", 64]["fitted_range"] is None  # an upstream rule: not fitted on these data
    code, out, _ = run(capsys, *argv)
    lines = out.splitlines()
    header = next(x for x in lines if x.lstrip().startswith("device "))
    assert "fitted_range" in header.split()
    mine = {x.split()[4]: x for x in lines if x.split()[2:3] == ["splitlab"]}  # batch -> splitlab's row
    assert mine["32"].endswith("  ok") and "outside: batch 64 > 32 fitted at ctx_len 131072" in mine["64"]
    assert lines[-1].startswith("# fitted_range outside: ")
    # another device than the data's is outside too
    code, out, _ = run(capsys, "plan", "--workload", "llama-3-8b", "--device", "b200", "--planner", "splitlab",
                       "--json")
    assert json.loads(out)[0]["fitted_range"] == "outside: device b200 not fitted (h200-sxm)"


def test_a_closed_pipe_is_not_a_traceback():
    import subprocess
    import sys

    proc = subprocess.run(f"'{sys.executable}' -m splitlab schema | head -1", shell=True, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.startswith("# result schema") and "Traceback" not in proc.stderr, proc.stderr


#: Bad arguments to ``sweep`` and ``report``: each refused (exit 2) before torch, Triton, pandas or papermill load
#: (issue 39: they took 8-12 s to be refused on a busy 2-core machine; now a fraction of a second).
BAD_ARGUMENTS = [
    ["sweep", "no_such_card"],
    ["sweep", "gqa_decode", "--grid", "no_such_grid"],
    ["sweep", "gqa_decode", "--device", "no_such_gpu"],
    ["sweep", "gqa_decode", "--out", "/dev/null"],
    ["sweep", "gqa_decode", "--workers", "0"],
    ["report", "--only", "no_such_page"],
    ["report", "--data", "no_such_set"],
    ["report", "--data", "README.md"],
    ["report", "--out", "/dev/null"],
    ["report", "-p", "no_equals_sign"],
]


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--workload", "llama-3-8b", "--batch", "4", "--ctx", "32k"],
                                  *BAD_ARGUMENTS])
def test_start_up_imports_no_heavy_module(argv):
    # help and plan are pure Python, and a bad argument is refused before anything heavy: torch, pandas, Triton and
    # the notebooks' machinery stay out of a fresh interpreter.
    import subprocess
    import sys

    code = ("import sys, contextlib, io\nfrom splitlab.cli import main\nrc = 0\n"
            f"with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit): rc = main({argv!r})\n"
            "print(rc, sorted({'torch', 'pandas', 'triton', 'papermill', 'jupytext', 'nbformat', 'nbconvert'}"
            " & set(sys.modules)))")
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo)
    want = 2 if argv in BAD_ARGUMENTS else 0
    assert proc.stdout.strip() == f"{want} []", (proc.stdout, proc.stderr)
    if want:
        assert proc.stderr.startswith("splitlab: error: ") and proc.stderr.count("\n") == 1, proc.stderr


def test_plan_speaks_of_splitlabs_schedule(capsys):
    """The table of ``splitlab plan`` is followed by the schedule splitlab's scheduler makes of the batch (what
    ``splitlab schedule`` prints in full), its modelled time beside the uniform schedule at the planner's split."""
    from splitlab import devices, planners, workloads
    from splitlab.planners import schedulers

    argv = ["plan", "--workload", "llama-3-8b", "--batch", "16", "--ctx", "32k", "--lengths", "longtail", "--device",
            "h200"]
    code, out, _ = run(capsys, *argv)
    line = next(x for x in out.splitlines() if x.startswith("# splitlab schedule, h200-sxm, batch 16: "))
    w = workloads.get("llama-3-8b", batch=16, ctx_len=32768).with_(length_dist="longtail", length_seed=0)
    s = schedulers.splitlab(w, devices.get("h200"))
    n = planners.plan(w, "h200", "splitlab").num_splits
    assert code == 0 and f": {s.scheduler}, {s.ctas} slots x 8 = {s.ctas * 8} CTAs, {len(s.items)} items" in line
    assert f"at the split count {n} " in line
    code, out, _ = run(capsys, *argv, "--planner", "flashinfer")  # without the splitlab planner: no schedule line
    assert code == 0 and "# splitlab schedule" not in out
