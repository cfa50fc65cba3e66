"""Split-K planners: faithful pure-Python ports of each source's rule, one module per source, and
adapters that put them behind one interface (``plan``). Nothing here imports torch.

    from splitlab.planners import plan, names
    plan(workloads.get("deepseek-v3-mla", batch=8, ctx_len=81920), "mi355x", "modular")
"""

# Importing a module registers its adapter; ``names()`` lists the planners in that order (the rows of ``splitlab
# plan``, the sweep's planner columns), which stays the one they have always had: splitlab's before SGLang's.
from splitlab.planners import (  # noqa: F401
    aiter,
    flash_attn,
    flashinfer,
    flashmla,
    flex,
    modular,
    splitlab,
)

# isort: split
from splitlab.planners import sglang  # noqa: F401
from splitlab.planners.registry import Plan, entry, names, plan, register

__all__ = ["Plan", "entry", "names", "plan", "register", "default_plan"]


def default_plan(workload, device=None) -> Plan:
    """The plan splitlab's kernel launchers use when ``num_splits=None``: the ``splitlab`` planner on
    ``device`` (a ``DeviceSpec``, a preset name, or ``None`` for the GPU torch sees), with the constants fitted for
    that device (``planners.splitlab.constants_for``; a warning, once, where it takes the fallback's)."""
    if device is None:
        from splitlab.devices import detect

        device = detect()
    p = plan(workload, device, "splitlab")
    splitlab.warn_if_fallback(workload.kind, device)  # the planner module (this package's), not the top package
    return p
