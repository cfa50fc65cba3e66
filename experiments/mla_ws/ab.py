"""The warp-specialized MLA work-list kernel (``splitlab.kernels.mla_sm90_ws``, each variant) against the shipped
Gluon tile at its planner's split count and against FlashMLA, on the same inputs, on one H200: every implementation
checked against the fp64 reference first, then timed by CUDA-graph replay; one CSV.

    python experiments/mla_ws/ab.py all --out DIR [--fmla KIT] [--budget-s 270]   # check, then time
    python experiments/mla_ws/ab.py check --out DIR --variants seesaw            # one check (what `all` runs)
    python experiments/mla_ws/ab.py run --out DIR --variants seesaw,recompute    # time only
    python experiments/mla_ws/ab.py summary DIR/mla_ws_ab.csv                    # the README's tables, any machine

``all`` first runs ``check`` for every variant and the shipped tile at once, each in a child process of its own with
a time limit (``--check-timeout-s``: a kernel that never finishes, a barrier waited on for ever, costs that child
only), then ``run`` on the variants that passed every check. Rows (``FIELDS``) go to ``DIR/mla_ws_ab.csv`` as they
are made: ``phase`` is ``check`` or ``time``.

- ``check``: small batches that reach every path: an empty request, odd lengths (a last block part empty), one and
  two blocks, items written directly and as partial rows, 64 / 96 / 128 / 16 heads, page 128, fp16, a NaN in an
  attended key (its request NaN), a block-table entry outside the cache (its request NaN); unread cache rows NaN,
  every output buffer NaN before the launch (``_launch.alloc`` poisoned). Against the fp64 reference
  (``accuracy.assert_matches_reference`` on the rows that must be finite; the rows that must be NaN all NaN).
- ``run``: MLA-128 and MLA-64 (576/512, page 64, bf16) at batch 1, 16, 64, 132 and 8K, 32K, 64K keys, same-length
  (``uniform``) and ``longtail`` lengths (batch 1 long-tail is the same-length batch: skipped), most telling first
  (``shapes``). Per batch: the fp64 reference once; each implementation's output against it (bf16 tolerance; a
  wrong one is a row ``wrong``, not timed); then ``bench.timing.time_graph`` (20 replays, p50; input sets rotated
  past the L2). Implementations: ``gluon-v6`` (``mla.mla_decode`` at ``bench.decode.default_knobs``: the Gluon
  64-row tile at the planner's split count), ``ws-<variant>@uniform`` (the same split count as a work list) and
  ``ws-<variant>@splitlab`` (splitlab's scheduler, one item a slot: ``persistent=False``), ``flashmla``
  (``bench.peers_flashmla``, its own scheduler). ``roofline`` = ``workloads.floor_time_us`` / time.

Budget: ``--budget-s`` (default 270) counts from the start of ``all``; ``run`` starts no new batch past it and the
README's command stops everything at 295 s. FlashMLA comes from the workplace kit (``--fmla``: its prebuilt objects
build in about 31 s, counted in the budget).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from splitlab.bench.csvrows import CsvRows, read_rows

FIELDS = ["phase", "impl", "variant", "schedule", "case", "heads", "batch", "longest", "dist", "dtype", "page",
          "splits", "ctas", "items", "us", "p20_us", "p80_us", "roofline", "rel_err", "lse_err", "status", "error",
          "elapsed_s"]
CSV_NAME = "mla_ws_ab.csv"
HEADS = (128, 64)
BATCHES = (64, 132, 16, 1)
KEYS = (32768, 65536, 8192)
DISTS = ("uniform", "longtail")
SCHEDULES = ("uniform", "splitlab")
#: Check batches: (name, heads, lengths, page, dtype, split count, what is done to the inputs).
CHECKS = [
    ("empty-and-odd", 128, [1000, 0, 77], 64, "bf16", 1, None),
    ("empty-and-odd-split3", 128, [1000, 0, 77], 64, "bf16", 3, None),
    ("one-and-two-blocks", 64, [64, 65, 128, 1], 64, "bf16", 2, None),
    ("long-split5", 128, [5000, 4096], 64, "bf16", 5, None),
    ("96-heads", 96, [300, 129, 64, 1], 64, "bf16", 2, None),
    ("16-heads", 16, [700, 33], 64, "bf16", 2, None),
    ("page-128", 128, [1000, 200, 3], 128, "bf16", 2, None),
    ("fp16", 64, [900, 64, 5], 64, "fp16", 3, None),
    ("nan-key", 128, [600, 300], 64, "bf16", 2, "nan-key"),
    ("bad-page", 64, [600, 300], 64, "bf16", 2, "bad-page"),
]


def shapes(heads=HEADS, batches=BATCHES, keys=KEYS, dists=DISTS) -> list[tuple[int, int, int, str]]:
    """(heads, batch, longest, dist) of the timed batches, in the order they run: MLA-128 first, the batches where
    FlashMLA led first (``BATCHES``, ``KEYS``); batch 1 ``longtail`` is the same-length batch, left out."""
    return [(h, b, n, d) for h in heads for b in batches for n in keys for d in dists
            if not (b == 1 and d != "uniform")]


class Rows(CsvRows):
    """This A/B's CSV (``bench.csvrows.CsvRows``: appended row by row, the header once, flushed each row)."""

    def __init__(self, path: Path):
        super().__init__(path, FIELDS)


def passed_checks(rows: list[dict], variants) -> list[str]:
    """The variants of ``variants`` with check rows, every one ``ok`` (a variant whose check child never finished
    has a ``timeout`` row)."""
    out = []
    for v in variants:
        mine = [r for r in rows if r["phase"] == "check" and r["variant"] == v]
        if mine and all(r["status"] == "ok" for r in mine):
            out.append(v)
    return out


def _split(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def parse_args(argv=None) -> argparse.Namespace:
    from splitlab.kernels.mla_sm90_ws import VARIANTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("all", "check", "run"):
        p = sub.add_parser(name)
        p.add_argument("--out", required=True, help="folder of the CSV")
        p.add_argument("--variants", type=_split, default=list(VARIANTS),
                       help=f"comma-separated, of {','.join(VARIANTS)}")
        if name != "check":
            p.add_argument("--fmla", default=os.environ.get("FMLA_DIR", ""), help="FlashMLA kit folder ('': none)")
            p.add_argument("--budget-s", type=float, default=270.0)
            p.add_argument("--heads", type=lambda t: [int(x) for x in _split(t)], default=list(HEADS))
            p.add_argument("--batches", type=lambda t: [int(x) for x in _split(t)], default=list(BATCHES))
            p.add_argument("--keys", type=lambda t: [int(x) for x in _split(t)], default=list(KEYS))
            p.add_argument("--dists", type=_split, default=list(DISTS))
            p.add_argument("--schedules", type=_split, default=list(SCHEDULES))
            p.add_argument("--replays", type=int, default=20)
        if name == "all":
            p.add_argument("--check-timeout-s", type=float, default=150.0)
        if name == "check":
            p.add_argument("--baseline", action="store_true", help="check the shipped Gluon tile (gluon-v6)")
    s = sub.add_parser("summary")
    s.add_argument("csv")
    a = ap.parse_args(argv)
    for v in getattr(a, "variants", []):
        if v not in VARIANTS:
            ap.error(f"variant {v!r}: expected one of {', '.join(VARIANTS)}")
    for sched in getattr(a, "schedules", []):
        if sched not in SCHEDULES:
            ap.error(f"schedule {sched!r}: expected one of {', '.join(SCHEDULES)}")
    return a


# --- on the GPU ------------------------------------------------------------------------------------------------


def poisoned_allocs():
    """``kernels.inputs.poisoned_allocs``: every buffer the launchers allocate starts NaN."""
    from splitlab.kernels.inputs import poisoned_allocs

    return poisoned_allocs()


def check(args) -> None:
    """Each check batch on ``args.variants`` (and the shipped tile with ``--baseline``): one row each."""
    import torch

    from splitlab.kernels import accuracy, mla, reference
    from splitlab.kernels.inputs import mla_inputs, poison_unread_pages_
    from splitlab.kernels.mla_sm90_ws import mla_decode_ws
    from splitlab.kernels.worklist import WorkList
    from splitlab.planners import schedulers

    rows = Rows(Path(args.out) / CSV_NAME)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    impls = [("gluon-v6", None)] if args.baseline else [(f"ws-{v}", v) for v in args.variants]
    for name, heads, lens, page, dt, splits, twist in CHECKS:
        x = mla_inputs(len(lens), heads, 576, lens, page_size=page, dtype=dtypes[dt], device="cuda", seed=7)
        poison_unread_pages_(x["kv_cache"], x["block_table"], lens, page)
        nan_rows: tuple[int, ...] = ()
        if twist == "nan-key":  # key 5 of request 0, inside its first block
            x["kv_cache"][x["block_table"][0, 0].long(), 5, 3] = float("nan")
            nan_rows = (0,)
        ref, ref_lse = reference.mla_decode(**x, head_dim_v=512, return_lse=True)
        if twist == "bad-page":  # request 1's second page outside the cache (after the reference read the good one)
            x["block_table"][1, 1] = x["kv_cache"].shape[0] + 5
            nan_rows = (1,)
        work = WorkList.from_schedule(schedulers.uniform(lens, splits, request_major=True), "cuda")
        for impl, variant in impls:
            if variant is None and twist == "bad-page":  # (the shipped tile clamps such a page: undefined, not NaN)
                continue
            t0 = time.time()
            row = dict(phase="check", impl=impl, variant=variant or "", schedule="uniform", case=name, heads=heads,
                       batch=len(lens), longest=max(lens), dist="", dtype=dt, page=page, splits=splits)
            try:
                with poisoned_allocs():
                    if variant is None:
                        out, lse = mla.mla_decode(**x, head_dim_v=512, num_splits=splits, return_lse=True)
                    else:
                        out, lse = mla_decode_ws(x["q"], x["kv_cache"], x["block_table"], work, variant=variant,
                                                 return_lse=True)
                    torch.cuda.synchronize()
                err, lerr, status, why = accuracy.verdict(out, lse, ref, ref_lse, dtypes[dt], nan_rows)
                row.update(rel_err=f"{err:.2e}", lse_err=f"{lerr:.2e}", status=status, error=why)
            except Exception as e:  # a refusal, a compile error, a fault: the row says which
                row.update(status="error", error=f"{type(e).__name__}: {str(e)[:160]}")
            rows.write(**row, elapsed_s=round(time.time() - t0, 2))
            print(f"check {impl} {name}: {row['status']} {row.get('rel_err', '')} {row.get('error', '')}", flush=True)
    rows.close()


def load_flashmla(folder: str) -> str:
    """Build FlashMLA from the workplace kit in ``folder`` (prebuilt objects) and register it as ``flash_mla``;
    '' when it is there, else why not."""
    if not folder:
        return "no --fmla kit given"
    try:
        from splitlab.bench.peers_flashmla import load_kit

        load_kit(folder)
        return ""
    except Exception as e:  # the peer is optional: its absence is a row, not a failure
        return f"{type(e).__name__}: {str(e)[:160]}"


def impls_for(w, dev, variants, schedules):
    """(impl, variant, schedule label, Schedule or None, inputs -> callable) of the batch ``w``."""
    from splitlab.bench import decode as bench_decode
    from splitlab.kernels import mla
    from splitlab.kernels.mla_sm90_ws import mla_decode_ws
    from splitlab.kernels.worklist import WorkList
    from splitlab.planners import schedulers

    knobs = bench_decode.default_knobs(w, dev)
    out = [("gluon-v6", "", f"split:{knobs['num_splits']}", None,
            lambda x: (lambda: mla.mla_decode(**x, head_dim_v=512, **knobs)))]
    scheds = {}
    if "uniform" in schedules:
        scheds["uniform"] = schedulers.uniform(w.lengths, knobs["num_splits"], request_major=True)
    if "splitlab" in schedules:
        scheds["splitlab"] = schedulers.splitlab(w, dev, persistent=False)  # the kernel runs one item a slot
    for label, s in scheds.items():
        wl = WorkList.from_schedule(s, "cuda")
        for v in variants:
            def make(x, wl=wl, v=v):
                return lambda: mla_decode_ws(x["q"], x["kv_cache"], x["block_table"], wl, variant=v)
            out.append((f"ws-{v}@{label}", v, label, s, make))
    return out


def run(args, t0: float | None = None) -> None:
    """Time the batches of ``shapes`` on ``args.variants`` beside the shipped tile and FlashMLA until the budget."""
    import torch

    from splitlab import workloads
    from splitlab.bench.decode import rotated_inputs
    from splitlab.bench.timing import time_graph
    from splitlab.devices import detect
    from splitlab.kernels import reference
    from splitlab.kernels.accuracy import TOLERANCE, rel_err
    from splitlab.workloads import DecodeWorkload

    t0 = time.time() if t0 is None else t0
    rows = Rows(Path(args.out) / CSV_NAME)
    dev = detect()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    tol = TOLERANCE[torch.bfloat16]
    peer_missing = load_flashmla(args.fmla)
    flashmla = None
    if not peer_missing:
        from splitlab.bench.peers_flashmla import FLASHMLA_DECODE

        peer_missing = FLASHMLA_DECODE.unavailable() or ""
        flashmla = None if peer_missing else FLASHMLA_DECODE
    if peer_missing:
        rows.write(phase="time", impl="flashmla", status="unavailable", error=peer_missing)
    todo = shapes(args.heads, args.batches, args.keys, args.dists)
    for n_done, (heads, batch, longest, dist) in enumerate(todo):
        if time.time() - t0 > args.budget_s:
            print(f"budget spent: {len(todo) - n_done} of {len(todo)} batches not run", flush=True)
            rows.write(phase="time", impl="-", status="budget", error=f"{len(todo) - n_done} batches not run")
            break
        w = DecodeWorkload("mla", batch, heads, 1, 576, 512, longest, page_size=64, length_dist=dist,
                           length_seed=0 if dist == "uniform" else batch + longest)
        sets = rotated_inputs(w, draw_on="device", l2_bytes=l2)
        first = sets[0]
        ref = reference.mla_decode(**first, head_dim_v=512)
        floor = workloads.floor_time_us(w, dev.roofline_gbps, dev.roofline_tflops)
        base = dict(phase="time", heads=heads, batch=batch, longest=longest, dist=dist, dtype="bf16", page=64)
        timed = impls_for(w, dev, args.variants, args.schedules)
        if flashmla is not None:
            timed.append(("flashmla", "", "own", None, lambda x, w=w: flashmla.call(w, x, {})))  # (a callable)
        line = []
        for impl, variant, label, s, make in timed:
            t1 = time.time()
            row = dict(base, impl=impl, variant=variant, schedule=label)
            if s is not None:
                row.update(splits=max(s.partials), ctas=s.ctas, items=len(s.items))
            try:
                if s is not None and s.persistent:
                    raise RuntimeError(f"{label}'s schedule is persistent; the kernel runs one item a CTA slot")
                with poisoned_allocs():
                    err = rel_err(make(first)(), ref)
                row["rel_err"] = f"{err:.2e}"
                if not err <= tol:
                    row["status"] = "wrong"
                else:
                    t = time_graph([make(x) for x in sets], replays=args.replays)
                    row.update(us=round(t.p50_us, 2), p20_us=round(t.p20_us, 2), p80_us=round(t.p80_us, 2),
                               roofline=round(floor / t.p50_us, 3), status="ok")
            except Exception as e:  # a refusal, out of resources, a peer's error: the row keeps it, the run goes on
                row.update(status="skipped" if "persistent" in str(e) else "error",
                           error=f"{type(e).__name__}: {str(e)[:160]}")
            rows.write(**row, elapsed_s=round(time.time() - t1, 2))
            line.append(f"{impl} {row.get('us', row['status'])}")
        print(f"[{time.time() - t0:5.0f}s] MLA-{heads} B={batch} {longest} {dist}: " + "; ".join(line), flush=True)
        del sets, first, ref
        torch.cuda.empty_cache()
    rows.close()


def run_all(args) -> None:
    """``check`` for every variant and the shipped tile, concurrently, each in its own process with a time limit;
    then ``run`` on the variants that passed."""
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    Rows(out / CSV_NAME).close()  # the header, before the children append to the file at once
    cmd = [sys.executable, os.path.abspath(__file__), "check", "--out", str(out)]
    jobs = {v: subprocess.Popen(cmd + ["--variants", v]) for v in args.variants}
    jobs["gluon-v6"] = subprocess.Popen(cmd + ["--baseline"])
    for name, p in jobs.items():
        why = ""
        try:
            if p.wait(timeout=max(1.0, args.check_timeout_s - (time.time() - t0))):
                why, status = f"the check process exited with code {p.returncode}", "error"
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            why, status = f"the check did not finish in {args.check_timeout_s:.0f} s", "timeout"
        if why:
            rows = Rows(out / CSV_NAME)
            rows.write(phase="check", impl=name if name == "gluon-v6" else f"ws-{name}",
                       variant="" if name == "gluon-v6" else name, status=status, error=why)
            rows.close()
    good = passed_checks(read_rows(out / CSV_NAME), args.variants)
    print(f"[{time.time() - t0:5.0f}s] checks passed: {good or 'none'}", flush=True)
    args.variants = good
    run(args, t0)


# --- reading ---------------------------------------------------------------------------------------------------


def geomean(xs) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summary_lines(rows: list[dict]) -> list[str]:
    """Per (heads, dist) and implementation: the geomean and worst of the shipped tile's time over its time, and of
    FlashMLA's (> 1: faster), the median roofline fraction; then the checks' verdicts."""
    timed = [r for r in rows if r["phase"] == "time" and r["status"] == "ok"]
    by_batch: dict[tuple, dict[str, dict]] = {}
    for r in timed:
        key = (int(r["heads"]), r["dist"], int(r["batch"]), int(r["longest"]))
        by_batch.setdefault(key, {})[r["impl"]] = r
    lines = []
    for heads, dist in sorted({k[:2] for k in by_batch}, key=lambda k: (-k[0], k[1])):
        group = {k: v for k, v in by_batch.items() if k[:2] == (heads, dist)}
        impls = sorted({i for v in group.values() for i in v})
        lines.append(f"MLA-{heads} {dist} ({len(group)} batches)")
        for impl in impls:
            mine = [v for v in group.values() if impl in v]
            vs_v6 = [float(v["gluon-v6"]["us"]) / float(v[impl]["us"]) for v in mine if "gluon-v6" in v]
            vs_fm = [float(v["flashmla"]["us"]) / float(v[impl]["us"]) for v in mine if "flashmla" in v]
            roof = sorted(float(v[impl]["roofline"]) for v in mine)
            parts = [f"  {impl:28s} n={len(mine)}"]
            if vs_v6:
                parts.append(f"vs gluon-v6 {geomean(vs_v6):.3f} (worst {min(vs_v6):.3f})")
            if vs_fm:
                parts.append(f"vs flashmla {geomean(vs_fm):.3f} (worst {min(vs_fm):.3f})")
            parts.append(f"roofline median {roof[len(roof) // 2]:.3f}")
            lines.append("; ".join(parts))
    checks = [r for r in rows if r["phase"] == "check"]
    for impl in sorted({r["impl"] for r in checks}):
        mine = [r for r in checks if r["impl"] == impl]
        bad = [f"{r['case']}: {r['status']} {r['error']}".strip() for r in mine if r["status"] != "ok"]
        errs = [float(r["rel_err"]) for r in mine if r["rel_err"] not in ("", None)]
        worst = f", largest rel_err {max(errs):.2e}" if errs else ""
        lines.append(f"check {impl}: {len(mine) - len(bad)}/{len(mine)} ok{worst}" + ("; " + "; ".join(bad)
                                                                                     if bad else ""))
    other = [r for r in rows if r["phase"] == "time" and r["status"] not in ("ok",)]
    for r in other:
        lines.append(f"time {r['impl']} {r['heads']}/{r['batch']}/{r['longest']}/{r['dist']}: {r['status']} "
                     f"{r['error']}".strip())
    return lines


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.cmd == "summary":
        print("\n".join(summary_lines(read_rows(Path(a.csv)))))
    elif a.cmd == "check":
        check(a)
    elif a.cmd == "run":
        run(a)
    else:
        run_all(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
