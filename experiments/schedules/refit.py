"""Fitting the persistent kernel's cost that prices stream-K in splitlab's scheduler, on measured schedule runs (CPU).

The schedule runs (``ragged_ab.py``, catalog ``h200-schedules``) timed every candidate of splitlab's scheduler on each
ragged batch, stream-K included, so the regret of any choice among them is a measured figure: the measured time of the
schedule chosen (matched by its hash) over the best measured schedule of the batch. This script re-runs splitlab's
scheduler (``planners.schedulers.splitlab``, the code that ships) on those batches with the constants
``persistent`` / ``persistent_wide`` (``planners.fitted.CostConstants``: a persistent slot's key tile in the one-item
kernel's; 0 never weighs stream-K) set to each value of ``GRID``, one tile class at a time, and picks per class the
value of least geomean regret on the *fit* run (``ragged_ab.csv``; near-ties of 0.2% to the lower worst, then to 0),
then scores it on the *confirm* run (``confirm_ab.csv``: fresh lengths, and the bimodal distribution), which the
choice never reads.

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

#: The values weighed for each class's constant (0: stream-K never weighed).
GRID = (0.0, 0.95, 1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.15, 1.2, 1.3)
#: Tile classes: (family kind, wide tile) -> the constant that prices it, and the shapes of the runs in it.
CLASSES = {("gqa", False): ("persistent", ("32/8", "64/8")), ("gqa", True): ("persistent_wide", ("128/1",)),
           ("mla", False): ("persistent", ("mla16",)), ("mla", True): ("persistent_wide", ("mla128",))}
#: The two runs: (file in the study, --seed-offset, distributions) as ragged_ab.py made them (its README).
RUNS = {"fit": ("ragged_ab.csv", 0, ("spread16", "longtail", "uniform")),
        "confirm": ("confirm_ab.csv", 1000, ("spread16", "longtail", "bimodal", "uniform"))}
NEAR_TIE = 1.002


def batches(study: str, run: str):
    """(family, shape, dist, workload, {schedule hash: measured us}) of every batch of one run of the study."""
    import pandas as pd
    from ragged_ab import workloads_for

    from splitlab import catalog

    file, offset, dists = RUNS[run]
    df = pd.read_csv(catalog.bench(study).path / file, dtype={"shape": str})
    df = df[(df["status"] == "ok") & df["impl"].str.startswith(("wl-", "cand-"))]
    groups = {k: g.groupby("schedule_hash")["us"].min().to_dict()
              for k, g in df.groupby(["family", "shape", "batch", "longest", "dist"])}
    for family in ("gqa", "mla"):
        for shape, dist, w in workloads_for(family, False, offset, dists):
            meas = groups.get((family, shape, w.batch, w.ctx_len, dist))
            if meas:
                yield family, shape, dist, w, meas


def regrets(data, c, dev) -> list[float]:
    from splitlab.planners import schedulers as S

    out = []
    for _, _, _, w, meas in data:
        s = S.splitlab(w, dev, c)
        out.append(meas.get(s.digest, max(meas.values())) / min(meas.values()))
    return out


def gm(xs) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", default="h200-schedules", help="the catalog bench entry holding the runs")
    ap.add_argument("--device", default="h200-sxm")
    ap.add_argument("--out", help="write DIR/refit.csv (every value of every class, both runs)")
    a = ap.parse_args(argv)

    import pandas as pd

    from splitlab import devices
    from splitlab.planners import splitlab as rule

    dev = devices.get(a.device)
    runs = {run: list(batches(a.study, run)) for run in RUNS}
    rows, chosen = [], {}
    for (kind, wide), (field, shapes) in CLASSES.items():
        shipped = rule.constants_for(dev, kind).constants
        for f in GRID:
            c = replace(shipped, **{field: f})
            for run, data in runs.items():
                for shape in shapes:
                    r = regrets([d for d in data if d[1] == shape], c, dev)
                    rows.append(dict(kind=kind, wide=wide, constant=field, value=f, run=run, shape=shape,
                                     batches=len(r), geomean=gm(r), worst=max(r), shipped=getattr(shipped, field)))
        t = pd.DataFrame([r for r in rows if (r["kind"], r["wide"]) == (kind, wide) and r["run"] == "fit"])
        score = t.groupby("value").apply(lambda g: pd.Series(dict(
            geomean=gm([x for x, n in zip(g["geomean"], g["batches"], strict=True) for _ in range(n)]),
            worst=g["worst"].max())), include_groups=False).reset_index()
        band = score[score["geomean"] <= score["geomean"].min() * NEAR_TIE]
        chosen[(kind, wide)] = float(band.sort_values(["worst", "value"]).iloc[0]["value"])
    df = pd.DataFrame(rows)
    df["chosen"] = [chosen[(k, w)] == v for k, w, v in zip(df["kind"], df["wide"], df["value"], strict=True)]
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        df.round(5).to_csv(Path(a.out) / "refit.csv", index=False)
    for (kind, wide), f in chosen.items():
        field = CLASSES[(kind, wide)][0]
        print(f"{kind} {'wide' if wide else 'narrow/mid'}: {field} = {f:g}")
    view = df[df["chosen"] | (df["value"] == df["shipped"])]
    with pd.option_context("display.width", 160):
        print(view.pivot_table(index=["shape", "value"], columns="run", values=["geomean", "worst"]).round(3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
