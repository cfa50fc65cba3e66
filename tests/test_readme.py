"""The README's commands and snippets, run as written where they need no GPU (the GPU ones are the H200's: see
BENCHMARKS.md): every `splitlab ...` line of its command block without a "GPU:" comment, the Python blocks
that need neither a cluster nor a GPU, and the `python -m splitlab.fit` line of its findings."""

import re
import shlex
from pathlib import Path

import pytest

from splitlab import fit
from splitlab.cli import main

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, re.S)
COMMANDS = [line.split("  #")[0].strip() for lang, body in BLOCKS if lang == "bash" for line in body.splitlines()
            if line.startswith("splitlab ") and "GPU:" not in line]
SNIPPETS = [body for lang, body in BLOCKS if lang == "python" and "dask_jobqueue" not in body]


def test_the_readme_has_what_this_file_runs():
    assert len(COMMANDS) >= 6 and any(c.startswith("splitlab report") for c in COMMANDS) and len(SNIPPETS) >= 3


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("MPLBACKEND", "Agg")
    argv = shlex.split(command.replace("[--only planner_shootout]", "--only planner_shootout"))[1:]
    if argv[0] == "report":
        argv[argv.index("--out") + 1] = str(tmp_path / "reports")
        argv.append("--quiet")
    assert main(argv) == 0, command
    assert capsys.readouterr().out.strip()


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.strip().splitlines()[0][:40])
def test_readme_python(snippet, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    exec(compile(snippet, "README.md", "exec"), {})


def test_readme_fit_command(capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    cmd = re.search(r"`python -m splitlab\.fit ([^`]*)`", README).group(1)
    assert fit.main(shlex.split(cmd)) == 0
    out = capsys.readouterr().out
    assert "h200-confirm15 " in out and "h200-confirm15-sparse" in out and "goal_met" in out
    # The registered rule's constants are what this command fits (planners.native.FITTED says so).
    from splitlab.planners.native import FITTED

    for kind, c in FITTED.items():
        assert f"{kind}: CostConstants({fit._fmt(c)})" in out, kind
