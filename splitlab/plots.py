"""The figures' shared pieces (matplotlib / seaborn): one color per planner everywhere, log2 axes for batch,
context and CTAs, lines at multiples of the SM count, heatmaps, and titles that carry the device and the data's
date (and say MODELLED when the numbers come from the fake timer).

    from splitlab import plots
    plots.setup()
    fig, ax = plt.subplots(figsize=plots.figsize(7.5, 3.8))
    ax.plot(x, y, **plots.planner_style("flashinfer"))
    plots.log2_axis(ax, "x"); plots.mark_sm_multiples(ax, 132)
    plots.title(ax, "latency against CTAs", info)      # info: splitlab.report.DataInfo (device, date, fake)

Readable in the HTML report: figures are drawn at ``DPI`` (1 pt of text is 1 CSS pt at the image's native size)
and at most ``PAGE_WIDTH_IN`` wide (``figsize``), so that a page about 1100 px wide shows them unscaled; no text
is smaller than ``MIN_FONT_PT``: a heatmap's cell numbers take the largest size that fits the cell at draw time
and are left out where the grid is too dense for that, and labels that would overlap (the SM multiples, a
heatmap's tick labels) are thinned.

Colour-blind safe: planner and series colours come from Okabe & Ito's palette and Paul Tol's muted scheme, each
planner with its own marker as a second cue; colour maps are viridis-family sequential maps or ``RATIO_CMAP``
(blue below 1x, orange above; no red-green map); a heatmap's missing cells are hatched grey, never a colour of
the scale.

A planner label may carry a device (``"modular@mi355x"``: the rule as it plans for another device, measured
here): it gets a dashed line and a hollow marker; ``planner_styles`` gives every line of one figure its own
colour (the plain planner keeps its colour, each ``name@device`` line a colour of its own).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.colors import LinearSegmentedColormap, to_hex, to_rgb

from splitlab import planners

MODELLED = "MODELLED (fake timer), not measured"
ORACLE_COLOR = "#000000"
#: The figures' resolution: at 96 dpi a point of text is a CSS point (4/3 px) when the page shows the image at its
#: native size.
DPI = 96
#: The widest figure, in inches, that the HTML report (a page about 1100 px wide: about 1040 px for an image)
#: shows unscaled at ``DPI``.
PAGE_WIDTH_IN = 10.6
#: The smallest text a figure draws, in points (9 pt = 12 px at ``DPI``).
MIN_FONT_PT = 9.0
#: The largest size of a heatmap's cell numbers.
ANNOT_MAX_PT = 11.0

# Okabe & Ito, "Color Universal Design" (2008), and Paul Tol's muted scheme (personal.sron.nl/~pault): hues that
# stay apart for the common colour-vision deficiencies. Fixed by name (not by registry order) so that a planner
# keeps its colour when others are added.
_FIXED = {
    "splitlab": "#D55E00",  # vermillion: this repository's own rule stands out
    "modular": "#0072B2",  # blue
    "flashinfer": "#009E73",  # bluish green
    "flashinfer-0.7.4": "#999933",  # olive
    "aiter": "#E69F00",  # orange
    "flash_attn": "#CC79A7",  # reddish purple
    "flex": "#882255",  # wine
    "sglang": "#56B4E9",  # sky blue
    "flashmla": "#332288",  # indigo
}
# For planners registered later than this table and for the ``name@device`` lines of one figure, the hues
# farthest from the table's first.
_SPARE = ["#AA4499", "#B8A03A", "#88CCEE", "#661100", "#44AA99", "#117733", "#6699CC", "#888888"]
_MARKERS = {"splitlab": "o", "modular": "s", "flashinfer": "D", "flashinfer-0.7.4": "d", "aiter": "^",
            "flash_attn": "v", "flex": "P", "sglang": "X", "flashmla": "*"}
_SPARE_MARKERS = ["h", "p", "<", ">", "8", "H"]
#: Colours and markers for series that are not planners (kernels, head counts, BLOCK_K values), in order.
SERIES_COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#882255", "#999933", "#332288",
                 "#666666"]
SERIES_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h", "<"]


def _free_color(preferred: str, used: set[str]) -> str:
    """``preferred`` unless already used, else the first unused spare (then tab20's hues)."""
    pool = [preferred, *_SPARE, *(to_hex(mpl.colormaps["tab20"](i)) for i in range(20))]
    for c in pool:
        if c.lower() not in used:
            return c
    return preferred


def _palette(names: Sequence[str]) -> dict[str, str]:
    out = {n: _FIXED[n] for n in names if n in _FIXED}
    used = {c.lower() for c in out.values()}
    for n in sorted(n for n in names if n not in _FIXED):
        # a planner registered later than this table: a spare colour by name, unused by the others
        out[n] = _free_color(_SPARE[sum(map(ord, n)) % len(_SPARE)], used)
        used.add(out[n].lower())
    return {n: out[n] for n in names}


#: One color per registered planner (``splitlab.planners.names()``), the same in every notebook and figure.
PLANNER_COLORS: dict[str, str] = _palette(planners.names())


def _ratio_cmap() -> LinearSegmentedColormap:
    """Blue (below 1x: faster) through a light grey at 1x to orange (above 1x: slower)."""
    return LinearSegmentedColormap.from_list(
        "splitlab_ratio", ["#1d4f91", "#4f8fcb", "#a9cbe8", "#f2f2f2", "#f9c48f", "#ee8a3c", "#a84c00"])


def _fill_cmap() -> LinearSegmentedColormap:
    """viridis blended 45% toward white: a light sequential map under planner markers and black numbers."""
    base = mpl.colormaps["viridis"](np.linspace(0, 1, 256))[:, :3]
    return LinearSegmentedColormap.from_list("splitlab_fill", base + (1 - base) * 0.45)


for _c in (_ratio_cmap(), _fill_cmap()):
    for _m in (_c, _c.reversed()):
        if _m.name not in mpl.colormaps:
            mpl.colormaps.register(_m)

#: A sequential quantity (bandwidth, split count).
SEQUENTIAL_CMAP = "viridis"
#: A share between 0 and 1 under markers and numbers (last-wave fill): light viridis.
FILL_CMAP = "splitlab_fill"
#: A ratio around 1x (candidate / baseline): blue below, orange above; use with ``log_color=True``.
RATIO_CMAP = "splitlab_ratio"
#: Regret (1 = the best choice): light at 1x, darker the worse.
REGRET_CMAP = "viridis_r"
#: The colour maps a figure may use: perceptually uniform, readable with the common colour-vision deficiencies
#: (no red-green map such as RdYlGn).
SAFE_CMAPS = frozenset({"viridis", "viridis_r", "cividis", "cividis_r", "magma", "magma_r", "inferno",
                        "inferno_r", "plasma", "plasma_r", "rocket", "rocket_r", "mako", "mako_r", "splitlab_fill",
                        "splitlab_fill_r", "splitlab_ratio", "splitlab_ratio_r"})
#: A heatmap's missing cells: hatched grey.
MISSING_FACE = "#b3b3b3"
MISSING_HATCH = "////"
MISSING_EDGE = "#6b6b6b"


class _Info(Protocol):
    device: str
    date: str
    fake: bool


def base_planner(label: str) -> str:
    """``"modular@mi355x"`` -> ``"modular"``."""
    return str(label).split("@", 1)[0]


def planner_color(label: str) -> str:
    """The planner's color (``"oracle"`` is black); a ``name@device`` label alone keeps its planner's color
    (``planner_styles`` gives it its own when both are in one figure)."""
    name = base_planner(label)
    if name in ("oracle", "best"):
        return ORACLE_COLOR
    return PLANNER_COLORS.get(name) or _palette([name])[name]


def planner_marker(label: str) -> str:
    name = base_planner(label)
    return _MARKERS.get(name) or _SPARE_MARKERS[sum(map(ord, name)) % len(_SPARE_MARKERS)]


def planner_style(label: str) -> dict[str, Any]:
    """Keyword arguments for ``ax.plot``/``ax.scatter``-like calls: color, marker, line style and label."""
    foreign = "@" in str(label)
    style: dict[str, Any] = dict(color=planner_color(label), marker=planner_marker(label), label=str(label),
                                 linestyle=_foreign_dash(str(label).split("@", 1)[1]) if foreign else "-")
    if foreign:
        style["markerfacecolor"] = "none"
    return style


def planner_styles(labels: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``planner_style`` for every label of one figure (in ``planner_order``), each with its own colour: a plain
    planner keeps its colour; the ``name@device`` lines (dashed, hollow marker) take the spare colours in turn,
    skipping those the figure already uses."""
    order = planner_order(labels)
    out: dict[str, dict[str, Any]] = {}
    used: set[str] = set()
    for foreign in (False, True):
        for lab in order:
            if ("@" in lab) != foreign:
                continue
            st = planner_style(lab)
            if foreign:
                st["color"] = _free_color(_SPARE[0], used)
            elif st["color"].lower() in used:
                st["color"] = _free_color(st["color"], used)
            used.add(st["color"].lower())
            out[lab] = st
    return {lab: out[lab] for lab in order}


def planner_palette(labels: Iterable[str]) -> dict[str, str]:
    """``{label: colour}`` for one figure, every label its own colour (seaborn's ``palette=``)."""
    return {lab: st["color"] for lab, st in planner_styles(labels).items()}


def series_styles(keys: Iterable[Any]) -> dict[Any, dict[str, Any]]:
    """Colour and marker for series that are not planners (head counts, kernels), in the order given."""
    return {k: dict(color=SERIES_COLORS[i % len(SERIES_COLORS)], marker=SERIES_MARKERS[i % len(SERIES_MARKERS)])
            for i, k in enumerate(keys)}


_DASHES: list[Any] = ["--", ":", "-.", (0, (6, 2, 1, 2, 1, 2)), (0, (1, 3)), (0, (8, 3))]


def _foreign_dash(device: str) -> Any:
    """A dash pattern per device preset (the same device, the same pattern everywhere)."""
    from splitlab import devices

    names = devices.names()
    try:
        i = names.index(devices.get(device).name)
    except Exception:
        i = sum(map(ord, device))
    return _DASHES[i % len(_DASHES)]


def planner_order(labels: Iterable[str]) -> list[str]:
    """Planner labels in registry order (``splitlab`` and oracle last), ``name@device`` after ``name``."""
    reg = planners.names()

    def key(label: str) -> tuple:
        name = base_planner(label)
        return (name == "oracle", name == "splitlab", reg.index(name) if name in reg else len(reg), "@" in label,
                label)

    return sorted(set(labels), key=key)


#: Font sizes (points) that ``setup`` sets; none below ``MIN_FONT_PT``.
FONT_SIZES = {"font.size": 10.0, "axes.labelsize": 10.0, "axes.titlesize": 10.5, "figure.titlesize": 11.5,
              "xtick.labelsize": 9.5, "ytick.labelsize": 9.5, "legend.fontsize": 9.0, "legend.title_fontsize": 9.5}


def setup(dpi: int = DPI) -> None:
    """A compact seaborn theme, colour-blind-safe series colours, fonts no smaller than ``MIN_FONT_PT`` and the
    report's DPI."""
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper", palette=SERIES_COLORS)
    mpl.rcParams.update({"figure.dpi": dpi, "savefig.dpi": dpi, "figure.figsize": (7.5, 3.8),
                         "figure.constrained_layout.use": True, "image.cmap": SEQUENTIAL_CMAP,
                         "hatch.linewidth": 0.6, **FONT_SIZES})


def figsize(width: float, height: float) -> tuple[float, float]:
    """``(width, height)`` in inches with the width capped at ``PAGE_WIDTH_IN`` (wider figures would be shrunk
    by the page, and their text with them)."""
    return (min(float(width), PAGE_WIDTH_IN), float(height))


def subtitle(info: _Info | None = None, *, device: str | None = None, note: str | None = None) -> str:
    """``"<device> · data <date>"`` (plus ``note``); for figures without data: ``"<device> · planned (no
    measurements)"``."""
    parts = []
    if info is not None:
        parts.append(f"{device or info.device} · data {info.date}")
    elif device:
        parts.append(f"{device} · planned (no measurements)")
    if note:
        parts.append(note)
    return " · ".join(parts)


def title(target: Any, text: str, info: _Info | None = None, *, device: str | None = None,
          note: str | None = None) -> None:
    """Title a figure (``suptitle``) or an axes: ``text`` over the device and data date; when ``info.fake``,
    a third line in red says the numbers are MODELLED (fake timer), not measured."""
    lines = [text]
    sub = subtitle(info, device=device, note=note)
    if sub:
        lines.append(sub)
    fake = bool(info is not None and getattr(info, "fake", False))
    is_fig = isinstance(target, mpl.figure.Figure)
    if fake:
        lines.append(MODELLED)
    label = "\n".join(lines)
    kw = {"color": "#b00000"} if fake else {}
    if is_fig:
        target.suptitle(label, **kw)
    else:
        target.set_title(label, **kw)


def fmt_pow2(v: float) -> str:
    """Compact labels for batch, context and CTA counts: 512, 1K, 64K, 1M."""
    v = float(v)
    if v >= 1 << 20 and v % (1 << 20) == 0:
        return f"{int(v) >> 20}M"
    if v >= 1024 and v % 1024 == 0:
        return f"{int(v) >> 10}K"
    return f"{v:g}"


def _tick_font_px(ax: Any, which: str) -> float:
    """The tick labels' font size on ``which`` ("x" or "y") in pixels."""
    fs = mpl.font_manager.FontProperties(size=mpl.rcParams[f"{which}tick.labelsize"]).get_size_in_points()
    return fs * ax.figure.dpi / 72.0


def _label_step(ax: Any, which: str, spacing_px: float, longest: int) -> int:
    """Show every k-th of equally spaced tick labels so that neighbours do not overlap (``longest``: characters
    of the longest label)."""
    fpx = _tick_font_px(ax, which)
    need = 0.64 * longest * fpx + 4 if which == "x" else 1.25 * fpx
    return max(1, math.ceil(need / max(spacing_px, 1e-9)))


class _Log2Labels(mpl.ticker.Formatter):
    """1, 2, ..., 1K, 64K; every k-th label where they would overlap at the drawn size of the axes."""

    def __init__(self, which: str) -> None:
        self.which = which

    def __call__(self, v: float, pos: Any = None) -> str:
        return fmt_pow2(v) if v >= 1 else f"{v:g}"

    def format_ticks(self, values: Any) -> list[str]:
        labels = [self(v) for v in values]
        ax = self.axis.axes if self.axis is not None else None
        if ax is None or len(values) < 2:
            return labels
        lo, hi = sorted(ax.get_xlim() if self.which == "x" else ax.get_ylim())
        shown = [i for i, v in enumerate(values) if lo <= v <= hi]
        if len(shown) < 2:
            return labels
        other = (ax.get_ylim() if self.which == "x" else ax.get_xlim())[0]
        pts = [(values[i], other) if self.which == "x" else (other, values[i]) for i in shown]
        px = ax.transData.transform(pts)[:, 0 if self.which == "x" else 1]
        spacing = float(np.min(np.abs(np.diff(px))))
        k = _label_step(ax, self.which, spacing, max(len(labels[i]) for i in shown))
        return [lab if i in shown and (shown.index(i) % k == 0) else "" for i, lab in enumerate(labels)]


def log2_axis(ax: Any, axis: str = "x", *, label: str | None = None, max_ticks: int = 9) -> None:
    """Log2 scale with power-of-two ticks labelled 1, 2, ..., 1K, 64K (``axis``: "x", "y" or "both"); at most
    ``max_ticks`` ticks (every other power of two, or sparser, on a wide range), and of those every k-th labelled
    where the labels would overlap at the drawn size."""
    from matplotlib.ticker import LogLocator

    for a in ("x", "y") if axis == "both" else (axis,):
        getattr(ax, f"set_{a}scale")("log", base=2)
        target = ax.xaxis if a == "x" else ax.yaxis
        target.set_major_locator(LogLocator(base=2, numticks=max_ticks))
        target.set_major_formatter(_Log2Labels(a))
        target.set_minor_locator(mpl.ticker.NullLocator())
        if label:
            (ax.set_xlabel if a == "x" else ax.set_ylabel)(label)


class _DrawTimeLayout(Artist):
    """An invisible artist that adjusts other artists of its axes when the figure is drawn (after the layout
    engine has sized the axes): it draws nothing and takes no room in the layout. Added below the texts it
    adjusts (lower zorder), so it runs first."""

    def __init__(self, texts: list[Any]) -> None:
        super().__init__()
        self.texts = texts
        self.set_zorder(-10)
        self.set_in_layout(False)

    def get_tightbbox(self, renderer: Any = None) -> None:  # takes no room
        return None

    def layout(self, renderer: Any) -> None:
        raise NotImplementedError

    def draw(self, renderer: Any) -> None:
        if renderer is not None and self.texts:
            self.layout(renderer)
        self.stale = False


class _SpacedLabels(_DrawTimeLayout):
    """Labels shown in priority order, each only where it lies inside its axes and overlaps none already shown."""

    def __init__(self, ax: Any, texts: list[Any]) -> None:
        super().__init__(texts)
        self._ax = ax

    def layout(self, renderer: Any) -> None:
        box = self._ax.get_window_extent(renderer).expanded(1.0, 1.0).padded(2.0)
        shown: list[Any] = []
        for t in self.texts:
            t.set_visible(True)
            bb = t.get_window_extent(renderer).padded(1.5)
            inside = box.x0 <= bb.x0 and bb.x1 <= box.x1 and box.y0 <= bb.y0 and bb.y1 <= box.y1
            if not inside or any(bb.overlaps(s) for s in shown):
                t.set_visible(False)
            else:
                shown.append(bb)


def mark_sm_multiples(ax: Any, sm_count: int, *, axis: str = "x", upto: float | None = None,
                      max_lines: int = 8, label: bool = True) -> list[int]:
    """Lines at 1x, 2x, ... the SM count along ``axis`` (up to ``upto``, default the axis limit), labelled
    "SMs=132", "2xSM", ...; on a log axis the multiples past the fourth are thinned to powers of two. A label that
    would overlap another (1x first, then the powers of two) or leave the axes at the drawn size is left out.
    Returns the multiples drawn."""
    if not sm_count or sm_count <= 0:
        return []
    lim = (ax.get_xlim() if axis == "x" else ax.get_ylim())[1]
    top = upto if upto is not None else lim
    ks = [k for k in range(1, max(1, int(top // sm_count)) + 1)]
    if len(ks) > 4:
        ks = [k for k in ks if k <= 4 or (k & (k - 1)) == 0]
    ks = ks[:max_lines]
    texts = []
    look = dict(fontsize=MIN_FONT_PT, color="#333333", zorder=2.6,
                bbox=dict(boxstyle="square,pad=0.12", fc="white", ec="none", alpha=0.75))
    for k in ks:
        kw = dict(color="#555555", lw=0.9 if k == 1 else 0.6, ls=":" if k > 1 else "--", zorder=0.5)
        if axis == "x":
            ax.axvline(k * sm_count, **kw)
            if label:
                texts.append(ax.text(k * sm_count, 0.99, f" {k}xSM" if k > 1 else f" SMs={sm_count}", rotation=90,
                                     va="top", ha="left", transform=ax.get_xaxis_transform(), **look))
        else:
            ax.axhline(k * sm_count, **kw)
            if label:
                texts.append(ax.text(0.99, k * sm_count, f"{k}xSM " if k > 1 else f"SMs={sm_count} ", va="bottom",
                                     ha="right", transform=ax.get_yaxis_transform(), **look))
    if texts:
        prio = sorted(range(len(ks)), key=lambda i: (ks[i] != 1, ks[i] & (ks[i] - 1) != 0, ks[i]))
        ax.add_artist(_SpacedLabels(ax, [texts[i] for i in prio]))
    return ks


class _CellNumbers(_DrawTimeLayout):
    """A heatmap's cell numbers at the largest size up to ``ANNOT_MAX_PT`` that fits a cell (``room``: the share
    of the cell's height they may take), or none where that size is below ``MIN_FONT_PT``."""

    def __init__(self, ax: Any, texts: list[Any], room: float) -> None:
        super().__init__(texts)
        self._ax = ax
        self.room = room
        self.fontsize = 0.0  # as last drawn; 0: left out

    def layout(self, renderer: Any) -> None:
        p0, p1 = self._ax.transData.transform([(0.0, 0.0), (1.0, 1.0)])
        cell_w, cell_h = abs(p1[0] - p0[0]), abs(p1[1] - p0[1]) * self.room
        ref = 10.0
        for t in self.texts:  # measured visible (a hidden text measures as a unit box)
            t.set_visible(True)
            t.set_fontsize(ref)
        w = max(t.get_window_extent(renderer).width for t in self.texts)
        h = max(t.get_window_extent(renderer).height for t in self.texts)
        # a fifth of the cell's width and a quarter of its height stay clear, so that neighbours do not touch
        fs = min(ANNOT_MAX_PT, ref * 0.8 * cell_w / max(w, 1e-9), ref * 0.75 * cell_h / max(h, 1e-9))
        self.fontsize = fs if fs >= MIN_FONT_PT else 0.0
        for t in self.texts:
            t.set_visible(bool(self.fontsize))
            t.set_fontsize(self.fontsize or ref)


def _thin_ticks(ax: Any, which: str, labels: Sequence[str]) -> None:
    """Ticks at every cell, labelled every k-th cell where the labels would otherwise overlap (k from the drawn
    size of the axes, at draw time)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter

    target = ax.xaxis if which == "x" else ax.yaxis
    n = len(labels)
    target.set_major_locator(FixedLocator(np.arange(n)))
    longest = max((len(s) for s in labels), default=1)

    def fmt(v: float, _pos: Any) -> str:
        i = int(round(v))
        if not 0 <= i < n:
            return ""
        p0, p1 = ax.transData.transform([(0.0, 0.0), (1.0, 1.0)])
        k = _label_step(ax, which, abs(p1[0] - p0[0]) if which == "x" else abs(p1[1] - p0[1]), longest)
        return labels[i] if i % k == 0 else ""

    target.set_major_formatter(FuncFormatter(fmt))


def _luminance(rgb: Any) -> float:
    c = np.asarray(rgb, dtype=float)[:3]
    c = np.where(c <= 0.03928, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return float(0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2])


@dataclass(frozen=True)
class HeatmapAxes:
    """Where values fall on a ``log2_heatmap``: ``x(v)`` and ``y(v)`` map a batch, context or split count to the
    axis coordinate (cells are one unit wide; a value between two columns, such as a planner's 48 splits
    between 32 and 64, lands between them in log2). ``mesh`` (for ``colorbar``), ``numbers`` (the cell numbers'
    layout: ``numbers.texts``, ``numbers.fontsize`` once drawn) and ``missing`` (the hatched patches) are the
    drawn pieces."""

    columns: tuple[Any, ...]
    index: tuple[Any, ...]
    mesh: Any = field(default=None, compare=False, repr=False)
    numbers: Any = field(default=None, compare=False, repr=False)
    missing: tuple[Any, ...] = field(default=(), compare=False, repr=False)

    @staticmethod
    def _pos(values: Any, ref: tuple[float, ...]) -> np.ndarray:
        lv = np.log2(np.asarray(values, dtype=float))
        lr = np.log2(np.asarray(ref, dtype=float))
        if len(lr) == 1:
            return lv - lr[0]
        # linear in log2 between the columns, and beyond the ends at the spacing of the nearest pair
        lo = (lv - lr[0]) / (lr[1] - lr[0])
        hi = len(lr) - 1 + (lv - lr[-1]) / (lr[-1] - lr[-2])
        return np.where(lv < lr[0], lo, np.where(lv > lr[-1], hi, np.interp(lv, lr, np.arange(len(lr)))))

    def x(self, values: Any) -> np.ndarray:
        return self._pos(values, self.columns)

    def y(self, values: Any) -> np.ndarray:
        return self._pos(values, self.index)


def _norm(vals: np.ndarray, *, log_color: bool, center: float | None, vmin: float | None,
          vmax: float | None) -> Any:
    from matplotlib.colors import LogNorm, Normalize, TwoSlopeNorm

    finite = vals[np.isfinite(vals)]
    if log_color:
        finite = finite[finite > 0]
        lo = vmin if vmin is not None else (finite.min() if finite.size else 1.0)
        hi = vmax if vmax is not None else (finite.max() if finite.size else 2.0)
        return LogNorm(vmin=lo, vmax=max(hi, lo * 1.0001))
    if center is not None:
        lo = vmin if vmin is not None else (min(finite.min(), center) if finite.size else center - 1)
        hi = vmax if vmax is not None else (max(finite.max(), center) if finite.size else center + 1)
        return TwoSlopeNorm(vcenter=center, vmin=min(lo, center - 1e-9), vmax=max(hi, center + 1e-9))
    lo = vmin if vmin is not None else (finite.min() if finite.size else 0.0)
    hi = vmax if vmax is not None else (finite.max() if finite.size else 1.0)
    return Normalize(vmin=lo, vmax=hi if hi > lo else lo + 1e-9)


def heatmap(ax: Any, table: pd.DataFrame, *, cmap: str = SEQUENTIAL_CMAP, vmin: float | None = None,
            vmax: float | None = None, center: float | None = None, annot: pd.DataFrame | None = None,
            fmt: str = "{:.2f}", cbar_label: str = "", xlabel: str | None = None, ylabel: str | None = None,
            log_color: bool = False, text_dy: float = 0.0, ratio_ticks: bool = False, colorbar: bool = True,
            xticklabels: Sequence[str] | None = None, yticklabels: Sequence[str] | None = None) -> HeatmapAxes:
    """A heatmap of ``table`` in its own row and column order (the first row at the top, as a table reads), one
    equal cell per value, for categories such as kernel x planner. Missing cells
    (NaN) are hatched grey. ``annot`` (same shape) is written into the cells, ``text_dy`` (in cells) above their
    middle, in black or white by the cell's colour, at the largest size that fits (none where that is below
    ``MIN_FONT_PT``). ``log_color``: a logarithmic colour scale (``ratio_ticks``: its ticks written 0.5x, 1x,
    2x); ``center``: a two-slope scale around that value. ``colorbar=False`` leaves the colour bar to
    ``plots.colorbar`` (one bar for several panels)."""
    return _heatmap(ax, table, flip=True, cmap=cmap, vmin=vmin, vmax=vmax, center=center, annot=annot, fmt=fmt,
                    cbar_label=cbar_label, xlabel=xlabel, ylabel=ylabel, log_color=log_color, text_dy=text_dy,
                    ratio_ticks=ratio_ticks, add_colorbar=colorbar,
                    xticklabels=list(xticklabels) if xticklabels is not None else [str(c) for c in table.columns],
                    yticklabels=list(yticklabels) if yticklabels is not None else [str(i) for i in table.index])


def log2_heatmap(ax: Any, table: pd.DataFrame, *, cmap: str = SEQUENTIAL_CMAP, vmin: float | None = None,
                 vmax: float | None = None, center: float | None = None, annot: pd.DataFrame | None = None,
                 fmt: str = "{:.2f}", cbar_label: str = "", xlabel: str | None = None,
                 ylabel: str | None = None, log_color: bool = False, text_dy: float = 0.0,
                 ratio_ticks: bool = False, colorbar: bool = True) -> HeatmapAxes:
    """A heatmap whose rows and columns are powers of two (batch, context, splits), one equal cell per value in
    ascending order (a log2 axis when the values are successive powers of two), labelled 1, 2, ..., 1K, 64K;
    otherwise as ``heatmap``. Returns ``HeatmapAxes`` to place markers (``ax.scatter(h.x(splits),
    h.y(batch))``)."""
    t = table.sort_index().sort_index(axis=1)
    return _heatmap(ax, t, flip=False, cmap=cmap, vmin=vmin, vmax=vmax, center=center, annot=annot, fmt=fmt,
                    cbar_label=cbar_label, xlabel=xlabel, ylabel=ylabel, log_color=log_color, text_dy=text_dy,
                    ratio_ticks=ratio_ticks, add_colorbar=colorbar, xticklabels=[fmt_pow2(v) for v in t.columns],
                    yticklabels=[fmt_pow2(v) for v in t.index], numeric=True)


def _heatmap(ax: Any, t: pd.DataFrame, *, flip: bool, cmap: str, vmin: float | None, vmax: float | None,
             center: float | None, annot: pd.DataFrame | None, fmt: str, cbar_label: str, xlabel: str | None,
             ylabel: str | None, log_color: bool, text_dy: float, ratio_ticks: bool, add_colorbar: bool,
             xticklabels: list[str], yticklabels: list[str], numeric: bool = False) -> HeatmapAxes:
    from matplotlib.patches import Rectangle

    nx, ny = t.shape[1], t.shape[0]
    vals = t.to_numpy(dtype=float)
    norm = _norm(vals, log_color=log_color, center=center, vmin=vmin, vmax=vmax)
    mesh = ax.pcolormesh(np.arange(nx + 1) - 0.5, np.arange(ny + 1) - 0.5, np.ma.masked_invalid(vals), cmap=cmap,
                         norm=norm, shading="flat")
    missing = []
    for i, j in zip(*np.where(~np.isfinite(vals)), strict=True):
        missing.append(ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=MISSING_FACE, hatch=MISSING_HATCH,
                                              edgecolor=MISSING_EDGE, linewidth=0, zorder=1.5)))
    ax.set_xlim(-0.5, nx - 0.5)
    ax.set_ylim((ny - 0.5, -0.5) if flip else (-0.5, ny - 0.5))
    if numeric:  # batch, context, splits: every k-th label where they would overlap
        _thin_ticks(ax, "x", xticklabels)
        _thin_ticks(ax, "y", yticklabels)
    else:  # categories: every label, the column names slanted where they would not fit a cell
        cell_px = 0.85 * ax.get_position().width * ax.figure.get_figwidth() * ax.figure.dpi / max(nx, 1)
        slant = _label_step(ax, "x", cell_px, max((len(s) for s in xticklabels), default=0)) > 1
        ax.set_xticks(np.arange(nx), xticklabels, rotation=30 if slant else 0, ha="right" if slant else "center",
                      rotation_mode="anchor" if slant else "default")
        ax.set_yticks(np.arange(ny), yticklabels)
    ax.grid(False)
    numbers = None
    if annot is not None:
        a = annot.reindex(index=t.index, columns=t.columns)
        rgba = mesh.to_rgba(np.ma.masked_invalid(vals))
        texts = []
        for i in range(ny):
            for j in range(nx):
                v = a.iat[i, j]
                if v is None or (isinstance(v, float) and math.isnan(v)) or not np.isfinite(vals[i, j]):
                    continue
                color = text_color(rgba[i, j])
                texts.append(ax.text(j, i + (-text_dy if flip else text_dy), fmt.format(v) if not isinstance(v, str)
                                     else v, ha="center", va="center", color=color, zorder=2.5))
        if texts:
            numbers = _CellNumbers(ax, texts, room=max(0.35, 1.0 - 2.0 * abs(text_dy)))
            ax.add_artist(numbers)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    hm = HeatmapAxes(tuple(float(c) for c in t.columns) if numeric else tuple(t.columns),
                     tuple(float(i) for i in t.index) if numeric else tuple(t.index), mesh=mesh, numbers=numbers,
                     missing=tuple(missing))
    if add_colorbar:
        colorbar(hm, ax, label=cbar_label, ratio_ticks=ratio_ticks)
    return hm


def colorbar(hm: HeatmapAxes, ax: Any, *, label: str = "", ratio_ticks: bool = False, **kw: Any) -> Any:
    """The colour bar of a heatmap beside ``ax`` (an axes or a list of them: one bar for panels that share a
    scale); ``ratio_ticks``: ticks at powers of two written 0.5x, 1x, 2x (for a logarithmic scale); ``kw`` go to
    ``Figure.colorbar`` (``location="top"``, ``shrink``)."""
    from matplotlib.colors import LogNorm

    fig = (ax if not isinstance(ax, (list, tuple, np.ndarray)) else np.ravel(ax)[0]).figure
    target = list(np.ravel(ax)) if isinstance(ax, (list, tuple, np.ndarray)) else ax
    cb = fig.colorbar(hm.mesh, ax=target, **{"shrink": 0.9, "pad": 0.02, **kw})
    if ratio_ticks and isinstance(hm.mesh.norm, LogNorm):
        long = cb.ax.xaxis if cb.orientation == "horizontal" else cb.ax.yaxis
        long.set_major_locator(mpl.ticker.LogLocator(base=2))
        long.set_minor_locator(mpl.ticker.NullLocator())
        long.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _p: f"{v:g}x"))
    if label:
        cb.set_label(label)
    return cb


def ecdf(ax: Any, values: Mapping[str, Iterable[float]], *, xlabel: str = "regret (p50 / oracle)",
         counts: bool = True) -> None:
    """Empirical CDFs, one per planner label, each in its own colour (``planner_styles``); log2 x axis. Each line is
    labelled ``name (n=shapes)``, or ``name`` alone without ``counts`` (for one legend shared by several panels:
    ``legend_outside(fig)``). The legend is the caller's (``legend_outside``: beside the data, never on it)."""
    for label, st in planner_styles(values).items():
        v = np.sort(np.asarray([x for x in values[label] if x is not None and np.isfinite(x)], dtype=float))
        if not len(v):
            continue
        y = np.arange(1, len(v) + 1) / len(v)
        ax.step(v, y, where="post", color=st["color"], linestyle=st["linestyle"],
                label=f"{label} (n={len(v)})" if counts else str(label), lw=1.6)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _p: f"{v:g}x"))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of shapes")
    ax.set_ylim(0, 1.02)


def legend_outside(target: Any, **kw: Any) -> Any:
    """A legend beside the data, never on it (no duplicate labels): to the right of an axes, or, for a figure
    (``matplotlib.figure.Figure``), one legend of all its axes' lines to the right of them all (for panels that
    share their series, e.g. one planner per colour). Returns the legend (None when there is nothing to label)."""
    is_fig = isinstance(target, mpl.figure.Figure)
    seen: dict[str, Any] = {}
    for ax in (target.axes if is_fig else [target]):
        handles, labels = ax.get_legend_handles_labels()
        for h, lab in zip(handles, labels, strict=True):
            if not lab.startswith("_"):
                seen.setdefault(lab, h)
    if not seen:
        return None
    known = {*planners.names(), "oracle", "best"}
    if all(base_planner(lab) in known for lab in seen):  # planners in their usual order, whatever panel came first
        seen = {lab: seen[lab] for lab in planner_order(seen)}
    if is_fig:  # constrained layout makes room for it beside the axes
        return target.legend(seen.values(), seen.keys(), loc="outside right upper", frameon=False, **kw)
    return target.legend(seen.values(), seen.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                         **kw)


def text_color(background: Any) -> str:
    """Black or white, whichever reads better on ``background`` (a colour)."""
    return "black" if _luminance(to_rgb(background)) > 0.18 else "white"
