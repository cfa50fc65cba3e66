"""The command line: tables, JSON, and one-line errors with exit code 2."""

import json

import pytest

from splitlab.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_devices_lists_presets(capsys):
    code, out, _ = run(capsys, "devices")
    assert code == 0 and "h200-sxm" in out and "mi355x" in out
    code, out, _ = run(capsys, "devices", "--json")
    assert {d["name"] for d in json.loads(out)} >= {"h100-sxm", "h200-sxm", "b200", "gb10", "mi325x"}


def test_plan_reproduces_seed_000_phase0_on_mi355x(capsys):
    # Seed 000's Phase 0 sweep (MLA-style, h=64, MI355X 256 CUs): (batch, ctx) -> np.
    phase0 = {(1, 131072): 128, (2, 65536): 64, (2, 81920): 64, (2, 131072): 128, (8, 81920): 32,
              (8, 131072): 32, (16, 131072): 16}
    code, out, _ = run(capsys, "plan", "--kind", "mla", "--heads", "64", "--batch", "1,2,8,16",
                       "--ctx", "65536,81920,131072", "--device", "MI355X", "--planner", "modular", "--json")
    assert code == 0
    got = {(r["batch"], r["ctx_len"]): r["num_splits"] for r in json.loads(out)}
    assert {k: got[k] for k in phase0} == phase0


def test_plan_table_for_every_planner(capsys):
    code, out, _ = run(capsys, "plan", "--workload", "deepseek-v3-mla", "--batch", "8", "--ctx", "81920",
                       "--device", "mi355x,h200,rtx5090")
    assert code == 0
    for name in ("modular", "flashmla", "splitlab", "last_wave_fill"):
        assert name in out
    code, out, _ = run(capsys, "plan", "--workload", "llama-3-8b", "--json", "--planner", "all")
    rows = json.loads(out)
    assert all(r["num_splits"] >= 1 and r["ctas"] >= 1 and 0 < r["last_wave_fill"] <= 1 for r in rows)


@pytest.mark.parametrize("argv, needle", [
    (["plan", "--workload", "llama-3-8b", "--batch", "0"], "batch=0"),
    (["plan", "--workload", "llama-3-8b", "--batch", "-3"], "batch=-3"),
    (["plan", "--workload", "llama-3-8b", "--batch", "two"], "--batch"),
    (["plan", "--workload", "llama-3-8b", "--ctx", "1.5"], "--ctx"),
    (["plan", "--workload", "llama-3-8b", "--heads", "12"], "num_q_heads=12"),
    (["plan", "--workload", "llama-3-8b", "--device", "tpu"], "device='tpu'"),
    (["plan", "--workload", "llama-3-8b", "--planner", "magic"], "planner='magic'"),
    (["plan", "--workload", "gpt-5"], "workload='gpt-5'"),
    (["plan", "--kind", "dense"], "--kind"),
    (["plan"], "--workload or --kind"),
    (["frobnicate"], "frobnicate"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("splitlab: error:") and needle in err
    assert "Traceback" not in err


def test_bench_without_gpu_is_a_clear_error(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    code, _, err = run(capsys, "bench", "--quick")
    assert code == 2 and "needs a GPU" in err
