"""What the warp-specialized MQA work-list launcher (``kernels.mqa_sm90_ws``) takes and what it refuses, in one
``SplitlabError`` line each, checked on the CPU without launching (its kernel compiles in ``test_compile_mqa_ws.py``
and runs only on an sm_90 GPU); its TMA descriptors; the box rule of its producer, replayed in Python; and where the
work-list launchers run it (``use_ws``)."""

from __future__ import annotations

import inspect

import pytest
import torch
from mbarrier_model import Bar, Memory, interleave
from sm90 import assert_gated_to_sm90

from splitlab.errors import SplitlabError
from splitlab.kernels import _launch, gqa, mqa_sm90_ws, worklist
from splitlab.kernels.inputs import gqa_inputs
from splitlab.kernels.worklist import WorkList
from splitlab.planners import schedulers

LENS = [300, 70]


def _inputs(heads=128, page=64, dtype=torch.bfloat16, hkv=1, d=128):
    return gqa_inputs(2, heads, hkv, d, LENS, page_size=page, dtype=dtype)


def _work(s=None):
    return WorkList.from_schedule(s or schedulers.uniform(LENS, 2), "cpu")


@pytest.fixture
def off_interpreter(monkeypatch):
    """The launcher's checks as on a GPU: not under the interpreter, CPU tensors standing in for CUDA ones."""
    monkeypatch.setattr(_launch, "INTERPRET", False)
    monkeypatch.setattr(_launch, "check_launch_device", lambda *a: None)


def _check(x, work=None):
    return mqa_sm90_ws.check_launch(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work or _work())


def _refused(x, match, **kw):
    with pytest.raises(SplitlabError, match=match) as e:
        _check(x, **kw)
    assert "\n" not in str(e.value)


def test_refused_under_the_interpreter():
    if not _launch.INTERPRET:
        pytest.skip("the suite runs kernels under the interpreter; here it does not")
    x = _inputs()
    with pytest.raises(SplitlabError, match="TRITON_INTERPRET"):
        mqa_sm90_ws.mqa_decode_ws(x["q"], x["k_cache"], x["v_cache"], x["block_table"], _work())


@pytest.mark.parametrize("heads,page,dtype", [(128, 16, torch.bfloat16), (128, 64, torch.float16),
                                              (64, 32, torch.bfloat16), (64, 128, torch.float16),
                                              (128, 192, torch.bfloat16)])
def test_takes_its_scope(off_interpreter, heads, page, dtype):
    x = _inputs(heads, page, dtype)
    work = _work()
    assert _check(x, work) is work


def test_refuses_what_it_does_not_run(off_interpreter):
    _refused(_inputs(heads=96), "96 query heads on 1 kv heads")
    _refused(_inputs(heads=128, hkv=2), "128 query heads on 2 kv heads")
    _refused(_inputs(heads=32), "32 query heads")
    _refused(_inputs(d=64), "dim 64")
    _refused(_inputs(page=8), "page_size=8")
    _refused(_inputs(page=48), "page_size=48")
    _refused(_inputs(page=80), "page_size=80")
    _refused(_inputs(dtype=torch.float32), "float32")


def test_stages(off_interpreter):
    x = _inputs()
    for stages in mqa_sm90_ws.STAGE_CHOICES:
        work = _work()
        assert mqa_sm90_ws.check_launch(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work, stages) is work
    for stages, shown in ((4, "4"), (1, "1"), (True, "True"), ("2", "'2'")):
        with pytest.raises(SplitlabError, match=f"stages={shown} is not allowed") as e:
            mqa_sm90_ws.check_launch(x["q"], x["k_cache"], x["v_cache"], x["block_table"], _work(), stages)
        assert "\n" not in str(e.value)


def test_refuses_caches_tma_cannot_read_as_rows(off_interpreter):
    x = _inputs()
    k = x["k_cache"]
    wide = torch.zeros(*k.shape[:3], 132, dtype=k.dtype)  # rows 264 bytes apart: 16-aligned, but not contiguous
    wide[..., :128] = k                                   # pages (a row of 132 elements)
    _refused(dict(x, k_cache=wide[..., :128]), "k_cache strides")
    odd = torch.zeros(*k.shape[:3], 129, dtype=k.dtype)  # rows 258 bytes apart: not 16-aligned
    odd[..., :128] = k
    _refused(dict(x, v_cache=odd[..., :128]), "v_cache strides")
    spread = torch.zeros(k.shape[0], k.shape[1] + 1, *k.shape[2:], dtype=k.dtype)  # padding after each page
    spread[:, :-1] = k
    _refused(dict(x, k_cache=spread[:, :-1]), "k_cache strides")


def test_refuses_schedules_it_does_not_run(off_interpreter):
    x = _inputs(page=64)
    _refused(x, "persistent", work=_work(schedulers.stream_k(LENS, 3)))
    _refused(x, "aligned to 16", work=_work(schedulers.uniform(LENS, 3, tile=16)))
    _refused(x, "3 requests", work=WorkList.from_schedule(schedulers.uniform([300, 70, 5], 2), "cpu"))
    # at page 16 a box is a page: items at multiples of 16 are taken
    assert _check(_inputs(page=16), _work(schedulers.uniform(LENS, 3, tile=16))) is not None


def test_descriptors_read_rows_copying_q_where_its_strides_are_not_rows(off_interpreter):
    if not mqa_sm90_ws.HAVE_GLUON:
        pytest.skip("needs triton 3.6's Gluon")
    x = _inputs(page=16)
    q_desc, k_desc, v_desc = mqa_sm90_ws.descriptors(x["q"], x["k_cache"], x["v_cache"])
    rows = x["k_cache"].shape[0] * 16
    assert q_desc.base is x["q"] and q_desc.shape == [2 * 128, 128] and q_desc.block_shape == [64, 64]
    assert k_desc.base is x["k_cache"] and k_desc.shape == [rows, 128] and k_desc.block_shape == [16, 64]
    assert v_desc.base is x["v_cache"] and v_desc.block_shape == [16, 64]
    assert mqa_sm90_ws.descriptors(x["q"], *(_inputs(page=128)[n] for n in ("k_cache", "v_cache")))[1] \
        .block_shape == [64, 64]
    heads_major = x["q"].transpose(0, 1).contiguous().transpose(0, 1)
    q_desc, _, _ = mqa_sm90_ws.descriptors(heads_major, x["k_cache"], x["v_cache"])
    assert q_desc.base is not heads_major and torch.equal(q_desc.base, x["q"]) and q_desc.strides == [128, 1]


@pytest.mark.parametrize("page", [16, 32, 64, 128])
@pytest.mark.parametrize("splits,tile", [(1, 64), (3, 64), (5, 16), (2, 32)])
def test_every_box_lies_in_one_page_and_covers_the_item(page, splits, tile):
    """The producer's rule (``_issue_tile``) replayed on the items of a schedule the launcher takes: each 64-key tile
    as boxes of ``box_rows(page)`` rows, those starting before the item's end copied. Each copied box lies in one
    page; the copied rows cover the item's keys; the bytes a tile's barrier expects are the copied boxes'."""
    lens = [1, 63, 64, 65, 300, 1000, 0]
    s = schedulers.uniform(lens, splits, tile=tile)
    box = mqa_sm90_ws.box_rows(page)
    if s.align % box:
        pytest.skip("a schedule the launcher refuses")
    nbox = mqa_sm90_ws.BLOCK_N // box
    for _, _, start, end in s.items:
        covered = set()
        for n0 in range(start, end, mqa_sm90_ws.BLOCK_N):
            valid = min(-(-(end - n0) // box), nbox)
            copied = [n0 + i * box for i in range(nbox) if n0 + i * box < end]
            assert len(copied) == valid
            for r in copied:
                assert r // page == (r + box - 1) // page
                covered |= set(range(r, r + box))
        assert set(range(start, end)) <= covered


def test_both_work_list_launchers_dispatch_by_the_same_rule():
    from splitlab.kernels import decode_plan

    for launcher in (worklist.gqa_decode_scheduled, decode_plan.GQADecodePlan.__init__):
        assert "use_ws(" in inspect.getsource(launcher)
    assert "mqa_sm90_ws" not in inspect.getsource(gqa.gqa_decode)  # the split-count launcher keeps its kernels


CUDA = torch.device("cuda", 0)


def _use(dtype=torch.bfloat16, heads=128, kv=1, dim=128, tile=None, page=16, device=CUDA, persistent=False,
         align=64):
    if tile is None:
        d = gqa.default_knobs(heads, dim, "bf16")
        tile = (d["block_n"], d["num_warps"], d["num_stages"])
    return mqa_sm90_ws.use_ws(dtype, heads, kv, dim, tile, page, device, persistent, align)


def test_the_work_list_launchers_take_it_where_in_scope(monkeypatch):
    monkeypatch.setattr(_launch, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert _use() and _use(heads=64) and _use(torch.float16, page=64) and _use(page=32) and _use(page=128)
    assert not _use(heads=32) and not _use(kv=2) and not _use(dim=64) and not _use(torch.float32)
    assert not _use(page=48) and not _use(page=8)
    assert not _use(tile=(32, 8, 3))  # an explicit tile other than the default keeps the tl tile
    assert not _use(persistent=True) and not _use(align=8)
    assert not _use(device=torch.device("cpu"))


def test_only_on_sm90_enabled_and_off_the_interpreter(monkeypatch):
    assert_gated_to_sm90(mqa_sm90_ws, _use, monkeypatch)


# --- the persistent kernel (``launch``'s ``cta_offsets``: a program walks its CTA slot's items) ----------------------


def test_the_persistent_kernel_takes_schedules_aligned_to_a_box(off_interpreter):
    x = _inputs(page=64)
    lens3 = LENS + [0]
    x3 = gqa_inputs(3, 128, 1, 128, lens3, page_size=64, dtype=torch.bfloat16)
    for s in (schedulers.stream_k(LENS, 3), schedulers.stream_k(lens3, 1), schedulers.flashmla(lens3, 2),
              schedulers.uniform(LENS, 2)):
        xs = x3 if s.batch == 3 else x
        work = _work(s)
        assert mqa_sm90_ws.check_launch(xs["q"], xs["k_cache"], xs["v_cache"], xs["block_table"], work,
                                        persistent=True) is work
    with pytest.raises(SplitlabError, match="aligned to 16 keys .* multiples of 64 \\(persistent\\)") as e:
        mqa_sm90_ws.check_launch(x["q"], x["k_cache"], x["v_cache"], x["block_table"],
                                 _work(schedulers.stream_k(LENS, 3, tile=16)), persistent=True)
    assert "\n" not in str(e.value)
    x16 = _inputs(page=16)  # a box is a page of 16: items at multiples of 16 are taken
    work = _work(schedulers.stream_k(LENS, 3, tile=16))
    assert mqa_sm90_ws.check_launch(x16["q"], x16["k_cache"], x16["v_cache"], x16["block_table"], work,
                                    persistent=True) is work
    _refused(x, "persistent", work=_work(schedulers.stream_k(LENS, 3)))  # the one-item kernel, as before


def test_the_work_list_launchers_run_the_persistent_kernel_only_where_switched_on(monkeypatch):
    """Until its GPU A/B, persistent schedules keep the tl tile (``PERSISTENT_ENABLED`` off); switched on, the
    launchers may take it for them (the same page, tile and alignment rules)."""
    monkeypatch.setattr(_launch, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert mqa_sm90_ws.PERSISTENT_ENABLED is False and not _use(persistent=True) and _use()
    monkeypatch.setattr(mqa_sm90_ws, "PERSISTENT_ENABLED", True)
    assert _use(persistent=True) and _use() and _use(persistent=True, page=64, heads=64)
    assert not _use(persistent=True, align=16, page=64) and _use(persistent=True, align=16, page=16)
    assert not _use(persistent=True, tile=(32, 8, 3)) and not _use(persistent=True, page=48)
    monkeypatch.setattr(mqa_sm90_ws, "ENABLED", False)
    assert not _use(persistent=True)


def test_the_launch_refuses_inconsistent_cta_offsets():
    items = torch.zeros(4, 4, dtype=torch.int32)
    offsets = torch.tensor([0, 2, 4], dtype=torch.int32)

    def refused(match, cta=offsets, slots=2, bounded=False):
        with pytest.raises(SplitlabError, match=match) as e:
            mqa_sm90_ws.check_walk(cta, slots, items.device, bounded)
        assert "\n" not in str(e.value)

    mqa_sm90_ws.check_walk(offsets, 2, items.device)
    mqa_sm90_ws.check_walk(offsets, 1, items.device, bounded=True)  # a capacity's first slots
    mqa_sm90_ws.check_walk(None, 2, items.device)  # one item a slot
    refused("expected an int32 tensor", cta=[0, 2, 4])
    refused("torch.int64", cta=offsets.long())
    refused("expected contiguous int32 of 4", slots=3)
    refused("expected contiguous int32 of at least 4", slots=3, bounded=True)
    refused("expected contiguous int32 of 2", slots=1)
    refused("expected contiguous int32", cta=torch.zeros(6, dtype=torch.int32)[::2])
    refused("expected contiguous int32", cta=offsets[None])
    refused("cta_offsets is on meta", cta=offsets.to("meta"))


def test_the_launch_checks_cta_offsets_before_anything_else():
    # launch's first act (before descriptors or Gluon): a wrong cta_offsets is one line, whatever else is passed
    x = _inputs()
    with pytest.raises(SplitlabError, match="expected contiguous int32 of 3"):
        mqa_sm90_ws.launch(x["q"], x["k_cache"], x["v_cache"], x["block_table"], torch.zeros(2, 4, dtype=torch.int32),
                           2, None, None, None, None, 0.1, cta_offsets=torch.zeros(2, dtype=torch.int32))


def _persistent_protocol(tiles, stages, ncons, rng, last_qk_frees_q=True):
    """The persistent kernel's barriers and buffers as ``mqa_sm90_ws``'s ``_persist_*`` partitions use them, for one
    program walking items of ``tiles`` tiles each with ``stages`` buffers and ``ncons`` consumers, under a random
    interleaving of the partitions and of the TMA copies' landings: every wait with the kernel's phase formula, every
    read of a buffer (at a wgmma's start and at its end: the GEMM reads shared memory while in flight) checked
    against what it must hold. ``last_qk_frees_q`` False: the consumers free Q at their first QK instead (a bug
    the model must catch). Returns the reads and the outputs written; a read of the wrong contents fails, a wait
    that can never pass is a deadlock (AssertionError)."""
    bars = {"q_ready": Bar(1), "q_free": Bar(ncons)}
    for i in range(stages):
        bars[f"k_ready{i}"], bars[f"v_ready{i}"] = Bar(1), Bar(1)
        bars[f"k_free{i}"], bars[f"v_free{i}"] = Bar(ncons), Bar(ncons)
    mem = Memory("q", *(f"{kv}{i}" for kv in "kv" for i in range(stages)))
    read, checked = mem.read, mem.checked
    landing = []  # TMA copies in flight: (contents by buffer, barrier), landing in any order

    def producer():
        g0 = done = 0
        for k, n in enumerate(tiles):
            for t in range(n):
                g = g0 + t
                buf, free = g % stages, ((g // stages) & 1) ^ 1
                yield ("wait", f"k_free{buf}", free)
                landing.append(({f"k{buf}": ("K", k, t)}, f"k_ready{buf}"))
                yield ("wait", f"v_free{buf}", free)
                landing.append(({f"v{buf}": ("V", k, t)}, f"v_ready{buf}"))
                if t == 0:
                    yield ("wait", "q_free", (done & 1) ^ 1)
                    landing.append(({"q": ("Q", k)}, "q_ready"))
            g0, done = g0 + n, done + (n > 0)

    def consumer(side):
        g0 = done = 0
        for k, n in enumerate(tiles):
            if n > 0:
                yield ("wait", "q_ready", done & 1)
            for t in range(n):
                g = g0 + t
                buf, phase = g % stages, (g // stages) & 1
                yield ("wait", f"k_ready{buf}", phase)
                read("q", ("Q", k)), read(f"k{buf}", ("K", k, t))
                yield ("step",)  # (the QK wgmma in flight)
                read("q", ("Q", k)), read(f"k{buf}", ("K", k, t))
                bars[f"k_free{buf}"].arrive()
                if t == (n - 1 if last_qk_frees_q else 0):
                    bars["q_free"].arrive()
                yield ("wait", f"v_ready{buf}", phase)
                read(f"v{buf}", ("V", k, t))
                yield ("step",)  # (the tail zeroed, the PV wgmma in flight)
                read(f"v{buf}", ("V", k, t))
                bars[f"v_free{buf}"].arrive()
            checked.append(("out", side, k))  # (the epilogue: this consumer's own output stage)
            yield ("step",)
            g0, done = g0 + n, done + (n > 0)

    interleave({"load": producer(), **{f"c{w}": consumer(w) for w in range(ncons)}}, bars, mem, landing, rng)
    return checked


@pytest.mark.parametrize("seed", range(40))
def test_the_persistent_barrier_protocol_never_deadlocks_nor_overwrites(seed):
    """A model of the persistent kernel's synchronisation (not of the kernel, which runs only on the GPU): items of
    0-5 tiles in random order, 2 or 3 stages, one or two consumers, the partitions and the TMA landings interleaved
    at random. The phases carried across items (the slot's tile count: buffer and K / V barriers' phases; its
    non-empty items: Q's and ``q_free``'s) never deadlock, no copy lands in a buffer before every read of its old
    contents (the next item's Q only after every consumer's last QK of this one), every read sees what it must, and
    every item's rows are written by every consumer (an empty item's too)."""
    import random

    rng = random.Random(seed)
    tiles = [rng.choice([0, 1, 1, 2, 3, 4, 5]) for _ in range(rng.randint(1, 7))]
    stages, ncons = rng.choice([2, 3]), rng.choice([1, 2])
    for _ in range(25):
        checked = _persistent_protocol(tiles, stages, ncons, rng)
        assert sorted(c for c in checked if c[0] == "out") == sorted(
            ("out", w, k) for w in range(ncons) for k in range(len(tiles)))
        assert sum(c[0] == "V" for c in checked) == 2 * ncons * sum(tiles)


def test_the_protocol_model_catches_q_freed_too_early():
    """The model is not vacuous: with Q freed at an item's first QK instead of its last, some interleaving lands the
    next item's Q while a consumer still reads this one's."""
    import random

    rng = random.Random(0)
    with pytest.raises(AssertionError, match="q holds"):
        for _ in range(200):
            _persistent_protocol([3, 2, 0, 4], 2, 2, rng, last_qk_frees_q=False)
