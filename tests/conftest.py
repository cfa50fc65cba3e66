"""Kernels run under Triton's interpreter on the CPU unless SPLITLAB_GPU_TESTS=1 (the GPU suite in
tests/gpu, run on the lent H200). The interpreter is chosen when ``@triton.jit`` runs (at import), so it
is set here, before any splitlab.kernels module is imported."""

import os

if os.environ.get("SPLITLAB_GPU_TESTS") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
