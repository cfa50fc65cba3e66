"""``splitlab regress``: the gate's answer on fixture sets built to pass and to fail, a wrong choice, bad input
(exit 2), and the README's CI recipe run as written."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from sweep_fixtures import tiny_card

from splitlab import regress
from splitlab.cli import main
from splitlab.planners import fitted, registry

REPO = Path(__file__).resolve().parents[1]
FIXTURE = str(REPO / "tests" / "fixtures" / "sweeps")  # measured H200 rows (a subset of the shipped set)
SHIPPED = str(fitted.SHIPPED_DIR / "h200-sxm.toml")


def run(capsys, *argv):
    code = main(["regress", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def answer(base, cand, data=FIXTURE, **bounds):
    """The gate's verdict computed here, from the module's pieces (what the command should print and exit on)."""
    df = regress._load("--data", [data], allow_fake=True)
    sides = [regress.parse_side(a, x) for a, x in (("--baseline", base), ("--candidate", cand))]
    frames = [df if s.scored_on_data else regress._load(s.arg, [s.data], True) for s in sides]
    t = [regress.times(s, f, allow_fake=True) for s, f in zip(sides, frames, strict=True)]
    return regress.compare(*t, **bounds)


def test_the_best_measured_point_never_regresses(capsys):
    code, out, err = run(capsys, "--baseline", "splitlab", "--candidate", FIXTURE, "--data", FIXTURE)
    v = answer("splitlab", FIXTURE)
    assert code == 0 and "PASS" in out and (v.table["ratio"].dropna() <= 1).all() and v.passed, err
    assert f"geomean candidate / baseline: {v.geomean:.4f}" in out


def test_a_rule_far_off_the_best_fails(capsys):
    code, out, _ = run(capsys, "--baseline", FIXTURE, "--candidate", "flashinfer", "--data", FIXTURE)
    v = answer(FIXTURE, "flashinfer")
    worst = v.table["ratio"].max()
    assert worst > 1.05 and code == 1 and f"worst {worst:.3f}x" in out and out.splitlines()[-1].startswith("FAIL")
    # the same comparison passes under bounds above its worst shape and its geomean
    code, out, _ = run(capsys, "--baseline", FIXTURE, "--candidate", "flashinfer", "--data", FIXTURE,
                       "--max-regression", f"{worst - 1 + 0.01:.3f}", "--max-geomean-regression",
                       f"{(v.geomean - 1) * 100 + 1:.2f}%")
    assert code == 0 and "PASS" in out


def test_constants_files_as_candidates(tmp_path, capsys):
    """The shipped constants against the planner that uses them: every ratio 1 (pass). Constants that price a
    CTA's start-up at 1000 key tiles never split: slower on the shapes that need splits (fail)."""
    code, out, _ = run(capsys, "--baseline", "splitlab", "--candidate", SHIPPED, "--data", FIXTURE)
    v = answer("splitlab", SHIPPED)
    assert code == 0 and (v.table["ratio"].dropna() == 1).all() and "geomean candidate / baseline: 1.0000" in out
    text = (fitted.SHIPPED_DIR / "h200-sxm.toml").read_text()
    bad = tmp_path / "unsplit.toml"
    bad.write_text(re.sub(r"(?m)^fixed = .*$", "fixed = 1000.0", text))
    code, out, _ = run(capsys, "--baseline", "splitlab", "--candidate", str(bad), "--data", FIXTURE)
    v = answer("splitlab", str(bad))
    assert code == 1 and not v.passed and len(v.slower) and "FAIL" in out
    assert set(v.table.loc[v.table["ratio"] > 1.05, "num_splits_cand"]) == {1}


def test_a_choice_measured_wrong_fails_the_gate(tmp_path, capsys, monkeypatch):
    """An implementation wrong at 2 splits, a planner that always takes 2: its choices are stored ``wrong``, and the
    gate fails on them although no time is slower."""
    from splitlab import planners
    from splitlab.bench import cards, sweep

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    planners.register("two", lambda w, dev: planners.Plan("two", 2), kinds=("gqa",))
    card = tmp_path / "t.toml"
    card.write_text(tiny_card("t_broken", "broken"))
    res = sweep.run(cards.load(card), sweep.SweepOptions(grid="quick", out=tmp_path / "runs", timer="fake",
                                                         device="h200", quiet=True, isolate=False))
    d = str(res.sweep_dir)
    code, out, _ = run(capsys, "--baseline", f"{d}:splitlab", "--candidate", f"{d}:two", "--allow-fake")
    v = answer(f"{d}:splitlab", f"{d}:two", data=d)
    assert len(v.broken) and code == 1 and "choice(s) of the candidate measured wrong" in out
    assert "wrong: t_broken" in out and "MODELLED" in out


@pytest.mark.parametrize("argv, needle", [
    (["--baseline", "nonesuch", "--candidate", "splitlab"], "--baseline='nonesuch' is not allowed; expected a "
                                                            "planner name"),
    (["--candidate", "splitlab"], "the following arguments are required: --baseline"),
    (["--baseline", "splitlab", "--candidate", "flashinfer", "--data", "/no/such/set"],
     "--data='/no/such/set' does not exist"),
    (["--baseline", "splitlab", "--candidate", "/no/such.toml", "--data", FIXTURE], "--candidate='/no/such.toml' "
                                                                                   "cannot be read"),
    (["--baseline", FIXTURE, "--candidate", FIXTURE + ":splitlab", "--data", FIXTURE], "--data is not allowed here"),
    (["--baseline", FIXTURE, "--candidate", FIXTURE + ":nobody"], "holds no choice of planner 'nobody'"),
    (["--baseline", "splitlab", "--candidate", "flashinfer", "--max-regression", "-1"], "'-1' is not allowed"),
    (["--baseline", "splitlab", "--candidate", "flashinfer", "--max-regression", "x"], "'x' is not a share"),
    (["--baseline", "splitlab", "--candidate", SHIPPED, "--data", FIXTURE, "--out", "/tmp/r"],
     "--out is not allowed with a constants file"),
    (["--baseline", "splitlab", "--candidate", "flashinfer", "--data", FIXTURE + "/gqa_decode-default",
      FIXTURE + "/mla_decode-default", "--out", "/tmp/r"], "--out is not allowed with several --data sets"),
    (["--baseline", FIXTURE + "/gqa_decode-default", "--candidate", FIXTURE + "/mla_decode-default"],
     "no shape has a correct measurement of both sides' choices"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err


def test_modelled_rows_need_allow_fake(tmp_path, capsys):
    from splitlab.bench import cards, sweep

    card = tmp_path / "t.toml"
    card.write_text(tiny_card("t_exact", "exact"))
    res = sweep.run(cards.load(card), sweep.SweepOptions(grid="quick", out=tmp_path / "runs", timer="fake",
                                                         device="h200", quiet=True, isolate=False))
    d = str(res.sweep_dir)
    code, _, err = run(capsys, "--baseline", d, "--candidate", f"{d}:splitlab")
    assert code == 2 and "holds modelled rows (timing='fake')" in err and "--allow-fake" in err
    code, out, _ = run(capsys, "--baseline", d, "--candidate", f"{d}:splitlab", "--allow-fake")
    assert code in (0, 1) and "MODELLED" in out


def test_the_page_is_written_with_out(tmp_path, capsys):
    code, out, _ = run(capsys, "--baseline", "splitlab", "--candidate", "flashinfer", "--data", FIXTURE,
                       "--max-regression", "1000%", "--max-geomean-regression", "1000%", "--out", str(tmp_path / "r"))
    page = tmp_path / "r" / "split_regressions.html"
    assert code == 0 and f"page: {page}" in out and page.is_file()
    ratios = pd.read_csv(tmp_path / "r" / "split_regressions-ratio.csv")
    assert len(ratios) == int(out.split(" shapes compared")[0].splitlines()[-1])  # the page compares the same shapes


README = (REPO / "README.md").read_text()


def test_the_readme_ci_recipe_runs(tmp_path):
    """README's CI job (its ``sh`` block after "CI ("), run as a shell step from a fresh folder holding the
    examples: the package is installed already here, so ``pip install`` is left out."""
    block = re.search(r"CI \(.*?```sh\n(.*?)```", README, re.S).group(1)
    lines = [x for x in block.replace("\\\n", " ").splitlines() if x.strip()]
    assert len(lines) <= 5 and any(x.startswith("splitlab regress") for x in lines)
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    script = "\n".join(["set -e", *(x for x in lines if not x.startswith("pip install"))])
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    p = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PASS" in p.stdout and (tmp_path / "runs").is_dir()
