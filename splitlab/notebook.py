"""What a report page (a notebook in ``notebooks/``) shows besides its cells, and reading it back.

A notebook states its finding with ``record_finding(text)``: a Markdown output ("**Finding.** ...") whose output
metadata carries ``{"splitlab": {"finding": text, ...}}``; ``read_finding`` takes the last one from the executed
notebook. ``show_figure(fig, name, table)`` shows a figure with the numbers it is drawn from in its metadata
(``figure_tables`` reads them back; ``splitlab report`` writes each beside the page as CSV). ``fold`` shows detail
folded under a one-line summary; ``show_whole_tables`` lets pandas print tables uncut. Nothing is written beside the
notebook::

    from splitlab import datasets, notebook
    df, info = datasets.load_data(data, allow_fake=allow_fake)
    notebook.show_figure(fig, "roofline", table)
    notebook.record_finding("splitlab's kernels reach 0.42 of the roofline ...")

IPython, matplotlib and nbformat load only when a helper that needs them runs.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitlab.errors import SplitlabError

if TYPE_CHECKING:
    import pandas as pd

#: The key of splitlab's output metadata (findings, figures' numbers).
FINDING_KEY = "splitlab"


# --- findings ---------------------------------------------------------------------------------------------

def record_finding(text: str, **facts: Any) -> None:
    """Show ``text`` as the notebook's one-line finding (and keep it, with ``facts``, in the output's
    metadata, where ``read_finding`` and the report index find it)."""
    from IPython.display import Markdown, display

    display(Markdown(f"**Finding.** {text}"), metadata={FINDING_KEY: {"finding": text, **facts}})


def read_finding(nb: Any) -> dict | None:
    """The last finding an executed notebook (an ``nbformat`` node) recorded, as ``{"finding": ..., ...}``."""
    found = None
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []) or []:
            meta = (out.get("metadata") or {}).get(FINDING_KEY)
            if isinstance(meta, dict) and meta.get("finding"):
                found = dict(meta)
    return found


def save_figure(executed: str | Path, number: int, dest: str | Path) -> Path:
    """Write the ``number``-th figure (1-based, in output order) of an executed notebook as a PNG file (for the
    README: ``save_figure("reports/planner_shootout.ipynb", 1, "docs/img/shootout.png")``)."""
    import base64

    import nbformat

    nb = nbformat.read(Path(executed), as_version=4)
    pngs = [o["data"]["image/png"] for c in nb.cells for o in c.get("outputs", []) or []
            if "image/png" in (o.get("data") or {})]
    if not 1 <= number <= len(pngs):
        raise SplitlabError(f"number={number} is not allowed; expected 1..{len(pngs)} (the figures of {executed})")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(base64.b64decode(pngs[number - 1]))
    return dest



#: A figure's name (``show_figure``): the tail of its CSV's file name, ``<notebook>-<name>.csv``.
FIGURE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")


def show_whole_tables() -> None:
    """pandas shows every column of a table and every character of a cell (no "..." where a column or text was
    cut off)."""
    import pandas as pd

    pd.set_option("display.max_columns", None, "display.width", None, "display.max_colwidth", None)


def show_figure(fig: Any, name: str, table: pd.DataFrame) -> None:
    """Show ``fig`` and keep ``table``, the numbers it is drawn from, in the output's metadata (``splitlab``:
    ``figure``, ``csv``): ``splitlab report`` writes it beside the page as ``<notebook>-<name>.csv`` and links it
    under the figure, so the numbers can be taken without the notebook. ``name``: lower-case letters, digits, ``-``
    and ``_``, one per figure of a notebook. The figure is closed (it is shown once)."""
    import matplotlib.pyplot as plt
    import pandas as pd
    from IPython.display import display

    if not FIGURE_NAME.fullmatch(name):
        raise ValueError(f"name={name!r} is not allowed; expected lower-case letters, digits, - and _")
    csv = table.to_csv(index=not isinstance(table.index, pd.RangeIndex))
    display(fig, metadata={FINDING_KEY: {"figure": name, "csv": csv}})
    plt.close(fig)


def figure_tables(nb: Any) -> list[tuple[str, str]]:
    """``(name, csv)`` of every figure ``show_figure`` showed in an executed notebook, in output order."""
    found = []
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []) or []:
            meta = (out.get("metadata") or {}).get(FINDING_KEY)
            if isinstance(meta, dict) and meta.get("figure"):
                found.append((str(meta["figure"]), str(meta.get("csv", ""))))
    return found


#: What a table shows where a value is missing (never ``NaN``).
MISSING = "-"


def table_html(table: pd.DataFrame, *, digits: int = 3) -> str:
    """``table`` as HTML that reads at a glance: no row numbers (a ``RangeIndex`` is left out; a named index stays),
    numbers rounded to ``digits`` (whole numbers without ``.0``), ``MISSING`` where a value is missing, no column
    that is empty in every row, every row and column (nothing cut to "...")."""
    import pandas as pd

    t = table.copy()
    t.columns.name = None  # (a pivot's column name would print as a header over the row numbers)
    empty = [c for c in t.columns if t[c].isna().all() or (t[c].astype(str).str.strip() == "").all()]
    t = t.drop(columns=empty)
    for c in t.columns:
        col = t[c]
        if pd.api.types.is_float_dtype(col):
            # counts that a missing value made floats (splits, batches) print as integers; 1.0 stays a ratio
            whole = bool(((col.dropna() % 1) == 0).all()) and bool(col.isna().any() or col.abs().max() >= 2)
            t[c] = [MISSING if pd.isna(v) else f"{v:.0f}" if whole else f"{v:.{digits}f}" for v in col]
    t = t.astype(object).where(t.notna(), MISSING)
    # text left-aligned (the page's style right-aligns every cell, which suits only numbers)
    text = [c for c in t.columns if all(isinstance(v, str) for v in t[c]) and not all(
        v == MISSING or _numeric(v) for v in t[c])]
    st = t.style.format(escape="html").format_index(escape="html", axis=0).format_index(escape="html", axis=1)
    st = st.set_properties(subset=text, **{"text-align": "left"}).set_table_styles(
        {c: [{"selector": "th", "props": "text-align: left"}] for c in text}, overwrite=False)
    if isinstance(table.index, pd.RangeIndex):
        st = st.hide(axis="index")
    return st.to_html()


def _numeric(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def show_table(table: pd.DataFrame, *, top: int | None = None, name: str | None = None, page: str = "",
               figure: str | None = None, note: str = "", digits: int = 3, folded: str | None = None) -> None:
    """Show a short table (``table_html``): its first ``top`` rows (all when None; sort it first so that they are
    the rows that matter), then, where rows were left out, one line saying how many, with a link to all of them as
    CSV beside the page (``<page>-<name>.csv``): ``name``: the whole table is kept in the output's metadata as a
    figure's numbers are (``show_figure``) and ``splitlab report`` writes it; ``figure``: the name of a figure
    ``show_figure`` showed whose numbers hold these rows. ``page``: the notebook's name (the report's file names
    start with it). ``note``: a sentence before the count (what the rows are, how they are sorted). ``folded``: the
    table is folded under this one-line summary (as ``fold``), opened when a reader wants it."""
    import pandas as pd
    from IPython.display import HTML, display

    if name is not None and not FIGURE_NAME.fullmatch(name):
        raise ValueError(f"name={name!r} is not allowed; expected lower-case letters, digits, - and _")
    shown = table if top is None else table.head(top)
    csv = html.escape(f"{page}-{name or figure}.csv")
    link = f'<a href="{csv}">{csv}</a>' if (name or figure) and page else ""
    lines = [note] if note else []
    where = ("; all of them: " if name else "; the figure's numbers, which hold them: ") + link if link else ""
    if len(shown) < len(table):
        lines.append(f"The first {len(shown)} of {len(table)} rows{where}.")
    elif link:
        lines.append(f"These rows as CSV: {link}." if name else f"The figure's numbers: {link}.")
    body = table_html(shown, digits=digits) + (f'<p style="font-size:12px">{" ".join(lines)}</p>' if lines else "")
    if folded:
        body = f"<details><summary>{html.escape(folded)}</summary>\n{body}\n</details>"
    meta = {FINDING_KEY: {"figure": name, "csv": table.to_csv(index=not isinstance(table.index, pd.RangeIndex))}} \
        if name else {}
    display(HTML(body), metadata=meta)


def fold(summary: str, *parts: str | pd.DataFrame) -> None:
    """Show ``parts`` (Markdown text, or tables: shown whole, as ``table_html`` shows them) folded under a one-line
    ``summary`` (HTML ``<details>``): detail a reader opens when they want it."""
    from IPython.display import Markdown, display

    html_parts = [p if isinstance(p, str) else table_html(p) for p in parts]
    display(Markdown(f"<details><summary>{html.escape(summary)}</summary>\n\n" + "\n\n".join(html_parts)
                     + "\n\n</details>"))
