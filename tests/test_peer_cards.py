"""The library peers (FlashInfer's paged decode and MLA, FlashMLA's dense MLA decode) as kernel cards: the cards
validate and expand on the shapes of splitlab's own cards, ``--dry-run`` lists them, and without the library (or a
GPU) their points are skipped with a one-line reason. FlashInfer's split knob maps onto its plan as the port of
its planner says; the comparison table's arithmetic on hand-made rows."""

import importlib.util

import pandas as pd
import pytest
import torch

from splitlab import devices, peer_table, results, workloads
from splitlab.bench import cards, grid, peers_flashinfer, peers_flashmla, sweep
from splitlab.bench.peers_flashinfer import (
    FLASHINFER_DECODE,
    FLASHINFER_MLA_FA2,
    FLASHINFER_MLA_FA3,
    csr_pages,
    split_arguments,
    tc_decode_plan,
)
from splitlab.bench.peers_flashmla import FLASHMLA_DECODE
from splitlab.bench.timing import FakeTimer
from splitlab.cli import main
from splitlab.errors import SplitlabError

PEER_CARDS = {"flashinfer_decode": "gqa_decode", "flashinfer_mla": "mla_decode", "flashinfer_mla_fa2": "mla_decode",
              "flashmla_decode": "mla_decode"}
H200 = devices.get("h200")


def _shapes(name, g):
    return {p.workload for p in grid.expand(cards.load(name), g, "h200").points}


@pytest.mark.parametrize("name", sorted(PEER_CARDS))
def test_peer_cards_validate_and_cover_splitlabs_shapes(name):
    c = cards.load(name)
    assert c.impl_type == "external" and c.timer == "graph"
    assert {"quick", "default", "seed", "peers"} <= set(c.grids)
    mine = PEER_CARDS[name]
    for g in ("quick", "peers"):
        assert _shapes(name, g) == _shapes(mine, g), (name, g)
    assert _shapes(name, "default") <= _shapes(mine, "default") | _shapes("sdpa_cudnn", "default")
    for g in ("peers",):  # the SDPA cards compare on the same shapes (a contiguous cache: page size aside)
        gqa = {w.with_(page_size=16) for w in _shapes("sdpa_cudnn", g)}
        assert name.startswith("flashinfer_mla") or name == "flashmla_decode" or gqa == _shapes(name, g)


@pytest.mark.parametrize("name", sorted(PEER_CARDS))
def test_peer_cards_dry_run(name, capsys):
    assert main(["sweep", name, "--grid", "peers", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "36 shapes" in text and f"kernel {name}" in text


def test_flashinfer_card_sweeps_its_split_and_every_planners_choice():
    pts = grid.expand(cards.load("flashinfer_decode"), "peers", "h200").points
    w = workloads.get("mqa-128", batch=1, ctx_len=65536)
    here = [p for p in pts if p.workload == w]
    own = tc_decode_plan(w, H200.sm_count).num_splits
    assert own == 256  # 2 * 132 tiles for one kv head: 16-page chunks of 4096 pages
    assert {p.facts["num_splits"] for p in here} >= {1, 2, 4, 64, own}
    assert all(p.facts["ctas"] == tc_decode_plan(w, H200.sm_count, p.facts["num_splits"]).work_tiles for p in here)
    assert {"splitlab", "flashinfer"} <= {n for p in pts for n in p.planners}
    assert len({p.point_id for p in here}) == len(here)


def test_flashinfer_plan_port():
    # Llama-3-8B (group 4: 16-row query tiles), 8 kv heads: 2 * 132 // 8 = 33 tiles a kv head.
    w = workloads.get("llama-3-8b", batch=1, ctx_len=65536)
    p = tc_decode_plan(w, 132)
    assert (p.cta_tile_q, p.chunk_pages, p.num_splits, p.split_kv) == (16, 125, 33, True)
    assert tc_decode_plan(w.with_(ctx_len=1024), 132).num_splits == 8  # the 8-page (128-key) floor
    assert tc_decode_plan(w.with_(batch=64), 132) == (1, (1,) * 64, 4096, 16, 64, False)  # batch fills the budget
    mqa = workloads.get("mqa-128", batch=64, ctx_len=1024)
    assert tc_decode_plan(mqa, 132).cta_tile_q == 128 and tc_decode_plan(mqa, 132).num_splits == 4
    # A pinned split: cdiv(pages, s) pages a chunk, disable_split_kv at 1; ragged lengths keep their own counts.
    assert split_arguments(w, 1) == {"disable_split_kv": True} and split_arguments(w, 3) == {"fixed_split_size": 1366}
    assert tc_decode_plan(w, 132, 3).num_splits == 3 and tc_decode_plan(w, 132, 5000).num_splits == 4096
    rag = w.with_(batch=3, seq_lens=(100, 1000, 4000), ctx_len=4000)
    assert tc_decode_plan(rag, 132, 4).per_request == (1, 1, 4) and tc_decode_plan(rag, 132, 4).work_tiles == 6
    assert tc_decode_plan(rag, 132, 1) == (1, (1, 1, 1), 250, 16, 3, False)


def test_csr_pages_from_splitlabs_block_table():
    table = torch.tensor([[5, 6, 7], [1, 2, 0], [9, 3, 4]], dtype=torch.int32)
    indptr, indices, last = csr_pages(table, torch.tensor([40, 17, 1], dtype=torch.int32), 16)
    assert indptr.tolist() == [0, 3, 5, 6] and indices.tolist() == [5, 6, 7, 1, 2, 9] and last.tolist() == [8, 1, 1]
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32


@pytest.mark.parametrize("impl, w, knobs, needle", [
    (FLASHINFER_DECODE, workloads.get("deepseek-v3-mla"), {}, "kind='mla'"),
    (FLASHINFER_DECODE, workloads.get("llama-3-8b"), {"block_n": 64}, "only num_splits"),
    (FLASHINFER_DECODE, workloads.get("llama-3-8b"), {"num_splits": 0}, "num_splits=0"),
    (FLASHINFER_DECODE, workloads.get("llama-3-8b", batch=2).with_(seq_lens=(0, 8), ctx_len=8), {}, "lengths >= 1"),
    (FLASHINFER_MLA_FA3, workloads.get("deepseek-v3-mla"), {"num_splits": 4}, "schedules its own splits"),
    (FLASHINFER_MLA_FA2, workloads.get("deepseek-v3-mla").with_(head_dim_qk=192, head_dim_v=128), {}, "576/512"),
    (FLASHMLA_DECODE, workloads.get("deepseek-v3-mla", page_size=16), {}, "page_size=16"),
    (FLASHMLA_DECODE, workloads.get("deepseek-v3-mla", dtype="fp8_e4m3"), {}, "dtype='fp8_e4m3'"),
])
def test_peers_refuse_what_they_cannot_run_in_one_line(impl, w, knobs, needle):
    with pytest.raises(SplitlabError, match=needle.replace("(", r"\(")) as e:
        impl.launch_facts(w, knobs, H200)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("impl, module", [(FLASHINFER_DECODE, "flashinfer"), (FLASHINFER_MLA_FA3, "flashinfer"),
                                          (FLASHMLA_DECODE, "flash_mla")])
def test_without_the_library_a_peer_says_why_in_one_line(monkeypatch, impl, module):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    reason = impl.unavailable()
    assert reason and "\n" not in reason and f"no module {module!r}" in reason
    assert ("splitlab[peers]" in reason) == (module == "flashinfer")
    assert peers_flashinfer.LIBRARY == "flashinfer" and peers_flashmla.LIBRARY == "flash_mla"


def test_peer_points_are_skipped_with_the_reason_where_they_cannot_run(tmp_path):
    if importlib.util.find_spec("flashinfer") is not None and torch.cuda.is_available():
        pytest.skip("FlashInfer and a GPU are here: the points would run")
    card = cards.load("flashinfer_decode")
    res = sweep.run(card, sweep.SweepOptions(grid="quick", out=tmp_path, quiet=True, limit=3), timer=FakeTimer(H200))
    df = results.load(res.sweep_dir)
    assert len(df) == 3 and (df.status == "skipped").all()
    assert df.error.map(lambda e: "\n" not in e and ("not installed" in e or "needs a CUDA GPU" in e)).all()
    assert df.num_splits.notna().all()  # each row still says which split it stands for


def _row(kernel, w, us, *, splits=None, planners=""):
    return dict(w.row(), kernel=kernel, status="ok", timing="graph", p50_us=us, num_splits=splits, planners=planners,
                sm_count=132, impl=kernel)


def test_comparison_table_arithmetic():
    w = workloads.get("llama-3-8b", batch=64, ctx_len=8192)  # 2.15 GB of KV: floor 477 us at 4.5 TB/s
    own = tc_decode_plan(w, 132).num_splits
    rows = [_row("gqa_decode", w, 600.0, splits=1, planners="splitlab"), _row("gqa_decode", w, 550.0, splits=2),
            _row("flashinfer_decode", w, 700.0, splits=own), _row("flashinfer_decode", w, 500.0, splits=own + 1),
            _row("sdpa_cudnn", w, 520.0), _row("sdpa_flash", w, 800.0)]
    r = peer_table.roles(pd.DataFrame(rows))
    by = r.set_index("role")
    assert by.loc["FlashInfer (own plan)", "p50_us"] == 700 and by.loc["FlashInfer (best split)", "p50_us"] == 500
    assert by.loc["splitlab (planner)", "p50_us"] == 600 and by.loc["splitlab (best)", "p50_us"] == 550
    floor = w.kv_bytes / (H200.roofline_gbps * 1e3)
    assert by.loc["SDPA cuDNN", "roofline"] == pytest.approx(floor / 520)
    assert by.loc["SDPA cuDNN", "gbps"] == pytest.approx(w.kv_bytes / 520e3)
    assert by.loc["SDPA cuDNN", "tflops"] == pytest.approx(w.flops / 520e6)
    c = peer_table.comparison(r)
    assert c.loc[0, "best_peer"] == "FlashInfer (best split)" and c.loc[0, "best_peer_us"] == 500
    assert c.loc[0, "speedup_planner"] == pytest.approx(500 / 600)
    assert c.loc[0, "speedup_best"] == pytest.approx(500 / 550)
    s = peer_table.summary(c)
    assert s.loc[0, "worst_shape"] == "32/8 B=64 N=8K" and s.loc[0, "wins_planner"] == 0
    md = peer_table.markdown(r, c)
    assert "| 32/8 B=64 N=8K | 600.0 (" in md and "FlashInfer (best split)" in md
    # A shape without any peer measured is left out of the comparison (nothing to compare with).
    alone = _row("gqa_decode", w.with_(batch=2), 90.0, splits=1, planners="splitlab")
    c2 = peer_table.comparison(peer_table.roles(pd.DataFrame([*rows, alone])))
    assert len(c2) == 1 and c2.loc[0, "batch"] == 64
    assert peer_table.comparison(peer_table.roles(pd.DataFrame([alone]))).empty
    with pytest.raises(SplitlabError, match="modelled"):
        peer_table.roles(pd.DataFrame(rows).assign(timing="fake"))
