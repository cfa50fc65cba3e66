"""The README's commands and snippets, run as written where they need no GPU (the GPU ones are the H200's: see
BENCHMARKS.md): every `splitlab ...` line of its command block without a "GPU:" comment, the Python blocks
that need neither a cluster nor a GPU, and its `splitlab fit` command (its CI job: tests/test_regress.py)."""

import re
import shlex
from pathlib import Path

import pytest

from splitlab import families, fit
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
    cmd = re.search(r"`splitlab fit( [^`]*)?`", README).group(1) or ""
    assert main(["fit", *shlex.split(cmd)]) == 0
    out = capsys.readouterr().out
    assert "h200-confirm:" in out and "goal_met" in out
    # The registered rule's constants are what this command fits (the shipped H200 constants file).
    from splitlab.planners import fitted

    for kind, c in fitted.load(fitted.SHIPPED_DIR / "h200-sxm.toml").families.items():
        assert f"{kind}: CostConstants({fit._fmt(c)})" in out, kind
    # README's table of what the data say is this output's goal tables: held-out, then the confirm set; a row per
    # family, and per lengths (``GQA · ragged``) where ragged batches were scored.
    goals = _goal_rows(out)
    rows = re.findall(r"^\| (GQA|MLA|sparse MLA)(?: · (uniform|ragged))? \|(.*)\|$", README, re.M)
    assert len(goals) == 2 and {(FAMILIES[f], n or "uniform") for f, n, _ in rows} == set(goals[0]), goals
    for family, lengths, cells in rows:
        kernel = FAMILIES[family], lengths or "uniform"
        held, held_best, conf, conf_best = (c.strip().replace("*", "") for c in cells.split("|"))
        for (geo, worst), best, goal in ((held.split(" / "), held_best, goals[0]), (conf.split(" / "), conf_best,
                                                                                    goals[1])):
            g = goal[kernel]
            assert abs(float(geo) - g["geomean"]) < 5e-4 and abs(float(worst) - g["worst"]) < 5e-4, (family, g)
            name, value = best.split()[:2]
            assert PORTED[name] == g["best"] and abs(float(value) - g["best_value"]) < 5e-4, (family, best, g)


FAMILIES = {f.label: f.name for f in families.ALL}  # README's family column -> splitlab's kernel
PORTED = {"FlexAttention": "flex", "FlashAttention": "flash_attn", "FlashMLA": "flashmla", "SGLang": "sglang",
          "FlashInfer": "flashinfer", "Modular": "modular", "aiter": "aiter"}


def _goal_rows(out: str) -> list[dict[tuple[str, str], dict]]:
    """The goal tables `splitlab fit` prints (after its header `kernel lengths geomean worst ...`), in order:
    per kernel and lengths its geomean, worst, and best ported rule with that rule's geomean."""
    tables, current = [], None
    for line in out.splitlines():
        words = line.split()
        if words[:4] == ["kernel", "lengths", "geomean", "worst"]:
            current = {}
            tables.append(current)
        elif current is not None and len(words) >= 7 and words[0].endswith("_decode"):
            current[words[0], words[1]] = dict(geomean=float(words[2]), worst=float(words[3]), best=words[5],
                                               best_value=float(words[6]))
        else:
            current = None
    return tables
