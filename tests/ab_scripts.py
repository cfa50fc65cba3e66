"""What the tests of the kernel A/B scripts share (``test_mla_ws_ab``, ``test_mqa_ws_ab``): loading a script as a
module (``load``: no experiment is a package; a script imports only the standard library and ``bench.abharness`` at
module level) and the check that its CSV appends rows under its header (``assert_appends_rows``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from splitlab.bench.csvrows import read_rows

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load(folder: str, name: str = "ab.py") -> ModuleType:
    """``experiments/<folder>/<name>`` as a module (named ``<folder>_<stem>``)."""
    path = EXPERIMENTS / folder / name
    spec = importlib.util.spec_from_file_location(f"{folder}_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def assert_appends_rows(ab: ModuleType, folder: Path, check_row: dict, time_row: dict) -> list[dict]:
    """``ab.Rows`` on ``folder/sub/ab.CSV_NAME`` (a folder not made yet): ``check_row`` written, the file closed and
    opened again, ``time_row`` appended under the one header (``ab.FIELDS``), a field not among them refused. Returns
    the rows read back."""
    path = folder / "sub" / ab.CSV_NAME
    rows = ab.Rows(path)
    rows.write(**check_row)
    rows.close()
    rows = ab.Rows(path)  # appended: the header once
    rows.write(**time_row)
    with pytest.raises(ValueError, match="not CSV fields"):
        rows.write(phase="time", speed=3)
    rows.close()
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(ab.FIELDS) and len(lines) == 3
    got = read_rows(path)
    assert [{k: v for k, v in r.items() if v} for r in got] == [{k: str(v) for k, v in r.items()}
                                                                for r in (check_row, time_row)]
    return got
