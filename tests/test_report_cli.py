"""``splitlab report -p NAME=VALUE`` (notebook parameters from the command line, YAML-typed, checked before anything
runs), its logs off a terminal (no progress bars), and the README's jupytext + papermill recipe."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("papermill")
pytest.importorskip("jupytext")
pytest.importorskip("yaml")

import nbformat  # noqa: E402

from splitlab import datasets, report  # noqa: E402
from splitlab.cli import main  # noqa: E402
from splitlab.errors import SplitlabError  # noqa: E402
from splitlab.report_parameters import notebook_arguments, parameter_text, typed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "sweeps"
FAKE = ["--allow-fake"] if datasets.data_info(FIXTURE).fake else []


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def injected(executed: Path) -> str:
    """The source of the cell papermill injected into an executed notebook."""
    nb = nbformat.read(executed, as_version=4)
    return next(c.source for c in nb.cells if "injected-parameters" in c.metadata.get("tags", []))


# --- parsing and typing ---------------------------------------------------------------------------------------

def test_name_equals_value_splits_at_the_first_equals_sign():
    assert parameter_text("devices=[b200, mi300x]") == ("devices", "[b200, mi300x]")
    assert parameter_text("timer=") == ("timer", "")
    assert parameter_text("card=a=b") == ("card", "a=b")
    for bad in ("devices", "=3", "two words=1", "1x=2", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=VALUE"):
            parameter_text(bad)


@pytest.mark.parametrize("text, declared, value", [
    ("[b200, mi300x]", "list", ["b200", "mi300x"]),
    ("[1, 2, 4]", "list", [1, 2, 4]),
    ("[]", "list", []),
    ("32", "int", 32),
    ("32k", "int", 32768),  # a size, as the CLI's key counts take it
    ("1M", "int", 1 << 20),
    ("0.05", "float", 0.05),
    ("2", "float", 2),
    ("true", "bool", True),
    ("llama-3-8b", "str", "llama-3-8b"),
    ("no", "str", "no"),  # a str parameter takes the text as written, not YAML's False
    ("0123", "str", "0123"),
    ("", "str", ""),
    ("'quoted'", "str", "quoted"),
    ("{a: 1}", "dict", {"a": 1}),
    ("[b200]", None, ["b200"]),  # an untyped parameter takes what YAML reads
])
def test_values_arrive_typed(text, declared, value):
    got = typed("x", text, "nb", declared)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text, declared, needle", [
    ("b200", "list", "nb takes a list for x, this is a str; expected a YAML list, e.g. x='[b200]'"),
    ("lots", "int", "takes an int for x, this is a str"),
    ("true", "int", "takes an int for x, this is a bool"),
    ("1.5", "int", "this is a float"),
    ("[1", "list", "is not YAML"),
    ("2026-01-01", None, "YAML reads it as a date"),
])
def test_a_value_of_the_wrong_type_is_refused_naming_the_flag(text, declared, needle):
    with pytest.raises(SplitlabError, match=re.escape(needle)) as e:
        typed("x", text, "nb", declared)
    assert str(e.value).startswith("-p x=") and "\n" not in str(e.value)


def test_a_parameter_goes_to_every_selected_notebook_that_declares_it():
    names = ["cta_latency", "seeds", "waves"]
    got = notebook_arguments(names, report.NOTEBOOK_DIR, {"tol": "0.05", "devices": "[b200]"})
    assert got == {"cta_latency": {"tol": 0.05}, "seeds": {"tol": 0.05}, "waves": {"devices": ["b200"]}}
    # Python's per-notebook parameters are typed already, and win over -p.
    got = notebook_arguments(names, report.NOTEBOOK_DIR, {"tol": "0.05"}, {"seeds": {"tol": 0.2}})
    assert got["seeds"] == {"tol": 0.2} and got["cta_latency"] == {"tol": 0.05}
    assert notebook_arguments(names, report.NOTEBOOK_DIR) == {}  # nothing given: nothing inspected


def test_a_name_no_selected_notebook_takes_is_refused_with_the_names_they_take():
    with pytest.raises(SplitlabError) as e:
        notebook_arguments(["waves"], report.NOTEBOOK_DIR, {"devcies": "[b200]"})
    msg = str(e.value)
    assert msg.startswith("-p devcies: no selected notebook (waves) takes devcies (did you mean devices?)")
    assert "devices" in msg and "ctx_len" in msg and "\n" not in msg
    with pytest.raises(SplitlabError, match="no selected notebook"):  # taken by a notebook not selected
        notebook_arguments(["waves"], report.NOTEBOOK_DIR, {"tol": "0.05"})
    with pytest.raises(SplitlabError, match="expected the flag --data"):
        notebook_arguments(["waves"], report.NOTEBOOK_DIR, {"data": "h200"})
    with pytest.raises(SplitlabError, match=r"parameters\['waves'\] names bogus"):
        notebook_arguments(["waves"], report.NOTEBOOK_DIR, None, {"waves": {"bogus": 1}})


# --- the command line ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["-p", "devcies=[b200, mi300x]"], "-p devcies: no selected notebook (waves) takes devcies (did you mean devices"),
    (["-p", "devices=b200"], "-p devices='b200' is not allowed: waves takes a list for devices"),
    (["-p", "ctx_len=[1"], "-p ctx_len='[1' is not YAML"),
    (["-p", "data=h200"], "-p data=... is not allowed; expected the flag --data"),
    (["-p", "devices"], "argument -p/--parameter: 'devices' is not allowed; expected NAME=VALUE"),
])
def test_a_bad_parameter_is_one_line_exit_2_before_anything_runs(tmp_path, capsys, argv, needle):
    out = tmp_path / "reports"
    code, stdout, err = run(capsys, "report", "--data", str(FIXTURE), *FAKE, "--out", str(out), "--only", "waves",
                            "--quiet", *argv)
    assert code == 2 and stdout == "" and err.count("\n") == 1, err
    assert err.startswith("splitlab: error: ") and needle in err, err
    assert not out.exists()  # refused before anything was written


def test_report_with_parameters_runs_and_logs_no_progress_bars_off_a_terminal(tmp_path):
    """The issue's command, run as a CI job would (stderr a pipe, not a terminal): the list arrives as a list, the
    size as an int, and the log is one line per step, without a carriage return."""
    out = tmp_path / "reports"
    env = dict(os.environ, MPLBACKEND="Agg", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "splitlab", "report", "--data", str(FIXTURE), *FAKE, "--out", str(out), "--only",
           "waves", "-p", "devices=[b200, mi300x]", "-p", "ctx_len=32k"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(out.resolve() / "index.html")
    assert "\r" not in proc.stderr and "Executing" not in proc.stderr, proc.stderr[-3000:]
    steps = [line for line in proc.stderr.splitlines() if line.startswith("splitlab report: [")]
    assert len(steps) == 1 and steps[0].startswith("splitlab report: [1/1] waves: ok in "), proc.stderr  # one a page
    cell = injected(out / "waves.ipynb")
    assert 'devices = ["b200", "mi300x"]' in cell and "ctx_len = 32768" in cell, cell
    html = (out / "waves.html").read_text(encoding="utf-8")
    assert "mi300x" in html.lower() and "b200" in html.lower()


def test_the_progress_bar_follows_the_terminal(tmp_path, monkeypatch):
    """papermill's per-cell bar only when stderr is a terminal (and progress is on)."""
    papermill = pytest.importorskip("papermill")
    seen = []

    def record(inp, outp, **kw):
        seen.append(kw["progress_bar"])
        Path(outp).write_text(Path(inp).read_text())

    monkeypatch.setattr(papermill, "execute_notebook", record)
    for tty, progress in ((True, True), (False, True), (True, False)):
        monkeypatch.setattr(sys.stderr, "isatty", lambda tty=tty: tty)
        report.build_report(FIXTURE, tmp_path / "out", only=["waves"], progress=progress, allow_fake=bool(FAKE))
    assert seen == [True, False, False]


def test_only_some_pages_computes_no_headline_unless_named(tmp_path, monkeypatch):
    """Issue 39: ``--only waves`` runs the waves page and no more (the index's answer, seconds to a minute, is not
    computed); ``--only waves,headline`` computes it, ``--only headline`` alone runs no notebook."""
    import papermill

    from splitlab import headline

    ran, built = [], []

    def execute(inp, outp, **kw):
        ran.append(Path(inp).stem)
        Path(outp).write_text(Path(inp).read_text())

    real = headline.build
    monkeypatch.setattr(papermill, "execute_notebook", execute)
    monkeypatch.setattr(headline, "build", lambda *a, **k: built.append(a[0]) or real(*a, **k))
    index = report.build_report(FIXTURE, tmp_path / "a", only=["waves"], progress=False, allow_fake=bool(FAKE))
    assert ran == ["waves"] and built == []
    page = index.read_text()
    assert "Not built by this report (--only waves)" in page and 'class="headline"' not in page
    assert not (tmp_path / "a" / report.HEADLINE_CSV).exists()
    index = report.build_report(FIXTURE, tmp_path / "b", only=["waves,headline"], progress=False,
                                allow_fake=bool(FAKE))
    assert ran == ["waves", "waves"] and len(built) == 1 and 'class="headline"' in index.read_text()
    index = report.build_report(FIXTURE, tmp_path / "c", only=["headline"], progress=False, allow_fake=bool(FAKE))
    assert ran == ["waves", "waves"] and len(built) == 2 and 'class="headline"' in index.read_text()
    assert report._select(None) == [*report.NOTEBOOKS, "headline"]  # a whole report: every page and the answer


def test_notebooks_without_the_lab_extra_are_one_line_naming_it(tmp_path, capsys, monkeypatch):
    """``splitlab`` installed without ``[lab]``: the report's notebooks are refused in one line naming the extra,
    before anything is written; ``--only headline`` needs none of it."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("papermill", "jupytext")
                        else find_spec(name, *a))
    out = tmp_path / "reports"
    code, stdout, err = run(capsys, "report", "--data", str(FIXTURE), *FAKE, "--out", str(out), "--only", "waves")
    assert code == 2 and stdout == "" and err.count("\n") == 1, err
    assert "jupytext, papermill not installed" in err and "pip install 'splitlab[lab]'" in err, err
    assert not out.exists()
    code, stdout, err = run(capsys, "report", "--data", str(FIXTURE), *FAKE, "--out", str(out), "--only",
                            "headline", "--quiet")
    assert code == 0 and (out / "index.html").is_file(), err


# --- the README's recipe for one notebook by hand -------------------------------------------------------------

def test_readme_recipe_runs_one_notebook_by_hand_with_a_typed_list(tmp_path):
    readme = (ROOT / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("jupytext ") and "papermill" in x)
    command = line.split("  #")[0]
    bindir = Path(sys.executable).parent
    words = shlex.split(command.replace("&&", ";"))
    assert words.count(";") == 1 and words[0] == "jupytext" and words[words.index(";") + 1] == "papermill"
    convert, execute = words[: words.index(";")], words[words.index(";") + 1:]
    ipynb = next(w for w in execute if w.endswith(".ipynb"))
    done = [w for w in execute if w.endswith(".ipynb")][1]
    rename = {ipynb: str(tmp_path / ipynb), done: str(tmp_path / done)}  # write into tmp, not the checkout

    def cmd(ws):
        return [str(bindir / ws[0]), *(rename.get(w, w) for w in ws[1:])]

    env = dict(os.environ, MPLBACKEND="Agg", CUDA_VISIBLE_DEVICES="", PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    for ws in (convert, execute):
        proc = subprocess.run(cmd(ws), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    cell = injected(tmp_path / done)
    assert re.search(r'devices = \["b200"(, "[a-z0-9]+")*\]', cell), cell  # a list, not the string "[b200]"
