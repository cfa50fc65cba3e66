"""The ``splitlab`` command line: ``devices``, ``plan``, ``bench`` and ``sweep``.

Bad input never ends in a traceback: a one-line ``splitlab: error: ...`` naming the argument and what
is allowed, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from splitlab import devices, planners, waves, workloads
from splitlab.errors import SplitlabError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage + message)
        raise SplitlabError(message)


def _int_list(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        try:
            out.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not an integer (give e.g. 1,2,8)") from None
    return out


def _build_workloads(args: argparse.Namespace) -> list[workloads.DecodeWorkload]:
    out = []
    for batch in args.batch:
        for ctx in args.ctx:
            if args.workload:
                w = workloads.get(args.workload, batch=batch, ctx_len=ctx, dtype=args.dtype,
                                  page_size=args.page_size, topk=args.topk)
                changes = {k: v for k, v in (("num_q_heads", args.heads), ("num_kv_heads", args.kv_heads),
                                             ("head_dim_qk", args.head_dim), ("head_dim_v", args.head_dim_v))
                           if v is not None}
                out.append(w.with_(**changes) if changes else w)
                continue
            if not args.kind:
                raise SplitlabError("--workload or --kind is required; workloads: " + ", ".join(workloads.names()))
            mla = args.kind != "gqa"
            out.append(workloads.DecodeWorkload(
                kind=args.kind, batch=batch, num_q_heads=args.heads or (128 if mla else 32),
                num_kv_heads=args.kv_heads or (1 if mla else 8), head_dim_qk=args.head_dim or (576 if mla else 128),
                head_dim_v=args.head_dim_v or (512 if mla else args.head_dim or 128), ctx_len=ctx,
                page_size=args.page_size or (1 if args.kind == "sparse_mla" else 16),
                topk=args.topk if args.topk is not None else (2048 if args.kind == "sparse_mla" else 0),
                dtype=args.dtype))
    return out


def plan_rows(ws: Sequence[workloads.DecodeWorkload], devs: Sequence[devices.DeviceSpec],
              names: Sequence[str]) -> list[dict]:
    """One row per (workload, device, planner): the plan and its wave statistics on splitlab's kernel."""
    rows = []
    for w in ws:
        for dev in devs:
            for name in names:
                row = dict(device=dev.name, sms=dev.sm_count, planner=name, kind=w.kind, batch=w.batch,
                           heads=w.num_q_heads, kv_heads=w.num_kv_heads, ctx_len=w.ctx_len, topk=w.topk)
                if w.kind not in planners.entry(name).kinds:
                    rows.append(row | dict(num_splits=None, note=f"does not cover {w.kind}"))
                    continue
                p = planners.plan(w, dev, name)
                ws_ = waves.wave_stats(w, p.num_splits, dev.sm_count, block_h=p.block_h)
                rows.append(row | dict(num_splits=p.num_splits, block_n=p.block_n, block_k=p.block_k,
                                       block_h=p.block_h, kv_chunk=p.kv_chunk, ctas=ws_.ctas, waves=round(ws_.waves, 3),
                                       last_wave_fill=round(ws_.last_wave_fill, 3), note=p.note))
    return rows


def _print_table(rows: list[dict], cols: list[str]) -> None:
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in cols] for r in rows]
    width = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, width, strict=True)))
    for x in cells:
        print("  ".join(v.rjust(w) for v, w in zip(x, width, strict=True)))


def cmd_devices(args: argparse.Namespace) -> int:
    rows = [dict(name=d.name, vendor=d.vendor, arch=d.arch, sms=d.sm_count, hbm_gbps=d.hbm_gbps,
                 l2_mb=d.l2_mb, bf16_tflops=d.bf16_tflops, aliases=",".join(d.aliases), source=d.source)
            for d in devices.PRESETS.values()]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        _print_table(rows, ["name", "vendor", "arch", "sms", "hbm_gbps", "l2_mb", "bf16_tflops", "aliases"])
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    devs = [devices.get(d) for d in args.device.split(",")]
    ws = _build_workloads(args)
    names = planners.names() if args.planner == "all" else [planners.entry(p).name for p in args.planner.split(",")]
    if args.planner == "all":
        names = [n for n in names if any(w.kind in planners.entry(n).kinds for w in ws)]
    rows = plan_rows(ws, devs, names)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("# ctas, waves, last_wave_fill: splitlab's kernel launched at the plan (modelled, 1 CTA per SM)")
    _print_table(rows, ["device", "sms", "planner", "kind", "batch", "heads", "ctx_len", "num_splits",
                        "block_k", "block_h", "ctas", "waves", "last_wave_fill"] + (["note"] if args.notes else []))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    if not torch.cuda.is_available():
        raise SplitlabError("bench needs a GPU; torch sees none")
    from splitlab.bench import decode

    names = args.suite.split(",")
    known = list(decode.suites(True))
    for n in names:
        if n not in known:
            raise SplitlabError(f"--suite={n!r} is not allowed; expected any of {', '.join(known)}")
    rows = decode.run(names, Path(args.out), quick=args.quick, with_flex=not args.no_flex,
                      full_tiles=args.tiles == "full")
    print(decode.format_summary(rows))
    return 0


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shard (give i/n, e.g. 0/4)") from None
    if not (n >= 1 and 0 <= i < n):
        raise argparse.ArgumentTypeError(f"{text!r} is not a shard; expected i/n with 0 <= i < n")
    return i, n


def _positive(kind: type):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected a number > 0")
        return v
    return parse


def _address(text: str) -> str:
    if not text.strip() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a scheduler address (give e.g. tcp://host:8786)")
    return text


def cmd_sweep(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    import torch

    if not torch.cuda.is_available():  # kernels then run under Triton's interpreter (set before they import)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from splitlab.bench import cards, sweep

    card = cards.load(args.card)
    card.grid(args.grid)
    opts = sweep.SweepOptions(grid=args.grid, out=Path(args.out), timer=args.timer, resume=args.resume,
                              device=args.device, limit=args.limit, max_minutes=args.max_minutes,
                              shard=args.shard, quiet=args.quiet, argv=args.argv)
    if (args.workers or args.scheduler) and not args.dry_run:
        from splitlab.bench import dist  # Dask only here: the single-process path never imports it

        _print_sweep_result(dist.run(card, opts, workers=args.workers, scheduler=args.scheduler), "this run")
        return 0
    runner = sweep.Runner(card, opts)
    if args.dry_run:
        print(runner.describe(rows=args.rows))
        return 0
    try:
        res = runner.run()
    except sweep.SweepAborted as e:
        print(f"splitlab: sweep stopped: {e}", file=sys.stderr)
        return 3
    _print_sweep_result(res, "this session")
    return 0


def _print_sweep_result(res, who: str) -> None:
    """One line: what this session (or Dask run) wrote, and how far the sweep is."""
    counts = ", ".join(f"{k} {v}" for k, v in sorted(res.statuses.items())) or "nothing to do"
    print(f"sweep {res.sweep_id} in {res.sweep_dir}: {who} {counts}; {res.done}/{res.total} points done"
          + (f", {res.left} left (stopped: {res.stopped}; run the same command with --resume)" if res.left else ""))


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="splitlab", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    d = sub.add_parser("devices", help="list device presets")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_devices)

    pl = sub.add_parser("plan", help="what each planner picks for a workload on each device")
    pl.add_argument("--workload", help="model preset: " + ", ".join(workloads.names()))
    pl.add_argument("--kind", choices=workloads.KINDS)
    pl.add_argument("--batch", type=_int_list, default=[1], help="requests (sparse: query tokens); list: 1,2,8")
    pl.add_argument("--ctx", type=_int_list, default=[8192], help="keys per request (sparse: pool size); list")
    pl.add_argument("--heads", type=int, help="query heads (overrides the preset)")
    pl.add_argument("--kv-heads", type=int)
    pl.add_argument("--head-dim", type=int, help="head dim of q/k")
    pl.add_argument("--head-dim-v", type=int)
    pl.add_argument("--topk", type=int)
    pl.add_argument("--page-size", type=int)
    pl.add_argument("--dtype", default="bf16", choices=workloads.DTYPES)
    pl.add_argument("--device", default="h200", help="preset name(s), comma-separated: " + ", ".join(devices.names()))
    pl.add_argument("--planner", default="all", help="planner name(s) or all: " + ", ".join(planners.names()))
    pl.add_argument("--json", action="store_true", help="machine-readable rows (with each adapter's note)")
    pl.add_argument("--notes", action="store_true", help="add each adapter's note: how it mapped the workload")
    pl.set_defaults(fn=cmd_plan)

    from splitlab import report

    r = sub.add_parser("report", help="execute the notebooks on a result set into HTML (no GPU needed)")
    report.add_arguments(r)
    r.set_defaults(fn=report.cli)

    b = sub.add_parser("bench", help="time splitlab's kernels against PyTorch's decode paths (GPU)")
    b.add_argument("--suite", default="gqa,mqa,mla,sparse",
                   help="comma-separated: gqa, mqa, mla, sparse, fp8 (the MLA kernels on an fp8 cache)")
    b.add_argument("--out", default="runs/bench", help="folder for points.csv, summary.csv, env.json")
    b.add_argument("--quick", action="store_true", help="a few shapes and a thinned knob sweep")
    b.add_argument("--no-flex", action="store_true", help="skip FlexAttention (it compiles per shape)")
    b.add_argument("--tiles", choices=("full", "thin"), default="full",
                   help="full: every tile at the two best split counts; thin: a sixth of them at the best one")
    b.set_defaults(fn=cmd_bench)

    sw = sub.add_parser("sweep", help="check and time a kernel card's grid (GPU; --timer fake on the CPU)")
    sw.add_argument("card", help="a kernel card: a .toml path or a name in kernels/")
    sw.add_argument("--grid", default="default", help="a named grid of the card (quick, default, seed, ...)")
    sw.add_argument("--out", default="runs", help="folder for the sweep's folder <card>-<grid>/ (default runs/)")
    sw.add_argument("--dry-run", action="store_true", help="print the expanded points; run nothing, write nothing")
    sw.add_argument("--resume", action="store_true", help="continue the sweep in <out>/<card>-<grid>/ (or start it)")
    sw.add_argument("--timer", choices=("graph", "events", "fake"),
                    help="graph: CUDA-graph replay, rotated inputs; events: L2-flushed CUDA events; fake: modelled "
                    "times for CI, not measurements (default: the card's, or the resumed sweep's)")
    sw.add_argument("--device", help="plan for this preset, not the GPU torch sees: " + ", ".join(devices.names()))
    sw.add_argument("--limit", type=_positive(int), help="at most this many points in this session")
    sw.add_argument("--max-minutes", type=_positive(float), help="start no new point after this many minutes")
    sw.add_argument("--shard", type=_shard, help="i/n: run only shard i of n (whole shapes), one process per GPU, "
                    "each with --resume")
    par = sw.add_mutually_exclusive_group()
    par.add_argument("--workers", type=_positive(int), help="N: run on a local Dask cluster of N worker processes, one "
                     "per visible GPU (CPU workers where there is none); needs splitlab[dist]")
    par.add_argument("--scheduler", type=_address, help="ADDRESS: run on this Dask cluster (one single-threaded "
                     "worker per GPU, CUDA_VISIBLE_DEVICES set; see README); needs splitlab[dist]")
    sw.add_argument("--quiet", action="store_true", help="no progress output")
    sw.add_argument("--rows", type=int, default=8, help="--dry-run: how many points to show")
    sw.set_defaults(fn=cmd_sweep)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        args.argv = ["splitlab", *(sys.argv[1:] if argv is None else argv)]
        return args.fn(args)
    except SplitlabError as e:
        print(f"splitlab: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
