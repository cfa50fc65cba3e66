"""splitlab as an installed package, away from its checkout: the wheel built from the repository carries the kernel
cards, the notebooks, the constants and the result sets the default report reads (``splitlab/_data``: the catalog,
its current, confirm and peers sets, no archive), and from a temporary folder ``splitlab plan``, ``splitlab sweep
CARD --dry-run``, ``splitlab report`` (the shipped headline), ``splitlab report --data DIR``, ``splitlab fit DIR`` and
``splitlab regress`` work; without the ``lab`` extra the report says, in one line, what to install; a package
without its data says, in one line, what to pass.

The wheel is installed with ``pip install --no-deps --target`` into a fresh folder and run on this venv's
interpreter with only that folder on ``PYTHONPATH`` ahead of the dependencies (torch, triton, pandas: the venv's),
so nothing of the checkout is importable: what runs is the wheel's. It is built from a copy of the files a wheel
is made of (``data/`` whole, so that the wheel's choice of it is tested; no tests) with ``pip wheel --no-deps
--no-build-isolation``: no network, a few seconds. The report's notebooks need the ``lab`` extra: this venv's where it
has it (``make setup``), else installed offline beside the wheel (pip's local wheels), else those tests skip."""

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from splitlab import catalog
from splitlab.planners import fitted

REPO = Path(__file__).resolve().parents[1]
#: What a wheel is built from (pyproject.toml's packages and package-dir).
SOURCES = ("pyproject.toml", "README.md", "splitlab", "kernels", "notebooks", "data")
#: The ``lab`` extra's modules (``splitlab.report.LAB_MODULES``; pyproject's ``lab`` packages).
LAB = ("jupytext", "nbformat", "papermill", "nbconvert", "ipykernel", "yaml")
LAB_PACKAGES = ("jupytext", "nbformat", "papermill", "nbconvert", "ipykernel", "pyyaml")
#: Roles of the sets the default report reads, which the wheel carries (unless also archive).
SHIPPED_ROLES = {"current", "confirm", "peers"}
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


@pytest.fixture(scope="module")
def lab(installed):
    """Extra ``PYTHONPATH`` entries for the ``lab`` extra: none where this venv has it, else a folder it was installed
    into offline; skips where it cannot be."""
    if all(importlib.util.find_spec(m) for m in LAB):
        return []
    target = installed[1].parent / "lab"
    p = subprocess.run([sys.executable, "-m", "pip", "-q", "install", "--no-index", "--target", str(target),
                        *LAB_PACKAGES], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        pytest.skip(f"the lab extra is not installed and cannot be installed offline: {p.stderr.strip()[-300:]}")
    return [str(target)]


def splitlab(installed, *argv, path=(), site=None):
    """``splitlab ARGV`` from the install's console script, in the run folder: (exit code, stdout, stderr);
    ``path``: more ``PYTHONPATH`` after the install (``site``, default the wheel's install folder)."""
    _, site_, run = installed
    site = site or site_
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLITLAB_")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), *map(str, path)]), MPLBACKEND="Agg")
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


def test_the_wheel_carries_the_sets_the_default_report_reads_and_no_more(installed):
    """splitlab/_data: the catalog and, of every set whose role is current, confirm or peers (not archive), each
    sweep's rows and sidecar; no study or archive set, no CSV copy, no journal."""
    have = {n.removeprefix("splitlab/_data/") for n in zipfile.ZipFile(installed[0]).namelist()
            if n.startswith("splitlab/_data/")}
    data = REPO / "data"
    want = {"catalog.toml"} | {
        f"{side.parent.relative_to(data).as_posix()}/{name}"
        for e in catalog.entries() if SHIPPED_ROLES & set(e.roles) and "archive" not in e.roles
        for src in e.sources() for side in src.rglob("sweep.json") for name in ("results.parquet", "sweep.json")}
    assert have == want, (sorted(have - want)[:5], sorted(want - have)[:5])
    assert any(n.startswith("h200-peers/") for n in have) and not any(n.startswith("archive/") for n in have)


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


def test_report_shows_the_shipped_headline_from_outside_the_checkout(installed, lab, tmp_path):
    """``splitlab report`` in a folder far from any checkout finds the sets the wheel carries: its index leads with
    the headline the checkout's report states (the same numbers), the kernels against the catalog's peers set."""
    import pandas as pd

    from splitlab import report

    code, out, err = splitlab(installed, "report", "--only", "headline", "--out", "rep-head", "--quiet", path=lab)
    run = installed[2]
    assert code == 0, err
    page = (run / "rep-head" / "index.html").read_text()
    assert '<table class="headline">' in page and "splitlab / best peer (h200-peers)" in page, page[:2000]
    assert "_data/h200" in page  # the wheel's copy (splitlab/_data), not the checkout's data/
    shipped = pd.read_csv(run / "rep-head" / report.HEADLINE_CSV)
    report._headline(report._headline_sets(report.notebook_parameters(), {}), False, tmp_path, False)
    pd.testing.assert_frame_equal(shipped, pd.read_csv(tmp_path / report.HEADLINE_CSV))


def test_report_without_the_lab_extra_is_one_line_naming_it(installed, tmp_path):
    """Installed without ``[lab]`` (here: its modules hidden from the interpreter), ``splitlab report`` is one line
    naming the extra and exit 2, not a ModuleNotFoundError traceback."""
    hide = tmp_path / "nolab"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\n\n\nclass NoLab:  # as if the lab extra were not installed\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.partition('.')[0] in {set(LAB)!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n\n\n"
        "sys.meta_path.insert(0, NoLab())\n")
    code, out, err = splitlab(installed, "report", "--out", "rep-nolab", path=[hide])
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "the report's notebooks need the lab extra" in err and "pip install 'splitlab[lab]'" in err, err
    assert not (installed[2] / "rep-nolab").exists()


def test_report_fit_and_regress_on_a_folder(installed, lab):
    run = installed[2]
    code, out, err = splitlab(installed, "report", "--data", "sweeps", "--only", "waves", "--out", "rep", "--quiet",
                              path=lab)
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
def test_no_data_outside_the_checkout_is_one_line_naming_what_to_pass(installed, argv, needle, tmp_path):
    """A package without its data (the wheel's install, its splitlab/_data left out) says what to pass."""
    bare = tmp_path / "site"
    shutil.copytree(installed[1], bare, ignore=lambda folder, names: ["_data"] if Path(folder).name == "splitlab"
                    else [])
    code, out, err = splitlab(installed, *argv, site=bare)
    assert code == 2 and err.count("\n") == 1 and needle in err and "does not exist" in err, err
