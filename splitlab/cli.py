"""The ``splitlab`` command line: ``devices``, ``plan``, ``bench`` and ``sweep``.

Bad input never ends in a traceback: a one-line ``splitlab: error: ...`` naming the argument and what
is allowed, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence

from splitlab import devices, planners, waves, workloads
from splitlab.args import (
    EXIT_INTERRUPTED,
    OneLineParser,
    add_fit_arguments,
    int_list_type,
    int_type,
    out_dir,
    positive_float,
    run_main,
    shown,
    split_list,
)
from splitlab.errors import SplitlabError
from splitlab.workloads import LIMITS

#: ``splitlab plan`` answers at most this many rows (workloads x devices x planners) in one call.
MAX_PLAN_ROWS = 10_000
#: ``splitlab sweep --workers``: at most this many local worker processes.
MAX_WORKERS = 256
#: ``splitlab sweep --dry-run --rows``: at most this many points shown.
MAX_ROWS = 1_000_000


def lengths_type(text: str) -> tuple[str, int]:
    """``--lengths DIST[:SEED]``: a named length distribution (``workloads.LENGTH_DISTS``) and its seed (default 0;
    ``uniform`` takes none)."""
    dists = ", ".join(workloads.LENGTH_DISTS)
    allowed = f"DIST[:SEED], DIST one of {dists}, SEED an integer in [0, {workloads.MAX_LENGTH_SEED}] (none for " \
              "uniform)"
    dist, sep, seed = (part.strip() for part in str(text).partition(":"))
    if dist not in workloads.LENGTH_DISTS:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not allowed; expected {allowed}")
    if not sep:
        return dist, 0
    if dist == workloads.UNIFORM:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not allowed: uniform lengths are not drawn, so take no "
                                         f"seed; expected {allowed}")
    digits = seed.isascii() and seed.isdigit() and len(seed) <= 12  # (a 5000-digit seed: no int() of it)
    if not digits or int(seed) > workloads.MAX_LENGTH_SEED:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not allowed; expected {allowed}")
    return dist, int(seed)


def seq_lens_type(text: str) -> tuple[int, ...]:
    """``--seq-lens L1,L2,...``: every request's key count, in ``[0, ctx limit]`` (sizes like 32k allowed), at most
    ``LIMITS['batch']`` of them, at least one >= 1."""
    lens = tuple(int_list_type(0, LIMITS["ctx_len"], sizes=True)(text))
    if len(lens) > LIMITS["batch"]:
        raise argparse.ArgumentTypeError(f"{len(lens)} lengths are not allowed; expected at most {LIMITS['batch']} "
                                         "(one per request)")
    if max(lens) < 1:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not allowed; expected at least one length >= 1 (a batch "
                                         "of empty requests has nothing to plan)")
    return lens


def _batch_shape(args: argparse.Namespace, kind: str) -> tuple[list[int], list[int], dict]:
    """``--batch`` and ``--ctx`` (their defaults filled in) and the length fields every workload takes: ``seq_lens``
    (from ``--seq-lens``, which sets the batch and the longest request) or ``length_dist`` and ``length_seed``
    (``--lengths``)."""
    if args.seq_lens is None:
        dist, seed = args.lengths or (workloads.UNIFORM, 0)
        return args.batch or [1], args.ctx or [8192], dict(length_dist=dist, length_seed=seed)
    lens = args.seq_lens
    if args.lengths is not None:
        raise SplitlabError(f"--lengths={args.lengths[0]} is not allowed with --seq-lens; expected one of them "
                            "(--seq-lens gives the lengths, --lengths draws them)")
    if args.ctx is not None:
        raise SplitlabError(f"--ctx={','.join(map(str, args.ctx))} is not allowed with --seq-lens; expected one of "
                            "them (the longest of --seq-lens is the context)")
    if args.batch is not None and args.batch != [len(lens)]:
        raise SplitlabError(f"--batch={','.join(map(str, args.batch))} is not allowed with --seq-lens of "
                            f"{len(lens)} lengths; expected --batch {len(lens)} or no --batch")
    if kind == "sparse_mla":
        raise SplitlabError("--seq-lens is not allowed for kind sparse_mla; expected --lengths DIST[:SEED] (a sparse "
                            "batch's valid top-k per token is drawn)")
    return [len(lens)], [max(lens)], dict(seq_lens=lens)


def _build_workloads(args: argparse.Namespace) -> list[workloads.DecodeWorkload]:
    if args.workload and args.kind:
        raise SplitlabError(f"--kind={args.kind} is not allowed with --workload={args.workload}; expected one of "
                            "them (a preset sets its kind)")
    if not args.workload and not args.kind:
        raise SplitlabError("--workload or --kind is required; workloads: " + ", ".join(workloads.names()))
    kind = workloads.get(args.workload).kind if args.workload else args.kind
    if args.topk is not None and kind != "sparse_mla":
        raise SplitlabError(f"--topk={args.topk} is not allowed for kind {kind}; expected it only with sparse_mla")
    mla = kind != "gqa"

    def given(value: int | None, default: int) -> int:  # a flag given as 0 is refused, never replaced
        return default if value is None else value

    batches, ctxs, lengths = _batch_shape(args, kind)
    out = []
    for batch in batches:
        for ctx in ctxs:
            if args.workload:
                w = workloads.get(args.workload, batch=batch, ctx_len=ctx, dtype=args.dtype,
                                  page_size=args.page_size, topk=args.topk)
                changes = {k: v for k, v in (("num_q_heads", args.heads), ("num_kv_heads", args.kv_heads),
                                             ("head_dim_qk", args.head_dim), ("head_dim_v", args.head_dim_v))
                           if v is not None}
                out.append(w.with_(**changes, **lengths))
                continue
            head_dim = given(args.head_dim, 576 if mla else 128)
            out.append(workloads.DecodeWorkload(
                kind=kind, batch=batch, num_q_heads=given(args.heads, 128 if mla else 32),
                num_kv_heads=given(args.kv_heads, 1 if mla else 8), head_dim_qk=head_dim,
                head_dim_v=given(args.head_dim_v, 512 if mla else head_dim), ctx_len=ctx,
                page_size=given(args.page_size, 1 if kind == "sparse_mla" else 16),
                topk=given(args.topk, 2048 if kind == "sparse_mla" else 0), dtype=args.dtype, **lengths))
    return out


def plan_rows(ws: Sequence[workloads.DecodeWorkload], devs: Sequence[devices.DeviceSpec],
              names: Sequence[str]) -> list[dict]:
    """One row per (workload, device, planner): the plan and its wave statistics on splitlab's kernel. A planner
    that does not cover the workload's kind, or refuses the workload (outside its rule's domain), gets a row
    without a plan whose ``note`` says why. ``fitted_range``, for a plan of a planner whose constants are fitted on
    data (``splitlab``): ``ok``, or ``outside: ...`` naming what of the shape or device lies outside that data
    (``planners.fitted_range``); None for the others."""
    from splitlab.planners import fitted_range

    rows = []
    for w in ws:
        for dev in devs:
            for name in names:
                row = dict(device=dev.name, sms=dev.sm_count, planner=name, kind=w.kind, batch=w.batch,
                           heads=w.num_q_heads, kv_heads=w.num_kv_heads, ctx_len=w.ctx_len, topk=w.topk,
                           length_dist=w.length_dist, length_seed=w.length_seed, seq_lens=w.seq_lens,
                           **workloads.length_columns(w), fitted_range=None)
                if w.kind not in planners.entry(name).kinds:
                    rows.append(row | dict(num_splits=None, note=f"does not cover {w.kind}"))
                    continue
                try:
                    p = planners.plan(w, dev, name)
                except SplitlabError as e:
                    rows.append(row | dict(num_splits=None, note=f"refused: {e}"))
                    continue
                ws_ = waves.wave_stats(w, p.num_splits, dev.sm_count, block_h=p.block_h)
                rows.append(row | dict(num_splits=p.num_splits, block_n=p.block_n, block_k=p.block_k,
                                       block_h=p.block_h, kv_chunk=p.kv_chunk, ctas=ws_.ctas, waves=round(ws_.waves, 3),
                                       last_wave_fill=round(ws_.last_wave_fill, 3), note=p.note,
                                       fitted_range=fitted_range.check(w, dev, name)))
    return rows


#: Text columns, left-aligned (the others are right-aligned).
TEXT_COLUMNS = ("fitted_range", "note")


def _print_table(rows: list[dict], cols: list[str]) -> None:
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in cols] for r in rows]
    width = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]

    def line(values: list[str]) -> str:
        return "  ".join(v.ljust(w) if c in TEXT_COLUMNS else v.rjust(w)
                         for c, v, w in zip(cols, values, width, strict=True)).rstrip()

    print(line(cols))
    for x in cells:
        print(line(x))


def cmd_devices(args: argparse.Namespace) -> int:
    rows = [dict(name=d.name, vendor=d.vendor, arch=d.arch, sms=d.sm_count, hbm_gbps=d.hbm_gbps,
                 l2_mb=d.l2_mb, bf16_tflops=d.bf16_tflops, aliases=",".join(d.aliases), source=d.source)
            for d in devices.PRESETS.values()]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        _print_table(rows, ["name", "vendor", "arch", "sms", "hbm_gbps", "l2_mb", "bf16_tflops", "aliases"])
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from splitlab import results

    if args.markdown:
        print(results.schema_markdown(), end="")
    elif args.json:
        print(json.dumps(results.schema_rows(), indent=1))
    else:
        import shutil
        import textwrap

        rows = results.schema_rows()
        cols = ["column", "dtype", "unit", "required"]
        width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
        indent = sum(width.values()) + 2 * len(cols)
        wrap = max(40, shutil.get_terminal_size((120, 24)).columns - indent)  # the meaning, wrapped beside the rest
        print(f"# result schema {results.SCHEMA_VERSION}: one row per measured point (docs/schema.md)")
        print("  ".join(c.ljust(width[c]) for c in cols) + "  meaning")
        for r in rows:
            lines = textwrap.wrap(r["meaning"], wrap) or [""]
            print("  ".join(r[c].ljust(width[c]) for c in cols) + "  " + lines[0])
            for more in lines[1:]:
                print(" " * indent + more)
    return 0


def _print_constants(ws: Sequence[workloads.DecodeWorkload], devs: Sequence[devices.DeviceSpec],
                     names: Sequence[str]) -> None:
    """One comment line per device (and family): which constants the ``splitlab`` planner took, and why those."""
    if "splitlab" not in names:
        return
    from splitlab.planners.splitlab import constants_for

    for dev in devs:
        for kind in dict.fromkeys(w.kind for w in ws):
            print(f"# splitlab constants for {dev.name} ({kind}): {constants_for(dev, kind).text}")


#: ``splitlab plan`` prints splitlab's schedule of a batch up to this many requests (the scheduler prices its
#: candidates in Python: milliseconds at hundreds of requests; ``splitlab schedule`` makes any batch's).
PLAN_SCHEDULE_MAX_BATCH = 4096


def _print_schedules(ws: Sequence[workloads.DecodeWorkload], devs: Sequence[devices.DeviceSpec],
                     names: Sequence[str]) -> None:
    """One comment line per batch and device: the schedule splitlab's scheduler makes of it (its slots, CTAs,
    items, busiest slot, partial rows) and its modelled time against the uniform schedule at the ``splitlab``
    planner's split count (what the split-count kernel runs)."""
    if "splitlab" not in names:
        return
    from splitlab.planners import schedulers

    for w in ws:
        if w.batch > PLAN_SCHEDULE_MAX_BATCH:
            continue
        for dev in devs:
            s = schedulers.splitlab(w, dev)
            n = planners.plan(w, dev, "splitlab").num_splits
            if n is None:
                continue
            from splitlab.planners import splitlab as rule

            c = rule.constants_for(dev, w.kind).constants
            u = schedulers.uniform(list(w.lengths), n, request_major=rule.REQUEST_MAJOR[w.kind])
            groups = schedulers.head_groups(w)
            summary = s.summary()
            print(f"# splitlab schedule, {dev.name}, batch {w.batch}: {s.scheduler}, {s.ctas} slots x {groups} = "
                  f"{s.ctas * groups} CTAs, {summary['items']} items, busiest slot {summary['busiest_keys']} keys, "
                  f"{summary['partial_rows']} partial rows; modelled "
                  f"{schedulers.modelled_time(s, w, dev.sm_count, c, dev.arch):.1f} against "
                  f"{schedulers.modelled_time(u, w, dev.sm_count, c, dev.arch):.1f} at the split count {n} "
                  "(key tiles; splitlab schedule lists the items)")


def cmd_plan(args: argparse.Namespace) -> int:
    from splitlab.planners.splitlab import using_constants

    with using_constants(args.constants, arg="--constants") as given:
        return _plan(args, given)


def _plan(args: argparse.Namespace, given=None) -> int:
    devs = [devices.get(d) for d in split_list("--device", args.device, "preset names")]
    if given is not None and given.device not in {d.name for d in devs}:
        raise SplitlabError(f"--constants={args.constants!r} holds constants fitted for {given.device}; expected "
                            f"--device {given.device} among the devices (a file applies to the device it was fitted "
                            "for)")
    from splitlab.planners.splitlab import ENV_CONSTANTS, env_constants

    for fc in env_constants().values():  # refused as --constants is: a file applies to the device it was fitted for
        if fc.device not in {d.name for d in devs}:
            raise SplitlabError(f"{ENV_CONSTANTS}={str(fc.path)!r} holds constants fitted for {fc.device}; expected "
                                f"--device {fc.device} among the devices (a file applies to the device it was fitted "
                                "for)")
    every = args.planner == "all"
    names = planners.names() if every else [planners.entry(p).name
                                            for p in split_list("--planner", args.planner, "planner names or all")]
    n_rows = len(args.batch or [1]) * len(args.ctx or [1]) * len(devs) * len(names)
    if n_rows > MAX_PLAN_ROWS:
        raise SplitlabError(f"--batch, --ctx, --device and --planner make {n_rows} rows; expected at most "
                            f"{MAX_PLAN_ROWS} (give shorter lists)")
    ws = _build_workloads(args)
    kinds = {w.kind for w in ws}
    if every:
        names = [n for n in names if kinds & set(planners.entry(n).kinds)]
    else:
        for n in names:
            if not kinds & set(planners.entry(n).kinds):
                raise SplitlabError(f"--planner={n} is not allowed for kind {', '.join(sorted(kinds))}; expected a "
                                    f"planner covering it: {', '.join(planners.names(next(iter(kinds))))}")
    rows = plan_rows(ws, devs, names)
    refused = [r for r in rows if r["num_splits"] is None]
    if not every and len(refused) == len(rows):  # the planners asked for refuse every workload
        raise SplitlabError(f"--planner={args.planner}: {refused[0]['note']}")
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("# ctas, waves, last_wave_fill: splitlab's kernel launched at the plan (modelled, 1 CTA per SM)")
    fitted = any(r["fitted_range"] is not None for r in rows)
    ragged = any(r["ctx_mean"] != r["ctx_max"] for r in rows)  # then the lengths' mean and longest (sparse: top-k)
    _print_table([r | dict(ctx_mean=round(r["ctx_mean"], 1)) for r in rows],
                 ["device", "sms", "planner", "kind", "batch", "heads", "ctx_len"]
                 + (["ctx_mean", "ctx_max"] if ragged else [])
                 + ["num_splits", "block_k", "block_h", "ctas", "waves", "last_wave_fill"]
                 + (["fitted_range"] if fitted else []) + (["note"] if args.notes or refused else []))
    _print_constants(ws, devs, names)
    _print_schedules(ws, devs, names)
    if any(str(r["fitted_range"]).startswith("outside") for r in rows):
        print("# fitted_range outside: the shape or device lies outside the data the planner's constants were fitted "
              "on; its plan is an extrapolation")
    return 0


#: ``splitlab schedule --scheduler`` (``planners.schedulers.NAMES``, restated so that the parser needs no planner
#: import; ``tests/test_cli.py`` holds the two equal).
SCHEDULERS = ("splitlab", "uniform", "balanced", "stream_k", "flashinfer", "flashmla")
#: ``splitlab schedule``: the largest split count and CTA count asked for, and the most items it prints.
MAX_SCHEDULE_SPLITS, MAX_SCHEDULE_CTAS, MAX_SCHEDULE_ITEMS = 1 << 16, 1 << 20, 1 << 20


def cmd_schedule(args: argparse.Namespace) -> int:
    from splitlab.planners import schedulers

    dev = devices.get(args.device)
    if args.batch is not None and len(args.batch) > 1 or args.ctx is not None and len(args.ctx) > 1:
        raise SplitlabError("--batch and --ctx take one value each with schedule; expected one batch")
    (w,) = _build_workloads(args)
    if w.batch * max(1, args.num_splits or 1) > MAX_SCHEDULE_ITEMS:
        raise SplitlabError(f"--batch {w.batch} x --num-splits {args.num_splits} items is not allowed; expected at "
                            f"most {MAX_SCHEDULE_ITEMS}")
    s = schedulers.schedule(w, dev, args.scheduler, num_splits=args.num_splits, ctas=args.ctas)
    if args.json:
        print(json.dumps(dict(s.to_json(), device=dev.name, kind=w.kind)))
        return 0
    summary = s.summary()
    per_cta = [s.cta_offsets[c + 1] - s.cta_offsets[c] for c in range(s.ctas)]
    print(f"# {dev.name} ({dev.sm_count} SMs), {w.kind} {w.num_q_heads}/{w.num_kv_heads}, batch {w.batch}, "
          f"keys {min(w.lengths)}-{max(w.lengths)} (mean {sum(w.lengths) / w.batch:.0f})")
    _print_table([dict(summary, mean_keys_per_cta=round(sum(s.cta_keys) / s.ctas),
                       items_per_cta=f"{min(per_cta)}-{max(per_cta)}")],
                 ["scheduler", "ctas", "items", "items_per_cta", "partial_rows", "max_partials", "busiest_keys",
                  "mean_keys_per_cta", "persistent", "schedule_hash"])
    if s.params:
        print("# " + ", ".join(f"{k}={v}" for k, v in s.params.items()))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    names = split_list("--suite", args.suite, "suite names")
    out_dir("--out", args.out, create=False)
    if not torch.cuda.is_available():
        raise SplitlabError("bench needs a GPU; torch sees none")
    from splitlab.bench import decode

    known = list(decode.suites(True))
    for n in names:
        if n not in known:
            raise SplitlabError(f"--suite={n!r} is not allowed; expected any of {', '.join(known)}")
    rows = decode.run(names, out_dir("--out", args.out), quick=args.quick, with_flex=not args.no_flex,
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


#: ``--dask-scheduler``: a Dask address, ``[scheme://]host:port``.
SCHEDULER_SCHEMES = ("tcp", "tls", "ucx", "ws", "wss")
_ADDRESS = re.compile(r"^(?:(?P<scheme>[A-Za-z0-9+.-]+)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)"
                      r":(?P<port>\d{1,5})$")


def _address(text: str) -> str:
    m = _ADDRESS.match(text)
    allowed = f"a Dask scheduler address [scheme://]host:port, scheme one of {', '.join(SCHEDULER_SCHEMES)} " \
        "(e.g. tcp://10.0.0.5:8786)"
    if m is None or (m["scheme"] or "tcp").lower() not in SCHEDULER_SCHEMES or not 1 <= int(m["port"]) <= 65535:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not allowed; expected {allowed}")
    return text


def cmd_sweep(args: argparse.Namespace) -> int:
    import os

    from splitlab.bench import cards

    # What can be refused without torch, Triton or the card's kernel (seconds to import) is refused first.
    if args.device is not None:
        devices.get(args.device)  # '' too: the preset named, or the one-line error
    cards.check_grid(cards.find(args.card), args.grid)
    out_dir("--out", args.out, create=False)
    import torch

    if not torch.cuda.is_available():  # kernels then run under Triton's interpreter (set before they import)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from splitlab.bench import sweep

    card = cards.load(args.card)
    card.grid(args.grid)
    out = out_dir("--out", args.out, create=not args.dry_run)
    opts = sweep.SweepOptions(grid=args.grid, out=out, timer=args.timer, resume=args.resume,
                              device=args.device, limit=args.limit, max_minutes=args.max_minutes,
                              shard=args.shard, quiet=args.quiet, argv=args.argv, skip_bad_lines=args.skip_bad_lines,
                              timelines=args.timelines,
                              **({} if args.point_timeout is None else {"point_timeout_s": args.point_timeout}))
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
    if res.stopped == "interrupted":  # Ctrl-C or SIGTERM mid-point: the work is kept, the exit says it stopped
        print("splitlab: interrupted; run the same command with --resume to go on", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _print_sweep_result(res, who: str) -> None:
    """One line: what this session (or Dask run) wrote, and how far the sweep is."""
    counts = ", ".join(f"{k} {v}" for k, v in sorted(res.statuses.items())) or "nothing to do"
    print(f"sweep {res.sweep_id} in {res.sweep_dir}: {who} {counts}; {res.done}/{res.total} points done"
          + (f", {res.left} left (stopped: {res.stopped}; run the same command with --resume)" if res.left else ""))


def cmd_fit(args: argparse.Namespace) -> int:
    from splitlab import fit

    return fit.run(args)


def cmd_regress(args: argparse.Namespace) -> int:
    from splitlab import regress

    return regress.run(args)


def _add_loop_commands(sub) -> None:
    """``fit`` and ``regress``: a team's loop on its own GPU (sweep, fit, plan, gate)."""
    f = sub.add_parser("fit", help="fit the splitlab planner's constants on a result set (no GPU needed)")
    add_fit_arguments(f)
    f.set_defaults(fn=cmd_fit)

    from splitlab.regress import add_arguments

    g = sub.add_parser("regress", help="gate a candidate's split choices against a baseline's: exit 1 on a regression")
    add_arguments(g)
    g.set_defaults(fn=cmd_regress)


def _add_plugin_flags(p: argparse.ArgumentParser, sub) -> None:
    """``--plugin MODULE`` before the command and on every command (``splitlab.plugins``)."""
    text = ("import this module (a name or a .py file) first, so its planners and kernels take part; repeatable; "
            "also SPLITLAB_PLUGINS=mod1,mod2")
    p.add_argument("--plugin", action="append", metavar="MODULE", help=text)
    for sp in dict.fromkeys(sub.choices.values()):
        sp.add_argument("--plugin", dest="plugin_here", action="append", default=[], metavar="MODULE", help=text)


def _add_workload_flags(p: argparse.ArgumentParser) -> None:
    """The flags that describe a workload, shared by ``plan`` and ``schedule``."""
    p.add_argument("--workload", help="model preset: " + ", ".join(workloads.names()))
    p.add_argument("--kind", choices=workloads.KINDS)
    p.add_argument("--batch", type=int_list_type(1, LIMITS["batch"]),
                    help=f"requests (sparse: query tokens), 1..{LIMITS['batch']}; list: 1,2,8 (default 1)")
    p.add_argument("--ctx", type=int_list_type(1, LIMITS["ctx_len"], sizes=True),
                    help="keys per request, the longest of a ragged batch (sparse: pool size), "
                    f"1..{LIMITS['ctx_len']}; list; sizes: 32k,128K,1M (default 8192)")
    p.add_argument("--lengths", type=lengths_type, metavar="DIST[:SEED]",
                    help="a ragged batch: each request's keys (sparse: valid top-k) drawn from a named distribution "
                    f"({', '.join(workloads.LENGTH_DISTS)}) with SEED (default 0), the longest exactly --ctx "
                    "(sparse: --topk)")
    p.add_argument("--seq-lens", type=seq_lens_type, metavar="L1,L2,...",
                    help="a ragged batch given request by request (keys each, 0 allowed; sizes: 32k); sets --batch "
                    "(give none or the same count) and the context (its longest); not for sparse_mla")
    p.add_argument("--heads", type=int_type(1, LIMITS["num_q_heads"]), help="query heads (overrides the preset)")
    p.add_argument("--kv-heads", type=int_type(1, LIMITS["num_kv_heads"]))
    p.add_argument("--head-dim", type=int_type(1, LIMITS["head_dim_qk"]), help="head dim of q/k")
    p.add_argument("--head-dim-v", type=int_type(1, LIMITS["head_dim_v"]))
    p.add_argument("--topk", type=int_type(1, LIMITS["topk"], sizes=True),
                    help="candidates per query token (sparse_mla only); 2048 or 2k")
    p.add_argument("--page-size", type=int_type(1, LIMITS["page_size"], sizes=True), help="keys per page")
    p.add_argument("--dtype", default="bf16", choices=workloads.DTYPES)


def build_parser() -> argparse.ArgumentParser:
    import splitlab

    p = OneLineParser(prog="splitlab", description=splitlab.__doc__.strip(),
                      epilog="`splitlab COMMAND -h`: a command's flags. README.md: the workflow.")
    p.add_argument("--version", action="store_true", help="print splitlab's version and exit")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=OneLineParser)  # none: the help

    d = sub.add_parser("devices", help="list device presets")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_devices)

    sc = sub.add_parser("schema", help="the result columns: type, unit, meaning (docs/schema.md)")
    fmt = sc.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="as Markdown: docs/schema.md is this output")
    fmt.add_argument("--json", action="store_true")
    sc.set_defaults(fn=cmd_schema)

    pl = sub.add_parser("plan", help="what each planner picks for a workload on each device")
    _add_workload_flags(pl)
    pl.add_argument("--device", default="h200", help="preset name(s), comma-separated: " + ", ".join(devices.names()))
    pl.add_argument("--planner", default="all", help="planner name(s) or all: " + ", ".join(planners.names()))
    pl.add_argument("--json", action="store_true", help="machine-readable rows (with each adapter's note)")
    pl.add_argument("--notes", action="store_true", help="add each adapter's note: how it mapped the workload")
    pl.add_argument("--constants", metavar="FILE", help="the splitlab planner takes this constants file (splitlab "
                    "fit --out) for the device it was fitted for, in place of the shipped ones")
    pl.set_defaults(fn=cmd_plan)

    sd = sub.add_parser("schedule", help="the work items a scheduler deals one batch's keys into (no GPU needed)")
    _add_workload_flags(sd)
    sd.add_argument("--device", default="h200", help="one preset name: " + ", ".join(devices.names()))
    sd.add_argument("--scheduler", default="splitlab", choices=SCHEDULERS,
                    help="who deals the keys (default splitlab: its cost model's choice)")
    sd.add_argument("--num-splits", type=int_type(1, MAX_SCHEDULE_SPLITS), help="uniform: chunks per request "
                    "(default: the splitlab planner's split count)")
    sd.add_argument("--ctas", type=int_type(1, MAX_SCHEDULE_CTAS), help="balanced, stream_k: CTAs per head group "
                    "(default: the device's slots for the tile)")
    sd.add_argument("--json", action="store_true", help="one object: scheduler, ctas, items [cta, request, "
                    "key_begin, key_end], partials per request, the summary")
    sd.set_defaults(fn=cmd_schedule)

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
    sw.add_argument("--skip-bad-lines", action="store_true", help="keep the good lines of a damaged journal: its bad "
                    "lines are skipped and it is rewritten without them (the damaged file kept as *.damaged-*)")
    sw.add_argument("--timer", choices=("graph", "events", "fake"),
                    help="graph: CUDA-graph replay, rotated inputs; events: L2-flushed CUDA events; fake: modelled "
                    "times for CI, not measurements (default: the card's, or the resumed sweep's)")
    sw.add_argument("--device", help="plan for this preset, not the GPU torch sees: " + ", ".join(devices.names()))
    sw.add_argument("--limit", type=int_type(1), help="at most this many points in this session")
    sw.add_argument("--max-minutes", type=positive_float, help="start no new point after this many minutes")
    from splitlab.bench.worker import POINT_TIMEOUT_S

    sw.add_argument("--point-timeout", type=positive_float, metavar="SECONDS", help="a point running longer (check, "
                    f"compile, timing) is killed and stored as error (default {POINT_TIMEOUT_S:g})")
    sw.add_argument("--shard", type=_shard, help="i/n: run only shard i of n (whole shapes), one process per GPU, "
                    "each with --resume")
    par = sw.add_mutually_exclusive_group()
    par.add_argument("--workers", type=int_type(1, MAX_WORKERS), help="N: run on a local Dask cluster of N worker "
                     "processes, one per visible GPU (CPU workers where there is none); needs splitlab[dist]")
    par.add_argument("--dask-scheduler", dest="scheduler", type=_address,
                     help="ADDRESS: run on this Dask cluster (one single-threaded "
                     "worker per GPU, CUDA_VISIBLE_DEVICES set; see README); needs splitlab[dist]")
    sw.add_argument("--timelines", action="store_true", help="each work-list point (a scheduler's) that passed its "
                    "check and was timed runs once more recording every program's SM, start, end and work, kept in "
                    "<sweep>/timelines.parquet by point id (SM and times -1 without a GPU); split-count points and "
                    "kernels without a work-list launcher (peers) record nothing")
    sw.add_argument("--quiet", action="store_true", help="no progress output")
    sw.add_argument("--rows", type=int_type(0, MAX_ROWS), default=8, help="--dry-run: how many points to show")
    sw.set_defaults(fn=cmd_sweep)
    _add_loop_commands(sub)
    _add_plugin_flags(p, sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``splitlab`` with ``argv`` (default ``sys.argv[1:]``); return the exit code. No command prints the help
    (0), ``--version`` the version; a bad argument is one line on stderr and 2; Ctrl-C or SIGTERM one line and 130."""

    def body() -> int:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.version:
            from splitlab import __version__

            print(f"splitlab {__version__}")
            return 0
        if args.cmd is None:  # bare `splitlab`: what it can do
            parser.print_help()
            return 0
        args.argv = ["splitlab", *(sys.argv[1:] if argv is None else argv)]
        from splitlab import plugins

        plugins.load([*(args.plugin or []), *getattr(args, "plugin_here", [])])
        return args.fn(args)

    return run_main("splitlab", body)


if __name__ == "__main__":
    sys.exit(main())
