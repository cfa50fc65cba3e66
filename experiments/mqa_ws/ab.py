"""The warp-specialized MQA work-list kernel (``splitlab.kernels.mqa_sm90_ws``) against the shipped GQA kernel at its
planner's split count, the tl work-list kernel at splitlab's schedule, SDPA cuDNN / flash and FlashInfer, on MQA-128
(128 query heads on one kv head, D = 128, bf16) on one H200: every splitlab kernel checked against the fp64
reference first, then timed by CUDA-graph replay; one CSV.

    python experiments/mqa_ws/ab.py all --out DIR [--budget-s 200]   # check, then time
    python experiments/mqa_ws/ab.py check --out DIR --kernel ws3     # one check (what `all` runs in children)
    python experiments/mqa_ws/ab.py run --out DIR --kernels ws       # time only
    python experiments/mqa_ws/ab.py summary DIR/mqa_ws_ab.csv        # the README's tables, any machine

The kernel runs at 2 and 3 stages (``KERNELS``: ``ws`` and ``ws3``), and persistent at 2 (``wsp``:
``mqa_decode_ws(..., persistent=True)``, a program walking its CTA slot's items; README "The persistent MQA
kernel"). ``all`` first runs ``check`` for each and for
the tl work-list kernel (``tl``: the harness's control; it has passed these checks' kind in the test suite), each in
a child process of its own, all at once, with a time limit (``--check-timeout-s``: a kernel that never finishes, a
barrier waited on for ever, costs that child only), then ``run`` with the kernels that passed every check (the
baselines and peers are timed either way). Rows (``FIELDS``) go to ``DIR/mqa_ws_ab.csv`` as they are made:
``phase`` is ``check`` or ``time``.

- ``check``: small batches that reach every path: an empty request, odd lengths (a last tile part empty, a box
  past the end not copied), one and two tiles, direct rows and partial rows, 128 and 64 heads, page 16, 32, 64 and
  128, items at multiples of 16 (page 16: a box is a page), fp16, a NaN in an attended key and in an attended value
  (the request NaN), a block-table entry outside the cache (the request NaN); unread cache rows NaN, every output
  buffer NaN before the launch (``inputs.poisoned_allocs``). Against the fp64 reference
  (``accuracy.assert_matches_reference`` on the rows that must be finite; the rows that must be NaN all NaN).
- ``run``: MQA-128 at batch 8, 16, 64 and 8K, 32K, 64K keys, same-length (``uniform``) and ``longtail`` lengths,
  page 16 and 64 (``shapes``: most telling first, both pages early). Per batch: the fp64 reference once; each
  implementation's output against it (bf16 tolerance; a wrong one is a row ``wrong``, not timed); then
  ``bench.timing.time_graph`` (p50; input sets rotated past the L2). Implementations: ``gqa`` (``gqa.gqa_decode``
  at ``bench.decode.default_knobs``: the planner's split), ``tl@splitlab`` (``worklist.gqa_decode_scheduled`` on
  splitlab's schedule), ``ws@uniform`` / ``ws3@uniform`` (this kernel at the planner's split count as a work list),
  ``ws@splitlab`` / ``ws3@splitlab`` (splitlab's scheduler, not persistent), ``wsp@<schedule>`` (``pairs``: the
  persistent kernel on every schedule, and alone on the persistent ones, ``PERSISTENT_SCHEDULES``: ``stream_k``,
  ``schedulers.schedule(w, dev, "stream_k")``; ``flashmla``, FlashMLA's split rule over one slot an SM,
  ``schedulers.flashmla(lengths, sm_count)``, as this kernel's CTA holds every head; ``splitlab-persistent``,
  splitlab's scheduler with stream-K among its candidates, a ``skipped`` row where it chose one item a slot), and the
  peers of ``bench.peers`` /
  ``bench.peers_flashinfer`` on their own inputs, each checked against its own fp64 reference (SDPA takes
  same-length batches only; a peer that is not importable is one ``unavailable`` row). ``roofline`` =
  ``workloads.floor_time_us`` / time.
- The persistent kernel's checks run each check batch on ``uniform``, ``stream_k`` and ``flashmla`` schedules of the
  batch over its split count in slots (``check_schedules``: several items a slot, empty requests mid-slot, one slot
  walking the whole batch at a split of 1).

Budget: ``--budget-s`` (default 200) counts from the start of ``all``; ``run`` starts no new batch past it.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

from splitlab.bench import abharness as harness
from splitlab.bench.abharness import split_list
from splitlab.bench.csvrows import CsvRows

FIELDS = ["phase", "impl", "schedule", "case", "heads", "batch", "longest", "dist", "dtype", "page", "splits", "ctas",
          "items", "us", "p20_us", "p80_us", "roofline", "rel_err", "lse_err", "status", "error", "elapsed_s"]
CSV_NAME = "mqa_ws_ab.csv"
HEADS = 128
BATCHES = (16, 64, 8)
KEYS = (32768, 8192, 65536)
DISTS = ("uniform", "longtail")
PAGES = (16, 64)
SCHEDULES = ("uniform", "splitlab", "stream_k", "flashmla", "splitlab-persistent")
#: The schedules of several items a slot, which only the persistent kernel runs.
PERSISTENT_SCHEDULES = ("stream_k", "flashmla", "splitlab-persistent")
PEERS = ("sdpa-cudnn", "sdpa-flash", "flashinfer")
#: The kernel at each of its stage counts (``mqa_sm90_ws.STAGE_CHOICES``) and persistent, by impl name; the baseline
#: of the checks.
KERNELS = {"ws": 2, "ws3": 3, "wsp": 2}
#: The impls that run the persistent kernel (``mqa_decode_ws(..., persistent=True)``: any schedule aligned to a box).
PERSISTENT_KERNELS = frozenset({"wsp"})
BASELINE = "tl"
#: Check batches: (name, heads, lengths, page, dtype, split count, what is done to the inputs or the schedule).
CHECKS = [
    ("empty-and-odd-p16", 128, [1000, 0, 77], 16, "bf16", 1, None),
    ("empty-and-odd-p16-split3", 128, [1000, 0, 77], 16, "bf16", 3, None),
    ("one-and-two-tiles-p64", 128, [64, 65, 128, 1], 64, "bf16", 2, None),
    ("long-split5-p16", 128, [5000, 4096], 16, "bf16", 5, None),
    ("long-split4-p64", 128, [4999, 4096, 130], 64, "bf16", 4, None),
    ("items-at-16-p16", 128, [1000, 77, 500], 16, "bf16", 3, "tile16"),
    ("64-heads-p16", 64, [300, 129, 64, 1], 16, "bf16", 2, None),
    ("64-heads-p64-fp16", 64, [700, 33], 64, "fp16", 2, None),
    ("page-32", 128, [1000, 200, 3], 32, "bf16", 2, None),
    ("page-128", 128, [1000, 200, 3], 128, "bf16", 2, None),
    ("fp16-p16", 128, [900, 64, 5], 16, "fp16", 3, None),
    ("nan-key-p16", 128, [600, 300], 16, "bf16", 2, "nan-key"),
    ("nan-value-p64", 128, [600, 300], 64, "bf16", 2, "nan-value"),
    ("bad-page-p16", 128, [600, 300], 16, "bf16", 2, "bad-page"),
    ("bad-page-p64", 64, [600, 300], 64, "bf16", 2, "bad-page"),
]


def shapes(batches=BATCHES, keys=KEYS, dists=DISTS, pages=PAGES) -> list[tuple[int, int, str, int]]:
    """(batch, longest, dist, page) of the timed batches, in the order they run: ``KEYS`` and ``BATCHES`` in their
    order (the most telling first), each at every page before the next."""
    return [(b, n, d, p) for n in keys for b in batches for d in dists for p in pages]


#: This A/B's CSV (``bench.csvrows.CsvRows``: appended row by row, the header once, flushed each row).
Rows = functools.partial(CsvRows, fields=FIELDS)


def pairs(kernels, schedules) -> list[tuple[str, str]]:
    """(kernel, schedule label) of the timed rows, schedule-major: a one-item kernel on the one-item schedules, the
    persistent one on every schedule."""
    return [(k, label) for label in schedules for k in kernels
            if k in PERSISTENT_KERNELS or label not in PERSISTENT_SCHEDULES]


def check_schedules(impl: str, lens: list[int], splits: int, tile: int) -> list[tuple[str, object]]:
    """(label, Schedule) a check batch runs ``impl`` on: ``uniform`` at ``splits`` (items at multiples of
    ``tile``); for the persistent kernel also stream-K and FlashMLA's rule over ``splits`` slots (several items a
    slot, empty requests mid-slot)."""
    from splitlab.planners import schedulers

    out = [(f"uniform:{splits}", schedulers.uniform(lens, splits, tile=tile))]
    if impl in PERSISTENT_KERNELS:
        out += [(f"stream_k:{splits}", schedulers.stream_k(lens, splits, tile=tile)),
                (f"flashmla:{splits}", schedulers.flashmla(lens, splits, block_size_n=tile))]
    return out


def skip_reason(kernel: str, label: str, s) -> str:
    """Why a timed row is not run ('' where it is): a one-item kernel on a persistent schedule (``pairs`` makes
    none), or ``@splitlab-persistent`` where splitlab's scheduler chose one item a slot (the ``@splitlab`` row)."""
    if s is None or kernel not in KERNELS:
        return ""
    if s.persistent and kernel not in PERSISTENT_KERNELS:
        return f"{label}'s schedule is persistent; {kernel} runs one item a CTA slot"
    if label == "splitlab-persistent" and not s.persistent:
        return "splitlab's scheduler chose one item a slot: the @splitlab row"
    return ""


def passed_checks(rows: list[dict], impl: str) -> bool:
    """Whether ``impl`` has check rows, every one ``ok`` (``bench.abharness.checks_passed``)."""
    return harness.checks_passed(rows, "impl", impl)


def parse_args(argv=None) -> argparse.Namespace:
    def own(p: argparse.ArgumentParser, name: str) -> None:
        if name != "check":
            p.add_argument("--kernels", type=split_list, default=list(KERNELS))
            p.add_argument("--budget-s", type=float, default=200.0)
            harness.add_lists(p, batches=BATCHES, keys=KEYS, dists=DISTS, pages=PAGES, schedules=SCHEDULES, peers=PEERS)
        else:
            p.add_argument("--kernel", default="ws", choices=[*KERNELS, BASELINE],
                           help=f"the kernel checked ({BASELINE}: the tl work-list kernel, the harness's control)")

    return harness.parse_ab_args(argv, __doc__.splitlines()[0], own, 120.0,
                                 {"kernels": tuple(KERNELS), "schedules": SCHEDULES, "peers": PEERS, "dists": DISTS,
                                  "pages": PAGES})


# --- on the GPU ------------------------------------------------------------------------------------------------


def check(args) -> None:
    """Each check batch on ``args.kernel`` (``KERNELS``, or ``BASELINE``: the tl work-list kernel): one row each."""
    import torch

    from splitlab.kernels import accuracy, reference, worklist
    from splitlab.kernels.inputs import gqa_inputs, poison_unread_pages_, poisoned_allocs, set_key_
    from splitlab.kernels.mqa_sm90_ws import mqa_decode_ws
    from splitlab.kernels.worklist import WorkList
    from splitlab.planners import schedulers

    rows = Rows(Path(args.out) / CSV_NAME)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    impl = args.kernel
    for name, heads, lens, page, dt, splits, twist in CHECKS:
        x = gqa_inputs(len(lens), heads, 1, 128, lens, page_size=page, dtype=dtypes[dt], device="cuda", seed=7)
        for cache in ("k_cache", "v_cache"):
            poison_unread_pages_(x[cache], x["block_table"], lens, page)
        nan_rows: tuple[int, ...] = ()
        if twist in ("nan-key", "nan-value"):  # key 5 of request 0 (its first tile), one column
            set_key_(x["k_cache" if twist == "nan-key" else "v_cache"], x["block_table"], 0, 5, float("nan"), 0, 3)
            # a NaN key column poisons the key's score, so the whole request; a NaN value column only that column
            # of the output (p V), the request's other columns and its lse stay finite
            nan_rows = (0,) if twist == "nan-key" else ()
        ref, ref_lse = reference.gqa_decode(**x, return_lse=True)
        if twist == "bad-page":  # request 1's second page outside the cache (after the reference read the good one)
            x["block_table"][1, 1] = x["k_cache"].shape[0] + 5
            nan_rows = (1,)
        tile = 16 if twist == "tile16" else schedulers.TILE_KEYS
        for label, s in check_schedules(impl, lens, splits, tile):
            work = WorkList.from_schedule(s, "cuda")
            t0 = time.time()
            row = dict(phase="check", impl=impl, schedule=label, case=name, heads=heads, batch=len(lens),
                       longest=max(lens), dtype=dt, page=page, splits=splits)
            try:
                q, k, v, bt = x["q"], x["k_cache"], x["v_cache"], x["block_table"]
                with poisoned_allocs():
                    if impl == BASELINE:
                        out, lse = worklist.gqa_decode_scheduled(q, k, v, bt, work, return_lse=True)
                    else:
                        out, lse = mqa_decode_ws(q, k, v, bt, work, stages=KERNELS[impl], return_lse=True,
                                                 persistent=impl in PERSISTENT_KERNELS)
                    torch.cuda.synchronize()
                why, want = "", ref
                if twist == "nan-value":  # column 3 of request 0 NaN in every head, as in the reference; the rest
                    if not bool(torch.isnan(out[0, :, 3]).all()):  # checked
                        why = "request 0's value column 3 is not all NaN"
                    out, want = out.clone(), ref.clone()
                    out[0, :, 3], want[0, :, 3] = 0, 0
                row.update(harness.verdict_fields(*accuracy.verdict(out, lse, want, ref_lse, dtypes[dt], nan_rows)))
                if why:
                    row.update(status="wrong", error=why)
            except Exception as e:  # a refusal, a compile error, a fault: the row says which
                row.update(status="error", error=harness.error_text(e))
            harness.write_check(rows, row, t0)
    rows.close()


def splitlab_impls(w, dev, schedules, kernels):
    """(impl, schedule label, Schedule or None, inputs -> callable) of splitlab's kernels on the batch ``w``: the
    shipped kernel, the tl work-list kernel, and each of ``kernels`` on the ``schedules`` ``pairs`` gives it."""
    from splitlab.bench import decode as bench_decode
    from splitlab.kernels import gqa, worklist
    from splitlab.kernels.mqa_sm90_ws import mqa_decode_ws
    from splitlab.kernels.worklist import WorkList
    from splitlab.planners import schedulers

    knobs = bench_decode.default_knobs(w, dev)
    out = [("gqa", f"split:{knobs['num_splits']}", None, lambda x: (lambda: gqa.gqa_decode(**x, **knobs)))]
    tl = schedulers.splitlab(w, dev)
    tl_work = WorkList.from_schedule(tl, "cuda")
    out.append((f"{BASELINE}@splitlab", "splitlab", tl, lambda x: (lambda: worklist.gqa_decode_scheduled(
        x["q"], x["k_cache"], x["v_cache"], x["block_table"], tl_work))))
    build = {"uniform": lambda: schedulers.uniform(w.lengths, knobs["num_splits"]),
             "splitlab": lambda: schedulers.splitlab(w, dev, persistent=False),  # one item a slot
             "stream_k": lambda: schedulers.schedule(w, dev, "stream_k"),
             # FlashMLA's rule over one slot an SM (its own part count assumes 64-head CTAs; this one holds all 128)
             "flashmla": lambda: schedulers.flashmla(w.lengths, dev.sm_count),
             "splitlab-persistent": lambda: schedulers.splitlab(w, dev)}  # stream-K among the candidates
    todo = pairs(kernels, schedules)
    scheds = {label: build[label]() for label in dict.fromkeys(label for _, label in todo)}
    lists = {label: WorkList.from_schedule(s, "cuda") for label, s in scheds.items()}
    for kernel, label in todo:
        def make(x, wl=lists[label], stages=KERNELS[kernel], persistent=kernel in PERSISTENT_KERNELS):
            return lambda: mqa_decode_ws(x["q"], x["k_cache"], x["v_cache"], x["block_table"], wl, stages=stages,
                                         persistent=persistent)
        out.append((f"{kernel}@{label}", label, scheds[label], make))
    return out


def peer_impls(names):
    """(impl, peer) of the peers named, and (impl, why) of those that cannot run here."""
    from splitlab.bench.peers import SDPA_CUDNN, SDPA_FLASH
    from splitlab.bench.peers_flashinfer import FLASHINFER_DECODE

    table = {"sdpa-cudnn": SDPA_CUDNN, "sdpa-flash": SDPA_FLASH, "flashinfer": FLASHINFER_DECODE}
    ok, missing = [], []
    for n in names:
        why = table[n].unavailable()
        (missing if why else ok).append((n, why or table[n]))
    return ok, missing


def run(args, t0: float | None = None) -> None:
    """Time the batches of ``shapes`` on splitlab's kernels and the peers until the budget."""
    import torch

    from splitlab import workloads
    from splitlab.bench.decode import rotated_inputs
    from splitlab.kernels import reference

    t0 = time.time() if t0 is None else t0
    rows = Rows(Path(args.out) / CSV_NAME)
    dev, l2, tol = harness.device_setup()
    peers, missing = peer_impls(args.peers)
    for name, why in missing:
        rows.write(phase="time", impl=name, status="unavailable", error=why)
    todo = shapes(args.batches, args.keys, args.dists, args.pages)
    for n_done, (batch, longest, dist, page) in enumerate(todo):
        if harness.budget_spent(rows, t0, args.budget_s, len(todo), n_done):
            break
        w = harness.ab_workload("gqa", batch, HEADS, 128, 128, longest, page, dist)
        floor = workloads.floor_time_us(w, dev.roofline_gbps, dev.roofline_tflops)
        base = dict(phase="time", heads=HEADS, batch=batch, longest=longest, dist=dist, dtype="bf16", page=page)
        line = []
        sets = rotated_inputs(w, draw_on="device", l2_bytes=l2)
        ref = reference.gqa_decode(**sets[0])
        for impl, label, s, make in splitlab_impls(w, dev, args.schedules, args.kernels):
            t1 = time.time()
            row = dict(base, impl=impl, schedule=label)
            if s is not None:
                row.update(harness.schedule_fields(s))
            why = skip_reason(impl.split("@")[0], label, s)
            try:
                if why:
                    row.update(status="skipped", error=why)
                else:
                    harness.time_row(row, make, sets, ref, floor, tol, args.replays)
            except Exception as e:  # a refusal, out of resources: the row keeps it, the run goes on
                row.update(status="error", error=harness.error_text(e))
            harness.write_timed(rows, row, t1, line)
        n_sets = len(sets)  # the peers rotate as many sets of their own inputs
        del sets, ref
        torch.cuda.empty_cache()
        for impl, peer in peers:
            t1 = time.time()
            row = dict(base, impl=impl, schedule="own")
            try:
                psets = [peer.inputs(w, device="cuda", seed=1 + i) for i in range(n_sets)]
                harness.time_row(row, lambda x, peer=peer, w=w: peer.call(w, x, {}), psets, peer.reference(w, psets[0]),
                                 floor, tol, args.replays)
            except Exception as e:  # SDPA on a ragged batch, a peer's own error: a row, not a failure
                row.update(status="skipped" if "ragged" in str(e) else "error", error=harness.error_text(e))
            harness.write_timed(rows, row, t1, line)
            psets = None
            torch.cuda.empty_cache()
        print(f"[{time.time() - t0:5.0f}s] MQA-128 B={batch} {longest} {dist} page {page}: " + "; ".join(line),
              flush=True)
    rows.close()


def run_all(args) -> None:
    """``check`` for each of ``args.kernels`` and the baseline, concurrently, each in its own process with a time
    limit; then ``run`` on the kernels that passed."""
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = harness.check_in_children(__file__, out, out / CSV_NAME, FIELDS,
                                     {k: ["--kernel", k] for k in [*args.kernels, BASELINE]}, args.check_timeout_s,
                                     t0, lambda name: dict(impl=name))
    args.kernels = [k for k in args.kernels if passed_checks(rows, k)]
    print(f"[{time.time() - t0:5.0f}s] checks passed: {args.kernels or 'none'}", flush=True)
    run(args, t0)  # (with none passed, the baselines and peers are still timed)


# --- reading ---------------------------------------------------------------------------------------------------


def summary_lines(rows: list[dict]) -> list[str]:
    """Per (page, dist) and implementation: the geomean and worst of the shipped kernel's time over its time and of
    the best peer's (> 1: faster), the median and lowest roofline fraction and how many batches reach 0.75; then
    the checks' verdicts and every row that is not ``ok``."""
    def impl_line(impl: str, mine: list[dict]) -> str:
        us = [float(v[impl]["us"]) for v in mine]
        vs_gqa = [float(v["gqa"]["us"]) / u for v, u in zip(mine, us, strict=True) if "gqa" in v]
        best = [min(float(v[p]["us"]) for p in PEERS if p in v) / u for v, u in zip(mine, us, strict=True)
                if any(p in v for p in PEERS)]
        roof = sorted(float(v[impl]["roofline"]) for v in mine)
        return "; ".join([f"  {impl:14s} n={len(mine)}", *harness.ratio_texts(("gqa", vs_gqa), ("best peer", best)),
                          f"roofline median {roof[len(roof) // 2]:.3f}, lowest {roof[0]:.3f}, "
                          f">= 0.75 in {sum(x >= 0.75 for x in roof)}/{len(roof)}"])

    return harness.summary_lines(rows, "page", lambda k, n: f"MQA-128 page {k[0]} {k[1]} ({n} batches)", impl_line,
                                 lambda r: f"{r['batch']}/{r['longest']}/{r['dist']}/page {r['page']}")


def main(argv=None) -> int:
    return harness.run_command(parse_args(argv), summary_lines, check, run, run_all)


if __name__ == "__main__":
    sys.exit(main())
