"""Fitting the work-list kernels' own constants in splitlab's scheduler on measured schedule runs (CPU): their fixed
cost per item and the persistent kernel's key-tile cost (what prices stream-K).

The schedule runs (``ragged_ab.py``, catalog ``h200-schedules``) timed every candidate of splitlab's scheduler on each
batch, stream-K included, so the regret of any choice among them is a measured figure: the measured time of the
schedule chosen (matched by its hash) over the best measured schedule of the batch. This script re-runs splitlab's
scheduler (``planners.schedulers.splitlab``, the code that ships) on those batches with the constants of
``planners.fitted.CostConstants`` it fits set to each value of a grid, in two passes, each choosing on the *fit* run
(``ragged_ab.csv``) the value of least geomean regret (near-ties of 0.2% to the lower worst, then to the lower value):

1. ``item_fixed`` per family (``FIXED_GRID``; 0: the split-count kernels' FIXED), stream-K not weighed;
2. ``persistent`` (narrow and mid tiles) or ``persistent_wide`` (wide tiles) per tile class (``GRID``; 0: stream-K
   not weighed), the family's ``item_fixed`` held.

Each choice is then scored on the *confirm* run (``confirm_ab.csv``: fresh lengths, and the bimodal distribution),
which no choice reads.

    python experiments/schedules/refit.py [--out DIR]    # prints the table; DIR/refit.csv: every value, both runs

A choice whose schedule was not timed in a batch scores the batch's worst measured schedule (as ``splitlab fit``
scores an unmeasured plan).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: The values weighed for the work-list kernels' fixed cost per item (key tiles; 0: FIXED's).
FIXED_GRID = (0.0, 1.0, 1.5, 2.0, 3.0, 4.0)
#: The values weighed for the persistent kernel's key-tile cost (0: stream-K not weighed).
GRID = (0.0, 0.95, 1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.15, 1.2, 1.3)
#: The shapes of the runs per family, and per tile class (family kind, wide tile) the constant that prices it.
FAMILIES = {"gqa": ("32/8", "64/8", "128/1"), "mla": ("mla16", "mla128")}
CLASSES = {("gqa", False): ("persistent", ("32/8", "64/8")), ("gqa", True): ("persistent_wide", ("128/1",)),
           ("mla", False): ("persistent", ("mla16",)), ("mla", True): ("persistent_wide", ("mla128",))}
#: The two runs: (file in the study, --seed-offset, distributions) as ragged_ab.py made them (its README).
RUNS = {"fit": ("ragged_ab.csv", 0, ("spread16", "longtail", "uniform")),
        "confirm": ("confirm_ab.csv", 1000, ("spread16", "longtail", "bimodal", "uniform"))}
NEAR_TIE = 1.002
#: The peers' implementations in the runs (the best of them per batch is what a schedule is scored against).
PEERS = ("flashinfer", "flashinfer-fa3", "flashmla")


def batches(study: str, run: str):
    """(family, shape, dist, workload, {schedule hash: measured us}, the best peer's us) of every batch of one run of
    the study."""
    import pandas as pd
    from ragged_ab import workloads_for

    from splitlab import catalog

    file, offset, dists = RUNS[run]
    df = pd.read_csv(catalog.bench(study).path / file, dtype={"shape": str})
    df = df[df["status"] == "ok"]
    keys = ["family", "shape", "batch", "longest", "dist"]
    peers = df[df["impl"].isin(PEERS)].groupby(keys)["us"].min().to_dict()
    df = df[df["impl"].str.startswith(("wl-", "cand-"))]
    groups = {k: g.groupby("schedule_hash")["us"].min().to_dict() for k, g in df.groupby(keys)}
    for family in ("gqa", "mla"):
        for shape, dist, w in workloads_for(family, False, offset, dists):
            k = (family, shape, w.batch, w.ctx_len, dist)
            if groups.get(k):
                yield family, shape, dist, w, groups[k], peers.get(k, float("nan"))


def chosen_us(meas: dict, w, c, dev) -> tuple[float, float]:
    """The measured time of the schedule splitlab's scheduler picks under ``c`` (the batch's worst where it was not
    timed) and the batch's best measured schedule."""
    from splitlab.planners import schedulers as S

    return meas.get(S.splitlab(w, dev, c).digest, max(meas.values())), min(meas.values())


def regrets(data, c, dev) -> list[float]:
    out = []
    for _, _, _, w, meas, _ in data:
        us, best = chosen_us(meas, w, c, dev)
        out.append(us / best)
    return out


def peer_speed(data, c, dev) -> list[float]:
    """The best peer's time over the chosen schedule's, per ragged batch (> 1: splitlab faster)."""
    out = []
    for _, _, dist, w, meas, peer in data:
        if dist != "uniform":
            out.append(peer / chosen_us(meas, w, c, dev)[0])
    return out


def gm(xs) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def _pass(runs: dict, shapes: tuple[str, ...], base, field: str, grid: tuple[float, ...], dev, tag: dict,
          rows: list[dict]) -> float:
    """Score ``field`` at each value of ``grid`` (the rest of ``base`` held) on both runs' batches of ``shapes``,
    append a row per value, run and shape, and return the value chosen on the fit run."""
    score = []
    for f in grid:
        c = replace(base, **{field: f})
        for run, data in runs.items():
            every = []
            for shape in shapes:
                r = regrets([d for d in data if d[1] == shape], c, dev)
                every += r
                rows.append(dict(tag, constant=field, value=f, run=run, shape=shape, batches=len(r), geomean=gm(r),
                                 worst=max(r)))
            if run == "fit":
                score.append((f, gm(every), max(every)))
    least = min(g for _, g, _ in score)
    return min((w, f) for f, g, w in score if g <= least * NEAR_TIE)[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", default="h200-schedules", help="the catalog bench entry holding the runs")
    ap.add_argument("--device", default="h200-sxm")
    ap.add_argument("--out", help="write DIR/refit.csv (every value of every pass, both runs)")
    a = ap.parse_args(argv)

    import pandas as pd

    from splitlab import devices
    from splitlab.planners import splitlab as rule

    dev = devices.get(a.device)
    runs = {run: list(batches(a.study, run)) for run in RUNS}
    rows, chosen = [], {}
    present = {d[1] for d in runs["fit"]}  # a study may hold some shapes only (h200-schedules-v7: MLA and MQA-128)
    for kind, every_shape in FAMILIES.items():
        shapes = tuple(sh for sh in every_shape if sh in present)
        if not shapes:
            continue
        zero = replace(rule.constants_for(dev, kind).constants, item_fixed=0.0, persistent=0.0, persistent_wide=0.0)
        fixed = _pass(runs, shapes, zero, "item_fixed", FIXED_GRID, dev, dict(kind=kind, pass_=1), rows)
        chosen[(kind, "item_fixed")] = fixed
        for (k, _), (field, cls) in CLASSES.items():
            if k == kind and any(sh in present for sh in cls):
                chosen[(kind, field)] = _pass(runs, cls, replace(zero, item_fixed=fixed), field, GRID, dev,
                                              dict(kind=kind, pass_=2), rows)
    df = pd.DataFrame(rows).rename(columns={"pass_": "pass"})
    df["chosen"] = [chosen[(k, f)] == v for k, f, v in zip(df["kind"], df["constant"], df["value"], strict=True)]
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        df.round(5).to_csv(Path(a.out) / "refit.csv", index=False)
    for (kind, field), v in chosen.items():
        print(f"{kind}: {field} = {v:g}")
    for kind, shapes in FAMILIES.items():
        shapes = tuple(sh for sh in shapes if sh in present)
        if (kind, "item_fixed") not in chosen:
            continue
        c = replace(rule.constants_for(dev, kind).constants, **{f: v for (k, f), v in chosen.items() if k == kind})
        for shape in shapes:
            sp = peer_speed([d for d in runs["confirm"] if d[1] == shape], c, dev)
            if sp:
                print(f"{shape}: the chosen schedules on the confirm run's ragged batches, best peer's time over "
                      f"theirs: geomean {gm(sp):.3f}, worst {min(sp):.3f} ({len(sp)} batches)")
    final = df[(df["pass"] == 2) & df["chosen"]]
    before = df[(df["pass"] == 1) & (df["value"] == 0)]
    with pd.option_context("display.width", 160):
        for name, t in (("chosen", final), ("before (item_fixed and persistent 0)", before)):
            print(f"\n{name}: geomean / worst regret")
            print(t.pivot_table(index="shape", columns="run", values=["geomean", "worst"]).round(3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
