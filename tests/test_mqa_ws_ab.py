"""``experiments/mqa_ws/ab.py`` without a GPU: its argument parsing, the batches it times, the schedules it gives
the kernel (each one the launcher takes), its CSV rows, which kernels it times after the checks and the summary it
prints. (``test_ab_harness.py`` has the harness it shares with ``experiments/mla_ws/ab.py``, the verdict of a check
among it; ``test_experiments.py`` byte-compiles the script and resolves its imports; the GPU parts run on the H200
only.)"""

from __future__ import annotations

import pytest
from ab_scripts import assert_appends_rows, load

from splitlab.kernels import _launch
from splitlab.kernels.mqa_sm90_ws import STAGE_CHOICES


@pytest.fixture(scope="module")
def ab():
    return load("mqa_ws")


@pytest.fixture
def off_interpreter(monkeypatch):
    """The launcher's checks as on a GPU: not under the interpreter, CPU tensors standing in for CUDA ones."""
    monkeypatch.setattr(_launch, "INTERPRET", False)
    monkeypatch.setattr(_launch, "check_launch_device", lambda *a: None)


def test_parses_its_commands(ab):
    a = ab.parse_args(["all", "--out", "o", "--budget-s", "150"])
    assert (a.cmd, a.out, a.budget_s, a.pages, a.peers) == ("all", "o", 150.0, [16, 64], list(ab.PEERS))
    assert a.kernels == ["ws", "ws3", "wsp"] and [ab.KERNELS[k] for k in ("ws", "ws3")] == list(STAGE_CHOICES)
    assert ab.PERSISTENT_KERNELS == {"wsp"} and ab.KERNELS["wsp"] in STAGE_CHOICES
    assert a.check_timeout_s > 0 and a.schedules == list(ab.SCHEDULES)
    a = ab.parse_args(["run", "--out", "o", "--batches", "8,64", "--keys", "8192", "--dists", "uniform",
                       "--pages", "16", "--peers", "sdpa-cudnn", "--schedules", "splitlab", "--kernels", "ws3"])
    assert (a.batches, a.keys, a.dists, a.pages, a.peers, a.schedules, a.kernels) == (
        [8, 64], [8192], ["uniform"], [16], ["sdpa-cudnn"], ["splitlab"], ["ws3"])
    assert ab.parse_args(["check", "--out", "o"]).kernel == "ws"
    assert ab.parse_args(["check", "--out", "o", "--kernel", "wsp"]).kernel == "wsp"
    a = ab.parse_args(["run", "--out", "o", "--kernels", "ws,wsp", "--schedules", "stream_k,flashmla"])
    assert (a.kernels, a.schedules) == (["ws", "wsp"], ["stream_k", "flashmla"])
    a = ab.parse_args(["check", "--out", "o", "--kernel", "tl"])
    assert a.kernel == ab.BASELINE and not hasattr(a, "budget_s")
    assert ab.parse_args(["summary", "x.csv"]).csv == "x.csv"


@pytest.mark.parametrize("argv", [["run", "--out", "o", "--schedules", "fa3"],
                                  ["run", "--out", "o", "--peers", "cudnn"], ["run", "--out", "o", "--pages", "32"],
                                  ["all", "--out", "o", "--dists", "bimodal"], ["run", "--out", "o", "--kernels",
                                                                                "ws4"],
                                  ["check", "--out", "o", "--kernel", "gqa"], ["run"], []])
def test_refuses_bad_arguments(ab, argv):
    with pytest.raises(SystemExit):
        ab.parse_args(argv)


def test_the_timed_batches(ab):
    s = ab.shapes()
    # batch 8/16/64 x 8K/32K/64K keys x uniform/longtail x page 16/64
    assert len(s) == 3 * 3 * 2 * 2 and len(set(s)) == len(s)
    assert {b for b, *_ in s} == {8, 16, 64} and {n for _, n, _, _ in s} == {8192, 32768, 65536}
    assert {d for *_, d, _ in s} == {"uniform", "longtail"} and {p for *_, p in s} == {16, 64}
    assert s[0] == (16, 32768, "uniform", 16) and s[1] == (16, 32768, "uniform", 64)


def test_the_kernels_schedules_are_ones_its_launcher_takes(ab):
    """For every timed batch on the H200's preset: splitlab's non-persistent schedule and the uniform one at the
    planner's split start their items at multiples of a box (``mqa_sm90_ws.box_rows``), one item a CTA slot."""
    from splitlab import devices
    from splitlab.bench import decode as bench_decode
    from splitlab.bench.abharness import ab_workload
    from splitlab.kernels.mqa_sm90_ws import box_rows
    from splitlab.planners import schedulers

    dev = devices.get("h200")
    for batch, longest, dist, page in ab.shapes():
        w = ab_workload("gqa", batch, ab.HEADS, 128, 128, longest, page, dist)  # as ``run`` draws it
        splits = bench_decode.default_knobs(w, dev)["num_splits"]
        for s in (schedulers.splitlab(w, dev, persistent=False), schedulers.uniform(w.lengths, splits)):
            assert not s.persistent and s.align % box_rows(page) == 0
        # the persistent kernel's: items at multiples of a box, several a slot on stream-K's and FlashMLA's rule
        for s in (schedulers.schedule(w, dev, "stream_k"), schedulers.flashmla(w.lengths, dev.sm_count),
                  schedulers.splitlab(w, dev)):
            assert s.align % box_rows(page) == 0
        assert schedulers.schedule(w, dev, "stream_k").persistent


def test_the_persistent_kernel_runs_every_schedule_the_others_only_one_item_ones(ab):
    p = ab.pairs(["ws", "wsp"], list(ab.SCHEDULES))
    assert [k for k, label in p if label in ab.PERSISTENT_SCHEDULES] == ["wsp"] * len(ab.PERSISTENT_SCHEDULES)
    assert ("ws", "uniform") in p and ("wsp", "uniform") in p and ("wsp", "splitlab") in p
    assert p[:2] == [("ws", "uniform"), ("wsp", "uniform")]  # schedule-major
    assert ab.pairs(["ws3"], ["stream_k", "flashmla"]) == []


def test_which_timed_rows_are_skipped(ab):
    from splitlab.planners import schedulers

    lens = [300, 70, 0]
    sk, one = schedulers.stream_k(lens, 2), schedulers.uniform(lens, 2)
    assert ab.skip_reason("wsp", "stream_k", sk) == "" and ab.skip_reason("wsp", "uniform", one) == ""
    assert "runs one item a CTA slot" in ab.skip_reason("ws", "stream_k", sk)
    assert "chose one item a slot" in ab.skip_reason("wsp", "splitlab-persistent", one)
    assert ab.skip_reason("wsp", "splitlab-persistent", sk) == ""
    assert ab.skip_reason("gqa", "split:4", None) == "" and ab.skip_reason("tl", "splitlab", one) == ""


@pytest.mark.parametrize("page", [16, 64])
def test_the_check_schedules_are_ones_the_launcher_takes(ab, off_interpreter, page):
    """Every check batch's schedules for each kernel (the persistent one: uniform, stream-K and FlashMLA's rule, with
    several items a slot) pass ``check_launch`` as the check calls it; the one-item kernels get uniform only."""
    import torch

    from splitlab.kernels import mqa_sm90_ws
    from splitlab.kernels.inputs import gqa_inputs
    from splitlab.kernels.worklist import WorkList
    from splitlab.planners import schedulers

    several = 0
    for _, heads, lens, p, _, splits, twist in ab.CHECKS:
        if p != page:
            continue
        x = gqa_inputs(len(lens), heads, 1, 128, lens, page_size=p, dtype=torch.bfloat16)
        tile = 16 if twist == "tile16" else schedulers.TILE_KEYS
        assert [label for label, _ in ab.check_schedules("ws", lens, splits, tile)] == [f"uniform:{splits}"]
        got = ab.check_schedules("wsp", lens, splits, tile)
        assert [label.split(":")[0] for label, _ in got] == ["uniform", "stream_k", "flashmla"]
        for _, s in got:
            work = WorkList.from_schedule(s, "cpu")
            assert mqa_sm90_ws.check_launch(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work,
                                            persistent=True) is work
            several += max(b - a for a, b in zip(s.cta_offsets, s.cta_offsets[1:], strict=False)) > 1
    assert several > 0


def test_writes_csv_rows(ab, tmp_path):
    got = assert_appends_rows(
        ab, tmp_path, dict(phase="check", impl="ws", case="fp16-p16", status="ok", rel_err="1.00e-03"),
        dict(phase="time", impl="gqa", heads=128, batch=16, longest=8192, dist="uniform", page=16, us=12.5,
             status="ok"))
    assert "variant" not in got[0] and got[1]["page"] == "16"


def test_times_the_kernel_only_after_every_check_passed(ab):
    ok = [dict(phase="check", impl="ws", status="ok"), dict(phase="check", impl="tl", status="wrong")]
    assert ab.passed_checks(ok, "ws")
    assert not ab.passed_checks(ok + [dict(phase="check", impl="ws", status="timeout")], "ws")
    assert not ab.passed_checks([dict(phase="time", impl="ws", status="ok")], "ws")  # no check row: not passed
    assert not ab.passed_checks(ok, "ws3") and ab.passed_checks(ok, "tl") is False


def test_summary(ab):
    def t(impl, us, page=16, batch=8, dist="uniform", roof=0.5, status="ok"):
        return dict(phase="time", impl=impl, heads="128", batch=str(batch), longest="8192", dist=dist,
                    page=str(page), us=str(us), roofline=str(roof), status=status, error="")

    rows = [t("gqa", 20.0, roof=0.4), t("ws@splitlab", 10.0, roof=0.8), t("sdpa-cudnn", 40.0, roof=0.2),
            t("flashinfer", 12.5, roof=0.64), t("gqa", 30.0, batch=16, roof=0.5),
            t("ws@splitlab", 20.0, batch=16, roof=0.75), t("sdpa-cudnn", 0, batch=16, status="skipped"),
            dict(phase="check", impl="ws", case="fp16-p16", rel_err="2.00e-03", status="ok", error=""),
            dict(phase="check", impl="ws", case="bad-page-p16", rel_err="", status="timeout", error="hung")]
    lines = ab.summary_lines(rows)
    assert lines[0] == "MQA-128 page 16 uniform (2 batches)"
    ws = next(x for x in lines if x.strip().startswith("ws@splitlab"))
    assert "vs gqa 1.732 (worst 1.500)" in ws  # 20/10 and 30/20
    assert "vs best peer 1.250 (worst 1.250)" in ws and "lowest 0.750, >= 0.75 in 2/2" in ws
    assert "check ws: 1/2 ok, largest rel_err 2.00e-03; bad-page-p16: timeout hung" in lines
    assert any(x.startswith("time sdpa-cudnn 16/8192/uniform/page 16: skipped") for x in lines)
