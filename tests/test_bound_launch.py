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
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: type("S", (), {"cuda_stream": 7})())


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
