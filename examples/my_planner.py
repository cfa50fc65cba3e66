"""An external planner, registered from outside splitlab: ``one_wave`` splits a decode until its CTAs fill one wave
of the GPU's SMs (at least 64 keys a split, at most 64 splits). It takes part like the built-in planners once its
module is imported with ``--plugin`` (or ``SPLITLAB_PLUGINS``)::

    splitlab --plugin examples/my_planner.py plan --kind gqa --batch 1,8 --planner one_wave,splitlab
    splitlab --plugin examples/my_planner.py sweep examples/my_kernel.toml --grid quick --timer fake --out runs
    splitlab --plugin examples/my_planner.py regress --baseline splitlab --candidate one_wave \\
        --data runs/my_decode-quick --allow-fake

A planner is a function ``(DecodeWorkload, DeviceSpec) -> Plan``; ``planners.register`` names it and the kinds it
covers. Nothing here imports torch.
"""

from splitlab import planners, waves
from splitlab.planners import Plan

MAX_SPLITS = 64
MIN_KEYS_PER_SPLIT = 64


@planners.register("one_wave", kinds=("gqa", "mla"), source="examples/my_planner.py: fill one wave of the SMs")
def one_wave(w, dev) -> Plan:
    """The most splits whose CTAs still fit in one wave (one CTA per SM), within the key and split limits."""
    unsplit = waves.ctas(w, 1)  # CTAs of the unsplit launch of splitlab's kernels for this workload
    most = max(1, min(MAX_SPLITS, -(-w.keys_per_request // MIN_KEYS_PER_SPLIT)))
    return Plan("one_wave", max(1, min(most, dev.sm_count // unsplit)), note=f"{unsplit} CTAs unsplit")
