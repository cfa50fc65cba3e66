"""Implementations for the sweep-harness tests (test cards point at them by import path ``sweep_fixtures:...``).

They take ``gqa_decode``'s arguments and knobs. ``exact`` is the fp64 reference itself (right, and fast on
tiny shapes); ``broken`` is wrong at ``num_splits == 2``; ``raising`` raises at ``num_splits == 4``;
``killer`` kills the sweep's process (the session, not only its point worker: as a kill -9 from outside or the
OOM killer would) at the point ``$SWEEP_KILL_AT`` = "num_splits,batch,ctx_len"; ``selfkill`` does the same after
sleeping ``$SWEEP_SLOW_S``; ``slow`` sleeps ``$SWEEP_SLOW_S`` seconds a call (for killing a sweep from outside);
``faulty`` crashes its process at some points (``FAULTS``: a segfault, an abort) and hangs at another.
``lengths_rows`` is result rows, not an implementation: shapes of uniform and of ragged lengths for the shootout.
"""

from __future__ import annotations

import os
import signal
import time

from splitlab.bench.worker import WORKER_ENV
from splitlab.kernels import reference

CALLS: list[int] = []  # num_splits of every call in this process (to see what ran)
LENS: list[tuple[int, ...]] = []  # the seq_lens of every call in this process (a ragged batch's lengths)


def exact(q, k_cache, v_cache, block_table, seq_lens, *, num_splits=None, block_n=None, num_warps=None,
          num_stages=None, sm_scale=None, return_lse=False):
    CALLS.append(num_splits)
    LENS.append(tuple(int(n) for n in seq_lens.cpu()))
    return reference.gqa_decode(q, k_cache, v_cache, block_table, seq_lens, sm_scale=sm_scale).to(q.dtype)


def broken(q, k_cache, v_cache, block_table, seq_lens, *, num_splits=None, block_n=None, num_warps=None,
           num_stages=None, sm_scale=None, return_lse=False):
    out = exact(q, k_cache, v_cache, block_table, seq_lens, num_splits=num_splits, sm_scale=sm_scale)
    return out * 1.5 if num_splits == 2 else out


def raising(q, k_cache, v_cache, block_table, seq_lens, *, num_splits=None, block_n=None, num_warps=None,
            num_stages=None, sm_scale=None, return_lse=False):
    if num_splits == 4:
        raise RuntimeError("simulated compile error: out of shared memory")
    return exact(q, k_cache, v_cache, block_table, seq_lens, num_splits=num_splits, sm_scale=sm_scale)


def _kill_the_session() -> None:
    """SIGKILL the sweep's process: this one, or the session that started this point worker (which then dies
    with it)."""
    os.kill(int(os.environ[WORKER_ENV]) if os.environ.get(WORKER_ENV) else os.getpid(), signal.SIGKILL)
    time.sleep(60)  # the signal is on its way


def _where(num_splits, q, seq_lens) -> str:
    return f"{num_splits},{q.shape[0]},{int(seq_lens.max())}"


def killer(q, k_cache, v_cache, block_table, seq_lens, *, num_splits=None, block_n=None, num_warps=None,
           num_stages=None, sm_scale=None, return_lse=False):
    if _where(num_splits, q, seq_lens) == os.environ.get("SWEEP_KILL_AT"):
        _kill_the_session()  # the session dies mid-point: no row, no cleanup
    return exact(q, k_cache, v_cache, block_table, seq_lens, num_splits=num_splits, sm_scale=sm_scale)


def slow(q, k_cache, v_cache, block_table, seq_lens, *, num_splits=None, block_n=None, num_warps=None,
         num_stages=None, sm_scale=None, return_lse=False):
    time.sleep(float(os.environ.get("SWEEP_SLOW_S", "0")))
    return exact(q, k_cache, v_cache, block_table, seq_lens, num_splits=num_splits, sm_scale=sm_scale)


def selfkill(q, k_cache, v_cache, block_table, seq_lens, *, num_splits=None, block_n=None, num_warps=None,
             num_stages=None, sm_scale=None, return_lse=False):
    time.sleep(float(os.environ.get("SWEEP_SLOW_S", "0")))
    if _where(num_splits, q, seq_lens) == os.environ.get("SWEEP_KILL_AT"):
        _kill_the_session()  # the sweep's process dies mid-point, as under `kill -9 <pid>`
    return exact(q, k_cache, v_cache, block_table, seq_lens, num_splits=num_splits, sm_scale=sm_scale)


#: Where ``faulty`` misbehaves ("num_splits,batch,ctx_len"): its process segfaults, aborts, or it hangs.
FAULTS = {"2,1,64": "segfault", "4,1,128": "abort", "8,2,64": "hang"}


def faulty(q, k_cache, v_cache, block_table, seq_lens, *, num_splits=None, block_n=None, num_warps=None,
           num_stages=None, sm_scale=None, return_lse=False):
    fault = FAULTS.get(_where(num_splits, q, seq_lens))
    if fault == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)  # as a kernel reading out of bounds would
    elif fault == "abort":
        os.abort()
    elif fault == "hang":
        time.sleep(3600)
    return exact(q, k_cache, v_cache, block_table, seq_lens, num_splits=num_splits, sm_scale=sm_scale)


def tiny_card(name: str, impl: str = "exact", *, splits: str = "[1, 2, 4, 8]", block_n: bool = True,
              header: str = "", default: str | None = None) -> str:
    """A kernel card for these implementations: a 4/2-head, 16-dim GQA on 64/128 keys (the ``quick`` grid)
    and one shape (the ``default`` grid, or ``default`` given as a block's body). ``header`` goes after the
    name (e.g. ``card = 1`` or a ``[planners]`` table is appended by the caller)."""
    knobs = "num_splits = { min = 1, max = 8 }\n" + ("block_n = { values = [16, 32, 64] }\n" if block_n else "")
    default = default or "num_q_heads = 4\nnum_kv_heads = 2\nhead_dim_qk = 16\nbatch = 1\nctx_len = 64\n"
    return (f"{header}name = \"{name}\"\nkind = \"gqa\"\n[impl]\nimport = \"sweep_fixtures:{impl}\"\n"
            "reference = \"splitlab.kernels.reference:gqa_decode\"\n"
            "launch_facts = \"splitlab.kernels.gqa:gqa_launch_facts\"\n"
            f"[knobs]\n{knobs}"
            "[[grids.quick]]\nnum_q_heads = 4\nnum_kv_heads = 2\nhead_dim_qk = 16\nbatch = [1, 2]\n"
            f"ctx_len = [64, 128]\nnum_splits = {splits}\nmin_keys_per_split = 1\n"
            f"[[grids.default]]\n{default}")


def lengths_rows():
    """Result rows (a ``pandas.DataFrame``) of four held-out MLA shapes on the H200 (16 heads, 8K keys, batches 2
    and 32), two of uniform and two of ragged lengths (``spread16``), each measured at the registered rule's plan
    and at another split, the choice of a ported rule (``flashmla``). Uniform: the rule picks the best (regret 1.0)
    and FlashMLA is 1.2x off. Ragged: the rule is 1.5x off at batch 2, where FlashMLA (tagged there only) picks
    the best, and best at batch 32 (geomean 1.2247). Scored together the rule would read 1.107 / 1.5."""
    import pandas as pd

    from splitlab import analysis, devices, results
    from splitlab.planners.registry import Plan
    from splitlab.planners.splitlab import fitted_plan

    dev = devices.get("h200-sxm")
    rows = []
    for dist, seed, times in (("uniform", 0, {2: (10.0, 12.0), 32: (10.0, 12.0)}),
                              ("spread16", 1, {2: (15.0, 10.0), 32: (10.0, None)})):
        for batch, (rule_us, ported_us) in times.items():
            shape = dict(kernel="mla_decode", device=dev.name, kind="mla", batch=batch, num_q_heads=16,
                         num_kv_heads=1, head_dim_qk=576, head_dim_v=512, ctx_len=8192, page_size=64, topk=0,
                         dtype="bf16", length_dist=dist, length_seed=seed, timing="graph", status="ok")
            w = results.workload(shape)
            shape["kv_bytes"] = w.kv_bytes
            rule = fitted_plan(w, dev)
            other = Plan("other", rule.num_splits // 2 if rule.num_splits > 1 else 2)
            rows.append(shape | analysis.resolve_knobs("mla_decode", w, rule, dev) | dict(p50_us=rule_us, planners=""))
            if ported_us is not None:
                rows.append(shape | analysis.resolve_knobs("mla_decode", w, other, dev)
                            | dict(p50_us=ported_us, planners="flashmla"))
    return pd.DataFrame(rows)
