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
- The persistent seesaw (``seesaw-persistent``: a program walks its CTA slot's items, README "The persistent
  seesaw") runs on every schedule, and alone on the persistent ones (``PERSISTENT_SCHEDULES``): ``@stream_k``
  (``schedulers.schedule(w, dev, "stream_k")``: stream-K over ``slots_per_group`` slots), ``@flashmla`` (FlashMLA's
  own schedule, ``schedulers.flashmla_schedule``: the kernels compared at one work split) and
  ``@splitlab-persistent`` (splitlab's scheduler with stream-K among its candidates; a row ``skipped`` where it
  chose one item a slot, the ``@splitlab`` row). Its checks run each check batch on ``uniform``, ``stream_k`` and
  ``flashmla`` schedules of the batch (several items a slot, empty requests mid-slot).

Budget: ``--budget-s`` (default 270) counts from the start of ``all``; ``run`` starts no new batch past it and the
README's command stops everything at 295 s. FlashMLA comes from the workplace kit (``--fmla``: its prebuilt objects
build in about 31 s, counted in the budget).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

from splitlab.bench import abharness as harness
from splitlab.bench.abharness import split_list
from splitlab.bench.csvrows import CsvRows

FIELDS = ["phase", "impl", "variant", "schedule", "case", "heads", "batch", "longest", "dist", "dtype", "page",
          "splits", "ctas", "items", "us", "p20_us", "p80_us", "roofline", "rel_err", "lse_err", "status", "error",
          "elapsed_s"]
CSV_NAME = "mla_ws_ab.csv"
HEADS = (128, 64)
BATCHES = (64, 132, 16, 1)
KEYS = (32768, 65536, 8192)
DISTS = ("uniform", "longtail")
SCHEDULES = ("uniform", "splitlab", "stream_k", "flashmla", "splitlab-persistent")
#: The schedules of several items a slot, which only the persistent variants run.
PERSISTENT_SCHEDULES = ("stream_k", "flashmla", "splitlab-persistent")
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


#: This A/B's CSV (``bench.csvrows.CsvRows``: appended row by row, the header once, flushed each row).
Rows = functools.partial(CsvRows, fields=FIELDS)


def persistent(variant: str) -> bool:
    """Whether ``variant`` walks its slot's items (``mla_sm90_ws.PERSISTENT_VARIANTS``)."""
    from splitlab.kernels.mla_sm90_ws import PERSISTENT_VARIANTS

    return variant in PERSISTENT_VARIANTS


def pairs(variants, schedules) -> list[tuple[str, str]]:
    """(variant, schedule label) of the timed rows, schedule-major: a one-item variant on the one-item schedules, a
    persistent one on every schedule."""
    return [(v, label) for label in schedules for v in variants
            if persistent(v) or label not in PERSISTENT_SCHEDULES]


def check_schedules(variant: str, lens: list[int], splits: int) -> list[tuple[str, object]]:
    """(label, Schedule) a check batch runs ``variant`` on: ``uniform`` at ``splits``; for a persistent variant
    also stream-K and FlashMLA's schedule over ``splits`` slots (several items a slot, empty requests mid-slot)."""
    from splitlab.planners import schedulers

    out = [("uniform", schedulers.uniform(lens, splits, request_major=True))]
    if persistent(variant):
        out += [(f"stream_k:{splits}", schedulers.stream_k(lens, splits)),
                (f"flashmla:{splits}", schedulers.flashmla(lens, splits))]
    return out


def passed_checks(rows: list[dict], variants) -> list[str]:
    """The variants of ``variants`` with check rows, every one ``ok`` (``bench.abharness.checks_passed``)."""
    return [v for v in variants if harness.checks_passed(rows, "variant", v)]


def parse_args(argv=None) -> argparse.Namespace:
    from splitlab.kernels.mla_sm90_ws import VARIANTS

    def own(p: argparse.ArgumentParser, name: str) -> None:
        p.add_argument("--variants", type=split_list, default=list(VARIANTS),
                       help=f"comma-separated, of {','.join(VARIANTS)}")
        if name != "check":
            p.add_argument("--fmla", default=os.environ.get("FMLA_DIR", ""), help="FlashMLA kit folder ('': none)")
            p.add_argument("--budget-s", type=float, default=270.0)
            harness.add_lists(p, heads=HEADS, batches=BATCHES, keys=KEYS, dists=DISTS, schedules=SCHEDULES)
        else:
            p.add_argument("--baseline", action="store_true", help="check the shipped Gluon tile (gluon-v6)")

    return harness.parse_ab_args(argv, __doc__.splitlines()[0], own, 150.0,
                                 {"variants": VARIANTS, "schedules": SCHEDULES})


# --- on the GPU ------------------------------------------------------------------------------------------------


def check(args) -> None:
    """Each check batch on ``args.variants`` (and the shipped tile with ``--baseline``): one row each."""
    import torch

    from splitlab.kernels import accuracy, mla, reference
    from splitlab.kernels.inputs import mla_inputs, poison_unread_pages_, poisoned_allocs
    from splitlab.kernels.mla_sm90_ws import mla_decode_ws
    from splitlab.kernels.worklist import WorkList

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
        for impl, variant in impls:
            if variant is None and twist == "bad-page":  # (the shipped tile clamps such a page: undefined, not NaN)
                continue
            for label, s in check_schedules(variant or "", lens, splits):
                t0 = time.time()
                row = dict(phase="check", impl=impl, variant=variant or "", schedule=label, case=name, heads=heads,
                           batch=len(lens), longest=max(lens), dist="", dtype=dt, page=page, splits=splits)
                try:
                    with poisoned_allocs():
                        if variant is None:
                            out, lse = mla.mla_decode(**x, head_dim_v=512, num_splits=splits, return_lse=True)
                        else:
                            out, lse = mla_decode_ws(x["q"], x["kv_cache"], x["block_table"],
                                                     WorkList.from_schedule(s, "cuda"), variant=variant,
                                                     return_lse=True)
                        torch.cuda.synchronize()
                    row.update(harness.verdict_fields(*accuracy.verdict(out, lse, ref, ref_lse, dtypes[dt],
                                                                        nan_rows)))
                except Exception as e:  # a refusal, a compile error, a fault: the row says which
                    row.update(status="error", error=harness.error_text(e))
                harness.write_check(rows, row, t0)
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
        return harness.error_text(e)


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
    build = {"uniform": lambda: schedulers.uniform(w.lengths, knobs["num_splits"], request_major=True),
             "splitlab": lambda: schedulers.splitlab(w, dev, persistent=False),  # one item a slot
             "stream_k": lambda: schedulers.schedule(w, dev, "stream_k"),
             "flashmla": lambda: schedulers.flashmla_schedule(w, dev),
             "splitlab-persistent": lambda: schedulers.splitlab(w, dev)}  # stream-K among the candidates
    todo = pairs(variants, schedules)
    scheds = {label: build[label]() for label in dict.fromkeys(label for _, label in todo)}
    lists = {label: WorkList.from_schedule(s, "cuda") for label, s in scheds.items()}
    for v, label in todo:
        def make(x, wl=lists[label], v=v):
            return lambda: mla_decode_ws(x["q"], x["kv_cache"], x["block_table"], wl, variant=v)
        out.append((f"ws-{v}@{label}", v, label, scheds[label], make))
    return out


def skip_reason(variant: str, label: str, s) -> str:
    """Why a timed row is not run ('' where it is): a one-item variant on a persistent schedule (``pairs`` makes
    none), or ``@splitlab-persistent`` where splitlab's scheduler chose one item a slot (the ``@splitlab`` row)."""
    if s is None or not variant:
        return ""
    if s.persistent and not persistent(variant):
        return f"{label}'s schedule is persistent; the kernel runs one item a CTA slot"
    if label == "splitlab-persistent" and not s.persistent:
        return "splitlab's scheduler chose one item a slot: the @splitlab row"
    return ""


def run(args, t0: float | None = None) -> None:
    """Time the batches of ``shapes`` on ``args.variants`` beside the shipped tile and FlashMLA until the budget."""
    import torch

    from splitlab import workloads
    from splitlab.bench.decode import rotated_inputs
    from splitlab.kernels import reference

    t0 = time.time() if t0 is None else t0
    rows = Rows(Path(args.out) / CSV_NAME)
    dev, l2, tol = harness.device_setup()
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
        if harness.budget_spent(rows, t0, args.budget_s, len(todo), n_done):
            break
        w = harness.ab_workload("mla", batch, heads, 576, 512, longest, 64, dist)
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
                row.update(harness.schedule_fields(s))
            why = skip_reason(variant, label, s)
            try:
                if why:
                    row.update(status="skipped", error=why)
                else:
                    harness.time_row(row, make, sets, ref, floor, tol, args.replays)
            except Exception as e:  # a refusal, out of resources, a peer's error: the row keeps it, the run goes on
                row.update(status="error", error=harness.error_text(e))
            harness.write_timed(rows, row, t1, line)
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
    jobs = {v: ["--variants", v] for v in args.variants}
    jobs["gluon-v6"] = ["--baseline"]
    rows = harness.check_in_children(
        __file__, out, out / CSV_NAME, FIELDS, jobs, args.check_timeout_s, t0,
        lambda name: dict(impl=name, variant="") if name == "gluon-v6" else dict(impl=f"ws-{name}", variant=name))
    good = passed_checks(rows, args.variants)
    print(f"[{time.time() - t0:5.0f}s] checks passed: {good or 'none'}", flush=True)
    args.variants = good
    run(args, t0)


# --- reading ---------------------------------------------------------------------------------------------------


def summary_lines(rows: list[dict]) -> list[str]:
    """Per (heads, dist) and implementation: the geomean and worst of the shipped tile's time over its time, and of
    FlashMLA's (> 1: faster), the median roofline fraction; then the checks' verdicts."""
    def impl_line(impl: str, mine: list[dict]) -> str:
        vs_v6 = [float(v["gluon-v6"]["us"]) / float(v[impl]["us"]) for v in mine if "gluon-v6" in v]
        vs_fm = [float(v["flashmla"]["us"]) / float(v[impl]["us"]) for v in mine if "flashmla" in v]
        roof = sorted(float(v[impl]["roofline"]) for v in mine)
        return "; ".join([f"  {impl:28s} n={len(mine)}", *harness.ratio_texts(("gluon-v6", vs_v6), ("flashmla", vs_fm)),
                          f"roofline median {roof[len(roof) // 2]:.3f}"])

    return harness.summary_lines(rows, "heads", lambda k, n: f"MLA-{k[0]} {k[1]} ({n} batches)", impl_line,
                                 lambda r: f"{r['heads']}/{r['batch']}/{r['longest']}/{r['dist']}",
                                 order=lambda k: (-k[0], k[1]))


def main(argv=None) -> int:
    return harness.run_command(parse_args(argv), summary_lines, check, run, run_all)


if __name__ == "__main__":
    sys.exit(main())
