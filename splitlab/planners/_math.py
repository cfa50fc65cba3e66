"""The integer helpers under their former name, for code that still imports them from here (the work-list kernels
and ``kernels/_launch.py``); they live in ``splitlab.intmath``, below the wave model and the planners."""

from splitlab.intmath import cdiv, clamp, next_power_of_two

__all__ = ["cdiv", "clamp", "next_power_of_two"]
