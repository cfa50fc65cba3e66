"""Kernel cards: the shipped cards load and cover what the issue asks; malformed cards get one clear error
naming the file, the key and what is allowed."""

import pytest
from sweep_fixtures import tiny_card

from splitlab.bench import cards, grid
from splitlab.bench.cards import CardError
from splitlab.cli import main

GOOD = tiny_card("t_gqa", header='card = 1\nseed = "000"\n',
                 default='model = "llama-3-8b"\nbatch = 1\nctx_len = 1024\nnum_splits = "pow2"\n') \
    + '[planners]\ncompare = "all"\n'


def write(tmp_path, text, name="card.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_good_card_loads(tmp_path):
    c = cards.load(write(tmp_path, GOOD))
    assert (c.name, c.kind, c.seeds, c.impl_label, c.timer) == ("t_gqa", "gqa", ("000",), "t_gqa", "graph")
    assert set(c.knobs) == {"num_splits", "block_n"} and c.planner_knobs == ("num_splits",)
    assert len(c.grid("quick")[0].shapes) == 4 and c.grid("quick")[0].knob_axes["num_splits"] == (1, 2, 4, 8)
    assert c.grid("default")[0].knob_axes["num_splits"] == (1, 2, 4, 8)  # "pow2" within the knob's range


def test_pow2_and_wave_filling_splits(tmp_path):
    text = tiny_card("t_gqa", default='model = "llama-3-8b"\nbatch = 3\nctx_len = 8192\nnum_splits = "pow2+waves"\n')
    c = cards.load(write(tmp_path, text))
    block = c.grid("default")[0]
    assert block.knob_axes["num_splits"] == (1, 2, 4, 8) and block.wave_splits == 8
    splits = sorted(p.knobs["num_splits"] for p in grid.expand(c, "default", "h200").points if p.in_grid)
    assert splits == [1, 2, 4, 5, 8]  # 24 CTAs on 132 SMs: floor(132 / 24) = 5 fills one slot per SM
    bad = text.replace('num_splits = { min = 1, max = 8 }', 'num_splits = { values = [1, 2, 4, 8] }')
    with pytest.raises(CardError, match="pow2\\+waves"):
        cards.load(write(tmp_path, bad, "bad.toml"))
    with pytest.raises(CardError, match="block_n"):
        cards.load(write(tmp_path, text.replace('num_splits = "pow2+waves"', 'block_n = "pow2+waves"'), "b2.toml"))


def test_shipped_cards_load_and_every_grid_expands():
    names = cards.names()
    assert {"gqa_decode", "mla_decode", "sparse_mla_decode", "sdpa_flash", "sdpa_cudnn", "flex_attention"} <= set(names)
    for n in names:
        c = cards.load(n)
        assert {"quick", "default"} <= set(c.grids)
        if c.impl_type == "kernel":
            assert "seed" in c.grids and c.seeds
        for g in c.grids:
            exp = grid.expand(c, g, "h200")
            assert exp.points, (n, g)
            assert len({p.point_id for p in exp.points}) == len(exp.points)
        assert len(grid.expand(c, "quick", "h200").points) <= 100  # a few minutes on an H200


def _default_ws(name):
    return [p for p in grid.expand(cards.load(name), "default", "h200").points]


def test_default_grids_cover_the_issue_ranges():
    gqa = _default_ws("gqa_decode")
    heads = {(p.workload.num_q_heads, p.workload.num_kv_heads) for p in gqa}
    assert {(32, 8), (64, 8), (128, 1)} <= heads
    assert {p.workload.batch for p in gqa} >= {1, 128} and {p.workload.ctx_len for p in gqa} >= {1024, 131072}
    assert max(p.facts["num_splits"] for p in gqa if p.in_grid) >= 64
    mla = _default_ws("mla_decode")
    assert {p.workload.num_q_heads for p in mla} == {16, 32, 64, 128}
    assert {p.workload.batch for p in mla} >= {1, 64} and {p.workload.ctx_len for p in mla} >= {1024, 131072}
    assert max(p.facts["num_splits"] for p in mla if p.in_grid) == 256
    sp = _default_ws("sparse_mla_decode")
    assert {p.workload.num_q_heads for p in sp} == {16, 32, 64, 96, 128}
    assert {p.facts["block_h"] for p in sp if p.workload.num_q_heads == 96} == {16, 32, 64}  # every head tile
    assert {p.workload.batch for p in sp} >= {1, 256} and {p.workload.topk for p in sp} >= {512, 2048}
    assert {p.facts["block_k"] for p in sp if p.in_grid} >= {32, 64}
    assert max(p.facts["num_splits"] for p in sp if p.in_grid) >= 64
    seed003 = [p for p in grid.expand(cards.load("sparse_mla_decode"), "seed", "h200").points
               if p.workload.num_q_heads == 64 and p.workload.topk == 2048]
    assert {p.workload.batch for p in seed003} >= {1, 128} and {p.facts["block_k"] for p in seed003} == {32, 64}
    seed000 = grid.expand(cards.load("mla_decode"), "seed", "h200").points
    assert {(p.workload.batch, p.workload.ctx_len) for p in seed000} >= {(1, 131072), (16, 131072), (2, 65536)}
    assert any("modular@mi355x" in p.planners for p in seed000)


BAD = [
    # (edit of GOOD, what the message must contain)
    (lambda t: t.replace('kind = "gqa"\n', ""), ["kind is missing", "expected one of gqa, mla, sparse_mla"]),
    (lambda t: t.replace("batch = [1, 2]", 'batch = "two"'), ["grids.quick[0].batch='two'", "expected an integer"]),
    (lambda t: t.replace("batch = [1, 2]", "batch = [1, 2.5]"), ["grids.quick[0].batch", "expected an integer"]),
    (lambda t: t.replace("[knobs]\n", "[knobs]\nblock_q = { min = 1, max = 4 }\n"),
     ["knobs.block_q", "not allowed", "num_splits, block_n, num_warps, num_stages"]),
    (lambda t: t.replace("{ min = 1, max = 8 }", "{ min = 8, max = 2 }"),
     ["knobs.num_splits.max=2", "expected an integer >= min (8)"]),
    (lambda t: t.replace("{ min = 1, max = 8 }", "{ min = 1 }"), ["knobs.num_splits.max is missing"]),
    (lambda t: t.replace("{ min = 1, max = 8 }", '{ min = "one", max = 8 }'), ["knobs.num_splits.min='one'"]),
    (lambda t: t.replace("num_splits = [1, 2, 4, 8]", "num_splits = [1, 16]"),
     ["grids.quick[0].num_splits=[1, 16]", "an integer in [1, 8]"]),
    (lambda t: t.replace("num_splits = [1, 2, 4, 8]", "num_splits = [1, 2]\nblock_n = [24]"),
     ["grids.quick[0].block_n=[24]", "one of 16, 32, 64"]),
    (lambda t: t.replace("num_splits = [1, 2, 4, 8]", 'num_splits = "all"'), ["grids.quick[0].num_splits='all'"]),
    (lambda t: t.replace("card = 1", "card = 1\ncolour = 3"), ["key 'colour' is not allowed", "expected one of card"]),
    (lambda t: t.replace("ctx_len = [64, 128]", "ctx_len = [64, 128]\nheads = 4"),
     ["key 'grids.quick[0].heads' is not allowed", "num_q_heads"]),
    (lambda t: t.replace("[[grids.default]]", "[[grids.other]]"), ["grids.default is missing", "quick, default"]),
    (lambda t: t.replace('model = "llama-3-8b"', 'model = "gpt-5"'), ["grids.default[0].model='gpt-5'", "llama-3-8b"]),
    (lambda t: t.replace('model = "llama-3-8b"', 'model = "deepseek-v3-mla"'),
     ["grids.default[0].model='deepseek-v3-mla'", "a gqa workload preset"]),
    (lambda t: t.replace("num_q_heads = 4", "num_q_heads = 3"), ["grids.quick[0]", "num_q_heads=3"]),
    (lambda t: t.replace("sweep_fixtures:exact", "sweep_fixtures:nope"), ["impl.import", "has no 'nope'"]),
    (lambda t: t.replace("sweep_fixtures:exact", "no_such_module:f"), ["impl.import", "ModuleNotFoundError"]),
    (lambda t: t.replace("sweep_fixtures:exact", "sweep_fixtures.exact"), ["impl.import", "package.module:attribute"]),
    (lambda t: t.replace('reference = "splitlab.kernels.reference:gqa_decode"\n', ""), ["impl.reference is missing"]),
    (lambda t: t.replace("[impl]\n", '[impl]\ntype = "plugin"\n'), ["impl.type='plugin'", "kernel, external"]),
    (lambda t: t.replace('compare = "all"', 'compare = ["magic"]'), ["planners.compare=['magic']", "splitlab"]),
    (lambda t: t.replace("card = 1", "card = 2"), ["card=2 is not allowed", "expected 1"]),
    (lambda t: t.replace("[[grids.quick]]", "[[grids.quick]\n"), ["not valid TOML"]),
    (lambda t: t.replace("min_keys_per_split = 1", "max_kv_gb = -1"), ["grids.quick[0].max_kv_gb=-1"]),
    (lambda t: t.replace("min_keys_per_split = 1", 'planner_devices = ["tpu"]'),
     ["grids.quick[0].planner_devices=['tpu']", "mi355x"]),
    # Past the workload bounds (workloads.LIMITS): the expansion ran out of memory.
    (lambda t: t.replace("batch = [1, 2]", "batch = [1000000000000]"),
     ["grids.quick[0].batch=[1000000000000]", "an integer in [1, 65536]"]),
    (lambda t: t.replace("ctx_len = [64, 128]", "ctx_len = [64, 4294967296]"), ["grids.quick[0].ctx_len="]),
    (lambda t: t.replace("{ min = 1, max = 8 }", "{ min = 1, max = 1000000000000 }"),
     ["knobs.num_splits.max=1000000000000", "an integer in [1, 65536]"]),
    (lambda t: t.replace("block_n = { values = [16, 32, 64] }", "block_n = { values = [16, 1099511627776] }"),
     ["knobs.block_n.values="]),
    # nan passed every comparison and filtered out every shape: "0/0 points done", exit 0.
    (lambda t: t.replace("min_keys_per_split = 1", "max_kv_gb = nan"), ["grids.quick[0].max_kv_gb=nan", "finite"]),
    (lambda t: t.replace("min_keys_per_split = 1", "max_kv_gb = inf"), ["grids.quick[0].max_kv_gb=inf"]),
    (lambda t: t.replace("min_keys_per_split = 1", "max_kv_gb = 1e-12"),
     ["grids.quick[0].max_kv_gb=1e-12", "keeps some shape of the block"]),
    (lambda t: t.replace("ctx_len = [64, 128]", f"ctx_len = {list(range(1, 60_000))}"),
     ["grids.quick[0] has 119998 shapes", "at most 100000"]),
]


@pytest.mark.parametrize("edit, needles", BAD)
def test_malformed_card_names_file_key_and_allowed(tmp_path, edit, needles):
    text = edit(GOOD)
    assert text != GOOD
    p = write(tmp_path, text, "bad_card.toml")
    with pytest.raises(CardError) as ei:
        cards.load(p)
    msg = str(ei.value)
    assert str(p) in msg and "\n" not in msg.strip()
    for n in needles:
        assert n in msg, (n, msg)


def test_external_card_rules(tmp_path):
    ext = """name = "peer"\nkind = "mla"\n[impl]\ntype = "external"\nimport = "splitlab.bench.peers:SDPA_FLASH"
[[grids.quick]]\nmodel = "deepseek-v3-mla"\nbatch = 1\nctx_len = 64\n[[grids.default]]\nmodel = "deepseek-v3-mla"
batch = 1\nctx_len = 64\n"""
    with pytest.raises(CardError, match="kind='mla' is not allowed; expected one of gqa"):
        cards.load(write(tmp_path, ext))
    not_impl = ext.replace("kind = \"mla\"", "kind = \"gqa\"").replace("peers:SDPA_FLASH", "peers:contiguous_kv") \
        .replace("deepseek-v3-mla", "llama-3-8b")
    with pytest.raises(CardError, match="impl.import=.* lacks"):
        cards.load(write(tmp_path, not_impl))
    knobbed = ext.replace("kind = \"mla\"", "kind = \"gqa\"").replace("deepseek-v3-mla", "llama-3-8b") \
        .replace("[[grids.quick]]", "[knobs]\nnum_splits = { min = 1, max = 4 }\n[[grids.quick]]")
    with pytest.raises(CardError, match=r"knobs.num_splits' is not allowed; expected one of the knobs .* \(none"):
        cards.load(write(tmp_path, knobbed))


def test_unknown_grid_and_card_are_one_line_exit_2(tmp_path, capsys):
    p = write(tmp_path, GOOD)
    assert main(["sweep", str(p), "--grid", "huge", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("splitlab: error:") and err.count("\n") == 1
    assert str(p) in err and "grids.huge does not exist; expected one of quick, default" in err
    assert main(["sweep", "no_such_card", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "card='no_such_card' is not allowed" in err and "gqa_decode" in err
    bad = write(tmp_path, GOOD.replace("batch = [1, 2]", "batch = 0"), "bad.toml")
    assert main(["sweep", str(bad), "--grid", "quick", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "bad.toml: grids.quick[0].batch=0 is not allowed" in err and "Traceback" not in err


def test_wave_filling_splits_follow_each_head_tile():
    points = [p for p in grid.expand(cards.load("sparse_mla_decode"), "confirm4", "h200").points
              if p.in_grid and p.workload.head_dim_qk == 576 and p.workload.batch == 4]
    splits = {bh: {p.knobs["num_splits"] for p in points if p.knobs["block_h"] == bh} for bh in (16, 64)}
    # 4 tokens x 128 heads: 32 CTAs at BLOCK_H 16 (floor(132 / 32) = 4, 8, 12, ...), 8 at 64 (16, 33, 49)
    assert {12, 20, 28} <= splits[16] and not {12, 20, 28} & splits[64]
    assert {33, 49} <= splits[64] and 49 not in splits[16]


def test_a_card_that_is_not_utf8_or_a_path_too_long_is_one_line(tmp_path, capsys):
    p = tmp_path / "latin1.toml"
    p.write_bytes(GOOD.replace('seed = "000"', 'description = "caf\xe9"').encode("latin-1"))
    with pytest.raises(CardError, match="latin1.toml: not UTF-8 text"):
        cards.load(p)
    long_path = str(tmp_path / ("d" * 5000)) + ".toml"
    with pytest.raises(CardError, match=r"\(5\d{3} characters\) is not allowed; expected a card file"):
        cards.load(long_path)
    for card in (str(p), long_path, str(tmp_path)):  # a folder is no card either
        assert main(["sweep", card, "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("splitlab: error:") and err.count("\n") == 1 and "Traceback" not in err
