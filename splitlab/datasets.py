"""A result set as the report and its notebooks read it: the rows, one per point, and what the sweeps' sidecars say.

    from splitlab import datasets
    df, info = datasets.load_data("h200")       # a catalog name or a folder of sweeps
    info.label                                  # 'NVIDIA H200, 132 SMs, data 2026-...'
    datasets.describe(info, df)                 # a Markdown note on where the numbers come from

``data_info(data)`` checks that ``data`` is a splitlab result set and describes it (``DataInfo``: its sweeps, the
GPU(s) and SM counts, the date, the timers); ``load_data`` reads its rows (``results.load``, one row per point:
``results.one_per_point``) and refuses modelled rows (the fake timer's) unless ``allow_fake``. Names resolve through
the catalog (``splitlab.catalog``); a relative folder is looked up in the current folder, then the repository's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from splitlab import catalog
from splitlab.errors import SplitlabError

if TYPE_CHECKING:  # pandas (with splitlab.results) loads with the rows, not with every `splitlab` command
    import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
MODELLED = "MODELLED (fake timer), not measured"


@dataclass(frozen=True)
class DataInfo:
    """What a result set's sidecars say: its sweeps, the GPU(s) it was measured on, the SM count, the date.

    ``device`` is the label figures carry: the GPU name torch reported (``NVIDIA H200``), or, for rows made
    without a GPU (the fake timer), the preset the points were planned for. ``fake`` is True when any sweep
    used the fake timer: its numbers are modelled, not measured. ``name``: the catalog name, else the folder's
    name; ``sources``: what ``results.load`` reads (a catalog set's sweep folders, else ``path``)."""

    path: Path
    sweeps: tuple[dict, ...]
    gpus: tuple[str, ...]
    presets: tuple[str, ...]
    sm_count: int
    date: str
    timers: tuple[str, ...]
    name: str = ""
    sources: tuple[Path, ...] = ()
    sm_counts: tuple[tuple[str, int], ...] = ()  # (device preset, SMs) of every sweep, once each

    @property
    def sms(self) -> str:
        """The SM count, or each device's when the sweeps ran on several (``b200: 148, h200-sxm: 132 SMs``)."""
        if len(self.sm_counts) > 1:
            return ", ".join(f"{d}: {n}" for d, n in self.sm_counts) + " SMs"
        return f"{self.sm_count} SMs"

    @property
    def fake(self) -> bool:
        return "fake" in self.timers

    @property
    def device(self) -> str:
        real = [g for g in self.gpus if g and g != "cpu"]
        if real:
            return ", ".join(real)
        return ", ".join(self.presets) + " (planned; no GPU)"

    @property
    def where(self) -> str:
        """Where the rows lie, without an absolute path (a report is read on other machines): the folder relative to
        the repository (a set's folder under the data folder) or the current folder, else the folder's name."""
        for base in (ROOT, Path.cwd()):
            try:
                return str(self.path.resolve().relative_to(base.resolve()))
            except ValueError:
                continue
        return self.path.name

    @property
    def label(self) -> str:
        """One line: device, SMs, date, and MODELLED when fake."""
        s = f"{self.device}, {self.sms}, data {self.date}"
        return f"{s} — {MODELLED}" if self.fake else s


def resolve_data(data: str | Path | None) -> Path:
    """``data`` as a path: a catalog set's folder (the catalog's current set when empty); a relative path is taken
    from the current folder when it exists there, else from the repository root (so a notebook opened in
    ``notebooks/`` finds a folder named relative to the repository)."""
    if not data:
        data = catalog.current().name
    if catalog.is_name(data):
        return catalog.DATA_DIR if data in catalog.ROLES else catalog.get(str(data)).path
    p = Path(data).expanduser()
    if p.is_absolute() or p.exists():
        return p.resolve() if p.exists() else p
    q = ROOT / p
    return q if q.exists() else p


def _uniq(xs: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(x for x in xs if x))


def _date(side: dict) -> str:
    stamp = side.get("updated") or side.get("created") or ""
    return str(stamp)[:10]


def data_info(data: str | Path) -> DataInfo:
    """Check that ``data`` is a splitlab result set (a sweep folder or a folder of them) and describe it.
    A missing path, a file, a folder without a ``sweep.json`` or with a foreign one: one ``SplitlabError``
    naming the path."""
    p = resolve_data(data)
    name = str(data) if catalog.is_name(data) else None
    expected = (f"expected a catalog name ({', '.join(catalog.names()) or 'none'}) or a folder of splitlab sweeps "
                "(made by `splitlab sweep`)")
    if not p.exists():
        raise SplitlabError(f"data={str(p)!r} does not exist; {expected}")
    if not p.is_dir():
        raise SplitlabError(f"data={str(p)!r} is a file, not a folder; {expected}")
    sources = tuple(catalog.sources(name)) if name else (p,)
    for s in sources:
        if not s.is_dir():
            raise SplitlabError(f"data={str(data)!r}: {s} does not exist; {expected}")
    sides = [side for s in sources
             for side in ([s / "sweep.json"] if (s / "sweep.json").is_file() else sorted(s.rglob("sweep.json")))]
    if not sides:
        raise SplitlabError(f"data={str(p)!r} holds no splitlab sweep (no sweep.json under it); {expected}")
    from splitlab.results import SUPPORTED_SCHEMAS, read_sidecar

    parsed = []
    for s in sides:
        try:  # JSON, an object, and its fields of the right types (the SM counts integers >= 1)
            side = read_sidecar(s)
        except SplitlabError as e:
            raise SplitlabError(f"data={str(p)!r}: {e}; {expected}") from None
        if not isinstance(side, dict) or not {"sweep_id", "kernel", "schema_version"} <= set(side):
            raise SplitlabError(f"data={str(p)!r}: {s} is not a splitlab sweep sidecar (no sweep_id, kernel, "
                                f"schema_version); {expected}")
        if side["schema_version"] not in SUPPORTED_SCHEMAS:
            raise SplitlabError(f"data={str(p)!r}: {s} has schema_version={side['schema_version']!r}; expected one "
                                f"of {', '.join(map(str, SUPPORTED_SCHEMAS))} (this splitlab's result schema)")
        parsed.append((s, side))
    sweeps, gpus, presets, sms, timers, dates, pairs = [], [], [], [], [], [], []
    for s, side in parsed:
        env_dev = (side.get("env") or {}).get("device") or {}
        preset = (side.get("device") or {}).get("name") or ""
        gpu = env_dev.get("name") or "cpu"
        sm = env_dev.get("sm_count") or (side.get("device") or {}).get("sm_count")
        sweeps.append(dict(folder=str(s.parent.relative_to(p)) if s.parent != p else ".", sweep_id=side["sweep_id"],
                           kernel=side["kernel"], grid=side.get("grid"), timer=side.get("timer"),
                           rows=side.get("rows"), gpu=gpu, preset=preset, date=_date(side),
                           fixture=bool(side.get("fixture"))))
        gpus.append(gpu)
        presets.append(preset)
        if sm:
            sms.append(int(sm))
            pairs.append((preset or gpu, int(sm)))
        timers.append(str(side.get("timer")))
        dates.append(_date(side))
    dates_ = sorted(d for d in dates if d)
    date = (dates_[-1] if dates_[0] == dates_[-1] else f"{dates_[0]} to {dates_[-1]}") if dates_ else "undated"
    return DataInfo(path=p, sweeps=tuple(sweeps), gpus=_uniq(gpus), presets=_uniq(presets),
                    sm_count=max(set(sms), key=sms.count) if sms else 0, date=date, timers=_uniq(timers),
                    name=name or p.name, sources=sources, sm_counts=_uniq(pairs))


def load_data(data: str | Path, *, allow_fake: bool = False) -> tuple[pd.DataFrame, DataInfo]:
    """The rows of every sweep under ``data`` and their ``DataInfo``. Modelled rows (the fake timer) are
    refused unless ``allow_fake``."""
    info = data_info(data)
    if info.fake and not allow_fake:
        raise SplitlabError(f"data={str(info.path)!r} holds modelled rows (timer='fake'); they are not measurements. "
                            "Pass allow_fake=True (splitlab report --allow-fake) to show them, labelled MODELLED")
    from splitlab import results

    try:
        df = results.load(*info.sources)
    except SplitlabError as e:
        raise SplitlabError(f"data={str(info.path)!r}: {e}") from None
    return results.one_per_point(df), info


def describe(info: DataInfo, df: pd.DataFrame | None = None) -> str:
    """A Markdown note on where the numbers come from (shown at the top of each notebook); with the rows
    ``load_data`` returned, also how many points two sweeps shared."""
    name = f"`{info.name}` " if info.name and info.name != info.path.name else ""
    lines = [f"**Data:** {name}`{info.where}`: {len(info.sweeps)} sweep(s) on **{info.device}** ({info.sms}), "
             f"**{info.date}**."]
    dup = df.attrs.get("duplicates", 0) if df is not None else 0
    if dup:
        lines.append(f"{dup} points measured by two sweeps (e.g. a `quick` grid inside `default`) count once, from "
                     "the larger sweep.")
    if info.fake:
        lines.append(f"\n**{MODELLED}.** These rows come from the sweep harness's fake timer: every time is a "
                     "model's output, so nothing below is evidence about a GPU.")
    # The list of sweeps is the same on every page: folded, one line until opened.
    lines.append(f"\n<details><summary>The {len(info.sweeps)} sweep(s)</summary>\n\n"
                 "| sweep | kernel | grid | timer | rows |\n|---|---|---|---|---|")
    for s in info.sweeps:
        lines.append(f"| {s['folder']} | {s['kernel']} | {s['grid']} | {s['timer']} | {s['rows']} |")
    lines.append("\n</details>")
    return "\n".join(lines)
