"""Host overhead of a decode call, kernels stubbed: plan/run (``kernels.decode_plan``) against the launchers.

    python experiments/plan_run/overhead.py overhead [--out experiments/plan_run/overhead.csv]
    python experiments/plan_run/overhead.py budget [--out experiments/plan_run/budget.csv] [--waves W]
    python experiments/plan_run/overhead.py floors [--out experiments/plan_run/floors.csv]

``overhead``: microseconds of Python per call on the CPU (CPU tensors, ``TRITON_INTERPRET=1`` so the launchers take
them; every jitted kernel's ``__getitem__`` is a no-op, so nothing is launched and what is timed is the launcher's
own work: checks, planning, allocation, argument marshalling), in CPU time of the process, the best of 7 repeats of
about 0.1 s. ``budget``: the modelled cost of holding splitlab's scheduler to a plan's default capacity
(``decode_plan.BUDGET_WAVES`` / ``BUDGET_SPLITS``; ``--waves`` another ``BUDGET_WAVES``, written to
``budget_<W>waves.csv``) against the unbounded scheduler, on the H200 preset.
``floors``: ``schedulers.splitlab`` on the serving loop's batches (``experiments/serving_loop``: the chat profile's
steady state, 16 and 64 slots, held to a plan's capacity), skipping the candidates whose price floor is above its
best price (``schedulers.FLOOR_MARGIN``) against pricing every one (margin infinite): milliseconds of CPU time a
plan (the median over the batches, the list schedules' memo cleared before each) and whether the two choose alike.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import statistics
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before splitlab.kernels: the launchers then take CPU tensors

import torch  # noqa: E402
from triton.runtime.jit import KernelInterface  # noqa: E402

from splitlab.devices import get as get_device  # noqa: E402
from splitlab.kernels import decode_plan, default_call, gqa_decode, mla_decode  # noqa: E402
from splitlab.kernels import worklist as wl  # noqa: E402
from splitlab.planners import schedulers as S  # noqa: E402
from splitlab.planners import splitlab as rule  # noqa: E402
from splitlab.workloads import DecodeWorkload  # noqa: E402

REPEATS, SECONDS = 7, 0.1  # repeats of about SECONDS each; the best repeat is reported (the machine is shared)


def per_call_us(fn) -> float:
    """Microseconds of this process's CPU time a call (``time.process_time``: time the shared machine gives to other
    processes is not counted), the best of ``REPEATS`` repeats of as many calls as fill ``SECONDS`` (at least one)."""
    t0 = time.process_time()
    fn()  # warm: caches, first allocations
    calls = max(1, int(SECONDS / max(time.process_time() - t0, 1e-7)))
    times = []
    for _ in range(REPEATS):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        times.append((time.process_time() - t0) / calls * 1e6)
    return min(times)


def lengths(batch: int, longest: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    lens = [rng.randint(longest // 16, longest) for _ in range(batch)]
    lens[0] = longest
    return lens


#: Pages of the stand-in caches: nothing is launched, so the block tables point into a small pool (every entry in
#: range, as the default path's validation checks) and the host's work is that of the full-size batch.
POOL_PAGES = 64


#: Steps a batch decodes before its lengths start over (the block table holds that many keys more).
HEADROOM = 4096


class Decoding:
    """A batch's lengths as decoding grows them: each ``step()`` one key more a request (a server's next step: the
    planners' memos miss), the same lengths again after ``HEADROOM`` steps; ``tensor`` holds them on the host."""

    def __init__(self, lens: list[int]) -> None:
        self.base, self.n = list(lens), 0
        self.base_t = torch.tensor(lens, dtype=torch.int32)
        self.tensor = self.base_t.clone()

    def step(self) -> list[int]:
        self.n = (self.n + 1) % HEADROOM
        torch.add(self.base_t, self.n, out=self.tensor)
        return [x + self.n for x in self.base]


def small_inputs(batch: int, heads: int, dim: int, lens: list[int], page: int):
    """q ``[batch, heads, dim]`` bf16, a block table of the lengths' pages (and ``HEADROOM`` keys more) into
    ``POOL_PAGES`` pages, seq_lens."""
    pages = -(-(max(lens) + HEADROOM) // page)
    bt = (torch.arange(batch * pages, dtype=torch.int32) % POOL_PAGES).view(batch, pages)
    return (torch.zeros(batch, heads, dim, dtype=torch.bfloat16), bt, torch.tensor(lens, dtype=torch.int32))


def gqa_cases(batch: int) -> tuple[dict, object]:
    """The calls timed on a GQA 32/8/128 bf16 batch of ``batch`` requests (ragged, up to 8K keys), and the schedule
    of splitlab's scheduler."""
    lens = lengths(batch, 8192, batch)
    q, bt, sl = small_inputs(batch, 32, 128, lens, 16)
    k = v = torch.zeros(POOL_PAGES, 16, 8, 128, dtype=torch.bfloat16)
    p = decode_plan.GQADecodePlan(32, 8, 128, 16, dtype=torch.bfloat16, device="cpu", max_batch=batch)
    g = decode_plan.GQADecodePlan(32, 8, 128, 16, dtype=torch.bfloat16, device="cpu", max_batch=batch,
                                  use_cuda_graph=True)
    dev = decode_plan.GQADecodePlan(32, 8, 128, 16, dtype=torch.bfloat16, device="cpu", max_batch=batch,
                                    use_cuda_graph=True, device_schedule=True)
    s = p.plan(lens)
    g.plan(lens)
    work = wl.WorkList.from_schedule(s, "cpu")
    out = torch.empty_like(q)
    d = Decoding(lens)
    return {
        "gqa_decode(num_splits=4)": lambda: gqa_decode(q, k, v, bt, sl, num_splits=4),
        "gqa_decode() default, same lengths": lambda: gqa_decode(q, k, v, bt, sl),
        "gqa_decode() default, next step": lambda: (d.step(), gqa_decode(q, k, v, bt, d.tensor)),
        "gqa_decode_scheduled(work)": lambda: wl.gqa_decode_scheduled(q, k, v, bt, work),
        "plan.run()": lambda: p.run(q, k, v, bt),
        "plan.run(out=)": lambda: p.run(q, k, v, bt, out=out),
        "plan.run(out=, check=False)": lambda: p.run(q, k, v, bt, out=out, check=False),
        "graph plan.run(out=)": lambda: g.run(q, k, v, bt, out=out),
        "graph plan.run(out=, check=False)": lambda: g.run(q, k, v, bt, out=out, check=False),
        "plan.plan(lens), same lengths": lambda: p.plan(lens),
        "plan.plan(lens), next step": lambda: p.plan(d.step()),
        "graph plan.plan(lens), next step": lambda: g.plan(d.step()),
        "plan(): the work list's write alone": lambda: p._write(s),
        "device plan.plan_on_device(seq_lens)": lambda: dev.plan_on_device(sl),
        "gqa_decode() default through a plan, next step": default_call.with_plan(
            lambda: (d.step(), gqa_decode(q, k, v, bt, d.tensor))),
    }, s



def mla_cases(batch: int) -> tuple[dict, object]:
    """The calls timed on an MLA 128/576/512 bf16 batch (page 64), as ``gqa_cases``."""
    lens = lengths(batch, 8192, batch)
    q, bt, sl = small_inputs(batch, 128, 576, lens, 64)
    kv = torch.zeros(POOL_PAGES, 64, 576, dtype=torch.bfloat16)
    p = decode_plan.MLADecodePlan(128, 576, 512, 64, dtype=torch.bfloat16, device="cpu", max_batch=batch)
    s = p.plan(lens)
    out = torch.empty(batch, 128, 512, dtype=torch.bfloat16)
    d = Decoding(lens)
    return {
        "mla_decode(num_splits=4)": lambda: mla_decode(q, kv, bt, sl, num_splits=4),
        "mla_decode() default, same lengths": lambda: mla_decode(q, kv, bt, sl),
        "mla_decode() default, next step": lambda: (d.step(), mla_decode(q, kv, bt, d.tensor)),
        "plan.run()": lambda: p.run(q, kv, bt),
        "plan.run(out=, check=False)": lambda: p.run(q, kv, bt, out=out, check=False),
        "plan.plan(lens), same lengths": lambda: p.plan(lens),
        "plan.plan(lens), next step": lambda: p.plan(d.step()),
        "mla_decode() default through a plan, next step": default_call.with_plan(
            lambda: (d.step(), mla_decode(q, kv, bt, d.tensor))),
    }, s


def overhead(out_path: str) -> None:
    KernelInterface.__getitem__ = lambda self, grid: lambda *a, **kw: None  # every launch a no-op
    rows = []
    for family, make, batches in (("gqa 32/8/128 bf16 page 16", gqa_cases, (8, 64, 256)),
                                  ("mla 128/576/512 bf16 page 64", mla_cases, (8, 64))):
        for batch in batches:
            cases, s = make(batch)
            for name, fn in cases.items():
                rows.append(dict(family=family, batch=batch, call=name, us=round(per_call_us(fn), 1),
                                 schedule=f"{s.scheduler} ctas={s.ctas} partial_rows={s.partial_rows}"))
                print(rows[-1], flush=True)
    write(out_path, rows)


def budget(out_path: str) -> None:
    dev = get_device("h200")
    rows = []
    shapes = (("gqa", 32, 8, 128, 128, 16), ("gqa", 64, 8, 128, 128, 16), ("gqa", 16, 2, 128, 128, 16),
              ("gqa", 128, 1, 128, 128, 16), ("mla", 16, 1, 576, 512, 64), ("mla", 128, 1, 576, 512, 64))
    for kind, hq, hkv, dqk, dv, page in shapes:
        c = rule.constants_for(dev, kind).constants
        one = DecodeWorkload(kind=kind, batch=1, num_q_heads=hq, num_kv_heads=hkv, head_dim_qk=dqk, head_dim_v=dv,
                             ctx_len=1, page_size=page)
        slots = S.slots_per_group(one, dev)
        ratios, used = [], []
        for batch in (1, 4, 16, 32, 64, 128, 256):
            for longest in (1024, 8192, 32768, 131072):
                for dist in ("spread16", "same"):
                    lens = lengths(batch, longest, batch + longest) if dist == "spread16" else [longest] * batch
                    w = DecodeWorkload(kind=kind, batch=batch, num_q_heads=hq, num_kv_heads=hkv, head_dim_qk=dqk,
                                       head_dim_v=dv, ctx_len=max(lens), page_size=page, seq_lens=tuple(lens))
                    cap = max(decode_plan.BUDGET_SPLITS * batch, decode_plan.BUDGET_WAVES * slots)
                    free = S.splitlab(w, dev, persistent=False)  # a plan runs one item a slot
                    held = S.splitlab(w, dev, max_ctas=cap, max_items=cap, persistent=False)
                    ratio = (S.modelled_time(held, w, dev.sm_count, c, dev.arch)
                             / S.modelled_time(free, w, dev.sm_count, c, dev.arch))
                    ratios.append(ratio)
                    used.append(held.ctas / cap)
        rows.append(dict(family=f"{kind} {hq}/{hkv}", batches=len(ratios),
                         geomean=round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 4),
                         worst=round(max(ratios), 4), held_back=sum(r > 1 for r in ratios),
                         median_grid_used=round(statistics.median(used), 3)))
        print(rows[-1], flush=True)
    write(out_path, rows)


def floors(out_path: str, steps: int = 30) -> None:
    from splitlab import serving

    dev = get_device("h200")
    rows = []
    for kind, hq, hkv, dqk, dv, page in (("gqa", 32, 8, 128, 128, 16), ("mla", 16, 1, 576, 512, 64)):
        for slots in (16, 64):
            server = serving.Server("chat", slots, seed=0, arrival="full", max_len=16384)
            batches = [DecodeWorkload(kind=kind, batch=slots, num_q_heads=hq, num_kv_heads=hkv, head_dim_qk=dqk,
                                      head_dim_v=dv, ctx_len=max(lens), page_size=page, seq_lens=tuple(lens))
                       for lens in (list(server.step()) for _ in range(steps))]
            cap = max(decode_plan.BUDGET_SPLITS * slots, decode_plan.BUDGET_WAVES * S.slots_per_group(batches[0], dev))
            row = dict(family=f"{kind} {hq}/{hkv}", slots=slots, batches=steps)
            chosen = {}
            for label, margin in (("floors", S.FLOOR_MARGIN), ("price_all", math.inf)):
                keep, S.FLOOR_MARGIN, ms = S.FLOOR_MARGIN, margin, []
                try:
                    for w in batches:
                        rule._schedule.cache_clear()
                        t0 = time.process_time()
                        chosen.setdefault(label, []).append(S.splitlab(w, dev, max_ctas=cap, max_items=cap,
                                                                       persistent=False).digest)
                        ms.append((time.process_time() - t0) * 1e3)
                finally:
                    S.FLOOR_MARGIN = keep
                row[f"{label}_ms"] = round(statistics.median(ms), 3)
            row["same_choices"] = chosen["floors"] == chosen["price_all"]
            rows.append(row)
            print(row, flush=True)
    write(out_path, rows)


def write(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("overhead", "budget", "floors"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--waves", type=int, default=None, help="budget: BUDGET_WAVES to model (default the plans')")
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    if a.waves is not None:
        decode_plan.BUDGET_WAVES = a.waves
        a.out = a.out or os.path.join(here, f"budget_{a.waves}waves.csv")
    {"overhead": overhead, "budget": budget, "floors": floors}[a.what](a.out or os.path.join(here, f"{a.what}.csv"))
