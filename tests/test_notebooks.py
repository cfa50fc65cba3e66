"""The notebooks, executed headlessly by ``splitlab.report.build_report`` (jupytext -> papermill -> nbconvert) on
the committed fixture ``tests/fixtures/sweeps`` (a few hundred rows of the real schema; see
``tests/fixtures/make_fixture.py``). ``allow_fake`` is passed only while the fixture's sidecars say it was made
with the fake timer, so a real subset swapped in is checked as measured data.

The kernels run with no visible GPU (``CUDA_VISIBLE_DEVICES=""``), so the ``sweep`` notebook takes its no-GPU
path here on any machine. ``SPLITLAB_NOTEBOOK_FIXTURE=<folder>`` runs the same checks on another result set (e.g. a
candidate subset before it replaces the committed one)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("papermill")
pytest.importorskip("jupytext")
pytest.importorskip("nbconvert")

import nbformat  # noqa: E402
import pandas as pd  # noqa: E402
from sweep_fixtures import tiny_card  # noqa: E402

from splitlab import analysis, catalog, datasets, notebook, planners, plots, report  # noqa: E402
from splitlab.errors import SplitlabError  # noqa: E402

FIXTURE = Path(os.environ.get("SPLITLAB_NOTEBOOK_FIXTURE") or Path(__file__).parent / "fixtures" / "sweeps")
FAKE = datasets.data_info(FIXTURE).fake


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        mp.setenv("MPLBACKEND", "Agg")  # the driver must drop it, or the figures vanish from the notebooks
        index = report.build_report(FIXTURE, out, progress=False, allow_fake=FAKE)
    return out, index


def _outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


@pytest.mark.parametrize("name", report.NOTEBOOKS)
def test_each_notebook_runs_into_html_with_figures_and_a_finding(built, name):
    out, _ = built
    nb = nbformat.read(out / f"{name}.ipynb", as_version=4)
    outs = _outputs(nb)
    errors = [f"{o.ename}: {o.evalue}" for o in outs if o.output_type == "error"]
    assert not errors, errors
    images = [o for o in outs if "image/png" in o.get("data", {})]
    if name == "sweep":
        first = next(o for o in outs if o.get("data") or o.get("text"))
        assert "No GPU" in str(first.get("data", {}).get("text/markdown", first.get("text", "")))
        assert not images
    else:
        assert images, f"{name} produced no figure"
    page = (out / f"{name}.html").read_text()
    for o in images:  # every figure shown with its numbers (notebook.show_figure), written beside the page as CSV
        fig = o.get("metadata", {}).get("splitlab", {}).get("figure")
        assert fig, f"{name}: a figure without its numbers (plt.show() instead of notebook.show_figure)"
        csv = out / f"{name}-{fig}.csv"
        assert csv.is_file() and csv.read_text().strip(), csv
        assert f'href="{csv.name}"' in page, csv.name
    finding = notebook.read_finding(nb)
    assert finding and finding["finding"]
    if FAKE and name not in ("waves", "sweep"):
        assert "MODELLED" in finding["finding"]
    page = (out / f"{name}.html").read_text()
    assert "data:image/png;base64" in page or name == "sweep"
    assert "<script src=" not in page  # self-contained: nothing loaded from the network
    assert "datasets.load_data(" not in page and "import matplotlib" not in page  # no code cells
    assert "Finding." in page


def test_index_links_every_notebook_with_its_finding_device_and_date(built):
    out, index = built
    assert index == out / "index.html"
    text = index.read_text()
    info = datasets.data_info(FIXTURE)
    for name in report.NOTEBOOKS:
        if name == "sweep":  # no GPU here: a page without a run is one line on the index, not a link
            assert 'href="sweep.html"' not in text and "(sweep): no GPU: skipped." in text
            continue
        assert f'href="{name}.html"' in text and f'href="{name}.ipynb"' in text
    assert info.date in text and "132 SMs" in text
    assert str(report.ROOT) not in text and "tests/fixtures/sweeps" in text  # no absolute path
    assert ("MODELLED (fake timer), not measured" in text) == FAKE
    assert "no finding recorded" not in text and "failed:" not in text


@pytest.mark.parametrize("name", report.NOTEBOOKS)
def test_each_page_reads_in_a_minute(built, name):
    """No DataFrame printed whole (pandas' "N rows × M columns"), no NaN cell, no absolute path; a long table is
    cut to its rows that matter with the rest as CSV beside the page (``notebook.show_table``)."""
    out, _ = built
    page = (out / f"{name}.html").read_text()
    assert not re.search(r"\d+ rows × \d+ columns", page), name
    assert not re.search(r"<t[dh][^>]*>\s*(NaN|nan|None|&lt;NA&gt;)\s*</t[dh]>", page), name
    assert str(report.ROOT) not in page, name
    for csv in re.findall(r'href="([\w.-]+\.csv)"', page):
        assert (out / csv).is_file(), (name, csv)


def test_split_regressions_shows_every_family_and_says_what_it_compares(built):
    """Every family (and lengths) of the compared shapes has its panel, drawn from all of its shapes; the wording
    says that two rules are compared on splitlab's kernels, not two kernels."""
    out, _ = built
    compared = pd.read_csv(out / "split_regressions-ratio.csv")
    drawn = pd.read_csv(out / "split_regressions-families.csv")
    summary = pd.read_csv(out / "split_regressions-family-summary.csv")
    pairs = set(zip(compared["family"], compared["lengths"], strict=True))
    assert pairs and set(zip(drawn["family"], drawn["lengths"], strict=True)) == pairs and len(drawn) == len(compared)
    assert set(zip(summary["family"], summary["lengths"], strict=True)) == pairs
    assert {"GQA", "MLA", "sparse MLA"} & {f for f, _ in pairs} == {f for f, _ in pairs}
    finding = notebook.read_finding(nbformat.read(out / "split_regressions.ipynb", as_version=4))["finding"]
    assert "splitlab's rule vs FlashInfer's rule, both on splitlab's kernels" in finding
    assert "time ratio" in finding


def test_parameters_cells_are_tagged_and_typed(tmp_path):
    import jupytext
    import papermill

    for name in report.NOTEBOOKS:
        nb = jupytext.read(report.NOTEBOOK_DIR / f"{name}.py")
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, name
        src = tagged[0].source
        assert re.search(r"^data: str = \"[\w-]+\"  # ", src, re.M), name  # a catalog name
        assert re.search(r"^allow_fake: bool = False  # ", src, re.M), name
        # every line of the cell is a typed, commented parameter papermill can read
        lines = [x for x in src.splitlines() if x.strip()]
        assert all(re.match(r"^\w+: \w+ = .+  # .+", x) for x in lines), name
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
        declared = papermill.inspect_notebook(str(tmp_path / f"{name}.ipynb"))
        assert {"data", "allow_fake"} <= set(declared), name
        assert len(declared) == len(lines), (name, sorted(declared))  # papermill parsed every line


def test_notebook_defaults_are_what_the_report_injects():
    """A notebook opened in JupyterLab computes what ``splitlab report`` shows: the defaults of its parameters cell
    equal the parameters the report injects by default, both the catalog's (``out`` aside: the report's folder)."""
    import jupytext

    injected = report.notebook_parameters()
    assert injected["data"] == catalog.current().name and injected["confirm"] == catalog.names("confirm")
    for name in report.NOTEBOOKS:
        nb = jupytext.read(report.NOTEBOOK_DIR / f"{name}.py")
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        defaults: dict = {}
        exec(cell.source, {}, defaults)
        shared = {k: v for k, v in injected.items() if k in defaults and k != "out"}
        assert {"data", "allow_fake"} <= set(shared), name
        if name == "kernels":
            assert shared["peers"] == catalog.names("peers"), name
        assert {k: defaults[k] for k in shared} == shared, name


TINY_CARD = tiny_card("t_notebook", splits="[1, 2, 4]", block_n=False)


def test_the_sweep_notebook_runs_a_tiny_card_with_the_fake_timer(tmp_path):
    # Its GPU path, on the CPU: a reference-based implementation (tests/sweep_fixtures.py), modelled times.
    card = tmp_path / "t_notebook.toml"
    card.write_text(TINY_CARD)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        mp.setenv("PYTHONPATH", str(Path(__file__).parent))
        report.build_report(FIXTURE, tmp_path / "out", only=["sweep"], progress=False, allow_fake=FAKE,
                            parameters={"sweep": {"card": str(card), "timer": "fake"}})
    nb = nbformat.read(tmp_path / "out" / "sweep.ipynb", as_version=4)
    outs = _outputs(nb)
    assert not [o for o in outs if o.output_type == "error"]
    assert [o for o in outs if "image/png" in o.get("data", {})]
    assert notebook.read_finding(nb)["finding"].startswith("MODELLED: t_notebook/quick")
    swept = tmp_path / "out" / "sweep-runs" / "t_notebook-quick"
    assert (swept / "results.parquet").is_file() and json.loads((swept / "sweep.json").read_text())["timer"] == "fake"
    with pytest.raises(SplitlabError, match="parameters\\['sweep'\\] names nope"):
        report.build_report(FIXTURE, tmp_path / "out2", only=["sweep"], progress=False, allow_fake=FAKE,
                            parameters={"sweep": {"nope": 1}})


# --- bad data ---------------------------------------------------------------------------------------------------

def test_a_missing_data_dir_is_one_clear_error_naming_it(tmp_path):
    missing = tmp_path / "no-such-data"
    with pytest.raises(SplitlabError, match=re.escape(str(missing)) + ".*does not exist"):
        report.build_report(missing, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_a_foreign_data_dir_is_one_clear_error_naming_it(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "numbers.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SplitlabError, match=re.escape(str(foreign)) + ".*no splitlab sweep"):
        report.build_report(foreign, tmp_path / "out", progress=False)
    (foreign / "run").mkdir()
    (foreign / "run" / "sweep.json").write_text(json.dumps({"name": "someone else's sweep"}))
    with pytest.raises(SplitlabError, match=re.escape(str(foreign)) + ".*not a splitlab sweep sidecar"):
        report.build_report(foreign, tmp_path / "out", progress=False)
    (foreign / "run" / "sweep.json").write_text(json.dumps({"sweep_id": "x", "kernel": "k", "schema_version": 99}))
    with pytest.raises(SplitlabError, match=re.escape(str(foreign)) + ".*schema_version=99"):
        report.build_report(foreign, tmp_path / "out", progress=False)
    a_file = tmp_path / "results.csv"
    a_file.write_text("x\n")
    with pytest.raises(SplitlabError, match=re.escape(str(a_file)) + ".*is a file"):
        report.build_report(a_file, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not FAKE, reason="the fixture holds measured data")
def test_modelled_data_needs_allow_fake(tmp_path):
    with pytest.raises(SplitlabError, match="timer='fake'.*--allow-fake"):
        report.build_report(FIXTURE, tmp_path / "out", progress=False)
    with pytest.raises(SplitlabError, match="allow_fake=True"):
        datasets.load_data(FIXTURE)


def test_only_names_known_notebooks(tmp_path):
    with pytest.raises(SplitlabError, match="only='nope' is not allowed; expected any of waves"):
        report.build_report(FIXTURE, tmp_path / "out", only=["nope"], progress=False, allow_fake=True)


# --- pieces ---------------------------------------------------------------------------------------------------

def test_data_info_reads_device_date_and_timer():
    info = datasets.data_info(FIXTURE)
    assert info.sm_count == 132 and re.fullmatch(r"\d{4}-\d{2}-\d{2}( to \d{4}-\d{2}-\d{2})?", info.date)
    assert {s["kernel"] for s in info.sweeps} >= {"gqa_decode", "mla_decode", "sparse_mla_decode"}
    assert ("MODELLED" in info.label) == FAKE


def test_every_planner_keeps_one_color():
    names = planners.names()
    assert set(names) <= set(plots.PLANNER_COLORS)
    assert len({plots.PLANNER_COLORS[n] for n in names}) == len(names)
    assert plots.planner_color("modular@mi355x") == plots.planner_color("modular")
    assert plots.planner_style("modular@mi355x")["linestyle"] != "-"
    assert plots.planner_order(["splitlab", "aiter", "modular@mi355x", "modular"])[-1] == "splitlab"


def test_titles_carry_device_date_and_say_modelled():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    info = datasets.DataInfo(path=FIXTURE, sweeps=(), gpus=("cpu",), presets=("h200-sxm",), sm_count=132,
                           date="2026-11-29", timers=("fake",))
    plots.title(fig, "latency", info)
    assert "h200-sxm" in fig._suptitle.get_text() and "2026-11-29" in fig._suptitle.get_text()
    assert plots.MODELLED in fig._suptitle.get_text()
    plots.title(ax, "waves", None, device="mi355x")
    assert "mi355x" in ax.get_title() and plots.MODELLED not in ax.get_title()
    plots.log2_axis(ax, "both")
    ax.set_xlim(1, 4096)
    assert plots.mark_sm_multiples(ax, 132) == [1, 2, 3, 4, 8, 16]
    plt.close(fig)


def test_cta_rule_counts_load_points():
    import pandas as pd

    base = dict(kernel="sparse_mla_decode", device="h200-sxm", kind="sparse_mla", num_q_heads=64, num_kv_heads=1,
                head_dim_qk=512, head_dim_v=512, ctx_len=65536, page_size=1, topk=2048, dtype="bf16", block_h=64,
                num_warps=8, num_stages=2, status="ok", sm_count=132)
    rows = []
    # (batch, splits, ctas, p50 at BLOCK_K 32, at 64): below the SMs 64 wins, above 32 wins, one tie, one miss.
    for b, s, ctas, t32, t64 in ((1, 8, 8, 12.0, 10.0), (32, 8, 256, 20.0, 25.0), (64, 4, 256, 30.0, 30.1),
                                 (16, 4, 64, 9.0, 11.0)):
        for bk, t in ((32, t32), (64, t64)):
            rows.append(dict(base, batch=b, num_splits=s, ctas=ctas, block_k=bk, p50_us=t))
    rule = analysis.cta_rule(pd.DataFrame(rows))
    assert len(rule) == 4 and int(rule["decisive"].sum()) == 3
    assert int(rule[rule["decisive"]]["predicted"].sum()) == 2  # batch 16: 32 faster below the SMs: a miss
    assert set(rule[rule["ctas"] == 256]["rule"]) == {32}
