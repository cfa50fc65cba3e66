"""``kernels.bound_launch``: the specialization key is at least as fine as Triton's, a call of a seen key bypasses
Triton with the arguments in the kernel's parameter order (constexprs and defaults included), and every other call
goes through Triton. A stand-in kernel records what it is given (the launch itself is checked on the H200:
``experiments/plan_run/launch_probe.py`` compares the outputs bit for bit, ``tests/gpu`` the plans' results)."""

from __future__ import annotations

import inspect

import pytest
import torch

from splitlab.kernels import bound_launch as bl


class FakeCompiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self, log):
        self.log = log

    def run(self, g0, g1, g2, stream, function, packed, launch_meta, enter, exit_, *args):
        self.log.append(("direct", (g0, g1, g2), args))


class FakeKernel:
    """A jitted kernel as BoundLaunch sees it: ``arg_names``, ``signature`` and ``kernel[grid](...)``."""

    def __init__(self):
        def kernel(x_ptr, n, scale, BLOCK, extra_ptr=None, FLAG=False):
            pass
        self.signature = inspect.signature(kernel)
        self.arg_names = list(self.signature.parameters)
        self.log = []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.log.append(("triton", grid, args, kw))
            return FakeCompiled(self.log)
        return launch


@pytest.fixture
def compiled_path(monkeypatch):
    monkeypatch.setattr(bl, "INTERPRET", False)
    monkeypatch.setattr(bl, "_stream_of", lambda: 7)


def test_the_key_separates_what_triton_specializes():
    t = torch.zeros(8)
    assert bl.spec_key((t, 5, 0.5)) == bl.spec_key((torch.ones(8), 7, 0.25))
    assert bl.spec_key((t, 1, 0.5)) != bl.spec_key((t, 3, 0.5))  # value 1
    assert bl.spec_key((t, 16, 0.5)) != bl.spec_key((t, 17, 0.5))  # divisibility by 16
    assert bl.spec_key((t, 2**31, 0.5)) != bl.spec_key((t, 2**31 - 15, 0.5))  # int width
    assert bl.spec_key((t[1:],)) != bl.spec_key((t,))  # 16-byte alignment
    assert bl.spec_key((t.half(),)) != bl.spec_key((t,))  # dtype
    assert bl.spec_key((True,)) != bl.spec_key((1,))
    assert bl.spec_key(("a string",)) is None


def test_a_seen_key_bypasses_triton_with_the_whole_parameter_list(compiled_path):
    k = FakeKernel()
    b = bl.BoundLaunch(k, BLOCK=64, num_warps=4)
    x = torch.zeros(32)
    b.launch((3,), x, 10, 0.5)
    assert k.log[-1] == ("triton", (3,), (x, 10, 0.5), dict(BLOCK=64, num_warps=4)) and b.hits == 0
    b.launch((5,), x, 12, 0.25)  # same specialization: the launcher, every parameter in order, defaults filled
    assert k.log[-1] == ("direct", (5, 1, 1), (x, 12, 0.25, 64, None, False)) and b.hits == 1
    b.launch((5,), x, 16, 0.25)  # another specialization: Triton again
    assert k.log[-1][0] == "triton" and b.hits == 1
    b.launch((5,), x[1:], 12, 0.25)  # a misaligned tensor: Triton again
    assert k.log[-1][0] == "triton"


def test_triton_every_call_under_the_interpreter_or_a_launch_hook(compiled_path, monkeypatch):
    k = FakeKernel()
    b = bl.BoundLaunch(k, BLOCK=64)
    x = torch.zeros(32)
    monkeypatch.setattr(bl, "INTERPRET", True)
    for _ in range(2):
        b.launch((1,), x, 10, 0.5)
    assert [e[0] for e in k.log] == ["triton", "triton"]
    monkeypatch.setattr(bl, "INTERPRET", False)
    if bl.knobs is not None:
        monkeypatch.setattr(bl, "_hooked", lambda hook: True)  # a profiler's hook
        for _ in range(2):
            b.launch((1,), x, 10, 0.5)
        assert [e[0] for e in k.log] == ["triton"] * 4


def test_a_gluon_descriptor_key_is_at_least_as_fine_as_tritons():
    """Gluon TMA descriptors (the warp-specialized kernels' q and caches): one key for descriptors Triton specializes
    alike (other bases, shapes, strides), another for another dtype, box or layout; and wherever two keys are equal,
    Triton's native specialization of the two is equal too."""
    ws = pytest.importorskip("splitlab.kernels.mla_sm90_ws")
    if not ws.HAVE_GLUON:
        pytest.skip("no Gluon in this triton")
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    TD, layout = ws.TensorDescriptor, ws.box_layout
    bf, hf = torch.zeros(256, 576, dtype=torch.bfloat16), torch.zeros(130, 576, dtype=torch.float16)
    descs = [TD(bf, [256, 576], [576, 1], [64, 64], layout(torch.bfloat16)),
             TD(bf[:128], [128, 576], [576, 1], [64, 64], layout(torch.bfloat16)),  # another shape
             TD(torch.zeros(64, 1152, dtype=torch.bfloat16), [64, 576], [1152, 1], [64, 64], layout(torch.bfloat16)),
             TD(bf, [256, 576], [576, 1], [32, 64], layout(torch.bfloat16)),  # another box
             TD(hf, [130, 576], [576, 1], [64, 64], layout(torch.float16))]  # another dtype and layout
    keys = [bl.spec_key((d,)) for d in descs]
    assert keys[0] == keys[1] == keys[2] and len({keys[0], keys[3], keys[4]}) == 3
    native = [native_specialize_impl(BaseBackend, d, False, True, True) for d in descs]
    for i in range(len(descs)):
        for j in range(len(descs)):
            if keys[i] == keys[j]:
                assert native[i] == native[j]
    assert bl.spec_key((descs[0], 5)) is not None and bl.spec_key((object(),)) is None


def test_launch_cached_keeps_one_bound_launch_per_kernel_and_meta(compiled_path):
    a, b, cache = FakeKernel(), FakeKernel(), {}
    x = torch.zeros(32)
    for k in (a, b, a, b):  # two kernels, the same meta: their own launches
        bl.launch_cached(k, cache, (2,), (x, 10, 0.5), dict(BLOCK=64))
    assert [e[0] for e in a.log] == ["triton", "direct"] and [e[0] for e in b.log] == ["triton", "direct"]
    bl.launch_cached(a, cache, (2,), (x, 10, 0.5), dict(BLOCK=32))  # other meta: its own, through Triton first
    bl.launch_cached(a, cache, (2,), (x, 10, 0.5), dict(BLOCK=64), bound=False)  # not bound: Triton
    assert [e[0] for e in a.log[2:]] == ["triton", "triton"] and len(cache) == 3


def test_the_fast_key_never_runs_a_binary_spec_key_would_not(compiled_path):
    """A call whose other arguments, tensor dtypes and alignment repeat an earlier call's takes the fast key; any
    difference (a value, a type, an alignment, a tensor where an int was) goes the classified way, so each launch
    is the one spec_key alone picks."""
    k = FakeKernel()
    b = bl.BoundLaunch(k, BLOCK=64)
    x, y = torch.zeros(32), torch.ones(32)
    calls = [(x, 10, 0.5), (y, 10, 0.5), (y, 10, 0.5), (x, 12, 0.5), (x, True, 0.5), (x, 1, 0.5), (x[1:], 10, 0.5),
             (x.half(), 10, 0.5), (x, x, 0.5), (x, 10, 1), (x, 10, 0.5), (y, 16, 0.25), (y, 16, 0.25)]
    plain = bl.BoundLaunch(k, BLOCK=64)
    plain._split = None
    want = []
    for c in calls:  # the classified path alone (no split ever made): which calls go through Triton
        plain.launch((2,), *c)
        plain._split, plain._fast = None, {}
        want.append(k.log[-1][0])
    k.log.clear()
    got = []
    for c in calls:
        b.launch((2,), *c)
        got.append(k.log[-1][0])
    assert got == want and b._fast  # the same launches, and the fast keys were used
    assert want == ["triton", "direct", "direct", "direct", "triton", "triton", "triton", "triton", "triton",
                    "triton", "direct", "triton", "direct"]


def test_the_fast_key_takes_gluon_descriptors(compiled_path):
    """Calls with Gluon TMA descriptors take the fast key too (a descriptor of another base or shape, the same
    class: no classification), and each launch is the one spec_key alone picks (another box, dtype or a tensor in
    the descriptor's place: Triton first)."""
    ws = pytest.importorskip("splitlab.kernels.mla_sm90_ws")
    if not ws.HAVE_GLUON:
        pytest.skip("no Gluon in this triton")
    TD, layout = ws.TensorDescriptor, ws.box_layout
    bf = torch.zeros(256, 576, dtype=torch.bfloat16)
    d0 = TD(bf, [256, 576], [576, 1], [64, 64], layout(torch.bfloat16))
    d1 = TD(bf[:128], [128, 576], [576, 1], [64, 64], layout(torch.bfloat16))
    d_box = TD(bf, [256, 576], [576, 1], [32, 64], layout(torch.bfloat16))
    k = FakeKernel()
    x = torch.zeros(32)
    calls = [(d0, 10, 0.5), (d1, 10, 0.5), (d0, 10, 0.5), (d_box, 10, 0.5), (d_box, 10, 0.5), (x, 10, 0.5),
             (d1, 12, 0.5), (d0, 10, 0.5)]
    plain = bl.BoundLaunch(k, BLOCK=64)
    want = []
    for c in calls:  # the classified path alone
        plain.launch((2,), *c)
        plain._split, plain._fast = None, {}
        want.append(k.log[-1][0])
    k.log.clear()
    b = bl.BoundLaunch(k, BLOCK=64)
    got = []
    for c in calls:
        b.launch((2,), *c)
        got.append(k.log[-1][0])
    assert got == want == ["triton", "direct", "direct", "triton", "direct", "triton", "direct", "direct"]
    assert len(b._fast) == 3  # (d, 10), (d_box, 10), (d, 12): every direct call after the first of its key was fast


class TmaKernel:
    """A kernel with two Gluon TMA descriptors (positions 0 and 2) whose compiled launcher is Triton's own
    ``CudaLauncher.__call__`` over ``wrap_handle_tensordesc`` (the CUDA backend's wrapper), a stand-in C launcher
    recording its arguments underneath."""

    def __init__(self, nv, scratch: int = 0):
        def kernel(q_desc, x_ptr, kv_desc, n, BLOCK, FLAG=False):
            pass
        self.signature = inspect.signature(kernel)
        self.arg_names = list(self.signature.parameters)
        self.log = []
        sig = {"q_desc": "tensordesc<bf16[64, 64]>", "x_ptr": "*fp32", "kv_desc": "tensordesc<bf16[64, 64]>",
               "n": "i32", "BLOCK": "constexpr", "FLAG": "constexpr"}
        metas = [dict(swizzle=128, elem_size=2, elem_type=9, block_size=[64, 64], fp4_padded=False, which=w)
                 for w in ("q", "kv")]
        run = object.__new__(nv.CudaLauncher)  # Triton's __call__, no module to compile
        run.num_ctas, run.launch_cooperative_grid, run.launch_pdl = 1, False, False
        run.global_scratch_size = run.profile_scratch_size = scratch
        run.global_scratch_align = run.profile_scratch_align = 1
        run.launch = nv.wrap_handle_tensordesc(lambda *a: self.log.append(("c", a)), sig, metas)
        self.compiled = type("Compiled", (), dict(run=run, function="fn", packed_metadata="meta"))()

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.log.append(("triton", grid, args, kw))
            return self.compiled
        return launch


def test_tma_encodings_are_kept_and_the_c_launcher_gets_tritons_arguments(compiled_path, monkeypatch):
    """Where a kernel takes TMA descriptors, a bound call hands the C launcher exactly the arguments Triton's
    wrapper would (each descriptor expanded to its encoding, shape and strides), encoding a descriptor once per
    base address, shape and strides; a launcher with scratch buffers keeps Triton's wrapper."""
    ws = pytest.importorskip("splitlab.kernels.mla_sm90_ws")
    if not ws.HAVE_GLUON:
        pytest.skip("no Gluon in this triton")
    nv = pytest.importorskip("triton.backends.nvidia.driver")
    encodes = []

    def encode(d, meta):  # Triton's make_tensordesc_arg without a driver: the map is what it is made of
        encodes.append((meta["which"], d.base.data_ptr(), tuple(d.shape)))
        return [("map", meta["which"], d.base.data_ptr(), *d.shape, *d.strides), *d.shape, *d.strides]

    monkeypatch.setattr(nv, "make_tensordesc_arg", encode)
    TD, layout = ws.TensorDescriptor, ws.box_layout(torch.bfloat16)
    a, b = torch.zeros(256, 576, dtype=torch.bfloat16), torch.zeros(512, 576, dtype=torch.bfloat16)
    qa, qb = TD(a, [256, 576], [576, 1], [64, 64], layout), TD(b, [512, 576], [576, 1], [64, 64], layout)
    qa_half = TD(a, [128, 576], [576, 1], [64, 64], layout)
    x = torch.zeros(32)
    calls = [(qa, x, qb, 7), (qa, x, qb, 7), (qb, x, qa, 7), (qa_half, x, qb, 9), (qa, x, qb, 7)]

    k = TmaKernel(nv)
    bound = bl.BoundLaunch(k, BLOCK=64)
    for c in calls:
        bound.launch((3,), *c)
    got = [e for e in k.log if e[0] == "c"]
    assert [e[0] for e in k.log if e[0] != "c"] == ["triton"] and bound.hits == len(calls) - 1
    ref = TmaKernel(nv)  # Triton's own wrapper on the same calls
    for c in calls[1:]:
        ref.compiled.run(3, 1, 1, 7, "fn", "meta", None, None, None, *c, 64, False)
    assert got == ref.log and len(got) == len(calls) - 1
    # Once per distinct (position, base, shape, strides) on the bound path (qa, qb, qb, qa, qa_half); Triton's
    # wrapper twice every call.
    assert len(encodes) - 2 * len(ref.log) == 5

    plain = TmaKernel(nv, scratch=16)  # a scratch buffer: Triton's __call__ allocates it, so its path is kept
    assert bl._tma_launch(plain.compiled, calls[0]) is None
    assert bl._tma_launch(k.compiled, (x, 7)) is None  # no descriptor


def test_the_unchecked_descriptor_is_the_checked_one():
    """``mla_sm90_ws.tma_descriptor`` (the Gluon launches' descriptors without the constructor's checks) gives the
    fields, the fast key and Triton's specialization of ``TensorDescriptor(...)`` for what the launchers pass (a q, a
    strided q's rows, a cache); a zero-size shape takes the constructor and its refusal."""
    ws = pytest.importorskip("splitlab.kernels.mla_sm90_ws")
    if not ws.HAVE_GLUON:
        pytest.skip("no Gluon in this triton")
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    layout = ws.box_layout(torch.bfloat16)
    q = torch.zeros(4, 16, 576, dtype=torch.bfloat16)
    wide = torch.zeros(4, 16, 640, dtype=torch.bfloat16)[..., :576]
    kv = torch.zeros(9, 64, 576, dtype=torch.bfloat16)
    for base, shape, strides in ((q, [64, 576], [576, 1]), (wide, [64, 576], [640, 1]), (kv, [576, 576], [576, 1])):
        want = ws.TensorDescriptor(base, shape, strides, [64, 64], layout)
        got = ws.tma_descriptor(base, shape, strides, [64, 64], layout)
        assert got.base is want.base and type(got) is type(want)
        assert (got.shape, got.strides, got.block_shape, got.layout, got.padding) == (
            want.shape, want.strides, want.block_shape, want.layout, want.padding)
        assert bl.spec_key((got,)) == bl.spec_key((want,))
        assert native_specialize_impl(BaseBackend, got, False, True, True) == \
            native_specialize_impl(BaseBackend, want, False, True, True)
    with pytest.raises(AssertionError, match="shape must be positive"):
        ws.tma_descriptor(q, [0, 576], [576, 1], [64, 64], layout)
