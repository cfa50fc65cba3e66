"""Plugins: a user's module imported before a command (``--plugin``, ``SPLITLAB_PLUGINS``) registers planners
(``planners.register``) and names kernels from cards anywhere on disk. ``examples/`` run end to end in a fresh
process, as CI would: a fake-timed sweep of the external card with the external planner, then ``splitlab regress``
of that planner against ``splitlab``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from splitlab import planners, workloads
from splitlab.cli import main
from splitlab.errors import SplitlabError
from splitlab.planners import registry

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
SPLITLAB = str(Path(sys.executable).with_name("splitlab"))


@pytest.fixture
def isolated(monkeypatch):
    """The registry, ``sys.path`` and the example modules as they were before the test."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("SPLITLAB_PLUGINS", raising=False)
    yield
    for name in ("my_planner", "my_kernel", "bad_plugin", "twice_plugin"):
        sys.modules.pop(name, None)


def cli(*argv, env=None, cwd=REPO):
    """``splitlab ARGV`` in a fresh process (the console script): (exit code, stdout, stderr)."""
    p = subprocess.run([SPLITLAB, *argv], cwd=cwd, capture_output=True, text=True, timeout=300,
                       env={**os.environ, **(env or {})})
    return p.returncode, p.stdout, p.stderr


def test_the_examples_run_end_to_end(tmp_path):
    from splitlab import regress, results
    from splitlab.regress import Side

    code, out, err = cli("--plugin", "examples/my_planner.py", "--plugin", "examples/my_kernel.py", "sweep",
                         "examples/my_kernel.toml", "--grid", "quick", "--timer", "fake", "--out", str(tmp_path),
                         "--quiet")
    assert code == 0, err
    run = tmp_path / "my_decode-quick"
    df = results.load(run)
    assert set(df["status"]) == {"ok"} and set(df["impl"]) == {"example-torch"}
    tags = {t for ts in df["planners"].dropna() for t in ts.split(",") if t}
    assert {"one_wave", "splitlab"} <= tags  # the plugin's planner took part in the sweep
    assert json.loads((run / "sweep.json").read_text())["planner_constants"] == {"h200-sxm": "h200-sxm (shipped)"}
    code, out, err = cli("--plugin", "examples/my_planner.py", "regress", "--baseline", "splitlab", "--candidate",
                         "one_wave", "--data", str(run), "--allow-fake")
    # the gate's answer, computed here from the same rows
    base = regress.times(Side("b", "splitlab", "planner", planner="splitlab"), df, allow_fake=True)
    cand = regress.times(Side("c", "one_wave", "planner", planner="one_wave"), df, allow_fake=True)
    v = regress.compare(base, cand)
    assert code == (0 if v.passed else 1), (out, err)
    assert "candidate: planner one_wave" in out and f"geomean candidate / baseline: {v.geomean:.4f}" in out
    assert len(v.table) == 4 and v.table["ratio"].notna().all()


def test_plugins_from_the_environment_and_on_a_subcommand(isolated, capsys, monkeypatch):
    code, out, err = cli("plan", "--kind", "gqa", "--batch", "1,8", "--planner", "one_wave,splitlab",
                         env={"SPLITLAB_PLUGINS": "examples/my_planner.py"})
    assert code == 0 and "one_wave" in out, err
    monkeypatch.chdir(REPO)
    assert main(["plan", "--plugin", "examples/my_planner.py", "--kind", "gqa", "--planner", "one_wave",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["num_splits"] for r in rows] == [16]  # 1 request x 8 KV heads: 16 splits fill 132 SMs (one wave)
    assert planners.entry("one_wave").source.startswith("examples/my_planner.py")
    # by module name, from the current folder (as python -m would), and twice: imported once
    monkeypatch.chdir(EXAMPLES)
    assert main(["--plugin", "my_planner", "--plugin", "my_planner", "plan", "--kind", "gqa", "--planner",
                 "one_wave"]) == 0


@pytest.mark.parametrize("spec, body, needle", [
    ("nonesuch_plugin_xyz", None, "--plugin='nonesuch_plugin_xyz' cannot be imported: ModuleNotFoundError"),
    ("missing.py", None, "--plugin='missing.py' does not exist"),
    ("bad_plugin.py", "raise RuntimeError('boom')\n", "cannot be imported: RuntimeError: boom"),
    ("twice_plugin.py", "from splitlab import planners\nplanners.register('splitlab', lambda w, d: None, "
     "kinds=('gqa',))\n", "planner 'splitlab' is registered twice: by splitlab.planners.splitlab and by twice_plugin"),
])
def test_a_bad_plugin_is_one_line_and_exit_2(isolated, tmp_path, capsys, monkeypatch, spec, body, needle):
    monkeypatch.chdir(tmp_path)
    if body is not None:
        (tmp_path / spec).write_text(body)
    assert main(["--plugin", spec, "devices"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and needle in err, err
    monkeypatch.setenv("SPLITLAB_PLUGINS", spec)
    assert main(["devices"]) == 2 and "SPLITLAB_PLUGINS=" in capsys.readouterr().err


def test_register_refuses_what_would_break_the_tables(isolated):
    def rule(w, dev):
        return planners.Plan("x", 1)

    for name, kinds, needle in (("a,b", ("gqa",), "not allowed"), ("x@h200", ("gqa",), "not allowed"),
                                ("all", ("gqa",), "not allowed"), ("x", ("dense",), r"kinds=\[.dense.\]"),
                                ("x", (), r"kinds=\[\]")):
        with pytest.raises(SplitlabError, match=needle):
            planners.register(name, rule, kinds=kinds)
    planners.register("mine", rule, kinds=("gqa",))
    planners.register("mine", rule, kinds=("gqa",))  # the same function again: a module imported twice
    assert planners.entry("mine").source == __name__ and not planners.entry("mine").builtin


def test_a_plugin_planner_that_raises_or_answers_junk_is_a_refusal(isolated, capsys):
    planners.register("raises", lambda w, d: 1 / 0, kinds=("gqa",))
    planners.register("junk", lambda w, d: planners.Plan("junk", 0), kinds=("gqa",))
    w = workloads.get("llama-3-8b")
    with pytest.raises(SplitlabError, match=r"planner 'raises' \(.*\) raised ZeroDivisionError"):
        planners.plan(w, "h200", "raises")
    with pytest.raises(SplitlabError, match="returned num_splits=0; expected a Plan with an integer num_splits >= 1"):
        planners.plan(w, "h200", "junk")
    assert main(["plan", "--workload", "llama-3-8b", "--planner", "raises,junk,splitlab", "--json"]) == 0
    notes = {r["planner"]: r["note"] for r in json.loads(capsys.readouterr().out)}
    assert notes["raises"].startswith("refused: planner 'raises'") and notes["junk"].startswith("refused:")


@pytest.mark.parametrize("splits", [1, 3, 8, 200])
def test_the_example_kernel_is_a_correct_split_k_decode(isolated, splits):
    """The external implementation the example card sweeps agrees with the fp64 reference (200 splits: more than
    a request's keys, so some parts are empty)."""
    import torch

    from splitlab.kernels import reference
    from splitlab.kernels.inputs import workload_inputs

    sys.path.insert(0, str(EXAMPLES))
    import my_kernel

    w = workloads.DecodeWorkload("gqa", 3, 8, 2, 32, 32, 130, page_size=16)
    x = workload_inputs(w, seed=3)
    out, lse = my_kernel.decode(**x, num_splits=splits, return_lse=True)
    ref, ref_lse = reference.gqa_decode(**x, return_lse=True)
    assert out.dtype == x["q"].dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-3, rtol=1e-3)
    assert my_kernel.launch_facts(w, num_splits=splits).ctas == 3 * 2 * splits
