"""Where the time goes: per-program timelines and gap ledgers of splitlab's work-list decode, and what recording
them costs (issue 38). README.md states the question, the command and the files.

For each point (a shape, a batch's lengths, a scheduler's schedule): the work-list launcher is checked against the
fp64 reference; timed plain and with timelines on (``kernels.timeline``), each by CUDA-graph replay over input sets
rotated past the L2 (``bench.timing.time_graph``: the instrumented overhead against the <= 3% goal), then with the
partial kernel alone recording (``timed_partial_us``: each kernel's share of that overhead), with the builds that
hold a program's start time to its end (``timed_hold_us``: ``Timelines(hold_start=True)``, the other way to record)
and plain once more (``plain_again_us``: how far the plain timing moved meanwhile), and behind a GPU spin
(``plain_behind_us``: without the replay launch's latency from the host); then one graph
of [a marker kernel that records the clock, the instrumented decode] is replayed and its last replay's records
read: the anchor (the marker's clock), every program's SM, start and end. The gap ledger (``splitlab.ledger``) of the
point is the plain wall time against the floor, split with that timeline, the instrumented timing (its
``recording`` part) and the replay's share (``replay``: what the replay's launch exposes at the point, ``(plain -
behind) x sets`` over its rotated sets; the peers take the run's estimate from empty launches at 1 and 64 calls a
replay, ``replay_check``); the modelled timeline
(``planners.timeline``) of the same schedule is written beside each partial program. The peers (FlashInfer for GQA,
FlashMLA for MLA, where they import) are timed on the same inputs and get the peer ledger (wall time and grid).

    python experiments/timelines/collect.py run --out DIR [--budget-s 540] [--families gqa,mla] [--fmla .fmla]
    python experiments/timelines/collect.py run --dry-run --out DIR     # CPU: interpreter, tiny shapes, no timing
    python experiments/timelines/collect.py reledger DIR [--replay-cost-us C]   # CPU: the ledgers made again

``reledger`` makes a written set's ledger columns again with the current ``splitlab.ledger`` from its measured
columns and records (points without records: from their stored timeline parts), nothing measured changed: for a set
written before the ``sets``, ``replay_cost_us`` and ``recording`` columns existed, ``sets`` is what
``rotated_inputs`` chose (``sets_of``) and the replay's cost ``ledger.REPLAY_COST_US`` (the timer check), labelled so.

``--dry-run`` runs every code path but the GPU's on the CPU (Triton's interpreter, three tiny shapes): the records
hold no clock (SM and times -1), nothing is timed, and no ledger is made (its rows say why); tests/test_timeline_
collect.py runs it.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

if "--dry-run" in sys.argv[1:]:  # Triton takes the interpreter from the environment when it is imported
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import globaltimer  # noqa: E402

from splitlab import ledger as _ledger  # noqa: E402  (pure Python)

#: Measured columns a set written before them lacks (``reledger`` writes them only where the set has them).
LATER_MEASURED = ("timed_partial_us", "timed_hold_us", "plain_again_us", "plain_behind_us")
#: The GPU spin each replay of the ``plain_behind_us`` timing is queued behind (``time_graph(behind_us=)``): long
#: enough for the host to launch the replay before the GPU reaches it.
BEHIND_US = 100.0
#: ``replay_cost_source`` of a replay cost measured at its own point: ``(plain - behind) x sets``, at least 0.
AT_POINT = "measured at the point"
POINT_FIELDS = ["shape", "kind", "batch", "longest", "dist", "scheduler", "schedule_hash", "ctas", "items",
                "partial_rows", "programs", "merge_programs", "rel_err", "status", "plain_us", "plain_p20_us",
                "plain_p80_us", "timed_us", "timed_p20_us", "timed_p80_us", "overhead",
                "timed_partial_us", "timed_hold_us", "plain_again_us", "plain_behind_us", "launch_pair_us", "sets",
                "replay_cost_us", "replay_cost_source", "floor_us", "partial_bytes", "model_launch", "model_tail",
                "model_units", "clock_step_ns", "model_err_median", "measured_us", "gap_us", "launch_us", "idle_us",
                "merge_us", "below_peak_us", "extra_bytes_us", "recording_us", "replay_us", "unexplained_us",
                "modelled", "unmeasured", "note"]
TIMELINE_FIELDS = ["shape", "batch", "longest", "dist", "scheduler", "schedule_hash", "kernel", "program", "sm",
                   "start_ns", "end_ns", "slot", "group", "item", "items", "anchor_ns", "model_place", "model_sm",
                   "model_start", "model_end"]
PEER_FIELDS = ["shape", "kind", "batch", "longest", "dist", "impl", "status", "us", "p20_us", "p80_us", "programs",
               "slots", "sets", "floor_us", "measured_us", "gap_us", "launch_us", "idle_us", "replay_us", "rest_us",
               "modelled", "unmeasured", "note"]
#: The columns ``reledger`` writes again (derived from the measured ones; every other column is kept as read).
POINT_LEDGER = ["sets", "replay_cost_us", "replay_cost_source", "measured_us", "gap_us",
                *(f"{p}_us" for p in _ledger.PARTS), "modelled", "unmeasured"]
PEER_LEDGER = ["sets", "measured_us", "gap_us", *(f"{p}_us" for p in _ledger.PEER_PARTS), "modelled", "unmeasured"]
#: The calls a replay of the empty-launch graphs that measure the replay's fixed cost (``replay_check``).
REPLAY_FEW, REPLAY_MANY = 1, 64
#: The H200 subset: (label, kind, q heads, kv heads, head dims, page) x batches x longest x length distributions.
SHAPES = [("32/8", "gqa", 32, 8, (128, 128), 16), ("128/1", "gqa", 128, 1, (128, 128), 16),
          ("mla16", "mla", 16, 1, (576, 512), 64)]
BATCHES, LONGEST, DISTS = (16, 64), (8192, 32768), ("uniform", "spread16", "longtail")
#: --dry-run's tiny shapes (interpreter): the same families and code paths at a few hundred keys.
DRY = [("4/2", "gqa", 4, 2, (16, 16), 16), ("mla16-tiny", "mla", 16, 1, (96, 64), 64)]


def shapes_of(dry: bool, families: set[str]):
    from splitlab.workloads import DecodeWorkload

    shapes = DRY if dry else SHAPES
    batches, longest, dists = ((3,), (200,), ("uniform", "longtail")) if dry else (BATCHES, LONGEST, DISTS)
    for label, kind, hq, hkv, (dqk, dv), page in shapes:
        if kind not in families:
            continue
        for b in batches:
            for n in longest:
                for dist in dists:
                    seed = 0 if dist == "uniform" else b + n
                    yield label, dist, DecodeWorkload(kind, b, hq, hkv, dqk, dv, n, page_size=page, length_dist=dist,
                                                      length_seed=seed)


def schedules(w, dev):
    """(label, schedule) of every point of ``w``: splitlab's scheduler, and the uniform split of the fitted plan."""
    from splitlab.planners import schedulers as S
    from splitlab.planners import splitlab as rule

    out = {"splitlab": S.splitlab(w, dev),
           "uniform": S.uniform(list(w.lengths), rule.fitted_plan(w, dev).num_splits,
                                request_major=rule.REQUEST_MAJOR[w.kind])}
    seen, res = set(), []
    for name, s in out.items():
        if s.digest not in seen:
            seen.add(s.digest)
            res.append((name, s))
    return res


def decode_call(w, wl, x, timelines=None):
    from splitlab.kernels.worklist import gqa_decode_scheduled, mla_decode_scheduled

    if w.kind == "gqa":
        return lambda: gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"], wl,
                                            timelines=timelines)
    return lambda: mla_decode_scheduled(x["q"], x["kv_cache"], x["block_table"], wl, head_dim_v=w.head_dim_v,
                                        timelines=timelines)


@triton.jit
def mark(buf_ptr):
    """One program that writes the GPU clock (``%globaltimer``, ns) into ``buf[0]``: the anchor launched just before
    a recorded decode (the ledger's launch part starts there), and an empty launch to time."""
    tl.store(buf_ptr, globaltimer())


def moved_bytes(w, s) -> int:
    """Bytes the partial kernel moves, as the ledger counts them: the cache's unique bytes (``kv_bytes``), q, the
    block table (4 bytes a page), and the partial rows written (fp32 values and lse per head)."""
    q = w.batch * w.num_q_heads * w.head_dim_qk * 2
    table = sum(-(-n // w.page_size) for n in w.lengths) * 4
    return w.kv_bytes + q + table + s.partial_rows * w.num_q_heads * (w.head_dim_v * 4 + 4)


def sets_of(w, l2_bytes: int) -> int:
    """The input sets ``bench.decode.rotated_inputs`` rotates through for ``w`` (the calls a timing's graph replay
    holds): ``timing.rotations`` of the bytes a call reads, the smaller of a set's bytes and ``kv_bytes``, which is
    ``kv_bytes`` (a set holds the cache's whole pages, q and the block table besides)."""
    from splitlab.bench.timing import rotations

    return rotations(w.kv_bytes, l2_bytes)


def replay_check(call) -> dict[str, float]:
    """The CUDA-graph replay's fixed cost (us), measured: ``time_graph`` of ``call`` (two empty launches) at
    ``REPLAY_FEW`` and ``REPLAY_MANY`` calls a replay (``ledger.replay_cost``), and at 8 (``launch_pair_us``, the
    peers' launch cost with 1/8 of the replay's in it)."""
    from splitlab.bench.timing import time_graph

    t = {k: time_graph([call] * k, replays=100).p50_us for k in (REPLAY_FEW, 8, REPLAY_MANY)}
    cost = _ledger.replay_cost(t[REPLAY_FEW], t[REPLAY_MANY], few=REPLAY_FEW, many=REPLAY_MANY)
    return dict(replay_cost_us=cost, launch_pair_us=t[8], **{f"pair_x{k}_us": v for k, v in t.items()})


def run(args) -> None:
    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--dry-run needs Triton's interpreter: pass --dry-run on the command line (it is set "
                         "before triton is imported), or TRITON_INTERPRET=1")
    import torch

    from splitlab import devices, ledger, workloads
    from splitlab.bench.decode import rotated_inputs
    from splitlab.bench.timing import time_graph
    from splitlab.kernels import reference
    from splitlab.kernels.accuracy import TOLERANCE, rel_err
    from splitlab.kernels.timeline import Timelines, clock_on
    from splitlab.kernels.worklist import WorkList
    from splitlab.planners import schedulers as S
    from splitlab.planners.timeline import modelled_timeline

    dry = args.dry_run
    if args.fmla and not dry:
        from splitlab.bench.peers_flashmla import load_kit

        load_kit(args.fmla)
    device = "cpu" if dry else "cuda"
    dev = devices.get("h200") if dry else devices.detect()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(device="cpu (interpreter, dry run)" if dry else torch.cuda.get_device_name(), sms=dev.sm_count,
               preset=dev.name, torch=torch.__version__, triton=__import__("triton").__version__,
               cuda=torch.version.cuda, argv=sys.argv, dry_run=dry)
    launch_pair = replay_c = None
    if not dry:  # the fixed cost of two launches (partial + merge) and of a graph replay, from empty launches
        buf = torch.zeros(1, dtype=torch.int64, device=device)

        def pair():
            mark[(1,)](buf)
            mark[(1,)](buf)

        check = replay_check(pair)
        env["replay_check"] = {k: round(v, 4) for k, v in check.items()}
        launch_pair, replay_c = check["launch_pair_us"], check["replay_cost_us"]
        print(f"replay's fixed cost {replay_c:.2f} us, two empty launches {launch_pair:.3f} us a call at 8 a replay",
              flush=True)
    (out / "env.json").write_text(json.dumps(env, indent=1))
    files = {name: open(out / name, "w", newline="") for name in ("points.csv", "timelines.csv", "peers.csv")}
    pts = csv.DictWriter(files["points.csv"], POINT_FIELDS)
    tls = csv.DictWriter(files["timelines.csv"], TIMELINE_FIELDS)
    prs = csv.DictWriter(files["peers.csv"], PEER_FIELDS)
    for wr in (pts, tls, prs):
        wr.writeheader()
    l2 = 0 if dry else torch.cuda.get_device_properties(0).L2_cache_size
    t0 = time.time()
    for label, dist, w in shapes_of(dry, set(args.families.split(","))):
        if time.time() - t0 > args.budget_s:
            print("budget spent; stopping", flush=True)
            break
        sets = rotated_inputs(w, device=device, draw_on="cpu" if dry else "device", l2_bytes=l2,
                              sets=1 if dry else None)
        first = sets[0]
        ref = (reference.gqa_decode(**first) if w.kind == "gqa" else
               reference.mla_decode(**first, head_dim_v=w.head_dim_v))
        floor = workloads.floor_time_us(w, dev.roofline_gbps, dev.roofline_tflops)
        base = dict(shape=label, batch=w.batch, longest=w.ctx_len, dist=dist)
        for sched, s in schedules(w, dev):
            wl = WorkList.from_schedule(s, device)
            row = dict(base, kind=w.kind, scheduler=sched, schedule_hash=s.digest, ctas=s.ctas, items=len(s.items),
                       partial_rows=s.partial_rows, programs=s.ctas * S.head_groups(w), floor_us=round(floor, 3),
                       partial_bytes=moved_bytes(w, s), sets=len(sets))
            model = modelled_timeline(s, w, dev)
            row.update(model_launch=round(model.launch, 4), model_tail=round(model.tail, 4), model_units=model.units)
            err = rel_err(decode_call(w, wl, first)(), ref)
            row["rel_err"] = f"{err:.2e}"
            if not err <= TOLERANCE[first["q"].dtype]:
                row.update(status="wrong", note="not timed: wrong against fp64")
                pts.writerow(row)
                continue
            rec = Timelines()
            anchor = None
            if dry:
                decode_call(w, wl, first, rec)()
                row.update(status="dry-run", note="interpreter: no clock, not timed, no ledger")
            else:
                plain = time_graph([decode_call(w, wl, x) for x in sets])
                timed = time_graph([decode_call(w, wl, x, Timelines()) for x in sets])
                # The partial kernel recording alone (the merge's plain build), the builds that hold the start time
                # to the end, and the plain build once more: what each kernel's recording costs, what the other way
                # to record costs, and how far the plain timing moved meanwhile.
                part_only = time_graph([decode_call(w, wl, x, Timelines(kernels=("partial",))) for x in sets])
                held = time_graph([decode_call(w, wl, x, Timelines(hold_start=True)) for x in sets])
                plain_again = time_graph([decode_call(w, wl, x) for x in sets])
                # The plain graph queued behind a GPU spin: its time without the replay launch's latency from the
                # host, so (plain - behind) x sets is what a replay's launch exposes at this point: the ledger's
                # replay cost (the empty launches' estimate, replay_check, overstates it on a slow host).
                behind = time_graph([decode_call(w, wl, x) for x in sets], behind_us=BEHIND_US)
                replay_at = max(0.0, (plain.p50_us - behind.p50_us) * len(sets))
                # One graph of [marker, instrumented decode] per rotated set, as the plain timing ran them (each
                # set's inputs evicted from the L2 by the sets before it); the last set's records of the last
                # replay are the point's timeline.
                set_recs = [Timelines() for _ in sets[:-1]] + [rec]
                abufs = [torch.zeros(1, dtype=torch.int64, device=device) for _ in sets]

                def recorded(call, abuf):
                    def run():
                        mark[(1,)](abuf)
                        call()
                    return run

                time_graph([recorded(decode_call(w, wl, x, r), a) for x, r, a in zip(sets, set_recs, abufs,
                                                                                      strict=True)],
                           replays=3, warmup=1)
                torch.cuda.synchronize()
                anchor = int(abufs[-1].item())
                row.update(status="ok", plain_us=round(plain.p50_us, 3), plain_p20_us=round(plain.p20_us, 3),
                           plain_p80_us=round(plain.p80_us, 3), timed_us=round(timed.p50_us, 3),
                           timed_p20_us=round(timed.p20_us, 3), timed_p80_us=round(timed.p80_us, 3),
                           overhead=round(timed.p50_us / plain.p50_us - 1, 4), launch_pair_us=round(launch_pair, 3),
                           timed_partial_us=round(part_only.p50_us, 3), timed_hold_us=round(held.p50_us, 3),
                           plain_again_us=round(plain_again.p50_us, 3), plain_behind_us=round(behind.p50_us, 3),
                           replay_cost_us=round(replay_at, 3), replay_cost_source=AT_POINT)
            recs = rec.read()
            partial, merge = recs.get("partial", []), recs.get("merge", [])
            row["merge_programs"] = len(merge)
            by_prog = {p.program: p for p in model.programs}
            for kernel, rs in (("partial", partial), ("merge", merge)):
                for r in rs:
                    m = by_prog.get(r["program"]) if kernel == "partial" else None
                    tls.writerow(dict(base, scheduler=sched, schedule_hash=s.digest, kernel=kernel, **r,
                                      anchor_ns=anchor if anchor is not None else "",
                                      model_place=m.place if m else "", model_sm=m.sm if m else "",
                                      model_start=round(m.start, 4) if m else "",
                                      model_end=round(m.end, 4) if m else ""))
            if clock_on(device) and partial:
                starts = sorted({r["start_ns"] for r in partial})
                row["clock_step_ns"] = min((b - a for a, b in zip(starts, starts[1:], strict=False)), default="")
                led = ledger.ledger(partial, merge, wall_us=row["plain_us"], floor_us=floor, sm_count=dev.sm_count,
                                    bandwidth_gbps=dev.roofline_gbps, partial_bytes=row["partial_bytes"],
                                    anchor_ns=anchor, timed_us=row["timed_us"], sets=len(sets),
                                    replay_cost_us=replay_at)
                row.update({k: round(v, 3) if isinstance(v, float) else v for k, v in led.row().items()})
                errs = sorted(e["rel_err"] for e in ledger.program_errors(model, partial))
                row["model_err_median"] = round(errs[len(errs) // 2], 4) if errs else ""
            pts.writerow(row)
            files["points.csv"].flush()
            files["timelines.csv"].flush()
            print(f"[{time.time() - t0:5.0f}s] {label} B={w.batch} L={w.ctx_len} {dist} {sched}: "
                  f"{row.get('status')} plain {row.get('plain_us')} timed {row.get('timed_us')} "
                  f"unexplained {row.get('unexplained_us')}", flush=True)
        if not dry:
            peers(w, dev, base, first, sets, ref, floor, launch_pair, prs, replay_cost_us=replay_c)
            files["peers.csv"].flush()
        torch.cuda.empty_cache() if not dry else None
    for f in files.values():
        f.close()


def peer_parts(launch_pair: float, sets: int, replay_cost_us: float | None) -> dict[str, float | None]:
    """A peer ledger's measured inputs (``ledger.peer_ledger``): ``launch_us``, two empty launches a call without the
    replay's share (``launch_pair`` was timed at 8 calls a replay), and ``replay_us``, the share of the peer's own
    timing over ``sets`` calls a replay (without ``replay_cost_us``: the pair as timed, and None)."""
    if replay_cost_us is None:
        return dict(launch_us=launch_pair, replay_us=None)
    return dict(launch_us=launch_pair - _ledger.replay_share(replay_cost_us, 8),
                replay_us=_ledger.replay_share(replay_cost_us, sets))


def peers(w, dev, base, first, sets, ref, floor, launch_pair, writer, *, replay_cost_us=None) -> None:
    """Time the peers that import (FlashInfer's decode for GQA, FlashMLA for MLA) and write their peer ledgers: the
    grid is their own plan's, ported (``schedulers.flashinfer`` / ``flashmla``), one program per place (modelled);
    the launch and the replay's share as ``peer_parts`` has them."""
    from splitlab import ledger
    from splitlab.bench.timing import time_graph
    from splitlab.kernels.accuracy import TOLERANCE, rel_err
    from splitlab.planners import schedulers as S

    found = []
    try:
        if w.kind == "gqa":
            from splitlab.bench.peers_flashinfer import FLASHINFER_DECODE

            grid = S.flashinfer(list(w.lengths), page_size=w.page_size, num_kv_heads=w.num_kv_heads,
                                sm_count=dev.sm_count)
            found.append(("flashinfer", FLASHINFER_DECODE, grid.ctas * w.num_kv_heads))
        else:
            from splitlab.bench.peers_flashmla import FLASHMLA_DECODE
            from splitlab.planners.flashmla import num_sm_parts

            found.append(("flashmla", FLASHMLA_DECODE, num_sm_parts(dev.sm_count, w.num_q_heads, 1)))
    except ImportError as e:
        print("peer unavailable:", e, flush=True)
    for name, p, programs in found:
        row = dict(base, kind=w.kind, impl=name, programs=programs, slots=dev.sm_count, floor_us=round(floor, 3),
                   sets=len(sets))
        if p.unavailable() is not None:
            writer.writerow(dict(row, status="unavailable", note=str(p.unavailable())[:160]))
            continue
        try:
            err = rel_err(p.call(w, first, {})(), ref)  # call() plans and returns the launch
            if not err <= TOLERANCE[first["q"].dtype]:
                writer.writerow(dict(row, status="wrong", note=f"rel_err {err:.2e}"))
                continue
            t = time_graph([p.call(w, x, {}) for x in sets])
            led = ledger.peer_ledger(wall_us=t.p50_us, floor_us=floor, programs=programs, slots=dev.sm_count,
                                     **peer_parts(launch_pair, len(sets), replay_cost_us))
            writer.writerow(dict(row, status="ok", us=round(t.p50_us, 3), p20_us=round(t.p20_us, 3),
                                 p80_us=round(t.p80_us, 3),
                                 **{k: round(v, 3) if isinstance(v, float) else v for k, v in led.row().items()}))
        except Exception as e:  # a peer's refusal or failure: keep the reason, go on
            writer.writerow(dict(row, status="error", note=f"{type(e).__name__}: {str(e)[:160]}"))


def _read_csv(path: Path) -> tuple[list[dict[str, str]], str]:
    text = path.read_text()
    return list(csv.DictReader(text.splitlines())), "\r\n" if "\r\n" in text else "\n"


def _write_csv(path: Path, fields: list[str], rows: list[dict[str, str]], newline: str) -> None:
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fields, lineterminator=newline)
        wr.writeheader()
        wr.writerows(rows)


def _cells(led, keys: list[str]) -> dict[str, object]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in led.row().items() if k in keys}


def reledger(folder, *, replay_cost_us: float | None = None) -> dict[str, object]:
    """Make the ledger columns (``POINT_LEDGER``, ``PEER_LEDGER``) of a written set (``folder``: points.csv,
    timelines.csv or .csv.gz, peers.csv, env.json) again with the current ``splitlab.ledger``, every other column as
    read. A point with records gets ``ledger.ledger`` of them; one without (a shipped set's batch 64) gets
    ``ledger.ledger_from_parts`` of its stored timeline parts. ``sets``: as written, else ``sets_of`` at the device
    preset's L2. The replay's cost: ``replay_cost_us`` if given (labelled ``given``), else the point's own where it
    was measured at the point (``AT_POINT``), else the run's from empty launches where it was measured (the points'
    column, or ``env.json``'s ``replay_check``), else ``ledger.REPLAY_COST_US`` (labelled
    ``ledger.REPLAY_COST_SOURCE``); the peers take the run's. Returns how many points the ledger explains to 5% of the
    measured time, of how many."""
    import gzip

    from splitlab import devices, workloads

    folder = Path(folder)
    env = json.loads((folder / "env.json").read_text())
    dev = devices.get(env.get("preset") or "h200")
    l2 = round(dev.l2_mb * 2**20)  # (the L2 torch reports on the H200: 60 MiB)
    shapes = {(label, str(w.batch), str(w.ctx_len), dist): w for label, dist, w in shapes_of(False, {"gqa", "mla"})}
    recs: dict[tuple[str, ...], dict] = {}
    gz = folder / "timelines.csv.gz"
    text = gzip.open(gz, "rt").read() if gz.exists() else (folder / "timelines.csv").read_text()
    for r in csv.DictReader(text.splitlines()):
        d = recs.setdefault(tuple(r[k] for k in ("shape", "batch", "longest", "dist", "scheduler")),
                            dict(partial=[], merge=[], anchor=r["anchor_ns"]))
        d[r["kernel"]].append({k: int(r[k]) for k in ("program", "sm", "start_ns", "end_ns")})
    points, nl = _read_csv(folder / "points.csv")
    done = [r for r in points if r["status"] == "ok"]
    measured = [float(r["replay_cost_us"]) for r in done if r.get("replay_cost_source") == "measured"]
    measured += [float(env["replay_check"]["replay_cost_us"])] if "replay_check" in env else []
    if replay_cost_us is not None:
        cost, source = replay_cost_us, "given"
    elif measured:  # one measurement a run
        cost, source = measured[0], "measured"
    else:
        cost, source = _ledger.REPLAY_COST_US, _ledger.REPLAY_COST_SOURCE
    launch_pair = float(done[0]["launch_pair_us"]) if done else None  # one a run
    explained = 0
    for row in done:
        w = shapes[(row["shape"], row["batch"], row["longest"], row["dist"])]
        sets = int(row["sets"]) if row.get("sets") else sets_of(w, l2)
        floor = workloads.floor_time_us(w, dev.roofline_gbps, dev.roofline_tflops)
        if abs(floor - float(row["floor_us"])) > 1e-3:
            raise SystemExit(f"reledger: {row['shape']} B={w.batch}: the floor is {floor:.3f} us, the row's "
                             f"{row['floor_us']}; expected the collection's device preset ({dev.name})")
        at_point = replay_cost_us is None and row.get("replay_cost_source") == AT_POINT
        row_cost, row_source = (float(row["replay_cost_us"]), AT_POINT) if at_point else (cost, source)
        timings = dict(wall_us=float(row["plain_us"]), floor_us=floor, timed_us=float(row["timed_us"]), sets=sets,
                       replay_cost_us=row_cost)
        d = recs.get(tuple(row[k] for k in ("shape", "batch", "longest", "dist", "scheduler")))
        if d is not None:
            led = _ledger.ledger(d["partial"], d["merge"], sm_count=dev.sm_count, bandwidth_gbps=dev.roofline_gbps,
                                 partial_bytes=float(row["partial_bytes"]),
                                 anchor_ns=int(d["anchor"]) if d["anchor"] else None, **timings)
        else:
            led = _ledger.ledger_from_parts({p: float(row[f"{p}_us"]) for p in _ledger.TIMELINE_PARTS}, **timings)
        row.update(_cells(led, POINT_LEDGER), sets=sets, replay_cost_us=round(row_cost, 3),
                   replay_cost_source=row_source)
        explained += abs(led.parts["unexplained"]) <= 0.05 * led.measured_us
    had = set(points[0]) if points else set()
    _write_csv(folder / "points.csv", [f for f in POINT_FIELDS if f not in LATER_MEASURED or f in had], points, nl)
    peers_, nl = _read_csv(folder / "peers.csv")
    for row in peers_:
        if row["status"] != "ok" or launch_pair is None:
            continue
        w = shapes[(row["shape"], row["batch"], row["longest"], row["dist"])]
        sets = int(row["sets"]) if row.get("sets") else sets_of(w, l2)
        led = _ledger.peer_ledger(wall_us=float(row["us"]), programs=int(row["programs"]), slots=int(row["slots"]),
                                  floor_us=workloads.floor_time_us(w, dev.roofline_gbps, dev.roofline_tflops),
                                  **peer_parts(launch_pair, sets, cost))
        row.update(_cells(led, PEER_LEDGER), sets=sets)
    _write_csv(folder / "peers.csv", PEER_FIELDS, peers_, nl)
    return dict(points=len(done), explained=explained)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="collect timelines, timings and ledgers into OUT")
    r.add_argument("--out", required=True)
    r.add_argument("--budget-s", type=float, default=540.0, help="stop starting new shapes after this many seconds")
    r.add_argument("--families", default="gqa,mla")
    r.add_argument("--dry-run", action="store_true", help="CPU: the interpreter at tiny shapes, nothing timed")
    r.add_argument("--fmla", default="", help="build and import FlashMLA from this workplace kit folder (.fmla/)")
    g = sub.add_parser("reledger", help="make a written set's ledger columns again (CPU; measured columns kept)")
    g.add_argument("folder")
    g.add_argument("--replay-cost-us", type=float, default=None,
                   help="the graph replay's fixed cost to use (default: the run's own, else ledger.REPLAY_COST_US)")
    args = ap.parse_args(argv)
    if args.cmd == "reledger":
        got = reledger(args.folder, replay_cost_us=args.replay_cost_us)
        print(f"{got['explained']} of {got['points']} points within 5% of the measured time")
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
