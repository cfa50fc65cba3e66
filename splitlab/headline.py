"""The report's headline: what a kernel team asks first, per family.

* **Planner.** splitlab's rule against the best ported rule, as geomean / worst regret, on the current set's held-out
  shapes and on each confirm set, batches of uniform and of ragged lengths apart (a row each, where the data hold
  ragged ones): ``scoring.shootout`` and ``scoring.goal``, the functions ``python -m splitlab.fit`` prints its tables
  with (README's table "What the shipped H200 data say" is ``readme_rows``; ``tests/test_report_pages.py`` checks
  that they agree).
* **Kernel.** splitlab's kernel at its planner's default against the fastest peer per shape (FlashInfer, FlashMLA,
  SDPA) on the peers set: the roofline fraction (floor / measured time, ``peer_table``) of each, as a geomean
  over the shapes both measured, and splitlab's speed over the best peer's.

    from splitlab import headline
    h = headline.build("h200", confirm=["h200-confirm"], peers=["h200-peers"])
    h.planners["gqa_decode", "uniform"]["held-out"].geomean   # 1.004
    headline.html(h), headline.figure_png(h)                  # the front page's table and figure

``summary`` holds every planner's score per (kernel, set, lengths) (the ``scoring.shootout`` rows): the table the figure
(set x planner, geomean and worst) is drawn from, written beside the report as CSV.
"""

from __future__ import annotations

import html as _html
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from splitlab import families
from splitlab.errors import SplitlabError
from splitlab.scoring import LENGTHS

if TYPE_CHECKING:
    import pandas as pd

#: The families, by splitlab's kernel, as the headline names them, in the headline's order (a view of
#: ``splitlab.families``: each record's ``label``).
FAMILIES = {f.name: f.label for f in families.ALL}
#: The ported rules as the libraries call themselves.
PLANNER_NAMES = {"flex": "FlexAttention", "flash_attn": "FlashAttention", "flashmla": "FlashMLA", "sglang": "SGLang",
                 "flashinfer": "FlashInfer", "flashinfer-0.7.4": "FlashInfer-0.7.4", "modular": "Modular",
                 "aiter": "aiter"}
HELD_OUT = "held-out"
#: The figure's colour scale ends here (a log scale from 1x): the differences that matter lie between 1.0x and 1.3x,
#: and a 10x outlier would flatten them.
COLOUR_MAX = 2.0
#: The rule the headline scores, and the rules that are not "ported" (splitlab's own first rule).
NEW, NOT_PORTED = "splitlab", ("splitlab-v0",)
#: The lengths of a row's batches (``scoring.LENGTHS``), in the order the rows go: uniform, then ragged.
UNIFORM, RAGGED = LENGTHS
#: A headline row: (splitlab's kernel, the lengths of its batches).
Row = tuple[str, str]


def family_label(kernel: str, lengths: str, split: bool) -> str:
    """A row's name: the family (``GQA``), and its lengths after a dot (``GQA · ragged``) where ``split`` (the
    table has ragged rows, so that every row says which it is)."""
    fam = FAMILIES.get(kernel, kernel)
    return f"{fam} · {lengths}" if split else fam


def _lengths(t: pd.DataFrame) -> pd.Series:
    """A ``shootout`` table's (or summary's) ``lengths`` column; uniform where it has none (a table of uniform
    batches only, written without the column)."""
    import pandas as pd

    return t["lengths"] if "lengths" in t else pd.Series(UNIFORM, index=t.index, dtype=object)


@dataclass(frozen=True)
class PlannerScore:
    """splitlab's rule on one family's shapes of one set, beside the best ported rule (``scoring.goal``'s choice):
    geomean and worst regret over ``shapes`` shapes; ``best_shapes``: the shapes the best ported rule has a measured
    choice on (fewer when it plans only some, e.g. FlashMLA's); ``goal_met``: geomean <= 1.02, worst <= 1.10 and
    below every ported rule."""

    geomean: float
    worst: float
    shapes: int
    goal_met: bool
    best: str
    best_geomean: float
    best_shapes: int

    @property
    def cell(self) -> str:
        """``geomean / worst`` as README's table writes it (bold: the goal met)."""
        s = f"{self.geomean:.3f} / {self.worst:.3f}"
        return f"**{s}**" if self.goal_met else s

    @property
    def best_cell(self) -> str:
        """The best ported rule and its geomean, ``(on its N shapes)`` where it plans fewer than splitlab."""
        s = f"{PLANNER_NAMES.get(self.best, self.best)} {self.best_geomean:.3f}"
        return s + (f" (on its {self.best_shapes} shapes)" if self.best_shapes < self.shapes else "")


@dataclass(frozen=True)
class PeerScore:
    """splitlab's kernel (at its planner's default) against the fastest peer of each shape: geomean roofline fraction
    of each over ``shapes`` shapes, splitlab's geomean speed over the best peer (above 1: faster) and the shapes it
    is faster on."""

    shapes: int
    roofline: float
    peer_roofline: float
    speedup: float
    wins: int


@dataclass
class Headline:
    """See the module docstring. ``sets``: the planner columns (``held-out``, then each confirm set's name);
    ``planners[kernel, lengths][set]`` (lengths ``uniform`` or ``ragged``) and ``peers[kernel]`` (absent: not
    measured); ``peers_set``: the set the kernels were compared on (``peers_note``: why there is no comparison, where
    there is none); ``summary``: every planner's score per (kernel, set, lengths)."""

    data: str
    sets: list[str]
    planners: dict[Row, dict[str, PlannerScore]]
    peers: dict[str, PeerScore]
    peers_set: str
    summary: pd.DataFrame = field(repr=False)
    peers_note: str = ""  # why no kernel has a peer comparison (``build``), where none has

    @property
    def kernels(self) -> list[str]:
        return [k for k in FAMILIES if k in self.peers or any((k, n) in self.planners for n in LENGTHS)]

    @property
    def rows(self) -> list[Row]:
        """The table's rows: per family its uniform batches (and the peers), then its ragged ones where scored."""
        return [(k, n) for k in self.kernels for n in LENGTHS
                if (k, n) in self.planners or (n == UNIFORM and (k, RAGGED) not in self.planners)]

    @property
    def split(self) -> bool:
        """Whether any row is of ragged batches (then every row names its lengths)."""
        return any(n == RAGGED for _, n in self.rows)

    def table(self) -> pd.DataFrame:
        """One row per family and lengths: the headline's numbers (``headline.csv`` beside the report); the peers'
        on the family's first row."""
        import pandas as pd

        rows, seen = [], set()
        for k, n in self.rows:
            row: dict[str, Any] = dict(family=FAMILIES[k], kernel=k, lengths=n)
            for s in self.sets:
                p = self.planners.get((k, n), {}).get(s)
                row |= {f"{s}: splitlab geomean": p.geomean if p else math.nan,
                        f"{s}: splitlab worst": p.worst if p else math.nan,
                        f"{s}: shapes": p.shapes if p else 0,
                        f"{s}: goal met": p.goal_met if p else None,
                        f"{s}: best ported": p.best if p else "",
                        f"{s}: best ported geomean": p.best_geomean if p else math.nan,
                        f"{s}: best ported shapes": p.best_shapes if p else 0}
            q = self.peers.get(k) if k not in seen else None
            seen.add(k)
            row |= {"peers: shapes": q.shapes if q else 0, "peers: splitlab roofline": q.roofline if q else math.nan,
                    "peers: best peer roofline": q.peer_roofline if q else math.nan,
                    "peers: splitlab speed over best peer": q.speedup if q else math.nan,
                    "peers: shapes splitlab faster": q.wins if q else 0}
            rows.append(row)
        return pd.DataFrame(rows)


# --- computing it ---------------------------------------------------------------------------------------------

def shootouts(df: pd.DataFrame, confirm: Mapping[str, pd.DataFrame] | None = None, *,
              allow_fake: bool = False) -> dict[str, pd.DataFrame]:
    """``scoring.shootout`` of ``df`` (its ``fit`` and ``held-out`` rows), keyed ``held-out``, then of each of
    ``confirm`` (name -> rows) keyed by its name: the registered (fitted) rule replayed, as ``python -m splitlab.fit``
    scores it."""
    from splitlab import scoring

    tables = {HELD_OUT: scoring.shootout(df, allow_fake=allow_fake)}
    tables |= {name: scoring.shootout(rows, allow_fake=allow_fake, part=name) for name, rows in (confirm or {}).items()}
    return tables


def goal(table: pd.DataFrame, part: str = HELD_OUT) -> pd.DataFrame:
    """``scoring.goal`` of a ``shootout`` table on ``part`` (a row per kernel and lengths), for the kernels and lengths
    where splitlab's rule has a measured choice there (elsewhere it has no regret to compare: no row)."""
    import pandas as pd

    from splitlab import scoring

    mine = table[(table["set"] == part) & (table["planner"] == NEW) & (table["measured"] > 0)]
    if mine.empty:
        return pd.DataFrame(columns=["kernel", "lengths", "geomean", "worst", "best_ported", "goal_met"])
    pairs = set(zip(mine["kernel"], _lengths(mine), strict=True))
    kept = table[[p in pairs for p in zip(table["kernel"], _lengths(table), strict=True)]]  # attrs come along
    return scoring.goal(kept, new_name=NEW, ported_exclude=NOT_PORTED, part=part)


def planner_scores(tables: Mapping[str, pd.DataFrame]) -> tuple[dict[Row, dict[str, PlannerScore]], pd.DataFrame]:
    """Per (kernel, lengths) and set of ``shootouts``' tables: ``PlannerScore`` (from ``scoring.goal``; none where
    splitlab's rule has no measured choice); and every table's rows in one frame (the summary)."""
    import pandas as pd

    scores: dict[Row, dict[str, PlannerScore]] = {}
    for part, table in tables.items():
        if table.empty or not (table["set"] == part).any():
            continue
        for g in goal(table, part).itertuples():
            best, _ = str(g.best_ported).rsplit(" ", 1)
            rows = table[(table["kernel"] == g.kernel) & (table["set"] == part)
                         & (_lengths(table) == g.lengths)].set_index("planner")
            scores.setdefault((g.kernel, g.lengths), {})[part] = PlannerScore(
                geomean=float(g.geomean), worst=float(g.worst), shapes=int(rows.loc[NEW, "measured"]),
                goal_met=bool(g.goal_met), best=best, best_geomean=float(rows.loc[best, "geomean"]),
                best_shapes=int(rows.loc[best, "measured"]))
    frames = [pd.DataFrame(t.to_dict("list")) for t in tables.values()]  # without attrs (concat compares them)
    summary = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return scores, summary


def peer_scores(df: pd.DataFrame, *, allow_fake: bool = False) -> dict[str, PeerScore]:
    """Per splitlab kernel with a peer measured on the same shapes (``peer_table.comparison``): the
    ``PeerScore`` over those shapes."""
    from splitlab import peer_table
    from splitlab.analysis import geomean

    roles = peer_table.roles(df, allow_fake=allow_fake)
    cmp = peer_table.comparison(roles)
    if cmp.empty or peer_table.SPLITLAB_PLANNER not in cmp.columns:
        return {}
    floor = roles.groupby(peer_table.SHAPE, dropna=False)["floor_us"].first().rename("floor_us").reset_index()
    cmp = cmp.merge(floor, on=peer_table.SHAPE, how="left")
    out = {}
    for fam, g in cmp.groupby("family", sort=False):
        g = g.dropna(subset=[peer_table.SPLITLAB_PLANNER, "best_peer_us", "floor_us"])
        if g.empty or fam not in families.kinds():  # ``peer_table`` names a family by its kind
            continue
        out[families.by_kind(fam).name] = PeerScore(
            shapes=len(g), roofline=geomean(g["floor_us"] / g[peer_table.SPLITLAB_PLANNER]),
            peer_roofline=geomean(g["floor_us"] / g["best_peer_us"]), speedup=geomean(g["speedup_planner"]),
            wins=int((g["speedup_planner"] > 1).sum()))
    return out


def build(data: str, confirm: Sequence[str] = (), peers: Sequence[str] | None = None, *,
          allow_fake: bool = False) -> Headline:
    """The ``Headline`` of ``data`` (a catalog name or a folder of sweeps): its held-out shapes and each ``confirm``
    set for the planner; for the kernels, the first of ``peers``, else (none given) the sets whose catalog role is
    the comparison wherever ``data`` is catalog data, by name or by path (``catalog.peers_of``: the same numbers
    whichever way the data are named), and only for data outside the catalog ``data``'s own peers. Where there is
    no comparison, ``peers_note`` says why (``NO_PEER_MEASURED`` for data outside the catalog without peers). A set
    that cannot be read raises ``SplitlabError`` naming it."""
    from splitlab import catalog
    from splitlab.datasets import load_data

    df, info = load_data(data, allow_fake=allow_fake)
    conf = {}
    for c in confirm:
        rows, cinfo = load_data(c, allow_fake=allow_fake)
        conf[cinfo.name] = rows
    tables = shootouts(df, conf, allow_fake=allow_fake)
    scores, summary = planner_scores(tables)
    own = False
    if not peers:
        found = catalog.peers_of(str(data) if catalog.is_name(data) else info.path)
        own = found is None  # data outside the catalog: their own peers are the comparison
        peers = [e.name for e in found or ()]
    kernels: dict[str, PeerScore] = {}
    peers_set, note = "", ""
    if peers or own:
        peer_df, peer_info = (df, info) if own else load_data(peers[0], allow_fake=allow_fake)
        try:
            kernels = peer_scores(peer_df, allow_fake=allow_fake)
        except SplitlabError as e:
            raise SplitlabError(f"peers {peer_info.name!r}: {e}") from None
        peers_set = peer_info.name
        if not kernels:
            note = NO_PEER_MEASURED if own else f"no peer measured in {peer_info.name}"
    else:
        note = f"no peers set in the catalog for the device of {info.name}"
    sets = [s for s, t in tables.items() if not t.empty and (t["set"] == s).any()]
    if not sets and not kernels:
        raise SplitlabError(f"data={str(data)!r}: no splitlab kernel with planner choices or peers to score")
    return Headline(data=info.name, sets=sets, planners=scores, peers=kernels, peers_set=peers_set,
                    summary=summary, peers_note=note)


#: The kernels' cells of data outside the catalog that hold no peer library's sweep (``build``).
NO_PEER_MEASURED = "no peer measured in these data"


# --- showing it -----------------------------------------------------------------------------------------------

def readme_rows(h: Headline) -> list[list[str]]:
    """README's table rows, one per family and lengths (``family_label``: ``GQA``, or ``GQA · uniform`` and
    ``GQA · ragged`` where ragged batches were scored), then per set splitlab's ``geomean / worst`` and the best
    ported rule."""
    rows = []
    for k, n in h.rows:
        cells = [family_label(k, n, h.split)]
        for s in h.sets:
            p = h.planners.get((k, n), {}).get(s)
            cells += [p.cell, p.best_cell] if p else ["", ""]
        rows.append(cells)
    return rows


def _set_label(s: str, sets: Sequence[str]) -> str:
    return "confirm" if s != HELD_OUT and len(sets) == 2 else s


def html(h: Headline, *, kernels: bool = True) -> str:
    """The headline as an HTML table (the report's front page): README's columns, then (``kernels``) the kernels'
    columns."""
    e = _html.escape
    head = ["family"]
    for s in h.sets:
        label = e(_set_label(s, h.sets))
        head += [f"{label}: splitlab<br><span class=muted>geomean / worst regret</span>",
                 f"{label}: best ported rule<br><span class=muted>geomean regret</span>"]
    if kernels:
        where = f" ({e(h.peers_set)})" if h.peers_set else ""
        head += [f"kernel: roofline fraction<br><span class=muted>splitlab / best peer{where}</span>",
                 "kernel: speed over the best peer<br><span class=muted>geomean (faster on)</span>"]

    def cell(s: str) -> str:
        if not s:
            return '<span class="muted">not measured</span>'
        return f"<b>{e(s[2:-2])}</b>" if s.startswith("**") and s.endswith("**") else e(s)

    body, seen = [], set()
    for (k, _), row in zip(h.rows, readme_rows(h), strict=True):
        tds = "".join(f"<td>{cell(c)}</td>" for c in row)
        if kernels and k not in seen:  # the kernels' cells span the family's rows (peers ran uniform batches)
            seen.add(k)
            q = h.peers.get(k)
            peer = ([f"{q.roofline:.2f} / {q.peer_roofline:.2f}",
                     f"{q.speedup:.3f}x ({q.wins} of {q.shapes} shapes)"]
                    if q else [f'<span class="muted">{e(h.peers_note or "not measured")}</span>'] * 2)
            span = sum(r == k for r, _ in h.rows)
            tds += "".join(f"<td rowspan={span}>{c}</td>" if span > 1 else f"<td>{c}</td>" for c in peer)
        body.append(f"<tr>{tds}</tr>")
    ths = "".join(f"<th>{c}</th>" for c in head)
    return f'<table class="headline"><tr>{ths}</tr>\n' + "\n".join(body) + "</table>"


def summary_table(h: Headline | pd.DataFrame, sets: Sequence[str] | None = None) -> pd.DataFrame:
    """The figure's table: one row per (kernel, set, lengths, planner) with shapes, measured choices, geomean, p90
    and worst regret (``sets``: those sets only, in that order; default the headline's), a family's uniform
    batches before its ragged ones in each set."""
    summary = h.summary if isinstance(h, Headline) else h
    sets = list(sets if sets is not None else (h.sets if isinstance(h, Headline) else summary["set"].unique()))
    t = summary[summary["set"].isin(sets)].copy()
    t["lengths"] = _lengths(t)
    t["_k"] = t["kernel"].map({k: i for i, k in enumerate(FAMILIES)}).fillna(len(FAMILIES))
    t["_s"] = t["set"].map({s: i for i, s in enumerate(sets)})
    t["_l"] = t["lengths"].map({n: i for i, n in enumerate(LENGTHS)})
    return t.sort_values(["_k", "_s", "_l", "geomean"]).drop(columns=["_k", "_s", "_l"]).reset_index(drop=True)


def figure(table: pd.DataFrame, info: Any = None, *, title: str | None = None, fig: Any = None,
           merged: Mapping[str, str] | None = None) -> Any:
    """A heatmap of ``summary_table``'s rows: one row per (family, set, lengths: ``GQA · held-out · ragged`` where
    ragged batches were scored), one column per planner (splitlab's rules last); colour the geomean regret, number
    the geomean over the worst; hatched: the planner has no measured choice there. Drawn into ``fig`` (resized; a
    notebook passes ``plt.figure()``, which its inline backend shows), else into a new ``matplotlib.figure.Figure``
    outside pyplot (``figure_png``). ``merged`` (``merged_planners``): planners shown once, as another; their
    notes are written under the heatmap."""
    import textwrap

    import matplotlib as mpl
    from matplotlib.figure import Figure

    from splitlab import plots

    if merged:
        table = table[~table["planner"].isin(list(merged))]
    lengths = _lengths(table)
    split = bool((lengths == RAGGED).any())
    t = table.assign(row=[f"{FAMILIES.get(k, k)} · {s}" + (f" · {n}" if split else "")
                          for k, s, n in zip(table["kernel"], table["set"], lengths, strict=True)])
    order = plots.planner_order(t["planner"])
    geo = t.pivot(index="row", columns="planner", values="geomean").reindex(index=list(dict.fromkeys(t["row"])),
                                                                          columns=order)
    worst = t.pivot(index="row", columns="planner", values="worst").reindex_like(geo)
    annot = geo.copy().astype(object)
    for i in range(geo.shape[0]):
        for j in range(geo.shape[1]):
            g, w = geo.iat[i, j], worst.iat[i, j]
            annot.iat[i, j] = f"{g:.3f}\n{w:.2f}" if math.isfinite(g) and math.isfinite(w) else math.nan
    cols = [PLANNER_NAMES.get(p, p) for p in order]
    with mpl.rc_context({"figure.dpi": plots.DPI, "savefig.dpi": plots.DPI, "figure.constrained_layout.use": True,
                         **plots.FONT_SIZES}):
        size = plots.figsize(1.05 * len(order) + 3.2, max(3.2, 0.62 * len(geo) + 1.6))
        if fig is None:
            fig = Figure(figsize=size)
        else:
            fig.set_size_inches(*size)
        ax = fig.add_subplot()
        plots.heatmap(ax, geo, annot=annot, cmap=plots.REGRET_CMAP, log_color=True, vmin=1.0, vmax=COLOUR_MAX,
                      ratio_ticks=True, xticklabels=cols,
                      cbar_label=f"geomean regret (>= {COLOUR_MAX:g}x: darkest)")
        plots.title(fig, title or "Each planner's regret: geomean (colour, upper number) and worst (lower number)",
                    info)
        if merged:
            ax.set_xlabel("\n".join(textwrap.wrap(" ".join(f"{v}." for v in merged.values()), 110)),
                          fontsize=plots.MIN_FONT_PT)
    return fig


def merged_planners(h: Headline) -> dict[str, str]:
    """The planners the headline's figure shows once, as another, each with its note (``analysis.merged_versions``:
    a release of a rule, ``flashinfer-0.7.4``, that chose what the rule chose on every shape of the headline's sets
    where both were recorded). Only choices are compared (modelled rows too); a set that cannot be read again (a
    confirm folder named by its folder's name) is left out."""
    import pandas as pd

    from splitlab import analysis
    from splitlab.datasets import load_data

    frames = []
    for name in [h.data, *(s for s in h.sets if s != HELD_OUT)]:
        try:
            frames.append(load_data(name, allow_fake=True)[0])
        except SplitlabError:
            continue
    return analysis.merged_versions(analysis.version_twins(pd.concat(frames))) if frames else {}


def figure_png(h: Headline, info: Any = None) -> bytes:
    """The front page's figure (``figure`` of the headline's sets, ``merged_planners`` shown once) as PNG bytes."""
    import matplotlib as mpl

    from splitlab import plots

    fig = figure(summary_table(h), info, merged=merged_planners(h))
    buf = io.BytesIO()
    with mpl.rc_context({"savefig.dpi": plots.DPI}):
        fig.savefig(buf, format="png", bbox_inches="tight", facecolor="white")
    return buf.getvalue()
