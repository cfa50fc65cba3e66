"""A served step's timeline inside a CUDA graph, and a sweep's recorded timelines, checked on the GPU (issue 38 item 1:
``GQADecodePlan.run(..., timelines=t)`` / ``MLADecodePlan.run`` and ``splitlab sweep --timelines``). README.md
("Served steps and sweeps") states the commands.

``graph``: for GQA 32/8 and MLA-16 at 16 requests, a capacity plan (``use_cuda_graph=True``) is planned at half of a
longtail batch's lengths, run once with a ``Timelines`` outside the capture (the buffers are allocated then), one
``run(..., timelines=t)`` captured into a CUDA graph, the plan made again at the whole lengths (same batch), the
graph replayed: its output must equal the plain eager run of the new plan (bit for bit where the capture's merge
tile is the new plan's, else within fp32 rounding: ``same_merge_tile``, ``rel_diff``), and its records must be the
new plan's (one a program of its slots x head groups, none of the capacity's slots past its count; the merge's, all
of its grid), clocked (SM in range, start <= end, every clock past 0). Then the step is timed by CUDA-graph replay
with and without the timeline (``bench.timing.time_graph``): what recording a served step costs. One JSON line a
family into ``OUT/served.jsonl``.

``check-sweep FOLDER``: every work-list point of a sweep folder that is ``ok`` has one record set (its ``ctas``
partial programs, merge records where it has partial rows, clocked unless ``timing`` is ``fake``) and every
split-count point none; prints one JSON summary, exit code 1 on any problem.

``graph --dry-run`` runs the same path on the CPU (Triton's interpreter, tiny shapes): no capture (the replay is the
eager run), no clock, nothing timed; ``tests/test_timeline_served.py`` runs it and ``check-sweep``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if "--dry-run" in sys.argv[1:]:  # Triton takes the interpreter from the environment when it is imported
    os.environ["TRITON_INTERPRET"] = "1"

#: (label, kind, q heads, kv heads, head dims, page): the H200's shapes and --dry-run's tiny ones.
SHAPES = [("32/8", "gqa", 32, 8, (128, 128), 16), ("mla16", "mla", 16, 1, (576, 512), 64)]
DRY = [("4/2", "gqa", 4, 2, (16, 16), 16), ("mla16-tiny", "mla", 16, 1, (96, 64), 64)]
BATCH, LONGEST, DRY_BATCH, DRY_LONGEST = 16, 8192, 3, 300


def record_problems(recs: dict, programs: int, merge: bool, clocked: bool, sm_count: int) -> list[str]:
    """What is wrong with one launch's records: the partial programs ``0..programs-1`` once each, merge records
    iff ``merge``, and (``clocked``) every SM in range and every start <= end, past 0."""
    out = []
    part = recs.get("partial", [])
    if [r["program"] for r in part] != list(range(programs)):
        out.append(f"partial programs {len(part)}; expected 0..{programs - 1} once each")
    if bool(recs.get("merge")) != merge:
        out.append(f"merge records {len(recs.get('merge', []))}; expected {'some' if merge else 'none'}")
    for kernel, rs in recs.items():
        if clocked and any(not (0 <= r["sm"] < sm_count and 0 < r["start_ns"] <= r["end_ns"]) for r in rs):
            out.append(f"{kernel}: a record without a clock (SM outside 0..{sm_count - 1} or start > end)")
        if not clocked and any(r["start_ns"] != -1 for r in rs):
            out.append(f"{kernel}: a clock where none can be read")
    return out


def graph(args) -> None:
    import torch

    from splitlab import devices
    from splitlab.bench.timing import time_graph
    from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan
    from splitlab.kernels.inputs import workload_inputs
    from splitlab.kernels.timeline import Timelines, clock_on
    from splitlab.workloads import DecodeWorkload

    dry = args.dry_run
    device = "cpu" if dry else "cuda"
    dev = devices.get("h200") if dry else devices.detect()
    dtype = torch.float32 if dry else torch.bfloat16
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    batch, longest = (DRY_BATCH, DRY_LONGEST) if dry else (BATCH, LONGEST)
    with open(out_dir / "served.jsonl", "a") as f:
        for label, kind, hq, hkv, (dqk, dv), page in (DRY if dry else SHAPES):
            w = DecodeWorkload(kind, batch, hq, hkv, dqk, dv, longest, page_size=page, length_dist="longtail",
                               length_seed=1, dtype="fp32" if dry else "bf16")
            lens_b = list(w.lengths)
            lens_a = [n // 2 for n in lens_b]  # the capture's plan: B's table holds its keys
            x = workload_inputs(w, device=device, seed=1, draw_on="cpu" if dry else "device")
            if kind == "gqa":
                p = GQADecodePlan(hq, hkv, dqk, page, dtype=dtype, device=device, use_cuda_graph=True,
                                  max_batch=batch, device_spec=dev)
                args_ = (x["q"], x["k_cache"], x["v_cache"], x["block_table"])
            else:
                p = MLADecodePlan(hq, dqk, dv, page, dtype=dtype, device=device, use_cuda_graph=True,
                                  max_batch=batch, device_spec=dev)
                args_ = (x["q"], x["kv_cache"], x["block_table"])
            t = Timelines()
            out = torch.full((batch, hq, dv), float("nan"), dtype=dtype, device=device)
            lse = torch.full((batch, hq), float("nan"), dtype=torch.float32, device=device)

            def step(timelines=t, out=out, lse=lse, p=p, a=args_):
                return p.run(*a, out=out, lse=lse, return_lse=True, timelines=timelines)

            p.plan(lens_a)
            capture_merge = p._planned.merge_meta
            step()  # outside the capture: the buffers are allocated here
            if dry:
                p.plan(lens_b)
                step()  # no graph on the CPU: the replay is the eager run
            else:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    step()
                p.plan(lens_b)
                g.replay()
                torch.cuda.synchronize()
            s = p.schedule
            want_out, want_lse = p.run(*args_, return_lse=True)
            recs = t.read()
            row = dict(shape=label, kind=kind, batch=batch, longest=longest, scheduler=p.scheduler,
                       slots=s.ctas, capacity_slots=p.capacity.ctas, partial_rows=s.partial_rows,
                       programs=len(recs.get("partial", [])), merge_programs=len(recs.get("merge", [])),
                       bit_identical=bool(torch.equal(out, want_out) and torch.equal(lse, want_lse)),
                       # the replay merges with the capture's merge tile, the eager run with its own: bit for bit
                       # only where the two are the same tile, else within fp32 rounding (rel_diff)
                       same_merge_tile=capture_merge == p._planned.merge_meta,
                       rel_diff=float((out.double() - want_out.double()).norm() / want_out.double().norm()),
                       problems=record_problems(recs, s.ctas * p.groups, True, clock_on(device), dev.sm_count))
            if not dry:
                plain = time_graph([lambda: step(timelines=None)])
                timed = time_graph([step])
                row.update(plain_us=round(plain.p50_us, 3), timed_us=round(timed.p50_us, 3),
                           overhead=round(timed.p50_us / plain.p50_us - 1, 4), device=dev.name)
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps(row), flush=True)


def check_sweep(folder: str) -> dict:
    """The summary of a sweep folder's timelines (``check-sweep``)."""
    from splitlab import devices, results, sweep_timelines

    rows = results.load(folder)
    table = sweep_timelines.load(folder)
    problems, checked = [], 0
    for _, r in rows.iterrows():
        mine = table[table["point_id"] == r["point_id"]]
        if r["scheduler"] == "" or r["status"] != "ok":
            if len(mine):
                problems.append(f"{r['point_id']}: records for a point that is not a timed work-list point")
            continue
        checked += 1
        recs = sweep_timelines.records(folder, r["point_id"])
        clocked = r["timing"] != "fake"
        for why in record_problems(recs, int(r["ctas"]), r["partial_rows"] > 0, clocked,
                                   devices.get(r["device"]).sm_count):
            problems.append(f"{r['point_id']} ({r['scheduler']}): {why}")
        if mine["session"].nunique() != 1:
            problems.append(f"{r['point_id']}: records of {mine['session'].nunique()} sessions; expected one")
    return dict(folder=Path(folder).name, points=len(rows), checked=checked, records=len(table), problems=problems)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("graph", help="a served step's timeline captured in a CUDA graph (GQA and MLA)")
    g.add_argument("--out", required=True)
    g.add_argument("--dry-run", action="store_true", help="CPU: the interpreter at tiny shapes, no graph, no timing")
    c = sub.add_parser("check-sweep", help="a sweep folder's timelines: one set a timed work-list point")
    c.add_argument("folder")
    args = ap.parse_args(argv)
    if args.cmd == "graph":
        graph(args)
        return 0
    summary = check_sweep(args.folder)
    print(json.dumps(summary))
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
