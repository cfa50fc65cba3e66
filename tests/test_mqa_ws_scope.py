"""What the warp-specialized MQA work-list launcher (``kernels.mqa_sm90_ws``) takes and what it refuses, in one
``SplitlabError`` line each, checked on the CPU without launching (its kernel compiles in ``test_compile_mqa_ws.py``
and runs only on an sm_90 GPU); its TMA descriptors; the box rule of its producer, replayed in Python; and where the
work-list launchers run it (``use_ws``)."""

from __future__ import annotations

import inspect

import pytest
import torch
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
