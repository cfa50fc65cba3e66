"""What the warp-specialized MLA work-list launcher (``kernels.mla_sm90_ws``) takes and what it refuses, in one
``SplitlabError`` line each, checked on the CPU without launching (its kernel compiles in
``test_compile_mla_ws.py`` and runs only on an sm_90 GPU); and where the work-list launchers run it (``use_ws``)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
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
