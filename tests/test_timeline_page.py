"""``notebooks/timelines.py`` executed alone (``splitlab report --only timelines``): without a measured set it draws
the modelled Gantt chart and ledger shares and says that no measured timeline set is in the catalog; given the
SYNTHETIC fixture ``tests/fixtures/timelines`` as ``measured`` it draws the measured Gantt chart under the modelled
one and the measured ledger; by default it draws the shipped H200 set (catalog ``h200-timelines``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("papermill")
pytest.importorskip("jupytext")
pytest.importorskip("nbconvert")

import nbformat  # noqa: E402
import pandas as pd  # noqa: E402

from splitlab import ledger, notebook, report  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"


def _build(tmp_path, **params):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        report.build_report(FIXTURES / "sweeps", tmp_path, only=["timelines"], progress=False, allow_fake=True,
                            parameters={"timelines": params} if params else None)
    nb = nbformat.read(tmp_path / "timelines.ipynb", as_version=4)
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outs if o.output_type == "error"]
    page = (tmp_path / "timelines.html").read_text()
    assert str(report.ROOT) not in page  # (the report's rule: no absolute path on a page)
    return nb, page


def test_without_measured_timelines_the_page_is_modelled_and_says_so(tmp_path):
    nb, page = _build(tmp_path, timelines="no-such-set")
    assert "No measured timeline set in the catalog" in page
    assert "measured (" not in page
    finding = notebook.read_finding(nb)["finding"]
    assert finding.startswith("MODELLED")
    gantt = pd.read_csv(tmp_path / "timelines-gantt.csv")
    assert set(gantt["source"]) == {"model"}
    shares = pd.read_csv(tmp_path / "timelines-ledger.csv", index_col=0)
    assert list(shares.columns) == ["busy", "idle", "tail"] and len(shares) == 9
    assert shares.sum(axis=1).to_numpy() == pytest.approx(1.0, abs=1e-3)  # (rounded to 4 places)


def test_a_measured_set_is_drawn_under_the_model(tmp_path):
    nb, page = _build(tmp_path, measured=str(FIXTURES / "timelines"))
    assert "No measured timeline set" not in page and "Measured timelines from <code>timelines</code>" in page
    assert "SYNTHETIC test fixture, not measured" in page  # the fixture says what it is
    gantt = pd.read_csv(tmp_path / "timelines-gantt.csv")
    fixture = pd.read_csv(FIXTURES / "timelines" / "timelines.csv", dtype={"shape": str})
    point = fixture[fixture["dist"] == "longtail"]
    assert (gantt["source"] == "measured-partial").sum() == (point["kernel"] == "partial").sum()
    assert (gantt["source"] == "measured-merge").sum() == (point["kernel"] == "merge").sum()
    model = gantt[gantt["source"] == "model"]
    measured = gantt[gantt["source"] == "measured-partial"]
    assert model["end"].max() == pytest.approx(measured["end"].max(), rel=1e-6)  # scaled to the measured span
    shares = pd.read_csv(tmp_path / "timelines-ledger.csv", index_col=0)
    assert list(shares.columns) == ["floor", *ledger.PARTS]
    assert shares.sum(axis=1).to_numpy() == pytest.approx(1.0, abs=1e-3)  # floor + parts = the measured time
    assert notebook.read_finding(nb)["finding"].startswith("Measured (2 points)")


def test_the_shipped_set_is_the_default(tmp_path):
    """The catalog's ``h200-timelines`` (measured on the H200, records gzipped): its default point drawn measured, a
    batch-64 point (no records shipped) said so, the finding over every point."""
    nb, page = _build(tmp_path)
    points = pd.read_csv(report.ROOT / "data" / "bench" / "h200" / "timelines" / "points.csv")
    assert "Measured timelines from <code>timelines</code> (catalog <code>h200-timelines</code>)" in page
    gantt = pd.read_csv(tmp_path / "timelines-gantt.csv")
    assert (gantt["source"] == "measured-partial").sum() > 0
    assert notebook.read_finding(nb)["finding"].startswith(f"Measured ({(points['status'] == 'ok').sum()} points)")
    _, page = _build(tmp_path / "b64", batch=64)
    assert "holds no records of this point" in page
