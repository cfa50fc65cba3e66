"""Schedules on ragged batches: splitlab's work-list kernels under each scheduler, beside splitlab's split-count
kernel at its planner's default and the peers (FlashInfer, FlashMLA), on the same inputs, in one run.

Every implementation is checked against the fp64 reference first (bf16 tolerance; a wrong one is recorded and not
timed), then timed by CUDA-graph replay over input sets rotated past the L2 (``bench.timing.time_graph``). Rows go
to ``OUT/ragged_ab.csv`` as they are made; ``summary`` prints the tables of the README.

    python experiments/schedules/ragged_ab.py run --family gqa --out DIR [--budget-s 500]
    python experiments/schedules/ragged_ab.py run --family mla --out DIR
    python experiments/schedules/ragged_ab.py summary DIR/ragged_ab.csv
    python experiments/schedules/ragged_ab.py flashmla-check --out DIR   # the port's items against upstream's

FlashInfer (``.fib/``) and FlashMLA (``.fmla/``) are the kits of the H200 workplace: ``--fmla DIR`` builds and
imports FlashMLA from such a folder; FlashInfer must be importable.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import sys
import time
from pathlib import Path

FIELDS = ["family", "shape", "batch", "longest", "dist", "impl", "scheduler", "us", "p20_us", "p80_us", "gbps",
          "roofline", "rel_err", "status", "ctas", "items", "partial_rows", "busiest_keys", "schedule_hash",
          "modelled", "error"]
SHAPES = {"gqa": [("32/8", 32, 8), ("64/8", 64, 8), ("128/1", 128, 1)], "mla": [("mla16", 16, 1), ("mla128", 128, 1)]}
BATCHES, LONGEST, DISTS = (16, 64, 128), (8192, 32768), ("spread16", "longtail")


def workloads_for(family: str, quick: bool, seed_offset: int = 0, dists: tuple[str, ...] = (*DISTS, "uniform")):
    from splitlab.workloads import DecodeWorkload

    for label, hq, hkv in SHAPES[family]:
        for b in BATCHES[:2] if quick else BATCHES:
            for n in LONGEST:
                for dist in dists:
                    if dist == "uniform" and b == 128:
                        continue
                    if family == "gqa":
                        w = DecodeWorkload("gqa", b, hq, hkv, 128, 128, n, page_size=16, length_dist=dist,
                                           length_seed=b + n + seed_offset)
                    else:
                        w = DecodeWorkload("mla", b, hq, 1, 576, 512, n, page_size=64, length_dist=dist,
                                           length_seed=b + n + seed_offset)
                    yield label, dist, w


def impls(w, dev, first):
    """(name, scheduler label, schedule or None, factory inputs -> callable) of every implementation timed."""
    from splitlab.bench import decode as bench_decode
    from splitlab.kernels import gqa, mla
    from splitlab.kernels.worklist import gqa_decode_scheduled, mla_decode_scheduled
    from splitlab.planners import schedulers as S
    from splitlab.planners import splitlab as rule

    out = []
    knobs = bench_decode.default_knobs(w, dev)
    if w.kind == "gqa":
        out.append(("splitlab-v6", f"uniform:{knobs['num_splits']}", None,
                    lambda x: (lambda: gqa.gqa_decode(**x, **knobs))))
    else:
        out.append(("splitlab-v6", f"uniform:{knobs['num_splits']}", None,
                    lambda x: (lambda: mla.mla_decode(**x, head_dim_v=512, **knobs))))
    chosen = S.splitlab(w, dev)
    scheds = {"wl-splitlab": chosen, "wl-uniform-v6": S.uniform(w.lengths, knobs["num_splits"],
                                                                   request_major=rule.REQUEST_MAJOR[w.kind])}
    if w.kind == "gqa":
        scheds["wl-flashinfer"] = S.flashinfer(w.lengths, page_size=w.page_size, num_kv_heads=w.num_kv_heads,
                                               sm_count=dev.sm_count)

        def kernel(x, wl):
            return gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"], wl)
    else:
        from splitlab.planners.flashmla import num_sm_parts

        scheds["wl-flashmla"] = S.flashmla(w.lengths, num_sm_parts(dev.sm_count, w.num_q_heads, 1))

        def kernel(x, wl):
            return mla_decode_scheduled(x["q"], x["kv_cache"], x["block_table"], wl, head_dim_v=512)
    return out + worklist_impls(w, dev, first, scheds, kernel)


def worklist_impls(w, dev, first, scheds: dict, kernel) -> list:
    """(name, scheduler label, schedule, factory inputs -> callable) of the work-list kernel ``kernel(x, wl)``
    under each schedule of ``scheds``, then (``cand-*``) under every candidate splitlab's scheduler weighs and
    stream-K at one and two waves; a candidate whose schedule an earlier name has is skipped."""
    from splitlab.kernels.worklist import WorkList
    from splitlab.planners import schedulers as S
    from splitlab.planners import splitlab as rule

    c = rule.constants_for(dev, w.kind).constants
    lens = list(w.lengths)
    extra = [S.stream_k(lens, m * S.slots_per_group(w, dev, c)) for m in (1, 2)]  # timed, not weighed
    scheds = dict(scheds)
    for i, s in enumerate([*S.candidates(w, dev.sm_count, c), *extra]):
        scheds[f"cand-{i}"] = s
    out = []
    seen = set()
    for name, s in scheds.items():
        if s.digest in seen and name.startswith("cand-"):
            continue
        seen.add(s.digest)
        wl = WorkList.from_schedule(s, first["q"].device)

        def make(x, wl=wl):
            return lambda: kernel(x, wl)
        label = s.scheduler + (f":{s.params.get('num_splits', '')}" if s.scheduler == "uniform" else "")
        out.append((name, label, s, make))
    return out


def peers(w):
    """The peers' implementations for ``w`` that import here."""
    out = []
    try:
        if w.kind == "gqa":
            from splitlab.bench.peers_flashinfer import FLASHINFER_DECODE

            out.append(("flashinfer", FLASHINFER_DECODE))
        else:
            from splitlab.bench.peers_flashinfer import FLASHINFER_MLA_FA3

            out.append(("flashinfer-fa3", FLASHINFER_MLA_FA3))
            from splitlab.bench.peers_flashmla import FLASHMLA_DECODE

            if FLASHMLA_DECODE.unavailable() is None:
                out.append(("flashmla", FLASHMLA_DECODE))
    except ImportError as e:
        print("peer unavailable:", e, flush=True)
    return [(n, p) for n, p in out if p.unavailable() is None]


def measure(ctx: dict, name: str, sched_label: str, s, make) -> None:
    """Check one implementation against the fp64 reference, then time it; append its row."""
    from splitlab.bench.timing import time_graph
    from splitlab.kernels.accuracy import rel_err

    w = ctx["w"]
    row = dict(ctx["base"], impl=name, scheduler=sched_label)
    if s is not None:
        sm = s.summary()
        row.update(ctas=sm["ctas"], items=sm["items"], partial_rows=sm["partial_rows"],
                   busiest_keys=sm["busiest_keys"], schedule_hash=sm["schedule_hash"],
                   modelled=s.params.get("modelled"))
    try:
        err = rel_err(make(ctx["first"])(), ctx["ref"])
        row["rel_err"] = f"{err:.2e}"
        if not err <= ctx["tol"]:
            row["status"] = "wrong"
        else:
            t = time_graph([make(x) for x in ctx["sets"]])
            row.update(us=round(t.p50_us, 2), p20_us=round(t.p20_us, 2), p80_us=round(t.p80_us, 2),
                       gbps=round(w.kv_bytes / (t.p50_us * 1e3), 1), roofline=round(ctx["floor"] / t.p50_us, 3),
                       status="ok")
    except Exception as e:  # compile error, out of resources, a peer's refusal: keep the reason, go on
        row.update(status="error", error=f"{type(e).__name__}: {str(e)[:160]}")
    ctx["rows"].append(row)
    ctx["writer"].writerow(row)


def run(args) -> None:
    from splitlab.kernels import reference

    if args.fmla:
        from splitlab.bench.peers_flashmla import load_kit

        load_kit(args.fmla)

    def reference_of(w, first):
        if w.kind == "gqa":
            return reference.gqa_decode(**first)
        return reference.mla_decode(**first, head_dim_v=512)

    def every_impl(w, dev, first):
        yield from impls(w, dev, first)
        for name, p in peers(w):
            yield name, "own", None, lambda x, p=p, w=w: p.call(w, x, {})

    def progress(w, dist, ok):
        best_peer = min((v for k, v in ok.items() if not k.startswith(("wl-", "cand-", "splitlab"))), default=None)
        best_sched = min((v for k, v in ok.items() if k.startswith(("wl-", "cand-"))), default=None)
        return (f"B={w.batch} L={w.ctx_len} {dist}: v6 {ok.get('splitlab-v6')} wl-splitlab {ok.get('wl-splitlab')} "
                f"best-sched {best_sched} best-peer {best_peer}")

    cases = workloads_for(args.family, args.quick, args.seed_offset, tuple(args.dists.split(",")))
    if args.shapes:  # a subset of the family's shapes (a re-sweep of the shapes a kernel change touched)
        keep = set(args.shapes.split(","))
        cases = [c for c in cases if c[0] in keep]
    run_cases(Path(args.out), "ragged_ab.csv", f"env-{args.family}.json", cases, args.budget_s,
              family=args.family, longest_of=lambda w: w.ctx_len, reference_of=reference_of, impls_of=every_impl,
              progress=progress)


def run_cases(out: Path, csv_name: str, env_name: str, cases, budget_s: float, *, family: str, longest_of,
              reference_of, impls_of, progress) -> None:
    """The A/B loop of this script and ``sparse_ab.py``: the device's environment to ``out/env_name``, then per
    (shape label, dist, workload) of ``cases`` until ``budget_s`` is spent: input sets rotated past the L2, the fp64
    reference ``reference_of(w, first set)``, every implementation of ``impls_of(w, dev, first set)`` measured
    (``measure``) into rows of ``FIELDS`` (``family``; ``longest_of(w)``: the row's longest) appended to
    ``out/csv_name``, and a progress line (``progress(w, dist, {impl: us of the ok rows})``, then the wrong and
    error counts)."""
    import torch

    from splitlab import workloads
    from splitlab.bench.decode import rotated_inputs
    from splitlab.devices import detect
    from splitlab.kernels.accuracy import TOLERANCE

    dev = detect()
    out.mkdir(parents=True, exist_ok=True)
    path = out / csv_name
    new = not path.exists()
    f = open(path, "a", newline="")
    wr = csv.DictWriter(f, fieldnames=FIELDS)
    if new:
        wr.writeheader()
    env = dict(device=torch.cuda.get_device_name(), sms=dev.sm_count, torch=torch.__version__,
               triton=__import__("triton").__version__, cuda=torch.version.cuda, argv=sys.argv)
    (out / env_name).write_text(json.dumps(env, indent=1))
    t0 = time.time()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    tol = TOLERANCE[torch.bfloat16]
    for label, dist, w in cases:
        if time.time() - t0 > budget_s:
            print("budget spent; stopping", flush=True)
            break
        sets = rotated_inputs(w, draw_on="device", l2_bytes=l2)
        first = sets[0]
        ref = reference_of(w, first)
        floor = workloads.floor_time_us(w, dev.roofline_gbps, dev.roofline_tflops)
        ctx = dict(w=w, first=first, sets=sets, ref=ref, floor=floor, tol=tol, writer=wr, rows=[],
                   base=dict(family=family, shape=label, batch=w.batch, longest=longest_of(w), dist=dist))
        for name, sched_label, s, make in impls_of(w, dev, first):
            measure(ctx, name, sched_label, s, make)
        rows = ctx["rows"]
        f.flush()
        ok = {r["impl"]: r["us"] for r in rows if r.get("status") == "ok"}
        print(f"[{time.time() - t0:5.0f}s] {label} {progress(w, dist, ok)} "
              f"wrong {sum(r.get('status') == 'wrong' for r in rows)} "
              f"err {sum(r.get('status') == 'error' for r in rows)}", flush=True)
        del sets, first, ref, ctx
        torch.cuda.empty_cache()
    f.close()


def flashmla_check(args) -> None:
    """FlashMLA's own scheduler (the metadata its first call writes) against ``schedulers.flashmla``'s port, on
    random ragged batches: every partition's (begin/end request, begin/end block, begin split, split flags) and
    the split-count prefix sums."""
    import torch

    from splitlab.bench.peers_flashmla import load_kit
    from splitlab.planners import flashmla as port

    load_kit(args.fmla)
    import flash_mla

    rng = random.Random(7)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    same = total = 0
    for _ in range(args.trials):
        b = rng.choice([1, 3, 16, 64, 128, 256])
        h = rng.choice([16, 64, 128])
        lens = [rng.choice([1, 63, 64, 65, rng.randint(1, 40000)]) for _ in range(b)]
        pages = max(-(-n // 64) for n in lens)
        q = torch.randn(b, 1, h, 576, dtype=torch.bfloat16, device="cuda") / 10
        kv = torch.randn(b * pages, 64, 1, 576, dtype=torch.bfloat16, device="cuda") / 10
        table = torch.arange(b * pages, dtype=torch.int32, device="cuda").view(b, pages)
        seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
        sched, _ = flash_mla.get_mla_metadata()
        flash_mla.flash_mla_with_kvcache(q, kv, table, seq, 512, sched, None, causal=False)
        meta = sched.tile_scheduler_metadata.cpu().tolist()
        prefix = sched.num_splits.cpu().tolist()
        mine, mine_prefix = port.get_mla_metadata(lens, port.num_sm_parts(sms, h, 1), 64, 5)
        # Upstream fills a partition past the last request with begin_block_idx read one past its shared
        # first-block array (not a value the kernel reads: begin_req_idx > end_req_idx skips it), so an empty
        # partition is compared by its request range only.
        ours = [[m.begin_req_idx, m.end_req_idx] + ([] if m.empty else [
            m.begin_block_idx, m.end_block_idx, m.begin_split_idx, int(m.is_first_req_splitted),
            int(m.is_last_req_splitted)]) for m in mine]
        theirs = [row[:2] + ([] if row[0] > row[1] else row[2:7]) for row in meta]
        ok = ours == theirs and mine_prefix == prefix[: len(mine_prefix)]
        same += ok
        total += 1
        if not ok:
            print("DIFF", b, h, lens[:8], ours[:3], theirs[:3], mine_prefix[:8], prefix[:8], flush=True)
    line = f"flashmla scheduler: port equals upstream on {same}/{total} random batches ({sms} SMs)"
    print(line, flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "flashmla_check.txt").write_text(line + "\n")


def summary(args) -> None:
    import pandas as pd

    df = pd.read_csv(args.csv)
    ok = df[df["status"] == "ok"].copy()
    key = ["family", "shape", "batch", "longest", "dist"]
    peer_names = ("flashinfer", "flashinfer-fa3", "flashmla")
    peer = ok[ok["impl"].isin(peer_names)].groupby(key)["us"].min().rename("peer_us")
    sched = ok[ok["impl"].str.startswith(("wl-", "cand-"))].groupby(key)["us"].min().rename("best_sched_us")
    t = ok.pivot_table(index=key, columns="impl", values="us", aggfunc="min").join(peer).join(sched)

    def gm(x):
        x = x.dropna()
        return math.exp(x.apply(math.log).mean()) if len(x) else float("nan")

    ragged = t[t.index.get_level_values("dist") != "uniform"]
    for fam, g in ragged.groupby(level="shape"):
        parts = []
        for impl in ("splitlab-v6", "wl-splitlab"):
            if impl in g:
                r = (g["peer_us"] / g[impl]).dropna()
                parts.append(f"{impl} {gm(r):.3f} (worst {r.min():.3f}, below 0.9: {(r < 0.9).sum()}/{len(r)})")
        print(f"{fam} ragged vs best peer: " + "; ".join(parts))
    for fam, g in t.groupby(level="shape"):
        lines = [f"{fam}:"]
        for dist, h in g.groupby(level="dist"):
            parts = []
            for impl in ("splitlab-v6", "wl-splitlab", "wl-uniform-v6", "wl-flashinfer", "wl-flashmla"):
                if impl in h and h[impl].notna().any():
                    r = h["peer_us"] / h[impl]
                    parts.append(f"{impl} {gm(r):.3f} (worst {r.min():.3f})")
            reg = h["wl-splitlab"] / h["best_sched_us"] if "wl-splitlab" in h else None
            if reg is not None:
                parts.append(f"regret {gm(reg):.3f} / {reg.max():.3f}")
            if "splitlab-v6" in h and "wl-uniform-v6" in h:
                parts.append(f"uniform-wl/v6 time {gm(h['wl-uniform-v6'] / h['splitlab-v6']):.3f}")
            lines.append(f"  {dist:9s} vs best peer: " + "; ".join(parts))
        print("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--family", choices=sorted(SHAPES), required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--fmla", default=os.environ.get("FMLA_DIR", ""))
    r.add_argument("--budget-s", type=float, default=500)
    r.add_argument("--quick", action="store_true")
    r.add_argument("--seed-offset", type=int, default=0, help="added to every batch's length seed (fresh batches)")
    r.add_argument("--dists", default="spread16,longtail,uniform", help="length distributions, comma-separated")
    r.add_argument("--shapes", default="", help="the family's shapes to run (SHAPES labels, comma-separated; all)")
    c = sub.add_parser("flashmla-check")
    c.add_argument("--out", required=True)
    c.add_argument("--fmla", required=True)
    c.add_argument("--trials", type=int, default=200)
    s = sub.add_parser("summary")
    s.add_argument("csv")
    a = ap.parse_args(argv)
    {"run": run, "flashmla-check": flashmla_check, "summary": summary}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
