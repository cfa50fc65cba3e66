"""The report's pages as a kernel team reads them: ``index.html`` leads with the headline table (the numbers README's
table states, from the same computation, ``splitlab.headline``) and a figure; ``planner_shootout.html`` keeps its
detail folded (at most 12 tables outside ``<details>``, no cell cut off); each figure's numbers lie beside the page
as CSV, linked under the figure.

Only the ``planner_shootout`` notebook runs here (on the committed fixture, ``tests/fixtures/sweeps``, with the
fixture itself as its confirm set so that the confirm branch runs); ``tests/test_notebooks.py`` checks every
notebook's figures for their CSV."""

from __future__ import annotations

import base64
import html
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytest.importorskip("papermill")
pytest.importorskip("jupytext")
pytest.importorskip("nbconvert")

import nbformat  # noqa: E402
import pandas as pd  # noqa: E402

from splitlab import datasets, headline, notebook, report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "sweeps"
FAKE = datasets.data_info(FIXTURE).fake
README = (ROOT / "README.md").read_text()
MAX_TOP_LEVEL_TABLES = 12
#: README's headline rows: a family, and its lengths where the table has ragged rows (``headline.family_label``).
README_ROW = r"^\| ((?:GQA|MLA|sparse MLA)(?: · (?:uniform|ragged))?) \|(.*)\|$"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("pages")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        report.build_report(FIXTURE, out, only=["planner_shootout", "headline"], progress=False, allow_fake=FAKE,
                            parameters={"planner_shootout": {"confirm": [str(FIXTURE)]}})
    return out


class _Tables(HTMLParser):
    """Counts ``<table>`` elements, and those outside any ``<details>``."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = self.top = self.all = 0

    def handle_starttag(self, tag, attrs):
        if tag == "details":
            self.depth += 1
        elif tag == "table":
            self.all += 1
            self.top += self.depth == 0

    def handle_endtag(self, tag):
        if tag == "details":
            self.depth -= 1


def tables(page: str) -> _Tables:
    t = _Tables()
    t.feed(page)
    return t


def _png_outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})]


# --- index.html -----------------------------------------------------------------------------------------------

def test_index_leads_with_the_headline_table_and_a_figure(built):
    text = (built / "index.html").read_text()
    answer, pages = text.index('<table class="headline">'), text.index("<h2>Pages</h2>")
    assert answer < pages  # the answer first, then the pages
    pngs = re.findall(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text[answer:pages])
    assert len(pngs) == 1 and base64.b64decode(pngs[0])[:8] == b"\x89PNG\r\n\x1a\n"
    head = pd.read_csv(built / report.HEADLINE_CSV)
    assert {"family", "kernel"} <= set(head.columns) and len(head)
    summary = pd.read_csv(built / report.SUMMARY_CSV)
    assert {"kernel", "set", "planner", "shapes", "measured", "geomean", "p90", "worst"} <= set(summary.columns)
    assert len(summary) and set(summary["set"]) == {"held-out", FIXTURE.name}  # the figure's rows: held-out, confirm
    for csv in (report.HEADLINE_CSV, report.SUMMARY_CSV, "planner_shootout-summary.csv"):
        assert f'href="{csv}"' in text, csv
    assert "The 6 sweep(s) behind these pages" in text and tables(text).top == 2  # the sweeps folded


def test_readme_table_is_the_headline_and_index_html_shows_it():
    """README's table "What the shipped H200 data say" is the headline of the report's default sets, cell for cell
    (tests/test_readme.py holds it to `python -m splitlab.fit`'s output), and the front page carries those cells."""
    p = report.notebook_parameters()
    head = headline.build(p["data"], p["confirm"], p["peers"])
    readme = [[c.strip() for c in (family + "|" + cells).split("|")]
              for family, cells in re.findall(README_ROW, README, re.M)]
    assert readme == headline.readme_rows(head)
    page = report.index_html([], datasets.data_info(p["data"]), head)
    for row in readme:
        for cell in row:
            shown = f"<b>{html.escape(cell[2:-2])}</b>" if cell.startswith("**") else html.escape(cell)
            assert f"<td>{shown}</td>" in page, cell
    # the kernels against their peers where the peers set measured them (GQA and MLA), not sparse MLA
    assert set(head.peers) == {"gqa_decode", "mla_decode"}
    for k, q in head.peers.items():
        assert 0 < q.roofline <= 1 and 0 < q.peer_roofline <= 1 and q.shapes > 0, k
        # one cell a family, spanning its uniform and ragged rows
        assert re.search(rf'<td(?: rowspan=\d)?>{q.roofline:.2f} / {q.peer_roofline:.2f}</td>', page), k
    assert page.count("not measured") == 2  # sparse MLA's two kernel cells


def test_the_headline_is_one_definition_whichever_way_the_data_are_named(tmp_path, monkeypatch):
    """Issue 39: ``splitlab report --data h200`` and ``--data data/h200`` (the same folder) state the same numbers:
    the planner columns on the held-out shapes and the catalog's confirm set, the kernels against the catalog's peers
    set (not the SDPA sweeps the current set also holds), built as the report builds them."""
    monkeypatch.chdir(ROOT)
    heads = {}
    for data in ("h200", "data/h200"):
        folder = tmp_path / data.replace("/", "-")
        folder.mkdir()
        head, note = report._headline(report._headline_sets(report.notebook_parameters(data), {}), False, folder,
                                      False)
        assert head is not None, note
        heads[data] = head
        assert head.sets == ["held-out", "h200-confirm"] and head.peers_set == "h200-peers", data
        assert set(head.peers) == {"gqa_decode", "mla_decode"} and not head.peers_note, data
    by_name, by_path = heads.values()
    pd.testing.assert_frame_equal(by_name.table(), by_path.table())
    assert headline.readme_rows(by_name) == headline.readme_rows(by_path)
    assert headline.html(by_name) == headline.html(by_path)
    assert (tmp_path / "h200" / report.HEADLINE_CSV).read_bytes() == (tmp_path / "data-h200" /
                                                                       report.HEADLINE_CSV).read_bytes()


def test_data_outside_the_catalog_without_peers_say_so(tmp_path):
    """Data outside the catalog are compared with the peers they hold; holding none, the kernels' cells say so
    instead of comparing with a subset of them or leaving it unexplained."""
    import shutil

    shutil.copytree(FIXTURE / "gqa_decode-default", tmp_path / "mine" / "gqa_decode-default")
    head = headline.build(str(tmp_path / "mine"), allow_fake=FAKE)
    assert head.peers == {} and head.peers_note == headline.NO_PEER_MEASURED and head.peers_set == "mine"
    page = headline.html(head)
    assert headline.NO_PEER_MEASURED in page and "not measured" not in page
    index = report.index_html([], datasets.data_info(tmp_path / "mine"), head)
    assert f"({headline.NO_PEER_MEASURED})" in index
    own = headline.build(str(FIXTURE), allow_fake=FAKE)  # the fixture holds SDPA's sweeps: compared with them
    assert own.peers_set == FIXTURE.name and "gqa_decode" in own.peers and not own.peers_note


def test_a_report_without_a_headline_says_why():
    info = datasets.data_info(FIXTURE)
    page = report.index_html([], info, None, "No headline for these data: no splitlab kernel")
    assert "No headline for these data" in page and 'class="headline"' not in page
    failed = report.index_html([], info, None, f"{report.HEADLINE_FAILED}: KeyError: 'x'")
    assert 'class="err">the headline failed' in failed


# --- planner_shootout.html ------------------------------------------------------------------------------------

def test_the_shootout_page_folds_its_detail_and_cuts_no_column(built):
    page = (built / "planner_shootout.html").read_text()
    t = tables(page)
    assert t.top <= MAX_TOP_LEVEL_TABLES and t.all > t.top, (t.top, t.all)
    assert page.count("<details>") >= 4  # the sweeps, the per-kernel table, the worst shapes, each goal table
    assert "...</td>" not in page and ">...<" not in page  # pandas' truncation marks
    nb = nbformat.read(built / "planner_shootout.ipynb", as_version=4)
    assert [o.metadata["splitlab"]["figure"] for o in _png_outputs(nb)] == ["summary", "ecdf"]


def test_each_figure_has_its_numbers_beside_the_page(built):
    nb = nbformat.read(built / "planner_shootout.ipynb", as_version=4)
    page = (built / "planner_shootout.html").read_text()
    for out in _png_outputs(nb):
        name = out.metadata["splitlab"]["figure"]
        csv = built / f"planner_shootout-{name}.csv"
        assert csv.is_file() and len(pd.read_csv(csv)), csv
        assert f'href="{csv.name}"' in page
    summary = pd.read_csv(built / "planner_shootout-summary.csv")
    assert set(summary["set"]) == {"fit", "held-out", FIXTURE.name}


# --- the pieces -----------------------------------------------------------------------------------------------

def test_figure_names_are_checked_and_unique_per_notebook(tmp_path):
    with pytest.raises(ValueError, match="name='Bad name' is not allowed"):
        notebook.show_figure(None, "Bad name", pd.DataFrame())

    def fig_output(name: str) -> dict:
        return {"output_type": "display_data", "data": {"image/png": ""},
                "metadata": {"splitlab": {"figure": name, "csv": f"a,b\n1,{name}\n"}}}

    nb = {"cells": [{"cell_type": "code", "outputs": [fig_output("one"), fig_output("two")]}]}
    page = report.Page("nb", "title")
    assert report._write_figure_tables(nb, "nb", tmp_path, page) == ["nb-one.csv", "nb-two.csv"]
    assert page.status == "ok" and (tmp_path / "nb-two.csv").read_text() == "a,b\n1,two\n"
    nb["cells"][0]["outputs"].append(fig_output("one"))
    report._write_figure_tables(nb, "nb", tmp_path, page)
    assert "figure name 'one' shown twice" in page.status


def test_the_headline_cells_say_what_readme_says():
    s = headline.PlannerScore(geomean=1.0051, worst=1.0579, shapes=80, goal_met=True, best="flashmla",
                              best_geomean=1.0469, best_shapes=52)
    assert s.cell == "**1.005 / 1.058**" and s.best_cell == "FlashMLA 1.047 (on its 52 shapes)"
    s = headline.PlannerScore(geomean=1.0264, worst=1.1059, shapes=18, goal_met=False, best="sglang",
                              best_geomean=1.1535, best_shapes=18)
    assert s.cell == "1.026 / 1.106" and s.best_cell == "SGLang 1.153"


def test_the_headline_scores_uniform_and_ragged_batches_apart():
    """A row per family and lengths (``sweep_fixtures.lengths_rows``: splitlab's rule best on the uniform batches,
    1.5x off on a ragged one): in the scores, README's rows, the front page's table (the kernels' cells spanning
    the family's rows), its CSV and the figure's rows; uniform data alone keep the rows unsuffixed."""
    from sweep_fixtures import lengths_rows

    rows = lengths_rows()
    tables = headline.shootouts(rows, {"fresh": rows})
    scores, summary = headline.planner_scores(tables)
    assert list(scores) == [("mla_decode", "uniform"), ("mla_decode", "ragged")]
    u, r = (scores["mla_decode", n]["held-out"] for n in ("uniform", "ragged"))
    assert (u.geomean, u.worst, u.shapes, u.goal_met, u.best, u.best_shapes) == (1.0, 1.0, 2, True, "flashmla", 2)
    assert (r.worst, r.shapes, r.goal_met, r.best, r.best_shapes) == (1.5, 2, False, "flashmla", 1)
    assert scores["mla_decode", "ragged"]["fresh"] == r
    head = headline.Headline(data="x", sets=["held-out", "fresh"], planners=scores, peers={}, peers_set="",
                             summary=summary)
    assert head.rows == [("mla_decode", "uniform"), ("mla_decode", "ragged")] and head.split
    want = [["MLA · uniform", *["**1.000 / 1.000**", "FlashMLA 1.200"] * 2],
            ["MLA · ragged", *["1.225 / 1.500", "FlashMLA 1.000 (on its 1 shapes)"] * 2]]
    assert headline.readme_rows(head) == want
    page = headline.html(head)
    assert page.count("<tr>") == 3 and page.count("<td rowspan=2>") == 2 and page.count("not measured") == 2
    csv = head.table()
    assert csv["lengths"].tolist() == ["uniform", "ragged"] and csv["held-out: splitlab worst"].tolist() == [1.0, 1.5]
    fig = headline.figure(headline.summary_table(head))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[:2] == ["MLA · held-out · uniform", "MLA · held-out · ragged"] and len(labels) == 4
    uniform = rows[rows["length_dist"] == "uniform"]
    scores, summary = headline.planner_scores(headline.shootouts(uniform))
    head = headline.Headline(data="x", sets=["held-out"], planners=scores, peers={}, peers_set="", summary=summary)
    assert not head.split and [r[0] for r in headline.readme_rows(head)] == ["MLA"]
