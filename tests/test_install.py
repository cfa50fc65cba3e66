"""splitlab as an installed package, away from its checkout: the wheel built from the repository carries the kernel
cards, the notebooks and the constants, and from a temporary folder ``splitlab plan``, ``splitlab sweep CARD
--dry-run``, ``splitlab report --data DIR``, ``splitlab fit DIR`` and ``splitlab regress`` work; a command that
needs data and gets none says, in one line, what to pass.

The wheel is installed with ``pip install --no-deps --target`` into a fresh folder and run on this venv's
interpreter with only that folder on ``PYTHONPATH`` ahead of the dependencies (torch, triton, pandas: the venv's),
so nothing of the checkout is importable: what runs is the wheel's. It is built from a copy of the files a wheel
is made of (no ``data/``, no tests) with ``pip wheel --no-deps --no-build-isolation``: no network, a few seconds."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from splitlab.planners import fitted

REPO = Path(__file__).resolve().parents[1]
#: What a wheel is built from (pyproject.toml's packages and package-dir).
SOURCES = ("pyproject.toml", "README.md", "splitlab", "kernels", "notebooks")
FIXTURE = REPO / "tests" / "fixtures" / "sweeps"  # measured H200 rows


def _ignored(folder, names):
    return [n for n in names if n == "__pycache__" or n.endswith((".pyc", ".ipynb")) or n.startswith(".ipynb")]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the install folder, a run folder outside the checkout holding a copy of the fixture sweeps)."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        p = REPO / name
        (shutil.copytree(p, src / name, ignore=_ignored) if p.is_dir() else shutil.copy(p, src / name))
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)],
                   check=True, capture_output=True, timeout=300)
    wheel = next((tmp / "dist").glob("splitlab-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp / "site"), str(wheel)], check=True,
                   capture_output=True, timeout=300)
    run = tmp / "run"
    run.mkdir()
    shutil.copytree(FIXTURE, run / "sweeps")
    return wheel, tmp / "site", run


def splitlab(installed, *argv):
    """``splitlab ARGV`` from the install's console script, in the run folder: (exit code, stdout, stderr)."""
    _, site, run = installed
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLITLAB_")}
    env.update(PYTHONPATH=str(site), MPLBACKEND="Agg")
    p = subprocess.run([str(site / "bin" / "splitlab"), *argv], cwd=run, env=env, capture_output=True, text=True,
                       timeout=600)
    return p.returncode, p.stdout, p.stderr


def test_the_wheel_carries_the_package_its_cards_notebooks_and_constants(installed):
    """Every module of the package, every shipped card, notebook and constants file is in the wheel (pyproject's
    explicit package list would drop a new subpackage silently; this would see it)."""
    wheel = installed[0]
    have = set(zipfile.ZipFile(wheel).namelist())
    want = {f"splitlab/{p.relative_to(REPO / 'splitlab').as_posix()}" for p in (REPO / "splitlab").rglob("*")
            if p.suffix in (".py", ".toml") and "__pycache__" not in p.parts}
    want |= {f"splitlab/_cards/{p.name}" for p in (REPO / "kernels").glob("*.toml")}
    want |= {f"splitlab/_notebooks/{p.name}" for p in (REPO / "notebooks").glob("*.py")}
    assert want <= have, sorted(want - have)
    assert "splitlab/planners/constants/h200-sxm.toml" in have and not any(n.startswith("data/") for n in have)


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    _, site, run = installed
    p = subprocess.run([sys.executable, "-c", "import splitlab, splitlab.resources as r; "
                        "print(splitlab.__file__); print(r.cards_dir()); print(r.notebooks_dir())"],
                       cwd=run, env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True)
    lines = p.stdout.split()
    assert [Path(x) for x in lines] == [site / "splitlab" / "__init__.py", site / "splitlab" / "_cards",
                                        site / "splitlab" / "_notebooks"], p.stderr


def test_plan_from_outside_the_checkout(installed):
    code, out, err = splitlab(installed, "plan", "--workload", "llama-3-8b", "--batch", "4", "--device", "mi355x,h200")
    assert code == 0, err
    assert "# splitlab constants for h200-sxm (gqa): h200-sxm (shipped)" in out
    assert "no constants fitted for mi355x; the fallback h200-sxm (shipped)" in out


def test_sweep_dry_run_of_a_shipped_card(installed):
    code, out, err = splitlab(installed, "sweep", "gqa_decode", "--grid", "quick", "--dry-run")
    assert code == 0, err
    assert f"card {installed[1] / 'splitlab' / '_cards' / 'gqa_decode.toml'}" in out and "would write" in out
    assert "splitlab planner constants for h200-sxm: h200-sxm (shipped)" in out


def test_report_fit_and_regress_on_a_folder(installed):
    run = installed[2]
    code, out, err = splitlab(installed, "report", "--data", "sweeps", "--only", "waves", "--out", "rep", "--quiet")
    assert code == 0 and (run / "rep" / "waves.html").is_file(), err
    code, out, err = splitlab(installed, "fit", "sweeps/gqa_decode-default", "--out", "mine.toml")
    assert code == 0, err
    fc = fitted.load(run / "mine.toml")
    assert fc.device == "h200-sxm" and set(fc.families) == {"gqa"} and fc.data == ("sweeps/gqa_decode-default",)
    code, out, err = splitlab(installed, "regress", "--baseline", "splitlab", "--candidate", "mine.toml", "--data",
                              "sweeps/gqa_decode-default", "--max-regression", "1000%",
                              "--max-geomean-regression", "1000%")
    assert code == 0 and "PASS" in out, err


@pytest.mark.parametrize("argv, needle", [
    (["report", "--out", "rep2"], "expected --data DIR, a folder of splitlab sweeps"),
    (["fit"], "expected DATA, a folder of splitlab sweeps (splitlab fit DIR)"),
    (["regress", "--baseline", "splitlab", "--candidate", "flashinfer"], "expected --data DIR, a folder of"),
])
def test_no_data_outside_the_checkout_is_one_line_naming_what_to_pass(installed, argv, needle):
    code, out, err = splitlab(installed, *argv)
    assert code == 2 and err.count("\n") == 1 and needle in err and "does not exist" in err, err
