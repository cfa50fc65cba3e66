"""A CSV written row by row as an A/B makes its rows (so a run cut short keeps what it measured), or at once from a
list of rows, and read back."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path


class CsvRows:
    """``path`` appended row by row with ``fields`` as columns (the header once, when the file is new or empty),
    flushed after each row; a field not in ``fields`` is a ``ValueError``."""

    def __init__(self, path: str | Path, fields: Sequence[str]) -> None:
        self.path = Path(path)
        self.fields = list(fields)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._f = open(self.path, "a", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=self.fields, restval="")
        if new:
            self._w.writeheader()
            self._f.flush()

    def write(self, **row) -> dict:
        unknown = set(row) - set(self.fields)
        if unknown:
            raise ValueError(f"not CSV fields: {sorted(unknown)}")
        self._w.writerow(row)
        self._f.flush()
        return row

    def close(self) -> None:
        self._f.close()


def write_rows(path: str | Path, rows: Sequence[dict]) -> None:
    """``rows`` written to ``path`` at once (replacing it), the columns the union of the rows' keys in the order they
    are first seen; a row without a column leaves it empty."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def read_rows(path: str | Path) -> list[dict]:
    """Every row of a CSV as a dict of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
