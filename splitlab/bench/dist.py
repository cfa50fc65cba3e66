"""Sweeps past one GPU on Dask (``splitlab sweep ... --workers N | --dask-scheduler ADDRESS``); needs the ``dist``
extra (``pip install splitlab[dist]``), imported only here and only when asked for.

Pinning. ``--workers N`` starts a local cluster of N worker processes (a ``distributed.SpecCluster`` of
``Nanny`` workers, i.e. a ``LocalCluster`` with per-worker options), one per visible GPU: worker i gets
``CUDA_VISIBLE_DEVICES`` = the i-th visible GPU and its own ``TRITON_CACHE_DIR`` in its environment, set in
the fresh (spawned) process before anything imports torch; one thread each, so a GPU never runs two points at
once. Without GPUs the workers are CPU processes (fake timer, Triton's interpreter). ``--dask-scheduler ADDRESS``
uses a running cluster whose operator started one single-threaded worker per GPU with ``CUDA_VISIBLE_DEVICES``
set (``dask worker ADDRESS --nthreads 1 --resources GPU=1``); when every worker declares a ``GPU`` resource,
each task asks for ``GPU=1``, otherwise workers with more than one thread are refused.

Sharding. The grid is cut into shards of whole shapes (``grid.shard``), up to ``TASKS_PER_WORKER`` per worker;
one task per shard runs the ordinary ``sweep.Runner`` for that shard in the worker (its own session and
fsynced journal, in the shared sweep folder), with ``resume`` on, so a task that re-enters a shard skips what
is finished.

Faults. Each task's session measures its points in a point worker process of its own (``sweep``'s isolation,
``splitlab.bench.worker``), so a point that crashes (a segfault, an abort), hangs past ``--point-timeout`` or
breaks the CUDA context costs that point and that point worker only: it is stored ``error`` with the reason and
the task goes on; the Dask worker is untouched. A Dask worker that dies itself mid-point (killed, out of host
memory) loses that point only: Dask reruns the task (the Nanny restarts the worker; other workers take it as
well), and the rerun, a resumed session, stores the point the dead session had started as ``error`` (not
retried) and goes on. A task that exhausts Dask's ``allowed-failures`` (``KilledWorker``) is resubmitted while
it makes progress; a shard whose point worker cannot start (``SweepAborted``) has its Dask worker restarted and
is resubmitted. A point is written by one session (a shard has one live session at a time) and rows are kept
one per point (``results.best_rows``), so no row is ever doubled. When every task has ended the driver rebuilds the
sweep's ``results.parquet`` / ``results.csv`` / ``sweep.json`` from all journals (``results.load`` reads the
journals at any time, too).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

from splitlab import results
from splitlab.bench.cards import Card
from splitlab.bench.sweep import Runner, SweepAborted, SweepOptions, SweepResult
from splitlab.errors import SplitlabError

SCHEDULER_CONNECT_S = 5  # --dask-scheduler: seconds to wait for the scheduler to answer
TASKS_PER_WORKER = 4  # shards per worker: finer shards balance better and a KilledWorker costs less
MISSING = "--workers/--dask-scheduler need Dask: pip install splitlab[dist] (dask and distributed)"


def _import_distributed():
    try:
        import distributed
    except ImportError:
        raise SplitlabError(MISSING) from None
    return distributed


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries (indices, or UUIDs if so given)."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return [str(i) for i in range(n)]
    return [x.strip() for x in env.split(",") if x.strip()][:n]


def worker_env(i: int, gpus: list[str]) -> dict[str, str]:
    """The environment of local worker ``i``: its GPU (if any) and a private Triton cache."""
    base = os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")
    env = {"TRITON_CACHE_DIR": str(Path(base) / f"splitlab-worker-{gpus[i] if gpus else i}")}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[i]
    else:
        env["TRITON_INTERPRET"] = os.environ.get("TRITON_INTERPRET", "1")
    return env


def worker_config() -> dict:
    """The Dask configuration of a local worker: the parent's, with the worker's statistical profiler off. That
    profiler wakes every 10 ms and takes the GIL to walk every thread's stack; a sweep's host side (inputs, the
    reference check, graph capture) is Python, and with it on a one-worker sweep on the H200 ran 14% slower
    than the plain sweep (12.9 against 15.0 points/s)."""
    import copy

    import dask

    cfg = copy.deepcopy(dask.config.config.get("distributed", {}))
    cfg.setdefault("worker", {}).setdefault("profile", {})["enabled"] = False
    return {"distributed": cfg}


def local_cluster(n: int, *, gpus: list[str] | None = None, silence_logs: int | None = None):
    """A local cluster of ``n`` single-threaded worker processes, worker i pinned to ``gpus[i]`` (CPU workers
    when ``gpus`` is empty). Refuses more workers than visible GPUs when there are GPUs."""
    import logging

    _import_distributed()
    from distributed import Nanny, Scheduler, SpecCluster

    gpus = visible_gpus() if gpus is None else gpus
    if gpus and n > len(gpus):
        raise SplitlabError(f"--workers={n} is not allowed; expected at most {len(gpus)}, the GPUs visible here "
                            "(one worker per GPU)")
    logs = logging.WARNING if silence_logs is None else silence_logs
    workers = {f"gpu{gpus[i]}" if gpus else f"cpu{i}": {
        "cls": Nanny, "options": {"nthreads": 1, "env": worker_env(i, gpus), "resources": {"GPU": 1},
                                  "silence_logs": logs, "dashboard": False, "config": worker_config()}}
               for i in range(n)}
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None, "host": "127.0.0.1"}}
    return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=logs, name="splitlab")


# --- the task (runs in a worker) -----------------------------------------------------------------------------

def run_shard(card_path: str, options: SweepOptions, shard: tuple[int, int], deadline: float | None) -> dict:
    """Run (resume) one shard of a sweep in this worker process; what it did, as a small dict."""
    from splitlab.bench import cards

    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
    max_minutes = None
    if deadline is not None:
        max_minutes = (deadline - time.time()) / 60
        if max_minutes <= 0:
            return dict(shard=shard, stopped="time", statuses={}, done=0, total=0, session=None)
    opts = dataclasses.replace(options, shard=shard, resume=True, quiet=True, limit=None, max_minutes=max_minutes)
    runner = Runner(cards.load(card_path), opts)
    try:
        res = runner.run()
    except SweepAborted as e:
        return dict(shard=shard, stopped="aborted", statuses={}, done=0, total=0, session=None, error=str(e),
                    worker=_worker_address())
    return dict(shard=shard, stopped=res.stopped, statuses=res.statuses, done=res.done, total=res.total,
                session=res.session)


def _worker_address() -> str | None:
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:
        return None


# --- the driver -----------------------------------------------------------------------------------------------

def _check_workers(client) -> dict | None:
    """The resources each task asks for: ``{"GPU": 1}`` when every worker declares GPU, else None (then every
    worker must have one thread)."""
    info = client.scheduler_info()["workers"]
    if not info:
        raise SplitlabError("the Dask cluster has no workers; expected one worker per GPU "
                            "(dask worker ADDRESS --nthreads 1 --resources GPU=1)")
    if all("GPU" in w.get("resources", {}) for w in info.values()):
        return {"GPU": 1}
    many = [a for a, w in info.items() if w.get("nthreads", 1) > 1]
    if many:
        raise SplitlabError(f"Dask workers {', '.join(many)} run {info[many[0]]['nthreads']} threads and declare "
                            "no GPU resource; expected one thread per GPU worker (dask worker ADDRESS --nthreads 1 "
                            "--resources GPU=1), so that a GPU never runs two points at once")
    return None


def run(card: Card, options: SweepOptions, *, workers: int | None = None, scheduler: str | None = None,
        tasks_per_worker: int = TASKS_PER_WORKER, cluster=None, log=None) -> SweepResult:
    """Run (or continue) ``card``'s sweep of ``options.grid`` on Dask: a local cluster of ``workers`` processes,
    the cluster at ``scheduler``, or (tests) an existing ``cluster``. Returns the sweep's state when every task
    has ended (``statuses``: the rows this run's sessions wrote)."""
    if options.shard is not None:
        raise SplitlabError("--shard is not allowed with --workers/--dask-scheduler (they shard the sweep themselves)")
    if options.limit is not None:
        raise SplitlabError("--limit is not allowed with --workers/--dask-scheduler (it counts points per session); "
                            "use --max-minutes")
    distributed = _import_distributed()
    say = log or (lambda msg: None if options.quiet else print(f"splitlab: {msg}", file=sys.stderr, flush=True))

    runner = Runner(card, options)
    timer_name = runner._timer_name()  # refuses an existing sweep without --resume, or another timer
    if timer_name != "fake" and workers is not None and not visible_gpus():
        runner._check_timer(timer_name)  # the one-line error: a GPU timer without a GPU
    exp = runner.expansion()
    shapes = len({p.workload for p in exp.points})
    deadline = time.time() + 60 * options.max_minutes if options.max_minutes else None
    task_opts = dataclasses.replace(options, timer=timer_name, resume=True, quiet=True)
    card_path = str(Path(card.path).resolve())

    own = None
    if cluster is None and scheduler is None:
        own = cluster = local_cluster(workers)
    if scheduler is not None:
        try:  # a wrong address fails in seconds, not after Dask's 30 s default (60 s for a name that never resolves)
            client = distributed.Client(scheduler, set_as_default=False, timeout=SCHEDULER_CONNECT_S)
        except (OSError, TimeoutError, ValueError) as e:
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SplitlabError(f"--dask-scheduler={scheduler!r}: no Dask scheduler answered within "
                                f"{SCHEDULER_CONNECT_S} s "
                                f"({why}); expected the address of a running scheduler (dask scheduler prints it)"
                                ) from None
    else:
        client = distributed.Client(cluster, set_as_default=False)
    try:
        resources = _check_workers(client)
        n_workers = len(client.scheduler_info()["workers"])
        n = max(1, min(shapes, n_workers * max(1, tasks_per_worker)))
        say(f"{len(exp.points)} points over {shapes} shapes in {n} shards on {n_workers} Dask workers")
        res = SweepResult(runner.dir, "", "dask")

        def submit(i: int, attempt: int):
            return client.submit(run_shard, card_path, task_opts, (i, n), deadline, resources=resources,
                                 key=f"splitlab-shard-{i}-of-{n}-{attempt}-{time.time_ns()}", pure=False)

        def finished() -> int:
            return len(results.sweep_state(runner.dir).finished) if runner.dir.exists() else 0

        old = {j.name for j in results.journals(runner.dir)} if runner.dir.exists() else set()
        futures = {submit(i, 0): (i, 0, finished()) for i in range(n)}
        pending = distributed.as_completed(list(futures), loop=client.loop)
        failures: list[str] = []
        for fut in pending:
            i, attempt, before = futures.pop(fut)
            try:
                out = fut.result()
            except distributed.KilledWorker:
                now = finished()
                if now > before:  # each death settles a point: go on while the shard makes progress
                    say(f"shard {i}/{n} killed its workers {attempt + 1} time(s); resubmitted")
                    new = submit(i, attempt + 1)
                    futures[new] = (i, attempt + 1, now)
                    pending.add(new)
                else:
                    failures.append(f"shard {i}/{n}: its workers died without finishing a point")
                continue
            except SplitlabError as e:
                failures.append(f"shard {i}/{n}: {e}")
                continue
            except Exception as e:  # e.g. the card's implementation does not import on that worker
                failures.append(f"shard {i}/{n}: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
                                if str(e).strip() else f"shard {i}/{n}: {type(e).__name__}")
                continue
            if out["stopped"] == "aborted":  # the GPU context is gone: a fresh worker process, then resume
                say(f"shard {i}/{n}: {out.get('error')}; restarting its worker and resubmitting")
                if out.get("worker"):
                    try:
                        client.restart_workers([out["worker"]])
                    except Exception as e:  # the scheduler may already have replaced it
                        say(f"could not restart {out['worker']}: {e}")
                if attempt < 8:
                    new = submit(i, attempt + 1)
                    futures[new] = (i, attempt + 1, finished())
                    pending.add(new)
                else:
                    failures.append(f"shard {i}/{n}: the GPU context broke {attempt + 1} times")
                continue
            if out["stopped"] not in ("finished",):
                res.stopped = out["stopped"]
            say(f"shard {i}/{n} {out['stopped']}: {out['done']}/{out['total']} points")
    finally:
        client.close()
        if own is not None:
            own.close()

    st, written = results.SweepState(), set()
    if runner.dir.exists():
        df, st = runner._finish(res)
        written = set(df["point_id"])  # the Parquet's rows, as just written
        res.sweep_id = (runner.sidecar() or {}).get("sweep_id", "")
    for row in st.rows:  # this run's rows, those of its killed sessions included
        if f"journal-{row.get('session')}.jsonl" not in old:
            res.statuses[row["status"]] = res.statuses.get(row["status"], 0) + 1
    ids = {p.point_id for p in exp.points}
    res.total, res.done = len(ids), len(ids & (st.finished | written))
    if failures:
        res.stopped = "failed"
        raise SplitlabError("; ".join(failures) + f" ({res.done}/{res.total} points done; rerun the same "
                            "command with --resume)")
    return res
