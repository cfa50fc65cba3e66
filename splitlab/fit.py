"""Fitting splitlab's wave-cost rule (``planners.splitlab.fitted_plan``) to measured data, honestly.

**The data.** By default the catalog's (``splitlab.catalog``): the fit reads the ``fit`` sets (``h200``: the newest
kernel version of every family on the H200) and scores the fitted rule on their held-out shapes and on every
``confirm`` set (fresh shapes swept after the rule was final)::

    splitlab fit                              # the fitted constants, the fit / held-out table, the confirm tables
    splitlab fit DATA ... [--confirm DATA]    # other sets: catalog names or sweep folders
    splitlab fit DIR --out my-gpu.toml        # and write the constants file the planner reads (planners.fitted)

(``python -m splitlab.fit`` is the same command.) ``--out`` writes the constants with the device they were fitted
for, the data, its kernel versions, what the data covered per family and the fitted rule's held-out and confirm
scores (uniform and ragged batches apart, as the shootout reports them); the shipped
``splitlab/planners/constants/h200-sxm.toml`` is this command's output on the catalog's sets.

**The split.** Only the *fit* shapes are ever passed to the fit; the *held-out* ones (other batches, contexts,
head counts and length spreads: ``scoring.held_out``) score it, with every other planner (``scoring.shootout``,
``scoring.goal``). ``scoring.split(df)`` cuts the rows, not just the shapes, so the fit never sees a held-out
measurement (not even through the oracle).

**The fit.** Per family, a grid search over the rule's constants (``GRID``: CTAs per SM for wide and for narrow tiles, a
CTA's fixed cost, the merge launch, the merge per split, a split's partial write, the last wave's cost; GQA also the
floor under one wave) that minimises the geomean regret, as ``analysis.replay`` scores it, over the fit shapes. Every
setting is evaluated at once with numpy (the rule's ``fitted_cost`` accepts arrays): seconds for all three families. A
plan whose knobs were not measured scores the shape's *worst* measured time (conservative: the fit cannot gain by
choosing points nobody timed). Near-ties (0.1%) go to the simpler model (``_grid_search``). The split ranges are the
cards' (``planners.splitlab.MAX_SPLITS``): nothing beyond them was swept.

Sparse MLA holds its merge costs at their physical values (``PHYSICAL``: a split writes its partial rows once,
the merge reads them back once) and adds two passes with the first pass's constants held: the head tile's
rates (``NARROW_GRID``, ``SM90_GRID``) and the 32-key tile's (``KEY_TILE_GRID``), each on the fit shapes where
every tile and split the rule weighs was measured (``_covered``), ties to the middle of the plateau
(``_depth``). Free to fit its merge costs, with the head tiles refitted in turn, the grid found 1.006 on the
fit shapes and 1.030 (worst 1.59) on the held-out ones: 67 shapes do not pin nine constants.

MLA adds a head-tile pass (``TILE32_GRID``, ``MLA_SM90_GRID``: the 32-row and the Gluon 64-row tiles' key-tile
costs) on the shapes where both tiles were timed at every split, near-ties to the rule that keeps the default tile
most. The grid searches score same-length batches only; GQA and MLA then take *ragged passes* (``JOINT_PASSES``:
GQA's mid-tile wave width, then ``JOINT_GRID``'s fixed cost, partial write and drain) scored setting by setting on
every fit shape, same-length and ragged, each class counting half (``_joint_search``).

**Devices and kernel versions.** The cost model knows where the Gluon tile runs (``planners.splitlab.sm90_tile_runs``:
its bf16 partials, its own key-tile cost), so one set of constants serves devices with and without it. Given several
sets, the first is read with the later ones layered over it (``layered``: a re-sweep of some kernels on a later kernel
version replaces the first set's rows of those kernels, and the other kernels keep theirs).
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from splitlab import analysis, catalog, results
from splitlab.devices import DeviceSpec
from splitlab.errors import SplitlabError
from splitlab.planners import fitted as fitted_file
from splitlab.planners.fitted import FittedConstants
from splitlab.planners.registry import Plan
from splitlab.planners.splitlab import (
    ENV_CONSTANTS,
    MAX_SPLITS,
    TILE_KEYS,
    CostConstants,
    candidates,
    fitted_cost,
    fitted_plan,
    head_tiles,
    key_tiles,
    narrow_head_tiles,
    split_candidates,
)
from splitlab.scoring import LENGTHS, goal, lengths_of, shootout, split
from splitlab.workloads import KERNEL_KINDS

GRID = dict(
    ctas_per_sm=(1, 2, 3, 4),
    ctas_per_sm_narrow=(1, 2, 3, 4),
    fixed=(0.0, 0.5, 1.0, 2.0, 4.0, 8.0),
    combine=(0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
    combine_per_split=(0.0, 0.01, 0.03, 0.1, 0.3, 1.0),
    partial=(0.0, 0.5, 1.0, 2.0),
    tail=(1.0, 0.5, 0.0),
)
#: GQA: the floor of a launch under one wave, in waves (``CostConstants.lone``; -1: off, the ceil / tail form). The
#: fit shapes cannot tell floors near the knee apart (every fill above the floor costs the same work, so they tie
#: wherever no fit shape has a fill between two of them); ties go to the largest floor (``_grid_search``): a floor
#: below the kernel's real knee makes the rule take the fewest splits down to it, where the bandwidth is not yet
#: saturated, while one above the knee only costs the fill between the two, which streams at full rate anyway.
LONE_GRID = (-1.0, 0.25, 0.4, 0.5, 0.6, 0.75)
#: The ragged pass (``_joint_search``): a CTA's fixed cost, a split's partial write and a narrow CTA's time alone as a
#: ragged launch drains (``CostConstants.drain``; -1: LONE's), refitted on same-length and ragged fit shapes together.
JOINT_GRID = dict(fixed=(0.0, 0.5, 1.0, 2.0, 4.0), partial=(0.5, 1.0, 2.0, 3.0), drain=(-1.0, 0.6, 0.8, 0.9, 1.0))
#: The ragged passes per family, in order: GQA first fits the wave width of its 32- and 64-row tiles
#: (``CostConstants.ctas_per_sm_mid``; 0: the narrow width), which only its groups 17-64 price. Sparse MLA has none
#: (its merge costs are held physical, and its ragged tokens are priced by their top-k slots: scored only).
JOINT_PASSES = {"gqa": (dict(ctas_per_sm_mid=(0, 1, 2, 3, 4)), JOINT_GRID), "mla": (JOINT_GRID,)}
#: The families whose floor under one wave is fitted: GQA (MLA's fit prefers none: its narrow tiles, two to an SM,
#: cost a whole wave under one, ``tail`` 1).
LONE_KINDS = ("gqa",)
#: sparse MLA: a 16-row head tile's cost per key tile in the tl kernel's; 0 (the 16-row tile never weighed) wins
#: near-ties: the narrow tile must earn its place.
NARROW_GRID = (0.0, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)
#: sparse MLA: the Gluon 64-row tile's cost per key tile in the tl kernel's (1.0, the same, first: wins ties).
SM90_GRID = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4)
#: MLA: the tl 32-row head tile's cost per key tile in 16-row tiles; 0 (other head tiles never weighed) wins
#: near-ties: the head-tile choice must earn its place.
TILE32_GRID = (0.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.7, 2.0)
#: MLA: the Gluon 64-row tile's cost per key tile in 16-row tl tiles (1.0, the same, first: wins ties).
MLA_SM90_GRID = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3)
#: sparse MLA: a 32-key tile's (BLOCK_K 32) cost in 64-key tiles; 0 (BLOCK_K 32 never weighed) wins near-ties.
KEY_TILE_GRID = (0.0, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.9, 1.0)
#: Constants held at their physical values instead of fitted, per family: sparse MLA's split writes its partial
#: rows once (P) and the merge reads them back once at full bandwidth (1 P per split and SM).
PHYSICAL = {"sparse_mla": dict(partial=(1.0,), combine_per_split=(1.0,))}


def _settings(kind: str) -> list[dict]:
    grid = GRID | PHYSICAL.get(kind, {})
    combos = [dict(zip(grid, v, strict=True)) for v in itertools.product(*grid.values())]
    if kind in LONE_KINDS:
        combos = [c | dict(lone=v) for c in combos for v in LONE_GRID]
    return combos


def _constants(values: dict, kind: str) -> CostConstants:
    """The ``CostConstants`` of one grid setting (scalars), or of many at once (numpy arrays over the settings,
    for the vectorised cost); fields the setting leaves out keep their defaults."""
    return CostConstants(max_splits=MAX_SPLITS[kind], **values)


def _arrays(settings: list[dict], kind: str) -> CostConstants:
    """One ``CostConstants`` whose fields are arrays over ``settings`` (for the vectorised cost)."""
    return _constants({k: np.array([s[k] for s in settings]) for k in settings[0]}, kind)


def _log_regret_per_setting(idx: analysis.MeasuredIndex, shape: tuple, kind: str, c: CostConstants,
                            n: int, dev: DeviceSpec) -> np.ndarray:
    w = idx.workload(shape)
    best, _ = idx.oracle(shape)
    worst = max(idx.times[shape].values())
    cands = candidates(w, c, dev.sm_count, dev.arch)
    cost = np.stack([np.broadcast_to(fitted_cost(w, s, dev.sm_count, c, bh, dev.arch, bk), (n,))
                     for bh, bk, s in cands])
    pick = np.argmin(cost, axis=0)  # first minimum: ties go to the default tiles, then fewer splits (fitted_plan)
    out = np.empty(n)
    for i, (bh, bk, s) in enumerate(cands):
        sel = pick == i
        if sel.any():
            t = idx.lookup(shape, Plan("fit", s, block_k=bk, block_h=bh), dev)[1]
            out[sel] = math.log((t or worst) / best)
    return out


def _grid_search(idx: analysis.MeasuredIndex, kind: str, settings: list[dict], dev: DeviceSpec,
                 prefer: tuple[str, float], centre: dict[str, Sequence[float]] | None = None
                 ) -> tuple[dict, pd.DataFrame]:
    """Score every setting (geomean and worst regret over ``idx``'s shapes) and pick: the lowest geomean; among
    settings within 0.1% of it (the band), those with ``prefer`` (field, value: the simpler model) if any; with
    ``centre`` (field: its grid), the one deepest inside the band along those fields (``_depth``: the middle of a
    plateau of ties, not its edge: the fit shapes pin a rate only between two of their breakpoints); then the
    lowest worst case (then, for GQA, the largest ``lone`` floor; then the grid's order)."""
    if not idx.shapes():  # nothing to score: the data does not cover this pass's shapes
        which = " with every tile and split the rule weighs measured" if centre else ""
        raise SplitlabError(f"no {kind} fit shape to score{which}; expected data covering the cards' fit grids "
                            "(e.g. the catalog's h200)")
    c = _arrays(settings, kind)
    logs = np.stack([_log_regret_per_setting(idx, sh, kind, c, len(settings), dev) for sh in idx.shapes()])
    score = pd.DataFrame(settings)
    score["geomean"] = np.exp(logs.mean(axis=0))
    score["worst"] = np.exp(logs.max(axis=0))
    score["shapes"] = len(idx.shapes())
    band = score[score["geomean"] <= score["geomean"].min() * 1.001]
    field, value = prefer
    near = band[band[field] == value] if (band[field] == value).any() else band
    order = ["worst", "lone"] if "lone" in near else ["worst"]  # then the largest floor (LONE_GRID)
    ascending = [True, False][:len(order)]
    if centre:
        fields = list(settings[0])
        tied = set(map(tuple, band[fields].itertuples(index=False)))
        depth = [_depth(tied, tuple(v), fields, centre) for v in near[fields].itertuples(index=False)]
        near = near.assign(edge=[d[0] for d in depth], inside=[d[1] for d in depth])
        order, ascending = ["edge", "inside", *order], [False, False, *ascending]
    best = near.sort_values(order, ascending=ascending, kind="stable").iloc[0]
    return {k: best[k] for k in settings[0]}, score.sort_values(["geomean", "worst"]).reset_index(drop=True)


def _depth(band: set[tuple], values: tuple, fields: list[str], centre: dict[str, Sequence[float]]) -> tuple[int, int]:
    """How deep a setting lies inside ``band`` (the settings' values tied at the best score): from ``values`` (of
    ``fields``), step along each field of ``centre`` (field: its grid) in both directions and count the steps
    that stay in the band (the grid's end ends a walk). Returns (the fewest steps of any walk: the distance to
    the plateau's nearest edge, the steps of all walks: its size around the setting); the middle of a plateau
    has the largest of both."""
    walks = []
    for f, grid in centre.items():
        k, grid = fields.index(f), list(grid)
        i = grid.index(values[k])
        for step in (-1, 1):
            n, j = 0, i + step
            while 0 <= j < len(grid) and (*values[:k], grid[j], *values[k + 1:]) in band:
                n, j = n + 1, j + step
            walks.append(n)
    return min(walks), sum(walks)


def _covered(idx: analysis.MeasuredIndex, kind: str, dev: DeviceSpec, tiles: str = "head") -> analysis.MeasuredIndex:
    """``idx`` cut to the shapes on which every (head tile, split count) the rule can pick was measured (at
    BLOCK_K 64; ``tiles="key"``: every (key tile, split count) at the default head tile, on shapes where the rule
    weighs BLOCK_K 32): the head- and key-tile passes are scored there only, since a shape swept at the default
    tiles alone would score every other pick as its worst time and so fit the data's coverage, not the kernel."""
    probe = CostConstants(ctas_per_sm=1, ctas_per_sm_narrow=1, fixed=0.0, combine=0.0, combine_per_split=0.0,
                          max_splits=MAX_SPLITS[kind], small_key_tile=1.0,  # weighs BLOCK_K 32 wherever the rule can
                          tile32=1.0)  # and every MLA head tile

    def covered(shape: tuple) -> bool:
        w = idx.workload(shape)
        if tiles == "key":
            keys = key_tiles(w, probe)
            if len(keys) < 2:
                return False
            pairs = [(None, bk) for bk in keys]
        else:
            pairs = ([(bh, None) for bh in head_tiles(w, probe, dev.arch)] if kind == "mla" else
                     [(bh, None if w.head_dim_qk > 512 else TILE_KEYS) for bh in (None, *narrow_head_tiles(w))])
        plans = [Plan("fit", s, block_k=bk, block_h=bh) for bh, bk in pairs
                 for s in split_candidates(w, MAX_SPLITS[kind], dev.sm_count, bh, bk)]
        return all(idx.lookup(shape, p, dev)[1] is not None for p in plans)

    return idx.only(filter(covered, idx.shapes()))


def _uniform(idx: analysis.MeasuredIndex) -> analysis.MeasuredIndex:
    """``idx`` cut to its same-length batches (``DecodeWorkload.ragged`` false)."""
    return idx.only(sh for sh in idx.shapes() if not idx.workload(sh).ragged)


def _ragged(idx: analysis.MeasuredIndex) -> analysis.MeasuredIndex:
    """``idx`` cut to its ragged batches."""
    return idx.only(sh for sh in idx.shapes() if idx.workload(sh).ragged)


def _joint_search(idx: analysis.MeasuredIndex, kind: str, values: dict, dev: DeviceSpec,
                  grid: dict[str, tuple]) -> tuple[dict, pd.DataFrame]:
    """A ragged pass: ``grid``'s constants (``JOINT_PASSES``) with every other constant held, scored setting by
    setting on every fit shape of ``idx``, same-length and ragged (a ragged launch's schedule is priced one setting
    at a time): the mean of the two classes' log geomean regrets, so that each counts as much as the other whatever
    their shape counts. The values held so far (``drain`` -1, ``ctas_per_sm_mid`` 0 where not yet fitted) win
    near-ties (0.1%), then the lower worst case."""
    shapes = {False: [], True: []}
    for sh in idx.shapes():
        shapes[idx.workload(sh).ragged].append(sh)
    keep = dict(dict(drain=-1.0, ctas_per_sm_mid=0), **values)
    grid = {k: tuple(dict.fromkeys((keep[k], *v))) for k, v in grid.items()}  # the held value first
    rows = []
    for combo in itertools.product(*grid.values()):
        # at the default head tiles, as the first pass (the fit shapes measure other head tiles on the tiles grid
        # alone, where the head-tile pass scores them; elsewhere an unmeasured pick would score its worst time)
        c = _constants(keep | dict(zip(grid, combo, strict=True)) | dict(tile32=0.0), kind)
        logs = {}
        for ragged, group in shapes.items():
            out = []
            for sh in group:
                best, _ = idx.oracle(sh)
                t = idx.lookup(sh, fitted_plan(idx.workload(sh), dev, c, name="fit"), dev)[1]
                out.append(math.log((t or max(idx.times[sh].values())) / best))
            logs[ragged] = out
        parts = [sum(v) / len(v) for v in logs.values() if v]
        every = logs[False] + logs[True]
        rows.append(dict(zip(grid, combo, strict=True)) | dict(
            geomean=math.exp(sum(parts) / len(parts)), worst=math.exp(max(every)), shapes=len(every)))
    score = pd.DataFrame(rows)
    band = score[score["geomean"] <= score["geomean"].min() * 1.001]
    best = band.sort_values("worst", kind="stable").iloc[0] if not (band.index == 0).any() else band.loc[0]
    return keep | {k: float(best[k]) for k in grid}, score


def fit_family(df_fit: pd.DataFrame, kind: str, *, device: DeviceSpec | str | None = None,
               head_tile_rows: pd.DataFrame | None = None, allow_fake: bool = False
               ) -> tuple[CostConstants, pd.DataFrame]:
    """The constants minimising the geomean regret over the shapes of ``df_fit`` of ``kind`` (grid search),
    and every setting's score (``geomean``, ``worst``), best first.

    Sparse MLA's head-tile constants are fitted in a second pass, with the first pass's constants held (the
    joint grid would be hundreds of times larger): ``narrow_tile`` over ``NARROW_GRID``, ``sm90_tile`` over
    ``SM90_GRID`` and the narrow tiles' CTAs per SM, the 16-row tile never weighed (0) preferred within 0.1%,
    on the shapes where every head tile and split
    the rule can pick was measured (``_covered``): those of ``head_tile_rows`` when given (fit rows of a later
    kernel version's head-tile sweep, ``main``'s ``--head-tiles``), else of ``df_fit``; ties to the middle of the
    plateau. A third pass fits the 32-key tile's cost (``small_key_tile`` over ``KEY_TILE_GRID``, 0 preferred) on
    the shapes of ``df_fit`` where both key tiles were measured at every split the rule weighs. ``allow_fake``: fit
    modelled rows (the fake timer's) too, for CI and demonstrations only."""
    from splitlab.devices import get as get_device

    rows = df_fit[df_fit["kind"] == kind]
    kernel = [k for k, v in KERNEL_KINDS.items() if v == kind]
    rows = rows[rows["kernel"].isin(kernel)]
    dev = analysis.data_device(analysis.measured(rows, allow_fake=allow_fake)) if device is None else (
        device if isinstance(device, DeviceSpec) else get_device(device))
    # The grid searches score same-length batches, every setting at once; ragged batches are priced by a schedule of
    # their CTAs (``planners.splitlab.ragged_launch_time``), one setting at a time, so they enter the ragged passes
    # below.
    every = analysis.MeasuredIndex(rows, allow_fake=allow_fake)
    idx = _uniform(every)
    # A partial-wave discount must earn its place: the whole-wave model (tail 1) wins near-ties.
    values, score = _grid_search(idx, kind, _settings(kind), dev, prefer=("tail", 1.0))
    ht_idx = idx  # the head-tile passes' data: a later kernel version's head-tile sweep where given
    if head_tile_rows is not None and kind in ("sparse_mla", "mla"):
        ht = head_tile_rows[(head_tile_rows["kind"] == kind) & head_tile_rows["kernel"].isin(kernel)]
        ht_idx = _uniform(analysis.MeasuredIndex(ht, allow_fake=allow_fake))
    if kind == "sparse_mla":
        settings = [values | dict(narrow_tile=r, ctas_per_sm_narrow=n, sm90_tile=g)
                    for r in NARROW_GRID for n in GRID["ctas_per_sm_narrow"] for g in SM90_GRID]
        values, score = _grid_search(_covered(ht_idx, kind, dev), kind, settings, dev, prefer=("narrow_tile", 0.0),
                                     centre=dict(narrow_tile=NARROW_GRID, sm90_tile=SM90_GRID))
        settings = [values | dict(small_key_tile=k) for k in KEY_TILE_GRID]
        values, score = _grid_search(_covered(idx, kind, dev, "key"), kind, settings, dev,
                                     prefer=("small_key_tile", 0.0), centre=dict(small_key_tile=KEY_TILE_GRID))
    if kind == "mla":
        covered = _covered(ht_idx, kind, dev)
        if covered.shapes():  # data with every head tile at every split the rule weighs (the card's tiles grid)
            # Near-ties go to the rule that keeps the default tile most: not weighing the others (tile32 0), then
            # the dearest Gluon tile, then the cheapest 32-row tile (the fit shapes pin the rates only between
            # their breakpoints; at 8-16 heads the 16-row and 64-row tiles tie within a few percent).
            settings = [values | dict(tile32=t, sm90_tile=g) for g in MLA_SM90_GRID for t in TILE32_GRID]
            values, score = _grid_search(covered, kind, settings, dev, prefer=("tile32", 0.0))
    if kind in JOINT_PASSES and _ragged(every).shapes():
        for grid in JOINT_PASSES[kind]:
            values, _ = _joint_search(every, kind, values, dev, grid)
    fitted = _constants({k: (int if k.startswith("ctas_per_sm") else float)(v) for k, v in values.items()}, kind)
    return fitted, score


def fit_all(df: pd.DataFrame, *, head_tiles: pd.DataFrame | None = None,
            allow_fake: bool = False) -> dict[str, CostConstants]:
    """``fit_family`` for every family in ``df``'s fit rows (``split(df)[0]``; held-out rows are dropped
    here, before anything reads them), sparse MLA's head-tile pass on ``head_tiles``' fit rows when given."""
    fit_rows, _ = split(df)
    ht = None if head_tiles is None else split(head_tiles)[0]
    kinds = [KERNEL_KINDS[k] for k in sorted(set(fit_rows["kernel"].astype(str)) & set(KERNEL_KINDS))]
    return {kind: fit_family(fit_rows, kind, head_tile_rows=ht, allow_fake=allow_fake)[0] for kind in kinds}


#: The constants a split-count sweep cannot measure: the work-list kernels' (the persistent kernel's key-tile cost,
#: which prices stream-K in splitlab's scheduler, ``planners.schedulers.persistent_cost``; their fixed cost per item,
#: ``schedulers.item_fixed``). They are fitted over schedule runs (``experiments/schedules/refit.py`` over the
#: catalog's ``h200-schedules``), and a fit carries them over from the constants the data's device has of its own
#: (none: 0, stream-K not weighed and an item's fixed cost FIXED's).
SCHEDULE_CONSTANTS = ("persistent", "persistent_wide", "item_fixed")


def carry_schedule_constants(fitted: dict[str, CostConstants], df: pd.DataFrame, *,
                             allow_fake: bool = False) -> dict[str, CostConstants]:
    """``fitted`` with ``SCHEDULE_CONSTANTS`` taken from the constants the data's device has of its own (a user's
    file, ``SPLITLAB_CONSTANTS`` or the shipped file fitted for it; not the fallback), else left at 0."""
    from splitlab.planners.splitlab import constants_for

    dev = analysis.data_device(analysis.measured(df[df["kernel"].isin(list(KERNEL_KINDS))], allow_fake=allow_fake))
    out = {}
    for kind, c in fitted.items():
        try:
            held = constants_for(dev, kind)
        except SplitlabError:
            held = None
        if held is not None and held.how != "fallback":
            c = replace(c, **{k: getattr(held.constants, k) for k in SCHEDULE_CONSTANTS})
        out[kind] = c
    return out


def layered(base: pd.DataFrame, newer: pd.DataFrame) -> pd.DataFrame:
    """``base``'s rows of the kernels ``newer`` lacks, and all of ``newer``'s: a re-sweep of some kernels on a later
    kernel version supersedes their older data, and the other kernels keep theirs."""
    return pd.concat([base[~base["kernel"].isin(set(newer["kernel"]))], newer], ignore_index=True)


def _fmt(c: CostConstants) -> str:
    s = (f"ctas_per_sm={c.ctas_per_sm}, ctas_per_sm_narrow={c.ctas_per_sm_narrow}, fixed={c.fixed:g}, "
         f"combine={c.combine:g}, combine_per_split={c.combine_per_split:g}, partial={c.partial:g}, "
         f"max_splits={c.max_splits}")
    s += f", tail={c.tail:g}" if c.tail != 1.0 else ""
    s += f", narrow_tile={c.narrow_tile:g}" if c.narrow_tile else ""
    s += f", lone={c.lone:g}" if c.lone >= 0 else ""
    s += f", sm90_tile={c.sm90_tile:g}" if c.sm90_tile != 1.0 else ""
    s += f", tile32={c.tile32:g}" if c.tile32 else ""
    s += f", ctas_per_sm_mid={c.ctas_per_sm_mid}" if c.ctas_per_sm_mid else ""
    s += f", drain={c.drain:g}" if c.drain >= 0 else ""
    return s + (f", small_key_tile={c.small_key_tile:g}" if c.small_key_tile else "")


def _fit_rows_checked(df: pd.DataFrame, arg: str, *, allow_fake: bool = False) -> None:
    """Refuse (one ``SplitlabError`` naming ``arg``) data the fit cannot use: no rows of a family's kernel among
    the fit shapes, modelled (fake-timer) rows unless ``allow_fake``, or no correct measurement of a family it
    holds."""
    fit_rows = split(df)[0] if not df.empty else df
    kernels = sorted(set(fit_rows["kernel"].astype(str)) & set(KERNEL_KINDS)) if "kernel" in fit_rows else []
    if not kernels:
        raise SplitlabError(f"{arg}: no fit rows of {', '.join(KERNEL_KINDS)}; expected sweeps of splitlab's kernels "
                            "over the cards' fit grids (e.g. the catalog's h200)")
    if not allow_fake and "timing" in df.columns and (df["timing"] == "fake").any():
        raise SplitlabError(f"{arg}: holds modelled rows (timing='fake'); expected measurements (the fit never "
                            "reads the fake timer's numbers; --allow-fake fits them anyway, for CI)")
    for k in kernels:
        if not (fit_rows[fit_rows["kernel"] == k]["status"] == "ok").any():
            raise SplitlabError(f"{arg}: no correct measurement (status 'ok') of {k} among the fit shapes; expected "
                                "measured rows to fit")


#: The fitted rule's scores a constants file records per family and set: rounded, so that a refit on the same data
#: writes the same file on any machine.
SCORE_DIGITS = 4


def _scores(table: pd.DataFrame, part: str, new_name: str = "splitlab", lengths: str = LENGTHS[0]
            ) -> dict[str, dict]:
    """Per family: the fitted rule's shapes, measured choices, geomean and worst regret on ``part`` of a
    ``shootout`` table, over its shapes of ``lengths`` (``uniform`` or ``ragged``) only."""
    which = table["lengths"] if "lengths" in table else lengths_of(table)
    out = {}
    for r in table[(table["set"] == part) & (table["planner"] == new_name) & (which == lengths)].to_dict("records"):
        if r["kernel"] in KERNEL_KINDS and r["measured"]:
            out[KERNEL_KINDS[r["kernel"]]] = dict(shapes=int(r["shapes"]), measured=int(r["measured"]),
                                           geomean=round(float(r["geomean"]), SCORE_DIGITS),
                                           worst=round(float(r["worst"]), SCORE_DIGITS))
    return out


def kernel_versions(data: Sequence[str]) -> list[str]:
    """What ran the data's kernels: a catalog set's kernel version (``"6"``), a sweep folder's splitlab version
    and commit as its sidecars record them (``"splitlab 0.1.0 (8f5b5be)"``)."""
    out: list[str] = []
    for d in data:
        if catalog.is_name(d):
            sets = catalog.entries(d) if d in catalog.ROLES else [catalog.get(d)]
            out += [str(e.kernel_version) for e in sets]
            continue
        root = Path(d)
        sides = [root / "sweep.json"] if (root / "sweep.json").is_file() else sorted(root.rglob("sweep.json"))
        for s in sides:
            try:
                side = results.read_sidecar(s)
            except SplitlabError:
                continue
            if side.get("kernel") not in KERNEL_KINDS:
                continue
            env = side.get("env") or {}
            commit = (env.get("git") or {}).get("commit")
            out.append(f"splitlab {env.get('splitlab', '?')}" + (f" ({commit})" if commit else ""))
    return list(dict.fromkeys(out))


def record(df: pd.DataFrame, fitted: dict[str, CostConstants], data: Sequence[str], table: pd.DataFrame,
           confirm: Sequence[tuple[str, pd.DataFrame]] = (), *, allow_fake: bool = False) -> FittedConstants:
    """The constants file of a fit: ``fitted`` on ``df`` (read from ``data``), its device, kernel versions, what
    the data covered per family (``fitted_range.ranges_from_rows``), and the held-out and confirm scores (``table``
    and each confirm set's ``shootout`` table, by name), of uniform and of ragged batches apart."""
    from splitlab.planners.fitted_range import ranges_from_rows

    fake = "timing" in df.columns and bool((df["timing"] == "fake").any())
    dev = analysis.data_device(analysis.measured(df[df["kernel"].isin(list(KERNEL_KINDS))], allow_fake=allow_fake))
    rows = df.drop(columns="timing") if fake else df  # a modelled fit records what its rows covered all the same
    confirm_scores: dict[str, dict[str, dict]] = {}
    confirm_ragged: dict[str, dict[str, dict]] = {}
    for name, conf in confirm:
        for lengths, scores in zip(LENGTHS, (confirm_scores, confirm_ragged), strict=True):
            for kind, s in _scores(conf, name, lengths=lengths).items():
                scores.setdefault(kind, {})[name] = s
    return FittedConstants(device=dev.name, families=dict(fitted), data=tuple(map(str, data)),
                           kernel_versions=tuple(kernel_versions(data)), timing="modelled" if fake else "measured",
                           ranges={k: v for k, v in ranges_from_rows(rows).items() if k in fitted},
                           held_out=_scores(table, "held-out"), confirm=confirm_scores,
                           held_out_ragged=_scores(table, "held-out", lengths=LENGTHS[1]),
                           confirm_ragged=confirm_ragged)


def _out_file(arg: str, value: str) -> Path:
    """Check that ``value`` names a file splitlab can write (not a folder; its folder writable or creatable)."""
    from splitlab.args import out_dir, path_text, shown

    what = "a file to write the constants into (e.g. my-gpu.toml)"
    p = Path(path_text(arg, value, what)).expanduser()
    if p.is_dir():
        raise SplitlabError(f"{arg}={shown(value)} is a folder; expected {what}")
    if p.suffix != ".toml":
        raise SplitlabError(f"{arg}={shown(value)} is not allowed; expected {what}, ending in .toml")
    out_dir(arg, p.parent if str(p.parent) else ".", create=False)
    return p


def write(fc: FittedConstants, path: Path) -> None:
    """Write ``fc`` to ``path`` (its folder created), whole or not at all: into a hidden temporary file beside it
    named for this process (``results.tmp_path``; those a killed process left are removed first:
    ``results.clean_stale_tmp``), created with the umask's mode (0666 & ~umask), then renamed over ``path``. A
    write that fails (a full disk, a file-size limit) is one ``SplitlabError``; the file there stays as it was."""
    import os
    import secrets

    data = fitted_file.dumps(fc).encode()
    tmp = results.tmp_path(path, secrets.token_hex(3))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        results.clean_stale_tmp(path.parent, path.name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        raise results.write_failed(OSError(e.errno, e.strerror), path, f"and run the fit again ({path} is as it "
                                   "was)") from None
    finally:
        tmp.unlink(missing_ok=True)


def run(a) -> int:
    """``splitlab fit`` (and ``python -m splitlab.fit``) from parsed arguments (``args.add_fit_arguments``)."""
    from splitlab.args import existing_path

    def load(arg: str, *data: str) -> pd.DataFrame:
        for d in data:
            if not catalog.is_name(d):
                existing_path(arg, d)
        try:
            return results.load_points(*data)
        except SplitlabError as e:
            raise SplitlabError(f"{arg}: {e}") from None

    out = None if a.out is None else _out_file("--out", a.out)
    if not a.data and not catalog.names("fit"):
        raise SplitlabError(f"data: none given, and no fit set in a catalog here ({catalog.why_none('fit')}); "
                            "expected DATA, a folder of splitlab sweeps "
                            "(splitlab fit DIR)")
    # Everything is read before the fit (minutes) starts: a bad set fails at once.
    data = list(a.data or catalog.names("fit"))
    if a.data:
        df = load("data", a.data[0])
        if a.data[1:]:
            df = layered(df, load("data", *a.data[1:]))
    else:
        df = load("data", *data)
    _fit_rows_checked(df, f"data={' '.join(data)!r}", allow_fake=a.allow_fake)
    head_tiles = None if a.head_tiles is None else load("--head-tiles", a.head_tiles)
    confirm_sets = a.confirm if a.confirm is not None else [] if a.data else catalog.names("confirm")
    confirm = [(d, load("--confirm", d)) for d in confirm_sets]
    fitted = carry_schedule_constants(fit_all(df, head_tiles=head_tiles, allow_fake=a.allow_fake), df,
                                      allow_fake=a.allow_fake)
    for kind, c in fitted.items():
        print(f"{kind}: CostConstants({_fmt(c)})")
    table = shootout(df, fitted, allow_fake=a.allow_fake)
    scored = []
    with pd.option_context("display.width", 160, "display.max_rows", 200):
        print(table.round(3).to_string(index=False))
        print(goal(table).round(3).to_string(index=False))
        for d, conf_rows in confirm:
            name = d if catalog.is_name(d) else Path(d).name
            conf = shootout(conf_rows, fitted, part=name, allow_fake=a.allow_fake)
            scored.append((name, conf))
            print(f"\n{name}:" if name == d else f"\n{name} ({d}):")
            print(conf.round(3).to_string(index=False))
            print(goal(conf, part=name).round(3).to_string(index=False))
    if out is not None:
        fc = record(df, fitted, data, table, scored, allow_fake=a.allow_fake)
        write(fc, out)
        print(f"\nwrote {out}: constants for {fc.device} ({', '.join(fc.families)}); the splitlab planner takes them "
              f"with `splitlab plan --constants {out}` or {ENV_CONSTANTS}={out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m splitlab.fit [DATA ...] [--confirm DATA] [--head-tiles DATA] [--out FILE]`` (the same as
    ``splitlab fit``): a bad argument is one line on stderr and exit code 2 (every set is checked and read before
    the fit starts); Ctrl-C one line and 130."""
    from splitlab.args import OneLineParser, add_fit_arguments, run_main

    p = OneLineParser(prog="python -m splitlab.fit", description=__doc__.split("\n")[0])
    add_fit_arguments(p)
    return run_main("python -m splitlab.fit", lambda: run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
