"""Schedules (``planners.schedule``) and the schedulers (``planners.schedulers``): pure Python, no GPU."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitlab import devices
from splitlab.errors import SplitlabError
from splitlab.planners import flashmla as flashmla_port
from splitlab.planners import schedulers as S
from splitlab.planners.schedule import Schedule, make
from splitlab.workloads import DecodeWorkload

LENGTHS = st.lists(st.one_of(st.sampled_from([0, 1, 63, 64, 65, 128]), st.integers(0, 20000)), min_size=1,
                   max_size=40)


def every_scheduler(lens: list[int]) -> list[Schedule]:
    return [S.uniform(lens, 5), S.uniform(lens, 1), S.balanced(lens, 50), S.stream_k(lens, 17),
            S.flashinfer(lens, page_size=16, num_kv_heads=8, sm_count=132), S.flashmla(lens, 33)]


@settings(max_examples=150, deadline=None)
@given(LENGTHS)
def test_every_schedule_covers_every_key_once(lens):
    for s in every_scheduler(lens):
        assert s.check() is s  # make() checked already; check() again is idempotent
        covered = [0] * len(lens)
        for _, r, b, e in s.items:
            covered[r] += e - b
        assert covered == lens, s.scheduler
        assert len(s.item_rows) == len(s.items)
        assert sum(r >= 0 for r in s.item_rows) == s.partial_rows
        assert sorted(r for r in s.item_rows if r >= 0) == list(range(s.partial_rows))
        for r, n in enumerate(s.partials):
            assert n >= 1 and (lens[r] > 0 or n == 1)


def test_check_names_the_broken_rule():
    lens = (100, 0)
    good = [(0, 0, 0, 64), (1, 0, 64, 100), (2, 1, 0, 0)]
    assert make("t", lens, good, align=64).partials == (2, 1)
    cases = {
        "reads twice": [(0, 0, 0, 64), (1, 0, 0, 100), (2, 1, 0, 0)],
        "covers keys": [(0, 0, 0, 64), (1, 1, 0, 0)],
        "empty request 1 has 2 items": [(0, 0, 0, 100), (1, 1, 0, 0), (2, 1, 0, 0)],
        "not a multiple of align": [(0, 0, 0, 60), (1, 0, 60, 100), (2, 1, 0, 0)],
        "names request 5": [(0, 0, 0, 100), (1, 5, 0, 0), (2, 1, 0, 0)],
        "runs two items": [(0, 0, 0, 64), (0, 0, 64, 100), (1, 1, 0, 0)],
        "keys [0, 0) of request 0": [(0, 0, 0, 0), (1, 0, 0, 100), (2, 1, 0, 0)],
    }
    for what, items in cases.items():
        with pytest.raises(SplitlabError, match=what.replace("[", r"\[").replace(")", r"\)")):
            make("t", lens, items, align=64)
    with pytest.raises(SplitlabError, match="runs no item"):
        Schedule("t", lens, 4, tuple(good), False, 64).check()


def test_uniform_is_the_split_count_kernels_split():
    # kernels.gqa: split_len = cdiv(cdiv(L, S), BLOCK_N) * BLOCK_N, split-major grid, empty splits dropped
    s = S.uniform([1000, 100, 0], 4)
    assert s.items == ((0, 0, 0, 256), (1, 1, 0, 64), (2, 2, 0, 0), (3, 0, 256, 512), (4, 1, 64, 100),
                       (5, 0, 512, 768), (6, 0, 768, 1000))
    assert s.partials == (4, 2, 1) and s.partial_rows == 6 and not s.persistent


@settings(max_examples=100, deadline=None)
@given(LENGTHS, st.integers(1, 264))
def test_flashmla_items_are_get_mla_metadata_spans(lens, parts):
    s = S.flashmla(lens, parts)
    meta, prefix = flashmla_port.get_mla_metadata(lens, parts)
    assert s.ctas == parts and s.persistent
    assert list(s.partials) == [prefix[i + 1] - prefix[i] for i in range(len(lens))]
    for p, m in enumerate(meta):
        mine = [it for it in s.items if it[0] == p]
        if m.empty:
            assert not mine
            continue
        assert [it[1] for it in mine] == list(range(m.begin_req_idx, m.end_req_idx + 1))
        assert mine[0][2] == (m.begin_block_idx * 64 if lens[m.begin_req_idx] else 0)


def test_stream_k_gives_every_cta_the_same_tiles():
    lens = [random.Random(3).randint(0, 9000) for _ in range(37)]
    s = S.stream_k(lens, 20)
    tiles = [sum(-(-(e - b) // 64) for c2, _, b, e in s.items if c2 == c) for c in range(s.ctas)]
    assert max(tiles) - min(tiles) <= 1 + 1  # a span cut inside a request's partial last tile counts it twice


def test_flashinfer_chunk_is_the_smallest_that_fits():
    lens = [4096] * 4 + [100]
    s = S.flashinfer(lens, page_size=16, num_kv_heads=8, sm_count=132)  # budget 2 * 132 // 8 = 33 CTAs
    pages = s.params["chunk_pages"]
    assert len(s.items) <= 33 and pages >= 8
    assert sum(-(-max(-(-n // 16), 1) // (pages - 1)) for n in lens) > 33 or pages == 8


def test_splitlab_scheduler_is_deterministic_and_priced():
    dev = devices.get("h200")
    w = DecodeWorkload("gqa", 64, 32, 8, 128, 128, 32768, page_size=16, length_dist="longtail", length_seed=5)
    a, b = S.splitlab(w, dev), S.splitlab(w, dev)
    assert a.digest == b.digest and a.params["chosen_by"] == "splitlab"
    c = __import__("splitlab.planners.splitlab", fromlist=["x"]).constants_for(dev, "gqa").constants
    costs = [S.modelled_time(s, w, dev.sm_count, c) for s in S.candidates(w, dev.sm_count, c)]
    assert a.params["modelled"] == pytest.approx(min(costs), abs=0.01)
    # a long-tail batch is not split evenly: its short requests take fewer items than its longest
    per = a.partials
    longest = max(range(w.batch), key=lambda r: w.lengths[r])
    assert per[longest] > min(per)


def test_summary_and_json_name_what_runs():
    s = S.flashmla([5000, 0, 300], 8)
    j = s.to_json()
    assert j["scheduler"] == "flashmla" and j["ctas"] == 8 and j["partials"] == list(s.partials)
    assert all(len(it) == 4 for it in j["items"]) and j["schedule_hash"] == s.digest
    assert S.uniform([5000, 0, 300], 2).digest != S.uniform([5000, 0, 300], 3).digest


def test_the_cli_schedule_json_contract(capsys):
    import json

    from splitlab import cli

    assert cli.SCHEDULERS == S.NAMES
    assert cli.main(["schedule", "--kind", "mla", "--seq-lens", "5000,0,300", "--scheduler", "flashmla",
                     "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    want = S.flashmla([5000, 0, 300], flashmla_port.num_sm_parts(132, 128, 1))
    assert j["scheduler"] == "flashmla" and j["ctas"] == want.ctas
    assert j["items"] == [list(it) for it in want.items] and j["partials"] == list(want.partials)
    assert cli.main(["schedule", "--kind", "gqa", "--batch", "8", "--ctx", "32k", "--lengths", "longtail:3"]) == 0
    assert "schedule_hash" in capsys.readouterr().out


def test_sparse_schedules_walk_each_tokens_top_k(capsys):
    """Sparse MLA: a token is a request, its walked top-k positions its keys (``w.lengths``: topk for every token,
    or the drawn valid prefix); FlashMLA's sparse decode schedule is its metadata over those lengths with the sparse
    implementation's SM parts (``planners.flashmla``: the split counts it plans); FlashInfer's is refused; the CLI's
    --json contract holds."""
    import json

    from splitlab import cli
    from splitlab.planners import flashmla as port

    dev = devices.get("h200")
    ragged = DecodeWorkload("sparse_mla", 8, 64, 1, 512, 512, 65536, page_size=1, topk=1024, length_dist="spread8",
                            length_seed=3)
    assert S.names_for("sparse_mla") == ("splitlab", "uniform", "balanced", "stream_k", "flashmla")
    for w in (ragged, ragged.with_(length_dist="uniform")):
        for name in S.names_for("sparse_mla"):
            s = S.schedule(w, dev, name)
            assert s.lengths == w.lengths and s.check() is s, name
        c = __import__("splitlab.planners.splitlab", fromlist=["x"]).constants_for(dev, "sparse_mla").constants
        slow, _ = _slow_splitlab(w, dev)
        assert S.splitlab(w, dev, c).digest == slow.digest
    assert S.schedule(ragged.with_(length_dist="uniform"), dev, "uniform", num_splits=4).lengths == (1024,) * 8
    uniform = ragged.with_(length_dist="uniform")
    assert S.schedule(uniform, dev, "flashmla").partials == port.plan_flashmla(uniform, dev).per_request
    parts = port.sparse_num_sm_parts(dev.sm_count, 64)
    _, prefix = port.get_mla_metadata(port.sparse_seqlens_k(8, 1024, topk_length=ragged.lengths), parts)
    s = S.schedule(ragged, dev, "flashmla")
    assert s.ctas == parts and s.persistent and s.partials == tuple(port.splits_per_request(prefix))
    with pytest.raises(SplitlabError, match="h_q=16 is not allowed") as e:
        S.schedule(ragged.with_(num_q_heads=16), dev, "flashmla")
    assert "\n" not in str(e.value)
    with pytest.raises(SplitlabError, match="scheduler 'flashinfer' is not allowed for kind sparse_mla"):
        S.schedule(ragged, dev, "flashinfer")
    argv = ["schedule", "--kind", "sparse_mla", "--batch", "8", "--topk", "1024", "--heads", "64", "--head-dim", "512",
            "--head-dim-v", "512", "--ctx", "65536", "--lengths", "spread8:3", "--scheduler", "balanced", "--json"]
    assert cli.main(argv) == 0
    j = json.loads(capsys.readouterr().out)
    want = S.schedule(ragged, dev, "balanced")
    assert j["scheduler"] == "balanced" and j["kind"] == "sparse_mla" and j["ctas"] == want.ctas
    assert j["items"] == [list(it) for it in want.items] and j["partials"] == list(want.partials)
    assert j["seq_lens"] == list(ragged.lengths)


@pytest.mark.parametrize("argv,says", [
    (["--kind", "mla", "--seq-lens", "10,0", "--scheduler", "flashinfer"], "not allowed for kind mla"),
    (["--kind", "gqa", "--seq-lens", "10,0", "--scheduler", "flashmla"], "not allowed for kind gqa"),
    (["--kind", "gqa", "--seq-lens", "10", "--scheduler", "uniform", "--ctas", "3"], "--ctas is not allowed"),
    (["--kind", "gqa", "--seq-lens", "10", "--num-splits", "3"], "--num-splits is not allowed"),
    (["--kind", "gqa", "--batch", "1,2"], "one value each"),
    (["--kind", "sparse_mla", "--heads", "16", "--scheduler", "flashmla"], "64 or 128 (FlashMLA sparse decode)"),
    (["--kind", "sparse_mla", "--scheduler", "flashinfer"], "not allowed for kind sparse_mla"),
    (["--kind", "gqa", "--scheduler", "nope"], "invalid choice"),
])
def test_the_cli_schedule_refuses_in_one_line(capsys, argv, says):
    from splitlab import cli

    assert cli.main(["schedule", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def _slow_splitlab(w, dev, max_ctas=None, max_items=None):
    """The scheduler's choice by pricing every built candidate (what ``schedulers.splitlab`` computes faster)."""
    c = __import__("splitlab.planners.splitlab", fromlist=["x"]).constants_for(dev, w.kind).constants
    best, key = None, None
    for s in S.candidates(w, dev.sm_count, c):
        if (max_ctas is not None and s.ctas > max_ctas) or (max_items is not None and len(s.items) > max_items):
            continue
        k = (S.modelled_time(s, w, dev.sm_count, c, dev.arch), s.partial_rows, len(s.items))
        if key is None or k < key:
            best, key = s, k
    return best, key[0]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([("gqa", 32, 8), ("gqa", 128, 1), ("gqa", 64, 8), ("mla", 16, 1), ("mla", 128, 1)]),
       st.integers(1, 96), st.sampled_from([1000, 8192, 40000]), st.sampled_from(["uniform", "spread16", "longtail"]),
       st.integers(0, 50), st.sampled_from([None, 64, 300]))
def test_the_fast_choice_is_the_built_candidates_choice(shape, batch, longest, dist, seed, cap):
    kind, hq, hkv = shape
    dims = (128, 128, 16) if kind == "gqa" else (576, 512, 64)
    w = DecodeWorkload(kind, batch, hq, hkv, dims[0], dims[1], longest, page_size=dims[2], length_dist=dist,
                       length_seed=seed)
    dev = devices.get("h200")
    cap = None if cap is None or cap < batch else cap
    fast = S.splitlab(w, dev, max_ctas=cap, max_items=cap)
    slow, modelled = _slow_splitlab(w, dev, cap, cap)
    assert fast.digest == slow.digest and fast.params["modelled"] == pytest.approx(round(modelled, 2))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 63, 64, 65, 500, 4096, 40000, 131072]), min_size=1, max_size=40),
       st.sampled_from([("gqa", 32, 8), ("gqa", 128, 1), ("mla", 16, 1), ("mla", 128, 1)]))
def test_each_candidates_floor_is_below_its_price(lens, shape):
    """The floor ``splitlab`` orders and skips candidates by (``_uniform_shape`` / ``_balanced_shape``'s CTA count,
    key tiles and longest CTA; ``ragged_launch_floor``) is the built tile list's and never above its price."""
    from splitlab.planners import splitlab as rule

    kind, hq, hkv = shape
    dims = (128, 128, 16) if kind == "gqa" else (576, 512, 64)
    lens = [1, *lens[1:]] if max(lens) == 0 else lens  # (a workload has keys; the scheduler's empty batch is uniform's)
    w = DecodeWorkload(kind, len(lens), hq, hkv, dims[0], dims[1], max(lens), page_size=dims[2], seq_lens=tuple(lens))
    dev = devices.get("h200")
    c = rule.constants_for(dev, kind).constants
    t = S.splitlab_terms(w, dev, c)
    cands = [(S._uniform_shape(lens, n), S._uniform_tiles(lens, n, t.request_major))
             for n in rule.split_candidates(w, c.max_splits, dev.sm_count)]
    cands += [(S._balanced_shape(lens, b), S._balanced_tiles(lens, b)) for b in t.budgets]
    for (shape_, rows), (tiles, rows_) in cands:
        assert shape_ == (len(tiles), sum(tiles), max(tiles)) and rows == rows_
        price = S._priced([x * 1.0 for x in tiles], rows, t.h, t.slots, t.rate, t.cap, t.p, dev.sm_count, c)
        floor = S._priced(shape_, rows, t.h, t.slots, t.rate, t.cap, t.p, dev.sm_count, c)
        assert floor <= price * (1 + S.FLOOR_MARGIN)


def test_stream_k_is_weighed_where_the_persistent_cost_is_fitted():
    """``persistent_cost`` > 0 (the shipped MLA constants for the narrow tiles) puts stream-K at ``STREAM_K_WAVES``
    among the candidates and prices its key tiles at that cost; 0 (GQA; MLA's wide tile, whose seesaw kernel runs one
    item a slot) leaves it out, and so does ``persistent=False`` (a plan's one-item kernel): the choice is then the
    best of the others."""
    from dataclasses import replace

    from splitlab.planners import splitlab as rule

    dev = devices.get("h200")
    w = DecodeWorkload("mla", 64, 16, 1, 576, 512, 32768, page_size=64, length_dist="longtail", length_seed=3)
    c = rule.constants_for(dev, "mla").constants
    assert S.persistent_cost(w, c) == c.persistent > 0
    assert S.persistent_cost(w.with_(num_q_heads=128), c) == c.persistent_wide == 0
    assert "stream_k" not in {s.scheduler for s in S.candidates(w.with_(num_q_heads=128), dev.sm_count, c)}
    assert S.persistent_cost(w.with_(kind="gqa", num_q_heads=32, num_kv_heads=8, head_dim_qk=128, head_dim_v=128,
                                     page_size=16), rule.constants_for(dev, "gqa").constants) == 0
    names = [s.scheduler for s in S.candidates(w, dev.sm_count, c)]
    assert names.count("stream_k") == len(S.STREAM_K_WAVES) and names[-1] == "stream_k"
    off = replace(c, persistent=0.0)
    assert "stream_k" not in {s.scheduler for s in S.candidates(w, dev.sm_count, off)}
    sk = S.stream_k(list(w.lengths), S.slots_per_group(w, dev, c))
    one, dear = S.modelled_time(sk, w, dev.sm_count, replace(c, persistent=1.0), dev.arch), \
        S.modelled_time(sk, w, dev.sm_count, replace(c, persistent=2.0), dev.arch)
    assert dear > one  # the persistent tile's cost is priced
    cheap = replace(c, persistent=0.5)  # stream-K's tiles at half price: it wins
    assert S.splitlab(w, dev, cheap).scheduler == "stream_k"
    assert S.splitlab(w, dev, cheap, persistent=False).scheduler != "stream_k"
    assert S.splitlab(w, dev, cheap, persistent=False).digest == S.splitlab(w, dev, off).digest


def test_item_fixed_prices_every_item_and_zero_is_fixeds():
    """``item_fixed`` (the work-list kernels' cost per item) is what ``modelled_time`` charges each item; 0 falls back
    to the split-count kernels' FIXED, so a uniform schedule is then priced as the split-count rule prices it."""
    from dataclasses import replace

    from splitlab.planners import splitlab as rule

    dev = devices.get("h200")
    w = DecodeWorkload("gqa", 16, 32, 8, 128, 128, 32768, page_size=16, length_dist="longtail", length_seed=1)
    c = rule.constants_for(dev, "gqa").constants
    assert S.item_fixed(c) == c.item_fixed > 0
    assert S.item_fixed(replace(c, item_fixed=0.0)) == c.fixed
    s = S.uniform(list(w.lengths), 4)
    cheap, dear = (S.modelled_time(s, w, dev.sm_count, replace(c, item_fixed=f), dev.arch) for f in (0.25, 4.0))
    assert dear > cheap
    assert S.modelled_time(s, w, dev.sm_count, replace(c, item_fixed=0.0), dev.arch) == \
        S.modelled_time(s, w, dev.sm_count, replace(c, item_fixed=c.fixed), dev.arch)
