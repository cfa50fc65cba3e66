"""``splitlab regress``: a pass/fail answer for CI. Does a candidate's split choice run slower than a baseline's?

    splitlab regress --baseline splitlab --candidate my-gpu.toml --data runs/       # new constants vs the shipped
    splitlab regress --baseline runs/old:splitlab --candidate runs/new:splitlab      # two sweeps' own choices
    splitlab regress --baseline splitlab --candidate my_rule --max-regression 0.03 --out reports/regress

Each side is one of (``parse_side``):

- a **planner** name (registered; a plugin's too, ``--plugin``): its choice for every shape of ``--data`` (default:
  the catalog's current set): the point the sweep measured for it, and where the sweep did not plan with it, its plan
  replayed on the measured points (``analysis.replay``: the point with exactly those knobs). ``splitlab`` is always
  replayed (today's rule and constants: the shipped sweeps tagged several versions of it), as the
  ``split_regressions`` page does, except on kernels replay cannot resolve (an external card's: the sweep's tags);
- a **constants file** (``splitlab fit --out``, ``.toml``): the ``splitlab`` rule with those constants, replayed the
  same way;
- a **result set** (a catalog name or a sweep folder): its best measured point per shape; ``SET:PLANNER``: the
  choices the sweep measured for that planner.

Per shape present on both sides: ``ratio = candidate / baseline`` p50. The exit code is 1 when any shape's ratio
exceeds ``1 + --max-regression``, the geomean exceeds ``1 + --max-geomean-regression``, or the candidate's choice
was measured wrong or failed where the baseline's was correct; 0 otherwise; 2 on bad input (a side that is none of
the above, data that do not exist, modelled rows without ``--allow-fake``, no shape both sides can be scored on).
Shapes a side cannot be scored on (its choice was never measured, or the planner refused) are counted, not gated.
``--out DIR`` also writes the ``split_regressions`` page (``splitlab.report``) for the two sides.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from splitlab import catalog, families
from splitlab.errors import SplitlabError

if TYPE_CHECKING:
    import pandas as pd

    from splitlab.planners.fitted import FittedConstants

#: Defaults of the two bounds: a shape may be 5% slower (run-to-run spread of one point on the H200 is about 2%),
#: the geomean 1%.
MAX_REGRESSION = 0.05
MAX_GEOMEAN_REGRESSION = 0.01
#: How many of the slowest shapes are printed.
TOP = 10
#: Statuses of a measured choice that fail the gate when the baseline's was correct.
BROKEN = ("wrong", "error")
EXIT_PASS, EXIT_FAIL = 0, 1


@dataclass(frozen=True)
class Side:
    """One side of the comparison: ``what`` is ``planner``, ``constants``, ``best`` (a set's best point) or
    ``tagged`` (a set's choices of ``planner``)."""

    arg: str
    text: str
    what: str
    planner: str = ""
    data: str = ""  # the set of a best / tagged side
    constants: FittedConstants | None = None

    @property
    def scored_on_data(self) -> bool:
        return self.what in ("planner", "constants")

    @property
    def label(self) -> str:
        if self.what == "planner":
            return f"planner {self.planner}"
        if self.what == "constants":
            return f"splitlab with {self.text}"
        return f"best of {self.data}" if self.what == "best" else f"{self.planner}'s choices in {self.data}"


def _is_set(text: str) -> bool:
    if catalog.is_name(text):
        return True
    try:
        return Path(text).expanduser().exists()
    except (OSError, ValueError):
        return False


def parse_side(arg: str, text: str) -> Side:
    """What ``text`` (the value of ``arg``) names (see the module docstring); one ``SplitlabError`` otherwise."""
    from splitlab import planners
    from splitlab.args import path_text, shown

    what = ("a planner name (" + ", ".join(planners.names()) + "), a constants file (.toml, splitlab fit --out), a "
            "result set (a catalog name or a sweep folder) or SET:PLANNER")
    path_text(arg, text, what)
    if text in planners.names():
        return Side(arg, text, "planner", planner=text)
    if text.endswith(".toml"):
        from splitlab.planners import fitted

        return Side(arg, text, "constants", planner="splitlab", constants=fitted.load(text, arg))
    if ":" in text:
        data, planner = text.rsplit(":", 1)
        if data and planner and "/" not in planner and _is_set(data):
            if planner in ("best", "oracle"):
                return Side(arg, text, "best", data=data)
            return Side(arg, text, "tagged", planner=planner, data=data)
    if _is_set(text):
        return Side(arg, text, "best", data=text)
    raise SplitlabError(f"{arg}={shown(text)} is not allowed; expected {what}")


def _load(arg: str, data: list[str], allow_fake: bool) -> pd.DataFrame:
    from splitlab import results
    from splitlab.args import existing_path

    for d in data:
        if not catalog.is_name(d):
            existing_path(arg, d)
    try:
        df = results.load_points(*data)
    except SplitlabError as e:
        raise SplitlabError(f"{arg}={' '.join(data)!r}: {e}") from None
    if not allow_fake and "timing" in df.columns and (df["timing"] == "fake").any():
        raise SplitlabError(f"{arg}={' '.join(data)!r} holds modelled rows (timing='fake'), not measurements; pass "
                            "--allow-fake to gate on them anyway (CI without a GPU)")
    if df.empty or not (df["status"] == "ok").any():
        raise SplitlabError(f"{arg}={' '.join(data)!r} holds no correct measurement (status 'ok'); expected sweeps "
                            "made by `splitlab sweep`")
    return df


def times(side: Side, df: pd.DataFrame, *, allow_fake: bool) -> pd.DataFrame:
    """Per shape of ``df``: the time of ``side``'s choice (``p50_us``, its ``num_splits``) and its ``status``: ``ok``,
    ``wrong`` / ``error`` (measured, not correct), ``not measured`` or ``refused`` (the planner raised)."""
    import pandas as pd

    from splitlab import analysis

    keys = analysis.shape_cols(df)
    cols = [*keys, "p50_us", "num_splits", "knobs", "status"]
    if side.what == "best":
        best = analysis.oracle(df, allow_fake=allow_fake)
        return _with_knobs(best).assign(status="ok")[cols]
    if side.what == "tagged":
        picks = analysis.planner_choices(df)
        picks = picks[picks["planner"] == side.planner]
        if picks.empty:
            have = sorted(set(analysis.planner_choices(df)["planner"]))
            raise SplitlabError(f"{side.arg}={side.text!r}: {side.data} holds no choice of planner {side.planner!r}; "
                                f"it holds {', '.join(have) or 'none'}")
        return _with_knobs(picks)[cols].reset_index(drop=True)
    replayable = df["kernel"].isin(families.names())
    parts = []
    if side.what == "planner" and side.planner != "splitlab":  # what the sweep measured for it, where it did
        picks = analysis.planner_choices(df)
        parts.append(_with_knobs(picks[picks["planner"] == side.planner])[cols])
        tagged = parts[0][keys].drop_duplicates()
        left = df.merge(tagged.assign(_tagged=True), on=keys, how="left")["_tagged"].isna().to_numpy()
        replayable &= left
        df_rest = None
    else:
        df_rest = df[~replayable]
    if replayable.any():
        rule = side.planner
        if side.what == "constants":
            from splitlab.planners.splitlab import fitted_plan

            fams = side.constants.families

            def rule(w, dev):
                if w.kind not in fams:
                    raise SplitlabError(f"{side.text} holds no {w.kind} constants")
                return fitted_plan(w, dev, fams[w.kind], name="splitlab")

        rep = analysis.replay(df[replayable], rule, allow_fake=allow_fake, name=side.text)
        status = ["ok" if not reason else "not measured" if reason.startswith("not measured") else "refused"
                  for reason in rep["reason"]]
        parts.append(_with_knobs(rep).assign(status=status)[cols])
    if df_rest is not None and len(df_rest) and side.what == "planner":  # an external kernel: the sweep's tags
        picks = analysis.planner_choices(df_rest)
        parts.append(_with_knobs(picks[picks["planner"] == side.planner])[cols])
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


#: The knobs ``report_text`` shows beside the split count, where a row has them (short names).
SHOWN_KNOBS = {"block_n": "BLOCK_N", "block_k": "BLOCK_K", "block_h": "BLOCK_H"}


def _with_knobs(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``knobs``: its split count and tiles, as text (``8 splits, BLOCK_H 16``)."""
    import pandas as pd

    def text(r: dict) -> str:
        s = [f"{int(r['num_splits'])} splits" if pd.notna(r.get("num_splits")) else "splits ?"]
        return ", ".join(s + [f"{k} {int(r[c])}" for c, k in SHOWN_KNOBS.items() if pd.notna(r.get(c))])

    return df.assign(knobs=[text(r) for r in df.to_dict("records")] if len(df) else [])


@dataclass
class Verdict:
    """The comparison and the gate's answer."""

    table: pd.DataFrame  # per shape on both sides: both times, statuses, ratio (NaN where not both ok)
    geomean: float
    slower: pd.DataFrame  # ratio above the bound
    broken: pd.DataFrame  # the candidate's choice wrong / error where the baseline's was ok
    unscored: dict[str, int]
    max_regression: float
    max_geomean_regression: float

    @property
    def passed(self) -> bool:
        return self.slower.empty and self.broken.empty and not self.geomean > 1 + self.max_geomean_regression


def compare(base: pd.DataFrame, cand: pd.DataFrame, *, max_regression: float = MAX_REGRESSION,
            max_geomean_regression: float = MAX_GEOMEAN_REGRESSION) -> Verdict:
    """Match the two sides' ``times`` by shape and judge the candidate (see the module docstring)."""
    import numpy as np

    from splitlab import analysis

    keys = [c for c in analysis.shape_cols(base) if c in cand.columns]
    m = base.merge(cand, on=keys, how="inner", suffixes=("_base", "_cand"))
    both = (m["status_base"] == "ok") & (m["status_cand"] == "ok")
    m["ratio"] = np.where(both, m["p50_us_cand"] / m["p50_us_base"], np.nan)
    m = m.sort_values("ratio", ascending=False, na_position="last").reset_index(drop=True)
    broken = m[(m["status_base"] == "ok") & m["status_cand"].isin(BROKEN)]
    unscored = {}
    for who in ("base", "cand"):
        for status, n in m.loc[~m[f"status_{who}"].isin(["ok", *BROKEN]), f"status_{who}"].value_counts().items():
            unscored[f"{'baseline' if who == 'base' else 'candidate'} {status}"] = int(n)
    if not both.any() and broken.empty:
        raise SplitlabError(f"no shape has a correct measurement of both sides' choices ({len(base)} baseline and "
                            f"{len(cand)} candidate shapes, {len(m)} in common"
                            + (f"; {', '.join(f'{k}: {v}' for k, v in unscored.items())}" if unscored else "")
                            + "); expected data that measured both (sweep with both planners registered)")
    ratios = m["ratio"].dropna()
    return Verdict(m, analysis.geomean(ratios) if len(ratios) else math.nan,
                   m[m["ratio"] > 1 + max_regression], broken, unscored, max_regression, max_geomean_regression)


def _shape(r: dict) -> str:
    s = f"{r['kernel']} B={r['batch']} H={r['num_q_heads']}/{r['num_kv_heads']} N={r['ctx_len']}"
    return s + (f" topk={r['topk']}" if r.get("topk") else "") + (f" on {r['device']}" if r.get("device") else "")


def report_text(v: Verdict, base: Side, cand: Side, *, top: int = TOP, modelled: bool = False) -> str:
    """What ``splitlab regress`` prints: the sides, the geomean, the slowest shapes, what was not scored, and the
    verdict."""
    scored = int(v.table["ratio"].notna().sum())
    lines = [f"candidate: {cand.label}", f"baseline:  {base.label}",
             f"{scored} shapes compared" + (f" of {len(v.table)} in common" if scored != len(v.table) else "")
             + (" (MODELLED: the fake timer's figures, not measurements)" if modelled else ""),
             f"geomean candidate / baseline: {v.geomean:.4f} (bound {1 + v.max_geomean_regression:.4f})"]
    worst = v.table[v.table["ratio"].notna()].head(top)
    if len(worst):
        lines.append(f"slowest {len(worst)} (ratio, shape: baseline -> candidate, p50 us):")
        for r in worst.to_dict("records"):
            lines.append(f"  {r['ratio']:.3f}  {_shape(r)}: {r['knobs_base']} -> {r['knobs_cand']}, "
                         f"{r['p50_us_base']:.2f} -> {r['p50_us_cand']:.2f}")
    for r in v.broken.to_dict("records"):
        lines.append(f"  {r['status_cand']}: {_shape(r)} (the candidate's choice: {r['knobs_cand']})")
    if v.unscored:
        lines.append("not scored: " + ", ".join(f"{k} {n}" for k, n in v.unscored.items()))
    why = []
    if len(v.slower):
        why.append(f"{len(v.slower)} shape(s) slower by more than {v.max_regression:.1%} (worst "
                   f"{v.slower['ratio'].max():.3f}x)")
    if v.geomean > 1 + v.max_geomean_regression:
        why.append(f"geomean {v.geomean:.4f} > {1 + v.max_geomean_regression:.4f}")
    if len(v.broken):
        why.append(f"{len(v.broken)} choice(s) of the candidate measured wrong or failed")
    lines.append("FAIL: " + "; ".join(why) if why else
                 f"PASS: no shape slower by more than {v.max_regression:.1%}, geomean within "
                 f"{v.max_geomean_regression:.1%}")
    return "\n".join(lines)


def _fraction(text: str) -> float:
    """An ``argparse`` type: a share >= 0, as ``0.05`` or ``5%``."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share; expected a number >= 0 (0.05 or 5%)") from None
    if not (math.isfinite(v) and 0 <= v <= 100):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected a number in [0, 100] (0.05 or 5%)")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``splitlab regress``."""
    from splitlab.args import int_type

    sides = "a planner name, a constants file (.toml), a result set (catalog name or sweep folder), or SET:PLANNER"
    p.add_argument("--baseline", required=True, metavar="X", help=sides)
    p.add_argument("--candidate", required=True, metavar="Y", help=sides)
    p.add_argument("--data", nargs="+", metavar="DIR", help="the result set(s) planner and constants sides are "
                   "scored on, read together (default: the catalog's current set)")
    p.add_argument("--max-regression", type=_fraction, default=MAX_REGRESSION, metavar="R",
                   help=f"fail when a shape is slower by more than this share (default {MAX_REGRESSION}; 5%% works)")
    p.add_argument("--max-geomean-regression", type=_fraction, default=MAX_GEOMEAN_REGRESSION, metavar="G",
                   help=f"fail when the geomean is slower by more than this share (default {MAX_GEOMEAN_REGRESSION})")
    p.add_argument("--out", metavar="DIR", help="also write the split_regressions page (HTML) into this folder")
    p.add_argument("--top", type=int_type(0), default=TOP,
                   help=f"how many of the slowest shapes to print (default {TOP})")
    p.add_argument("--allow-fake", action="store_true", help="accept modelled rows (the fake timer): CI without a GPU")


def _page(args: argparse.Namespace, base: Side, cand: Side, data: list[str] | None) -> None:
    from splitlab.report import build_report

    def params(side: Side) -> tuple[str, str]:
        if side.what == "planner":
            return side.planner, ""
        return ("oracle" if side.what == "best" else side.planner), side.data

    (b, bd), (c, cd) = params(base), params(cand)
    replay = any(s.what == "planner" and s.planner == "splitlab" for s in (base, cand)) or not any(
        s.what == "tagged" and s.planner == "splitlab" for s in (base, cand))
    parameters = dict(baseline=b, baseline_data=bd, candidate=c, candidate_data=cd, tol=args.max_regression,
                      replay_splitlab=replay)
    build_report(data[0] if data else (cd or bd), Path(args.out), only=["split_regressions"], progress=False,
                 allow_fake=args.allow_fake, parameters={"split_regressions": parameters})


def run(args: argparse.Namespace) -> int:
    """``splitlab regress`` from parsed arguments (``add_arguments``): prints ``report_text``; returns the exit
    code (0 pass, 1 fail; bad input raises ``SplitlabError``, 2)."""
    from splitlab.args import out_dir

    base, cand = parse_side("--baseline", args.baseline), parse_side("--candidate", args.candidate)
    on_data = [s for s in (base, cand) if s.scored_on_data]
    if args.data and not on_data:
        raise SplitlabError("--data is not allowed here: both sides are result sets (it is what planner and constants "
                            "sides are scored on)")
    if args.out is not None:
        out_dir("--out", args.out, create=False)
        consts = [s.text for s in (base, cand) if s.what == "constants"]
        if consts:
            raise SplitlabError(f"--out is not allowed with a constants file ({consts[0]}): the split_regressions page "
                                "compares planners and result sets; leave --out out, or compare sweeps' choices")
        if args.data and len(args.data) > 1:
            raise SplitlabError("--out is not allowed with several --data sets: the page reads one result set")
    data = args.data
    if on_data and not data:
        if not catalog.entries("current"):
            raise SplitlabError(f"--data is missing and there is no current set in a catalog here "
                                f"({catalog.why_none('current')}); expected --data DIR, a folder "
                                "of splitlab sweeps")
        data = [catalog.current().name]

    def sets(side: Side) -> tuple[str, ...]:  # what a side is scored on: --data, or its own result set
        return tuple(data) if side.scored_on_data else (side.data,)

    frames = {}
    for side in (base, cand):
        if sets(side) not in frames:
            frames[sets(side)] = _load("--data" if side.scored_on_data else side.arg, list(sets(side)),
                                       args.allow_fake)
    t_base = times(base, frames[sets(base)], allow_fake=args.allow_fake)
    t_cand = times(cand, frames[sets(cand)], allow_fake=args.allow_fake)
    v = compare(t_base, t_cand, max_regression=args.max_regression,
                max_geomean_regression=args.max_geomean_regression)
    modelled = any("timing" in f.columns and (f["timing"] == "fake").any() for f in frames.values())
    print(report_text(v, base, cand, top=args.top, modelled=modelled))
    if args.out is not None:
        _page(args, base, cand, data)
        print(f"page: {Path(args.out) / 'split_regressions.html'}")
    return EXIT_PASS if v.passed else EXIT_FAIL
