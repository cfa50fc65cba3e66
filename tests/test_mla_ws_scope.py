"""What the warp-specialized MLA work-list launcher (``kernels.mla_sm90_ws``) takes and what it refuses, in one
``SplitlabError`` line each, checked on the CPU without launching (its kernel compiles in
``test_compile_mla_ws.py`` and runs only on an sm_90 GPU); and where the work-list launchers run it (``use_ws``)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from mbarrier_model import Bar, Memory, interleave
from sm90 import assert_gated_to_sm90

from splitlab.errors import SplitlabError
from splitlab.kernels import _launch, mla, mla_sm90_ws, worklist
from splitlab.kernels.inputs import mla_inputs, quantize_fp8
from splitlab.kernels.worklist import WorkList
from splitlab.planners import schedulers

LENS = [300, 70]


def _inputs(heads=128, page=64, dtype=torch.bfloat16, dqk=576):
    return mla_inputs(2, heads, dqk, LENS, page_size=page, dtype=dtype)


def _work(s=None):
    return WorkList.from_schedule(s or schedulers.uniform(LENS, 2, request_major=True), "cpu")


@pytest.fixture
def off_interpreter(monkeypatch):
    """The launcher's checks as on a GPU: not under the interpreter, CPU tensors standing in for CUDA ones."""
    monkeypatch.setattr(_launch, "INTERPRET", False)
    monkeypatch.setattr(_launch, "check_launch_device", lambda *a: None)


def _check(x, work=None, variant="seesaw-fine", head_dim_v=512):
    return mla_sm90_ws.check_launch(x["q"], x["kv_cache"], x["block_table"], work or _work(), variant, head_dim_v)


def test_refused_under_the_interpreter():
    if not _launch.INTERPRET:
        pytest.skip("the suite runs kernels under the interpreter; here it does not")
    x = _inputs()
    with pytest.raises(SplitlabError, match="TRITON_INTERPRET"):
        mla_sm90_ws.mla_decode_ws(x["q"], x["kv_cache"], x["block_table"], _work())


@pytest.mark.parametrize("variant", sorted(mla_sm90_ws.VARIANTS))
@pytest.mark.parametrize("heads,page,dtype", [(128, 64, torch.bfloat16), (64, 128, torch.float16),
                                              (16, 64, torch.bfloat16)])
def test_takes_its_scope(off_interpreter, variant, heads, page, dtype):
    x = _inputs(heads, page, dtype)
    work = _work()
    assert _check(x, work, variant) is work


def _refused(x, match, **kw):
    with pytest.raises(SplitlabError, match=match) as e:
        _check(x, **kw)
    assert "\n" not in str(e.value)


def test_refuses_what_it_does_not_run(off_interpreter):
    x = _inputs()
    _refused(x, "variant='pingpong'", variant="pingpong")
    _refused(x, "head_dim_v=448", head_dim_v=448)
    _refused(_inputs(dqk=512), "head_dim_qk=512")
    _refused(_inputs(page=16), "pages of 16")
    _refused(_inputs(page=32), "pages of 32")
    _refused(_inputs(dtype=torch.float32), "float32")
    _refused(dict(x, kv_cache=quantize_fp8(x["kv_cache"], 1.0)), "float8")


def test_refuses_caches_tma_cannot_read_as_rows(off_interpreter):
    x = _inputs()
    kv = x["kv_cache"]
    wide = torch.zeros(kv.shape[0], kv.shape[1], 580, dtype=kv.dtype)  # rows 1160 bytes apart: not 16-aligned
    wide[..., :576] = kv
    _refused(dict(x, kv_cache=wide[..., :576]), "kv_cache strides")
    spread = torch.zeros(kv.shape[0], kv.shape[1] + 1, 576, dtype=kv.dtype)  # a row of padding after each page
    spread[:, :-1] = kv
    _refused(dict(x, kv_cache=spread[:, :-1]), "kv_cache strides")
    _refused(dict(x, kv_cache=kv.transpose(0, 1).contiguous().transpose(0, 1)), "kv_cache strides")


def test_refuses_schedules_it_does_not_run(off_interpreter):
    x = _inputs()
    _refused(x, "persistent", work=_work(schedulers.stream_k(LENS, 3)))
    _refused(x, "aligned to 16", work=_work(schedulers.uniform(LENS, 3, tile=16)))
    _refused(x, "3 requests", work=WorkList.from_schedule(schedulers.uniform([300, 70, 5], 2), "cpu"))


def test_reads_q_as_rows_copying_it_where_its_strides_are_not_rows(off_interpreter):
    x = _inputs()
    q_desc, kv_desc = mla_sm90_ws.descriptors(x["q"], x["kv_cache"])
    assert q_desc.base is x["q"] and q_desc.shape == [2 * 128, 576] and q_desc.block_shape == [64, 64]
    assert kv_desc.base is x["kv_cache"] and kv_desc.shape == [x["kv_cache"].shape[0] * 64, 576]
    heads_major = x["q"].transpose(0, 1).contiguous().transpose(0, 1)  # [B, H, D] with H outermost in memory
    q_desc, _ = mla_sm90_ws.descriptors(heads_major, x["kv_cache"])
    assert q_desc.base is not heads_major and torch.equal(q_desc.base, x["q"]) and q_desc.strides == [576, 1]


@pytest.fixture
def on_sm90(off_interpreter, monkeypatch):
    """``use_ws`` as on an sm_90 GPU (a CUDA device naming capability 9.0; nothing is launched)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))


CUDA = torch.device("cuda", 0)
TILE64 = (64, 64, 8, 2)  # the tl tile's default at 40 heads and more (mla.mla_defaults)


def _tile(heads):
    d = mla.mla_defaults(heads, 576, "bf16", head_dim_v=512)
    return d.block_h, d.block_n, d.num_warps, d.num_stages


def _use(dtype=torch.bfloat16, kv=None, dqk=576, dv=512, tile=TILE64, page=64, device=CUDA, persistent=False,
         align=64):
    return mla_sm90_ws.use_ws(dtype, kv or dtype, dqk, dv, tile, page, device, persistent, align)


def test_the_work_list_launchers_take_it_where_in_scope(on_sm90):
    assert _use() and _use(torch.float16, page=128)
    assert _tile(40) == _tile(128) == TILE64  # 40 heads and more
    for heads in (16, 32):  # the 16- and 32-row tl tiles keep their kernel
        assert not _use(tile=_tile(heads))
    assert not _use(kv=_launch.FP8_KV_DTYPE)
    assert not _use(torch.float32)
    assert not _use(dqk=512, dv=448)
    assert not _use(page=32)
    assert not _use(persistent=True)
    assert not _use(align=16)
    assert not _use(device=torch.device("cpu"))


def test_only_on_sm90_enabled_and_off_the_interpreter(monkeypatch):
    assert_gated_to_sm90(mla_sm90_ws, _use, monkeypatch)


def test_a_cache_it_cannot_read_as_rows_keeps_the_tl_tile():
    kv = _inputs()["kv_cache"]
    assert mla_sm90_ws.cache_ok(kv)
    spread = torch.zeros(kv.shape[0], kv.shape[1] + 1, 576, dtype=kv.dtype)[:, :-1]  # padding after each page
    assert not mla_sm90_ws.cache_ok(spread)
    assert not mla_sm90_ws.cache_ok(kv[:0])


def test_both_work_list_launchers_dispatch_by_the_same_rule():
    from splitlab.kernels import decode_plan

    for launcher in (worklist.mla_decode_scheduled, decode_plan.MLADecodePlan.__init__):
        assert "use_ws(" in inspect.getsource(launcher)
    assert "use_ws(" not in inspect.getsource(mla.mla_decode)  # the split-count launcher keeps its kernels


@pytest.mark.parametrize("keys", [1, 64, 100, 128, 200, 320])
def test_the_seesaw_order_is_the_online_softmax(keys):
    """The seesaw's order of operations (``mla_sm90_ws``'s docstring; consumer 1 adds P0 V0_R before c1 scales its
    output, where FlashMLA's text hands it P0 c1), replayed in fp64 block by block, odd block counts and a masked
    last block included, gives softmax(S) V and its log-sum-exp: a model of the schedule's algebra, not of the
    kernel (which runs only on the GPU)."""
    g = torch.Generator().manual_seed(keys)
    rows, block, dv = 8, 64, 16
    n_blocks = -(-keys // block)
    s = torch.full((rows, n_blocks * block), float("-inf"), dtype=torch.float64)
    s[:, :keys] = 4 * torch.randn(rows, keys, generator=g, dtype=torch.float64)
    v = torch.randn(n_blocks * block, dv, dtype=torch.float64, generator=g)
    half = dv // 2

    def online(m_prev, scores):  # the kernel's m_safe rule: an all -inf row keeps its scale finite
        m_new = torch.maximum(m_prev, scores.max(dim=1).values)
        m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)
        return m_new, torch.exp2(m_prev - m_safe), torch.exp2(scores - m_safe[:, None])

    m = torch.full((rows,), float("-inf"), dtype=torch.float64)
    o_l, o_r = torch.zeros(rows, half, dtype=torch.float64), torch.zeros(rows, half, dtype=torch.float64)
    l0, l1 = torch.zeros(rows, dtype=torch.float64), torch.zeros(rows, dtype=torch.float64)
    for j in range(-(-n_blocks // 2)):
        b0 = slice(2 * j * block, (2 * j + 1) * block)
        m0, c0, p0 = online(m, s[:, b0])  # consumer 0
        l0 = l0 * c0 + p0.sum(dim=1)
        o_l = o_l * c0[:, None] + p0 @ v[b0, :half]
        o_r = o_r * c0[:, None] + p0 @ v[b0, half:]  # consumer 1, given m0, c0, P0
        if 2 * j + 1 < n_blocks:
            b1 = slice((2 * j + 1) * block, (2 * j + 2) * block)
            m1, c1, p1 = online(m0, s[:, b1])
            l1 = l1 * c0 * c1 + p1.sum(dim=1)
            o_r = o_r * c1[:, None] + p1 @ v[b1, half:]
            o_l = o_l * c1[:, None] + p1 @ v[b1, :half]  # consumer 0, given c1, P1
            l0 = l0 * c1
        else:
            m1, l1 = m0, l1 * c0
        m = m1
    l = l0 + l1
    out = torch.cat([o_l, o_r], dim=1) / l[:, None]
    ref = torch.softmax(s * math.log(2), dim=1) @ v  # base-2 scores
    assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)
    assert torch.allclose((m + torch.log2(l)) * math.log(2), torch.logsumexp(s * math.log(2), dim=1), rtol=1e-12)


# --- the persistent seesaw (``seesaw-persistent``: a program walks its CTA slot's items) ----------------------------


def test_the_persistent_variant_takes_persistent_schedules(off_interpreter):
    x = _inputs()
    lens3 = LENS + [0]
    x3 = mla_inputs(3, 128, 576, lens3, page_size=64, dtype=torch.bfloat16)
    for s in (schedulers.stream_k(LENS, 3), schedulers.stream_k(lens3, 1), schedulers.flashmla(lens3, 2),
              schedulers.uniform(LENS, 2, request_major=True)):
        xs = x3 if s.batch == 3 else x
        work = _work(s)
        assert _check(xs, work, "seesaw-persistent") is work
    _refused(x, "aligned to 16", work=_work(schedulers.stream_k(LENS, 3, tile=16)), variant="seesaw-persistent")
    for v in set(mla_sm90_ws.VARIANTS) - mla_sm90_ws.PERSISTENT_VARIANTS:  # one item a slot, as before
        _refused(x, "persistent", work=_work(schedulers.stream_k(LENS, 3)), variant=v)


def test_the_work_list_launchers_run_the_persistent_variant_only_where_switched_on(on_sm90, monkeypatch):
    """Until its GPU A/B, persistent schedules keep the tl tile (``PERSISTENT_VARIANT`` None); switched on, the
    launchers take it for them and the seesaw for the rest."""
    assert mla_sm90_ws.DEFAULT_VARIANT not in mla_sm90_ws.PERSISTENT_VARIANTS
    assert mla_sm90_ws.PERSISTENT_VARIANTS < set(mla_sm90_ws.VARIANTS)
    assert mla_sm90_ws.PERSISTENT_VARIANT is None and not _use(persistent=True)
    monkeypatch.setattr(mla_sm90_ws, "PERSISTENT_VARIANT", "seesaw-persistent")
    assert _use(persistent=True) and _use()
    assert mla_sm90_ws.variant_for(True) == "seesaw-persistent" and mla_sm90_ws.variant_for(False) == "seesaw"


def test_the_launch_refuses_inconsistent_cta_offsets():
    items = torch.zeros(4, 4, dtype=torch.int32)
    offsets = torch.tensor([0, 2, 4], dtype=torch.int32)

    def refused(match, variant="seesaw-persistent", cta=offsets, slots=2, bounded=False):
        with pytest.raises(SplitlabError, match=match) as e:
            mla_sm90_ws.check_walk(variant, cta, slots, items.device, bounded)
        assert "\n" not in str(e.value)

    mla_sm90_ws.check_walk("seesaw-persistent", offsets, 2, items.device)
    mla_sm90_ws.check_walk("seesaw-persistent", offsets, 1, items.device, bounded=True)  # a capacity's first slots
    mla_sm90_ws.check_walk("seesaw", None, 2, items.device)
    refused("expected cta_offsets", cta=None)
    refused("cta_offsets with variant='seesaw'", variant="seesaw")
    refused("variant='pingpong'", variant="pingpong")
    refused("expected an int32 tensor", cta=[0, 2, 4])
    refused("torch.int64", cta=offsets.long())
    refused("expected contiguous int32 of 4", slots=3)
    refused("expected contiguous int32 of at least 4", slots=3, bounded=True)
    refused("expected contiguous int32 of 2", slots=1)
    refused("expected contiguous int32", cta=torch.zeros(6, dtype=torch.int32)[::2])
    refused("cta_offsets is on meta", cta=offsets.to("meta"))


def _persistent_protocol(tiles, rng):
    """The persistent seesaw's barriers and buffers as ``mla_sm90_ws``'s ``_persist_*`` partitions use them, for
    one program walking items of ``tiles`` blocks each, under a random interleaving of the three partitions and of
    the TMA copies' landings: every wait with the kernel's phase formula, every read of a buffer checked against
    what it must hold (a block, Q, a P, a staged output half). Returns the reads checked; a read of the wrong
    contents fails, a wait that can never pass is a deadlock (AssertionError)."""
    bars = {"q_ready": Bar(1), "q_free": Bar(1), "m0": Bar(1), "s1": Bar(1), "epi": Bar(2)}
    for i in range(2):
        bars[f"ready{i}"], bars[f"free{i}"] = Bar(1), Bar(2)
    mem = Memory("q", "v0", "v1", "r0", "r1")
    read, checked = mem.read, mem.checked
    landing = []  # TMA copies in flight: (contents by buffer, barrier); a block's pieces complete one barrier

    def producer():
        blocks = done = 0
        for k, n in enumerate(tiles):
            for t in range(n):
                g = blocks + t
                yield ("wait", f"free{g & 1}", ((g >> 1) & 1) ^ 1)
                landing.append(({f"v{g & 1}": (k, t), f"r{g & 1}": (k, t, "rope")}, f"ready{g & 1}"))
                if t == 0:
                    yield ("wait", "q_free", (done & 1) ^ 1)
                    landing.append(({"q": k}, "q_ready"))
            blocks, done = blocks + n, done + (n > 0)

    def consumer(side):
        blocks = steps = done = 0
        for k, n in enumerate(tiles):
            if n == 0:
                continue  # (_fill_half: registers only)
            yield ("wait", "q_ready", done & 1)
            for j in range((n + 1) // 2):
                has1 = 2 * j + 1 < n
                g0 = blocks + 2 * j
                b0, b1, ph0, ph1, phase = g0 & 1, 1 - (g0 & 1), (g0 >> 1) & 1, ((g0 + 1) >> 1) & 1, (steps + j) & 1
                if side == 0:  # _seesaw_left
                    yield ("wait", f"ready{b0}", ph0)
                    read("q", k), read(f"v{b0}", (k, 2 * j)), read(f"r{b0}", (k, 2 * j, "rope"))
                    mem[f"r{b0}"] = ("P0", k, j)
                    bars["m0"].arrive()
                    yield ("step",)
                    read(f"v{b0}", (k, 2 * j)), read(f"r{b0}", ("P0", k, j))
                    yield ("wait", "s1", phase)
                    bars[f"free{b0}"].arrive()
                    if has1:
                        yield ("wait", f"ready{b1}", ph1)
                        read(f"v{b1}", (k, 2 * j + 1)), read(f"r{b1}", ("P1", k, j))
                        bars[f"free{b1}"].arrive()
                else:  # _seesaw_right
                    if has1:
                        yield ("wait", f"ready{b1}", ph1)
                        read("q", k), read(f"v{b1}", (k, 2 * j + 1)), read(f"r{b1}", (k, 2 * j + 1, "rope"))
                    yield ("wait", "m0", phase)
                    yield ("wait", f"ready{b0}", ph0)
                    read(f"v{b0}", (k, 2 * j)), read(f"r{b0}", ("P0", k, j))
                    if has1:
                        mem[f"r{b1}"] = ("P1", k, j)
                    bars["s1"].arrive()
                    yield ("step",)
                    if has1:
                        bars[f"free{b0}"].arrive()
                        read(f"v{b1}", (k, 2 * j + 1))
                        if 2 * j + 2 < n:
                            bars[f"free{b1}"].arrive()
            bars["epi"].arrive()
            yield ("wait", "epi", done & 1)
            stage = "q" if side == 0 else f"v{(blocks + n - 1) & 1}"  # consumer 0 via Q, 1 via the last block
            mem[stage] = ("out", side, k)
            yield ("step",)
            read(stage, ("out", side, k))
            bars["q_free" if side == 0 else f"free{(blocks + n - 1) & 1}"].arrive()
            blocks, steps, done = blocks + n, steps + (n + 1) // 2, done + 1

    interleave({"load": producer(), "c0": consumer(0), "c1": consumer(1)}, bars, mem, landing, rng)
    return checked


@pytest.mark.parametrize("seed", range(40))
def test_the_persistent_barrier_protocol_never_deadlocks_nor_overwrites(seed):
    """A model of the persistent seesaw's synchronisation (not of the kernel, which runs only on the GPU): items of
    0-5 blocks in random order, the partitions and the TMA landings interleaved at random. The phases carried
    across items (block count: buffer and kv barriers' phases; step count: m0 / s1; non-empty items: Q, q_free and
    the row-sum exchange) never deadlock, no copy lands in a buffer before every read of its old contents (the
    staged output halves included: consumer 0 stages through Q's buffer, consumer 1 through the item's last
    block), and every read sees what it must."""
    import random

    rng = random.Random(seed)
    tiles = [rng.choice([0, 1, 1, 2, 3, 4, 5]) for _ in range(rng.randint(1, 7))]
    for _ in range(25):
        checked = _persistent_protocol(tiles, rng)
        assert sum(isinstance(c, tuple) and c[0] == "out" for c in checked) == 2 * sum(n > 0 for n in tiles)
