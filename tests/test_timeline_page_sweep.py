"""``notebooks/timelines.py`` given a sweep folder recorded with ``splitlab sweep --timelines`` (``sweep``, ``point``):
the Gantt charts are that point's. Its records made under Triton's interpreter hold no clock, which the page says
(the model's chart only); the same records with SYNTHETIC times written into the folder's ``timelines.parquet``
(a test stand-in, not measured) are drawn under the model, one bar a program."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("papermill")
pytest.importorskip("jupytext")
pytest.importorskip("nbconvert")

import pandas as pd  # noqa: E402
from test_sweep_schedules import card_text, load  # noqa: E402
from test_timeline_page import _build  # noqa: E402

from splitlab import results, sweep_timelines  # noqa: E402
from splitlab.bench import sweep  # noqa: E402
from splitlab.bench.sweep import SweepOptions  # noqa: E402


def shown(nb) -> str:
    """What the executed page displayed (its outputs' text and markdown, not its code)."""
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    return "\n".join(str(o.get("data", {}).get(k, "")) for o in outs for k in ("text/markdown", "text/plain"))


def test_a_sweep_point_is_drawn_and_a_clockless_one_is_said_so(tmp_path):
    text = card_text(knobs='scheduler = { values = ["uniform"] }\n', block='scheduler = ["uniform"]\n'
                     'num_splits = [2]\n')
    card = dataclasses.replace(load(tmp_path, text), planner_knobs=())
    res = sweep.run(card, SweepOptions(out=tmp_path / "runs", device="h200", quiet=True, grid="quick", timer="fake",
                                       isolate=False, timelines=True))
    folder = res.sweep_dir
    pid = results.load(folder).point_id[0]
    nb, _ = _build(tmp_path / "a", sweep=str(folder), point=pid)
    assert f"The sweep {folder.name} records of this point hold no clock" in shown(nb)
    gantt = pd.read_csv(tmp_path / "a" / "timelines-gantt.csv")
    assert set(gantt["source"]) == {"model"}

    # SYNTHETIC clock values (a stand-in for a GPU's records), written as the sweep writes the table.
    path = folder / sweep_timelines.FILE
    table = sweep_timelines.load(folder)
    table["sm"] = table["program"] % 3
    table["start_ns"] = 1000 + 100 * table["program"] + 5000 * (table["kernel"] == "merge").astype("int64")
    table["end_ns"] = table["start_ns"] + 400
    results.write_parquet(table, path, journal_sizes=results.parquet_meta(path)["journals"])
    nb, _ = _build(tmp_path / "b", sweep=str(folder), point=pid)
    assert "hold no clock" not in shown(nb)
    gantt = pd.read_csv(tmp_path / "b" / "timelines-gantt.csv")
    for kernel in ("partial", "merge"):
        assert (gantt["source"] == f"measured-{kernel}").sum() == (table["kernel"] == kernel).sum() > 0
