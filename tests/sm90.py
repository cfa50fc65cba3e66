"""Compiling kernels for a real NVIDIA target (sm_90) on a CPU machine, without launching, shared by the tests that
check compiled code (``test_compile_sm90``, ``test_decode_plan``, ``test_device_schedule``).

The interpreter accepts code that NVIDIA compilation rejects, so a child process without ``TRITON_INTERPRET`` gives
Triton a stand-in driver that only names the target (``PREAMBLE``), and ``Warmup`` wraps a jitted kernel so that a
launcher's ``kernel[grid](...)`` runs the whole pipeline through ptxas (bundled with the triton wheel) into
``compiled`` instead of launching; ``usage(kernel)`` reads its registers and stack (``REG:n STACK:m``) with the bundled
cuobjdump (``resource_line``: the whole line), ``ptxas_log(kernel)`` what the bundled ptxas says of its PTX.
``WORKLIST`` sets up a compile script of the work-list kernels; ``WS_CHECKS`` adds the checks the warp-specialized
kernels' compile scripts share (``test_compile_mla_ws``, ``test_compile_mqa_ws``); ``assert_gated_to_sm90`` the check
their scope tests share of where the work-list launchers run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: The start of every compile script: the stand-in driver (exit 3 where Triton cannot take one: the test skips),
#: ``compiled``, ``cuobjdump``, ``ptxas``, ``resource_line``, ``usage``, ``ptxas_log`` and ``Warmup``.
PREAMBLE = r"""
import os, re, subprocess, sys, tempfile
try:
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    class TargetOnlyDriver:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)
        def get_current_device(self):
            return 0
        def get_current_stream(self, device=None):
            return 0

    driver.set_active(TargetOnlyDriver())
except Exception as e:
    print(f"no stand-in driver: {e!r}")
    sys.exit(3)

compiled = []
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


ptxas = os.path.join(os.path.dirname(cuobjdump), "ptxas")


def resource_line(k):  # cuobjdump's resource line of the cubin (REG, STACK, SHARED, LOCAL, ...), "?" without cuobjdump
    if not os.path.exists(cuobjdump):
        return "?"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    out = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    return next((line.strip() for line in out.splitlines() if "REG:" in line), "?")


def usage(k):  # registers and stack from the cubin, where cuobjdump is bundled
    line = resource_line(k)
    return line if line == "?" else re.search(r"REG:\d+ STACK:\d+", line).group(0)


def ptxas_log(k):  # ptxas -v on the kernel's PTX for sm_90a: its warnings (C7515: serialised wgmma) and spill counts
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    log = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull], capture_output=True,
                         text=True)
    os.unlink(f.name)
    return log.stdout + log.stderr

class Warmup:
    def __init__(self, kernel):
        self.kernel = kernel
    def __getitem__(self, grid):
        return lambda *a, **kw: compiled.append(self.kernel.warmup(*a, grid=grid, **kw))
"""


#: After ``PREAMBLE``, for a compile script of the work-list kernels (``kernels.worklist``): the partial kernels and
#: the merge wrapped in ``Warmup``, the launchers' device checks stubbed (CPU tensors stand in; nothing is launched),
#: the timeline's clock read on (the GPU build), and two requests of GQA 32/8 (``x``) and MLA-16 (``m``) inputs.
WORKLIST = r"""
import splitlab.kernels._launch as launch_common
import splitlab.kernels.gqa as gqa
import splitlab.kernels.timeline as timeline
import splitlab.kernels.worklist as wl
from splitlab.kernels.inputs import gqa_inputs, mla_inputs
from splitlab.planners import schedulers as S

wl._gqa_worklist_kernel = Warmup(wl._gqa_worklist_kernel)
wl._mla_worklist_kernel = Warmup(wl._mla_worklist_kernel)
import splitlab.kernels.workitems as wi
wi._merge_kernel = Warmup(wi._merge_kernel)
gqa._check_inputs = lambda *a: None
launch_common.check_launch_device = lambda *a: None
timeline.clock_on = lambda device: True

lens = [100, 7]
x = gqa_inputs(2, 32, 8, 128, lens, page_size=16, dtype=torch.bfloat16)
m = mla_inputs(2, 16, 576, lens, page_size=64, dtype=torch.bfloat16)
"""


#: After ``PREAMBLE``, for a warp-specialized kernel's compile script: ``check_ws(cases, smem_budget, serialised)``
#: compiles each case and prints what fails: no stack, local memory or spill stores (``SPILL``), shared memory within
#: ``smem_budget`` (``SHARED``), no ptxas warning matching ``serialised`` (``WGMMA``: C7515, a wgmma serialised),
#: the partitions' ``setmaxnreg`` values among the PTX's (``REGS``) and its count of m64nNk16 wgmma for each N
#: (``SHAPES``); True where any case failed.
WS_CHECKS = r"""
def check_ws(cases, smem_budget, serialised=r"C7515"):  # cases: (name, compile it, setmaxnreg wanted, {N: wgmma})
    failed = False
    for name, build, want_regs, want_wgmma in cases:
        n0 = len(compiled)
        try:
            build()
            k = compiled[n0]
        except Exception as e:
            failed = print(f"FAIL {name}: {type(e).__name__}: {str(e)[:3000]}") or True
            continue
        usage, log, ptx = resource_line(k), ptxas_log(k), k.asm["ptx"]
        regs = sorted(int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+);", ptx))
        shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", ptx)
        got = {n: shapes.count(str(n)) for n in want_wgmma}
        problems = [
            ("WGMMA", re.search(serialised, log), f"ptxas serialises its wgmma: {log.strip()[:300]}"),
            ("SPILL", "STACK:0 " not in usage or "LOCAL:0 " not in usage or " 0 bytes spill stores" not in log, usage),
            ("SHARED", k.metadata.shared > smem_budget, f"{k.metadata.shared} B > {smem_budget}"),
            ("REGS", not set(want_regs) <= set(regs),
             f"setmaxnreg {sorted(set(regs))}, expected {sorted(want_regs)} among them"),
            ("SHAPES", got != want_wgmma, f"{got} (N: m64nNk16 wgmma), expected {want_wgmma}"),
        ]
        for tag, bad, what in problems:
            if bad:
                print(f"{tag} {name}: {what}")
                failed = True
        print(f"ok {name}: shared {k.metadata.shared} B; setmaxnreg {sorted(set(regs))}; {usage}")
    return failed
"""


def assert_gated_to_sm90(module, use, monkeypatch) -> None:
    """A Gluon kernel module's dispatch rule (``use()``: its ``use_ws`` at a call in scope) says yes on an sm_90 GPU
    outside the interpreter, and no off sm_90 (capability 10.0), with ``module.ENABLED`` off, or under the
    interpreter: the GPU and the interpreter stood in for by ``monkeypatch``, nothing launched."""
    import torch

    import splitlab.kernels._launch as launch_common

    def capability(major):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))

    monkeypatch.setattr(launch_common, "INTERPRET", False)
    capability(9)
    assert use()
    capability(10)
    assert not use()
    capability(9)
    monkeypatch.setattr(module, "ENABLED", False)
    assert not use()
    monkeypatch.setattr(module, "ENABLED", True)
    monkeypatch.setattr(launch_common, "INTERPRET", True)
    assert not use()


def compile_in_child(body: str) -> subprocess.CompletedProcess:
    """Run ``PREAMBLE + body`` in a child process without the interpreter, from the repository's root; skip the test
    where no stand-in driver can be set, fail it (with the child's output) where the script exits non-zero."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, "-c", PREAMBLE + body], env=env, cwd=root, capture_output=True, text=True,
                       timeout=600)
    if r.returncode == 3:
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return r
