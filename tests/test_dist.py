"""Sweeps on Dask (``splitlab.bench.dist``): a local cluster of two CPU worker processes runs a fake-timer sweep
while one worker is SIGKILLed mid-point (by the point itself, ``sweep_fixtures:selfkill``, which kills the
session's process, so the kill lands in a point deterministically); the merged results hold exactly the points
of a single-process run, none missing, none doubled, one ``error`` (the point in flight). A rerun adds nothing.
A point that crashes or hangs costs only its point worker, not the Dask worker. Without Dask installed the
single-process path works and ``--workers`` says which extra to install."""

import os
import sys
from pathlib import Path

import pytest

from splitlab import results
from splitlab.bench import dist, sweep
from splitlab.bench.sweep import SweepOptions
from splitlab.cli import main
from splitlab.errors import SplitlabError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_sweep import REPO, card_for, card_text, rows_of  # noqa: E402

KILL_AT = "4,1,128"  # num_splits, batch, ctx_len of the point that kills its worker


def _opts(out, **kw):
    return SweepOptions(grid="quick", out=out, timer="fake", device="h200", quiet=True, **kw)


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("distributed")
    mp = pytest.MonkeyPatch()
    # The workers are fresh (spawned) processes: they import the fixtures and read the kill switch from here.
    mp.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))
    mp.setenv("SWEEP_KILL_AT", KILL_AT)
    mp.setenv("SWEEP_SLOW_S", "0.03")
    mp.setenv("TRITON_INTERPRET", "1")
    c = dist.local_cluster(2, gpus=[])  # CPU workers, whatever this machine has
    try:
        yield c
    finally:
        c.close()
        mp.undo()


def test_a_killed_worker_loses_only_its_point_and_nothing_is_doubled(tmp_path, cluster):
    from distributed import Client

    card = card_for(tmp_path, "selfkill")
    with Client(cluster) as client:
        pids_before = set(client.run(os.getpid).values())
        profiling = client.run(lambda: __import__("dask").config.get("distributed.worker.profile.enabled"))
    assert len(pids_before) == 2
    assert set(profiling.values()) == {False}  # the GIL-taking profiler is off in sweep workers

    res = dist.run(card, _opts(tmp_path / "dask"), cluster=cluster, tasks_per_worker=2)
    sweep_dir = res.sweep_dir

    # The same grid in one process, nothing killed: the reference point set.
    os.environ.pop("SWEEP_KILL_AT", None)
    try:
        ref = sweep.run(card, _opts(tmp_path / "single"))
    finally:
        os.environ["SWEEP_KILL_AT"] = KILL_AT
    want = set(results.load(ref.sweep_dir).point_id)

    df = results.load(sweep_dir)
    assert set(df.point_id) == want and len(df) == len(want) and df.point_id.is_unique
    ids = [r["point_id"] for r in rows_of(sweep_dir)]
    assert len(ids) == len(set(ids)) == len(want)  # no row written twice, in any journal
    died = df[df.status == "error"]
    assert len(died) == 1 and "process died" in died.error.iloc[0]
    assert (died.num_splits.iloc[0], died.batch.iloc[0], died.ctx_len.iloc[0]) == (4, 1, 128)
    assert (df[df.status != "error"].status == "ok").all()
    assert res.done == res.total == len(want) and res.statuses == {"ok": len(want) - 1, "error": 1}
    # A worker really died (the Nanny restarted it: a new pid), and a later session settled its point.
    with Client(cluster) as client:
        pids_after = set(client.run(os.getpid).values())
    assert len(pids_after) == 2 and pids_after != pids_before
    events = {j.name: results.read_journal(j) for j in results.journals(sweep_dir)}
    dead = [n for n, evs in events.items() if any(e["event"] == "start" and e["point_id"] == died.point_id.iloc[0]
                                                   for e in evs)]
    assert len(dead) == 1 and died.session.iloc[0] not in dead[0]
    # One sweep, rows say where they ran; the Parquet was rebuilt from every journal.
    assert df.sweep_id.nunique() == 1 and df.session.nunique() >= 3 and df.host.notna().all()
    assert df.gpu_index.isna().all() and df.gpu_uuid.isna().all()  # CPU workers
    assert len(results.load(sweep_dir / "results.parquet")) == len(want)

    # A rerun adds nothing (and without --resume it is refused, like the plain sweep).
    with pytest.raises(SplitlabError, match="--resume"):
        dist.run(card, _opts(tmp_path / "dask"), cluster=cluster)
    again = dist.run(card, _opts(tmp_path / "dask", resume=True), cluster=cluster)
    assert again.statuses == {} and again.done == again.total == len(want)
    assert len(rows_of(sweep_dir)) == len(want) and len(results.load(sweep_dir)) == len(want)


def test_a_crashing_or_hanging_point_costs_that_point_only_on_dask(tmp_path, cluster):
    """Each task's session measures in a point worker of its own: a segfault, an abort or a hang ends that worker,
    not the Dask worker (same pids before and after), and the run finishes with those points stored error."""
    from distributed import Client
    from sweep_fixtures import FAULTS

    card = card_for(tmp_path, "faulty")
    with Client(cluster) as client:
        pids_before = set(client.run(os.getpid).values())
    res = dist.run(card, _opts(tmp_path / "dask", point_timeout_s=2.0), cluster=cluster, tasks_per_worker=1)
    df = results.load(res.sweep_dir)
    assert res.done == res.total == len(df) and df.point_id.is_unique
    where = df.num_splits.astype(str) + "," + df.batch.astype(str) + "," + df.ctx_len.astype(str)
    errors = dict(zip(where[df.status == "error"], df.error[df.status == "error"], strict=True))
    assert sorted(errors) == sorted(FAULTS) and errors["8,2,64"].startswith("timed out after 2 s")
    assert errors["2,1,64"].startswith("worker died with SIGSEGV") and (df[df.status != "error"].status == "ok").all()
    with Client(cluster) as client:
        assert set(client.run(os.getpid).values()) == pids_before


def test_pinning_and_gpu_columns():
    assert dist.worker_env(1, ["2", "3"])["CUDA_VISIBLE_DEVICES"] == "3"
    envs = [dist.worker_env(i, ["0", "1"])["TRITON_CACHE_DIR"] for i in range(2)]
    assert len(set(envs)) == 2
    assert "CUDA_VISIBLE_DEVICES" not in dist.worker_env(0, [])
    pytest.importorskip("distributed")
    with pytest.raises(SplitlabError, match="at most 2"):
        dist.local_cluster(3, gpus=["0", "1"])
    env = dict(host="h", cuda_visible_devices="2,3", device=dict(index=0, uuid="GPU-x"))
    assert sweep._where(env) == dict(host="h", gpu_index=2, gpu_uuid="GPU-x")
    assert sweep._where(dict(host="h", cuda_visible_devices=None, device=dict(index=1, uuid="u")))["gpu_index"] == 1
    assert sweep._where(dict(host="h", device=dict(name="cpu", index=None, uuid=None)))["gpu_index"] is None


def test_old_data_without_the_new_columns_reads_with_na(tmp_path):
    import pandas as pd

    df = pd.read_parquet(next(Path(REPO / "data" / "h200").rglob("results.parquet")))
    old = df.drop(columns=[c for c in ("host", "gpu_index", "gpu_uuid") if c in df.columns])
    old.to_parquet(tmp_path / "old.parquet")
    back = results.load(tmp_path / "old.parquet")
    assert len(back) == len(old) and back.host.isna().all() and str(back.gpu_index.dtype) == "Int64"


def test_cli_flags_and_the_single_process_path_without_dask(tmp_path, capsys, monkeypatch):
    p = tmp_path / "exact.toml"
    p.write_text(card_text("exact"))
    base = ["sweep", str(p), "--grid", "quick", "--out", str(tmp_path / "runs"), "--timer", "fake", "--quiet",
            "--device", "h200"]
    bad_flags = [(["--workers", "0"], "--workers"), (["--dask-scheduler", " "], "--dask-scheduler"),
                 (["--workers", "2", "--dask-scheduler", "tcp://x:1"], "not allowed"),
                 (["--workers", "2", "--shard", "0/2"], "--shard"), (["--workers", "2", "--limit", "3"], "--limit")]
    for bad, word in bad_flags:
        assert main(base + bad) == 2, bad
        err = capsys.readouterr().err
        assert word in err and err.count("\n") == 1, err
    # Dask absent: the plain sweep never imports it; --workers names the extra.
    for mod in ("dask", "distributed"):
        monkeypatch.setitem(sys.modules, mod, None)  # `import dask` raises ImportError
    assert main(base) == 0
    assert "points done" in capsys.readouterr().out
    assert main(base + ["--resume", "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert "pip install splitlab[dist]" in err and err.count("\n") == 1
