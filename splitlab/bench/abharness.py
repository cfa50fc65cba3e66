"""The harness a kernel A/B script shares (``experiments/mla_ws/ab.py``, ``experiments/mqa_ws/ab.py``): comma lists
on its command line, the checks run in child processes at once with a time limit, the budget a timed run stops at,
one timed row (checked against the fp64 reference, then timed by CUDA-graph replay), the CSV fields of a check's
verdict and of a schedule, and the pieces of the summary it prints (geomean ratios, the checks' verdicts, the rows
that are not ``ok``).

Only the standard library at module level: a script imports this beside its argument parsing, on machines without a
GPU; torch and the kernels are imported where a GPU part runs. The CSV itself is ``bench.csvrows``; a check's
verdict ``kernels.accuracy.verdict``.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from splitlab.bench.csvrows import CsvRows, read_rows

#: How much of an exception's message a CSV row keeps.
ERROR_CHARS = 160


def split_list(text: str) -> list[str]:
    """A comma-separated command-line list (empty items dropped)."""
    return [t for t in text.split(",") if t]


def int_list(text: str) -> list[int]:
    """A comma-separated command-line list of integers."""
    return [int(x) for x in split_list(text)]


def parse_ab_args(argv: Sequence[str] | None, description: str, own: Callable[[argparse.ArgumentParser, str], None],
                  check_timeout_s: float, allowed: Mapping[str, Sequence]) -> argparse.Namespace:
    """An A/B's command line: ``all``, ``check`` and ``run``, each with ``--out`` (the CSV's folder) and then the
    script's own arguments (``own(parser, command)``), ``all`` and ``run`` with ``--replays`` (20), ``all`` with
    ``--check-timeout-s``; ``summary CSV``. A list argument's item outside its choices is refused
    (``refuse_unknown``)."""
    ap = argparse.ArgumentParser(description=description)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("all", "check", "run"):
        p = sub.add_parser(name)
        p.add_argument("--out", required=True, help="folder of the CSV")
        own(p, name)
        if name != "check":
            p.add_argument("--replays", type=int, default=20)
        if name == "all":
            p.add_argument("--check-timeout-s", type=float, default=check_timeout_s)
    s = sub.add_parser("summary")
    s.add_argument("csv")
    a = ap.parse_args(argv)
    refuse_unknown(ap, a, allowed)
    return a


def add_lists(p: argparse.ArgumentParser, **defaults: Sequence) -> None:
    """A comma-list argument ``--<name>`` a default, in their order: of integers (``int_list``) where the default's
    items are, else of words (``split_list``); the default a list."""
    for name, default in defaults.items():
        ints = bool(default) and all(isinstance(x, int) for x in default)
        p.add_argument(f"--{name}", type=int_list if ints else split_list, default=list(default))


def run_command(args: argparse.Namespace, summary_lines: Callable[[list[dict]], list[str]], check: Callable,
                run: Callable, run_all: Callable) -> int:
    """Do what an A/B's command line asks: print the summary of a CSV, or ``check``, ``run`` or ``all``."""
    if args.cmd == "summary":
        print("\n".join(summary_lines(read_rows(Path(args.csv)))))
    elif args.cmd == "check":
        check(args)
    elif args.cmd == "run":
        run(args)
    else:
        run_all(args)
    return 0


def refuse_unknown(ap: argparse.ArgumentParser, args: argparse.Namespace, allowed: Mapping[str, Sequence]) -> None:
    """``ap.error`` on an item of a list argument not among its choices (``allowed``: the argument's plural name ->
    its choices; a command without the argument passes)."""
    for name, choices in allowed.items():
        for v in getattr(args, name, []):
            if v not in choices:
                ap.error(f"{name[:-1]} {v!r}: expected one of {', '.join(map(str, choices))}")


def error_text(e: BaseException) -> str:
    """An exception as a row's ``error``: its type and the start of its message."""
    return f"{type(e).__name__}: {str(e)[:ERROR_CHARS]}"


def checks_passed(rows: Iterable[Mapping], field: str, value: str) -> bool:
    """Whether the check rows whose ``field`` is ``value`` exist and are every one ``ok`` (a check child that never
    finished has a ``timeout`` row, one that failed an ``error`` row)."""
    mine = [r for r in rows if r["phase"] == "check" and r[field] == value]
    return bool(mine) and all(r["status"] == "ok" for r in mine)


def check_in_children(script: str, out: Path, csv_path: Path, fields: Sequence[str],
                      jobs: Mapping[str, Sequence[str]], timeout_s: float, t0: float,
                      failure_row: Callable[[str], dict]) -> list[dict]:
    """Run ``script check --out out`` with each job's arguments (``jobs``: name -> arguments), all at once, each in
    a child process of its own, until ``timeout_s`` from ``t0`` (a kernel that never finishes, a barrier waited on
    for ever, costs that child only: it is killed). A child that exits non-zero or is killed is a check row
    (``failure_row(name)``: its impl fields) with status ``error`` or ``timeout``; the children append their own rows
    to ``csv_path``. Returns every row of ``csv_path`` after."""
    CsvRows(csv_path, fields).close()  # the header, before the children append to the file at once
    cmd = [sys.executable, os.path.abspath(script), "check", "--out", str(out)]
    procs = {name: subprocess.Popen(cmd + list(args)) for name, args in jobs.items()}
    for name, p in procs.items():
        why = ""
        try:
            if p.wait(timeout=max(1.0, timeout_s - (time.time() - t0))):
                why, status = f"the check process exited with code {p.returncode}", "error"
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            why, status = f"the check did not finish in {timeout_s:.0f} s", "timeout"
        if why:
            rows = CsvRows(csv_path, fields)
            rows.write(phase="check", **failure_row(name), status=status, error=why)
            rows.close()
    return read_rows(csv_path)


def verdict_fields(err: float, lse_err: float, status: str, why: str) -> dict:
    """The CSV fields of a check's verdict (``kernels.accuracy.verdict``'s tuple)."""
    return dict(rel_err=f"{err:.2e}", lse_err=f"{lse_err:.2e}", status=status, error=why)


def write_check(rows: CsvRows, row: dict, t0: float) -> None:
    """Write a check row (``impl``, ``case``, its verdict), with the seconds since ``t0``, and print its line."""
    rows.write(**row, elapsed_s=round(time.time() - t0, 2))
    print(f"check {row['impl']} {row['case']}: {row['status']} {row.get('rel_err', '')} {row.get('error', '')}",
          flush=True)


def budget_spent(rows: CsvRows, t0: float, budget_s: float, n_todo: int, n_done: int) -> bool:
    """Whether ``budget_s`` from ``t0`` is spent; if so, say so and write the ``budget`` row (how many of the
    ``n_todo`` batches were not run)."""
    if time.time() - t0 <= budget_s:
        return False
    print(f"budget spent: {n_todo - n_done} of {n_todo} batches not run", flush=True)
    rows.write(phase="time", impl="-", status="budget", error=f"{n_todo - n_done} batches not run")
    return True


def schedule_fields(s) -> dict:
    """The CSV fields of a ``planners.schedule.Schedule``: its largest split count, its CTAs and its items."""
    return dict(splits=max(s.partials), ctas=s.ctas, items=len(s.items))


def device_setup() -> tuple:
    """What a timed run reads once: the device (``devices.detect``), its L2 bytes (the input sets rotate past it)
    and the bf16 tolerance a timed output is checked to."""
    import torch

    from splitlab.devices import detect
    from splitlab.kernels.accuracy import TOLERANCE

    return detect(), torch.cuda.get_device_properties(0).L2_cache_size, TOLERANCE[torch.bfloat16]


def ab_workload(kind: str, batch: int, heads: int, head_dim: int, head_dim_v: int, longest: int, page: int,
                dist: str):
    """A timed batch: one kv head; ``uniform`` lengths at seed 0, any other distribution at ``batch + longest``
    (each batch draws its own lengths, the same on every run)."""
    from splitlab.workloads import DecodeWorkload

    return DecodeWorkload(kind, batch, heads, 1, head_dim, head_dim_v, longest, page_size=page, length_dist=dist,
                          length_seed=0 if dist == "uniform" else batch + longest)


def time_row(row: dict, make: Callable, sets: Sequence, ref, floor_us: float, tol: float, replays: int) -> None:
    """Check ``make``'s output on the first input set against the fp64 reference ``ref`` (every buffer the launchers
    allocate NaN first: ``kernels.inputs.poisoned_allocs``); past ``tol`` the row is ``wrong`` and not timed, else
    ``bench.timing.time_graph`` over every set (p50, p20, p80) and ``roofline`` = ``floor_us`` / p50. ``make``: an
    input set -> a callable that launches once."""
    from splitlab.bench.timing import time_graph
    from splitlab.kernels.accuracy import rel_err
    from splitlab.kernels.inputs import poisoned_allocs

    with poisoned_allocs():
        err = rel_err(make(sets[0])(), ref)
    row["rel_err"] = f"{err:.2e}"
    if not err <= tol:
        row["status"] = "wrong"
        return
    t = time_graph([make(x) for x in sets], replays=replays)
    row.update(us=round(t.p50_us, 2), p20_us=round(t.p20_us, 2), p80_us=round(t.p80_us, 2),
               roofline=round(floor_us / t.p50_us, 3), status="ok")


def write_timed(rows: CsvRows, row: dict, t0: float, line: list[str]) -> None:
    """Write a timed row, with the seconds since ``t0``, and add ``impl`` and its time (or status) to ``line``."""
    rows.write(**row, elapsed_s=round(time.time() - t0, 2))
    line.append(f"{row['impl']} {row.get('us', row['status'])}")


# --- the summary -----------------------------------------------------------------------------------------------


def geomean(xs: Iterable[float]) -> float:
    """The geometric mean of the positive finite ``xs`` (NaN if none)."""
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def ratio_text(label: str, xs: Sequence[float]) -> str:
    """``vs <label> <geomean> (worst <min>)`` of the time ratios ``xs`` (> 1: faster)."""
    return f"vs {label} {geomean(xs):.3f} (worst {min(xs):.3f})"


def ratio_texts(*labelled: tuple[str, Sequence[float]]) -> list[str]:
    """``ratio_text`` of each (label, ratios) that has ratios."""
    return [ratio_text(label, xs) for label, xs in labelled if xs]


def timed_groups(rows: Iterable[Mapping], field: str,
                 order: Callable | None = None) -> list[tuple[tuple, dict[tuple, dict[str, Mapping]], list[str]]]:
    """The ``ok`` timed rows by (``field``, dist) in ``order`` (a sort key; None: ascending): for each, the key, its
    batches ((``field``, dist, batch, longest) -> impl -> row) and its implementations, sorted."""
    by_batch: dict[tuple, dict[str, Mapping]] = {}
    for r in rows:
        if r["phase"] == "time" and r["status"] == "ok":
            key = (int(r[field]), r["dist"], int(r["batch"]), int(r["longest"]))
            by_batch.setdefault(key, {})[r["impl"]] = r
    out = []
    for g in sorted({k[:2] for k in by_batch}, key=order):
        group = {k: v for k, v in by_batch.items() if k[:2] == g}
        out.append((g, group, sorted({i for v in group.values() for i in v})))
    return out


def check_lines(rows: Iterable[Mapping]) -> list[str]:
    """A line an implementation checked: how many check rows ``ok``, the largest relative error, each failure."""
    checks = [r for r in rows if r["phase"] == "check"]
    lines = []
    for impl in sorted({r["impl"] for r in checks}):
        mine = [r for r in checks if r["impl"] == impl]
        bad = [f"{r['case']}: {r['status']} {r['error']}".strip() for r in mine if r["status"] != "ok"]
        errs = [float(r["rel_err"]) for r in mine if r["rel_err"] not in ("", None)]
        worst = f", largest rel_err {max(errs):.2e}" if errs else ""
        lines.append(f"check {impl}: {len(mine) - len(bad)}/{len(mine)} ok{worst}" + ("; " + "; ".join(bad)
                                                                                     if bad else ""))
    return lines


def not_ok_lines(rows: Iterable[Mapping], where: Callable[[Mapping], str]) -> list[str]:
    """A line a timed row that is not ``ok``: its impl, ``where(row)`` (its batch), status and error."""
    return [f"time {r['impl']} {where(r)}: {r['status']} {r['error']}".strip()
            for r in rows if r["phase"] == "time" and r["status"] != "ok"]


def summary_lines(rows: Sequence[Mapping], field: str, title: Callable[[tuple, int], str],
                  impl_line: Callable[[str, list[dict[str, Mapping]]], str], where: Callable[[Mapping], str],
                  order: Callable | None = None) -> list[str]:
    """An A/B's summary: per (``field``, dist) group (``timed_groups``, in ``order``) its title (``title(key, number
    of batches)``) and a line an implementation (``impl_line(impl, its batches: impl -> row)``); then the checks'
    verdicts (``check_lines``) and every timed row that is not ``ok`` (``not_ok_lines``)."""
    lines = []
    for key, group, impls in timed_groups(rows, field, order):
        lines.append(title(key, len(group)))
        lines += [impl_line(impl, [v for v in group.values() if impl in v]) for impl in impls]
    return lines + check_lines(rows) + not_ok_lines(rows, where)
