"""The figures' shared pieces (matplotlib / seaborn): one color per planner everywhere, log2 axes for batch,
context and CTAs, lines at multiples of the SM count, and titles that carry the device and the data's date
(and say MODELLED when the numbers come from the fake timer).

    from splitlab import plots
    plots.setup()
    fig, ax = plt.subplots()
    ax.plot(x, y, **plots.planner_style("flashinfer"))
    plots.log2_axis(ax, "x"); plots.mark_sm_multiples(ax, 132)
    plots.title(ax, "latency against CTAs", info)      # info: splitlab.report.DataInfo (device, date, fake)

A planner label may carry a device (``"modular@mi355x"``: the rule as it plans for another device, measured
here): it keeps the planner's color and gets a dashed line and a hollow marker.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import matplotlib as mpl
import numpy as np
import pandas as pd

from splitlab import planners

MODELLED = "MODELLED (fake timer), not measured"
ORACLE_COLOR = "#000000"
DPI = 90

# Fixed by name (not by registry order) so that a planner keeps its color when others are added. The
# colors are Okabe-Ito / tab10 hues that stay apart for the common color-vision deficiencies.
_FIXED = {
    "splitlab": "#d62728",  # red: this repository's own rule stands out
    "modular": "#1f77b4",
    "flashinfer": "#2ca02c",
    "aiter": "#ff7f0e",
    "flash_attn": "#9467bd",
    "flex": "#8c564b",
    "sglang": "#e377c2",
    "flashmla": "#17becf",
}
_SPARE = ["#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2"]


def _palette(names: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    spare = [c for c in _SPARE]
    for n in names:
        if n in _FIXED:
            out[n] = _FIXED[n]
        else:  # a planner registered later than this palette: a stable spare color by name
            out[n] = spare[sum(map(ord, n)) % len(spare)]
    return out


#: One color per registered planner (``splitlab.planners.names()``), the same in every notebook and figure.
PLANNER_COLORS: dict[str, str] = _palette(planners.names())
_MARKERS = {"splitlab": "o", "modular": "s", "flashinfer": "D", "aiter": "^", "flash_attn": "v", "flex": "P",
            "sglang": "X", "flashmla": "*"}


class _Info(Protocol):
    device: str
    date: str
    fake: bool


def base_planner(label: str) -> str:
    """``"modular@mi355x"`` -> ``"modular"``."""
    return str(label).split("@", 1)[0]


def planner_color(label: str) -> str:
    """The planner's color (``"oracle"`` is black); a ``name@device`` label keeps its planner's color."""
    name = base_planner(label)
    if name in ("oracle", "best"):
        return ORACLE_COLOR
    return PLANNER_COLORS.get(name) or _palette([name])[name]


def planner_style(label: str) -> dict[str, Any]:
    """Keyword arguments for ``ax.plot``/``ax.scatter``-like calls: color, marker, line style and label."""
    name = base_planner(label)
    foreign = "@" in str(label)
    style: dict[str, Any] = dict(color=planner_color(label), marker=_MARKERS.get(name, "o"), label=str(label),
                                 linestyle=_foreign_dash(str(label).split("@", 1)[1]) if foreign else "-")
    if foreign:
        style["markerfacecolor"] = "none"
    return style


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


def setup(dpi: int = DPI) -> None:
    """A compact seaborn theme and a modest DPI (small reports, fast CI)."""
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper", font_scale=1.05)
    mpl.rcParams.update({"figure.dpi": dpi, "savefig.dpi": dpi, "figure.figsize": (7.5, 3.8),
                         "axes.titlesize": 10, "figure.titlesize": 11, "legend.fontsize": 8,
                         "figure.constrained_layout.use": True})


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


def log2_axis(ax: Any, axis: str = "x", *, label: str | None = None, max_ticks: int = 9) -> None:
    """Log2 scale with power-of-two ticks labelled 1, 2, ..., 1K, 64K (``axis``: "x", "y" or "both"); at most
    ``max_ticks`` ticks (every other power of two, or sparser, on a wide range)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    for a in ("x", "y") if axis == "both" else (axis,):
        getattr(ax, f"set_{a}scale")("log", base=2)
        target = ax.xaxis if a == "x" else ax.yaxis
        target.set_major_locator(LogLocator(base=2, numticks=max_ticks))
        target.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_pow2(v) if v >= 1 else f"{v:g}"))
        target.set_minor_locator(mpl.ticker.NullLocator())
        if label:
            (ax.set_xlabel if a == "x" else ax.set_ylabel)(label)


def mark_sm_multiples(ax: Any, sm_count: int, *, axis: str = "x", upto: float | None = None,
                      max_lines: int = 8, label: bool = True) -> list[int]:
    """Lines at 1x, 2x, ... the SM count along ``axis`` (up to ``upto``, default the axis limit), labelled
    "1xSM", "2xSM"; on a log axis the multiples past the fourth are thinned to powers of two. Returns the
    multiples drawn."""
    if not sm_count or sm_count <= 0:
        return []
    lim = (ax.get_xlim() if axis == "x" else ax.get_ylim())[1]
    top = upto if upto is not None else lim
    ks = [k for k in range(1, max(1, int(top // sm_count)) + 1)]
    if len(ks) > 4:
        ks = [k for k in ks if k <= 4 or (k & (k - 1)) == 0]
    ks = ks[:max_lines]
    for k in ks:
        kw = dict(color="#555555", lw=0.9 if k == 1 else 0.6, ls=":" if k > 1 else "--", zorder=0.5)
        if axis == "x":
            ax.axvline(k * sm_count, **kw)
            if label:
                ax.text(k * sm_count, 1.0, f" {k}xSM" if k > 1 else f" SMs={sm_count}", rotation=90, va="top",
                        ha="left", fontsize=7, color="#555555", transform=ax.get_xaxis_transform())
        else:
            ax.axhline(k * sm_count, **kw)
            if label:
                ax.text(1.0, k * sm_count, f"{k}xSM " if k > 1 else f"SMs={sm_count} ", va="bottom", ha="right",
                        fontsize=7, color="#555555", transform=ax.get_yaxis_transform())
    return ks


@dataclass(frozen=True)
class HeatmapAxes:
    """Where values fall on a ``log2_heatmap``: ``x(v)`` and ``y(v)`` map a batch, context or split count to the
    axis coordinate (cells are one unit wide; a value between two columns, such as a planner's 48 splits
    between 32 and 64, lands between them in log2)."""

    columns: tuple[float, ...]
    index: tuple[float, ...]

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


def log2_heatmap(ax: Any, table: pd.DataFrame, *, cmap: str = "viridis", vmin: float | None = None,
                 vmax: float | None = None, center: float | None = None, annot: pd.DataFrame | None = None,
                 fmt: str = "{:.2f}", cbar_label: str = "", xlabel: str | None = None,
                 ylabel: str | None = None, log_color: bool = False, text_dy: float = 0.0,
                 ratio_ticks: bool = False) -> HeatmapAxes:
    """A heatmap whose rows and columns are powers of two (batch, context, splits), one equal cell per value in
    ascending order (a log2 axis when the values are successive powers of two), labelled 1, 2, ..., 1K, 64K.
    ``annot`` (same shape) is written into the cells, ``text_dy`` (in cells) above their middle. ``log_color``:
    a logarithmic color scale (``ratio_ticks``: its ticks written 0.5x, 1x, 2x). Returns ``HeatmapAxes`` to place
    markers (``ax.scatter(h.x(splits), h.y(batch))``)."""
    from matplotlib.colors import LogNorm, TwoSlopeNorm

    t = table.sort_index().sort_index(axis=1)
    nx, ny = t.shape[1], t.shape[0]
    vals = t.to_numpy(dtype=float)
    norm = None
    if log_color:
        finite = vals[np.isfinite(vals) & (vals > 0)]
        lo = vmin if vmin is not None else (finite.min() if finite.size else 1.0)
        hi = vmax if vmax is not None else (finite.max() if finite.size else 2.0)
        norm = LogNorm(vmin=lo, vmax=max(hi, lo * 1.0001))
    elif center is not None:
        finite = vals[np.isfinite(vals)]
        lo = vmin if vmin is not None else (min(finite.min(), center) if finite.size else center - 1)
        hi = vmax if vmax is not None else (max(finite.max(), center) if finite.size else center + 1)
        norm = TwoSlopeNorm(vcenter=center, vmin=min(lo, center - 1e-9), vmax=max(hi, center + 1e-9))
    mesh = ax.pcolormesh(np.arange(nx + 1) - 0.5, np.arange(ny + 1) - 0.5, np.ma.masked_invalid(vals), cmap=cmap,
                         norm=norm, vmin=None if norm is not None else vmin, vmax=None if norm is not None else vmax,
                         shading="flat")
    ax.set_xticks(np.arange(nx), [fmt_pow2(v) for v in t.columns])
    ax.set_yticks(np.arange(ny), [fmt_pow2(v) for v in t.index])
    ax.set_xlim(-0.5, nx - 0.5)
    ax.set_ylim(-0.5, ny - 0.5)
    ax.grid(False)
    if annot is not None:
        a = annot.reindex(index=t.index, columns=t.columns)
        for i in range(ny):
            for j in range(nx):
                v = a.iat[i, j]
                if v is None or (isinstance(v, float) and math.isnan(v)):
                    continue
                ax.text(j, i + text_dy, fmt.format(v) if not isinstance(v, str) else v, ha="center", va="center",
                        fontsize=6.5, color="black",
                        bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.55))
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    cb = ax.figure.colorbar(mesh, ax=ax, shrink=0.9, pad=0.02)
    if ratio_ticks and log_color:
        cb.ax.yaxis.set_major_locator(mpl.ticker.LogLocator(base=2))
        cb.ax.yaxis.set_minor_locator(mpl.ticker.NullLocator())
        cb.ax.yaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _p: f"{v:g}x"))
    if cbar_label:
        cb.set_label(cbar_label)
    return HeatmapAxes(tuple(float(c) for c in t.columns), tuple(float(i) for i in t.index))


def ecdf(ax: Any, values: Mapping[str, Iterable[float]], *, xlabel: str = "regret (p50 / oracle)") -> None:
    """Empirical CDFs, one per planner label, in the planner's color and style; log2 x axis."""
    for label in planner_order(values):
        v = np.sort(np.asarray([x for x in values[label] if x is not None and np.isfinite(x)], dtype=float))
        if not len(v):
            continue
        y = np.arange(1, len(v) + 1) / len(v)
        st = planner_style(label)
        ax.step(v, y, where="post", color=st["color"], linestyle=st["linestyle"], label=f"{label} (n={len(v)})",
                lw=1.4)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _p: f"{v:g}x"))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of shapes")
    ax.set_ylim(0, 1.02)


def legend_outside(ax: Any, **kw: Any) -> None:
    """A legend to the right of the axes (no duplicate labels)."""
    handles, labels = ax.get_legend_handles_labels()
    seen: dict[str, Any] = {}
    for h, lab in zip(handles, labels, strict=True):
        seen.setdefault(lab, h)
    if seen:
        ax.legend(seen.values(), seen.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, **kw)
