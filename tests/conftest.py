"""Kernels run under Triton's interpreter on the CPU unless SPLITLAB_GPU_TESTS=1 (the GPU suite in
tests/gpu, run on the lent H200). The interpreter is chosen when ``@triton.jit`` runs (at import), so it
is set here, before any splitlab.kernels module is imported."""

import os

if os.environ.get("SPLITLAB_GPU_TESTS") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402  (after the interpreter switch above)


@pytest.fixture
def allocs():
    """Every buffer the kernel launchers allocate (``splitlab.kernels._launch.alloc``) starts as NaN; the
    list collects them so a test can check that each was fully written."""
    from splitlab.kernels.inputs import poisoned_allocs

    with poisoned_allocs() as made:
        yield made


@pytest.fixture
def planned(monkeypatch):
    """The workloads ``splitlab.planners.default_plan`` is asked about (what a launcher with ``num_splits=None``
    plans for), in order; each call still returns the real plan."""
    import splitlab.planners as planners

    seen: list = []
    real = planners.default_plan

    def spy(workload, device=None):
        seen.append(workload)
        return real(workload, device)

    monkeypatch.setattr(planners, "default_plan", spy)
    return seen
