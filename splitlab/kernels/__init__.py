"""Triton split-K decode kernels, their fp64 references (``reference``) and the shared ``combine``.

    from splitlab.kernels import gqa_decode, mla_decode, sparse_mla_decode
    from splitlab.kernels.combine import combine   # (not re-exported: the name is its module's)

Every launcher honours the strides of all its tensors (or refuses them in one line), keeps NaN and inf of any key a
request attends in its output as the reference does, and checks the values it reads through -- block tables,
lengths, sparse indices -- under one switch, ``validate=`` / ``SPLITLAB_VALIDATE`` (``splitlab.kernels._launch``).
"""

from splitlab.kernels import default_call  # noqa: F401  (installs the default call through a plan: _launch)
from splitlab.kernels.gqa import gqa_decode, gqa_launch_facts
from splitlab.kernels.mla import mla_decode, mla_launch_facts
from splitlab.kernels.sparse_mla import sparse_mla_decode, sparse_mla_launch_facts

__all__ = ["gqa_decode", "gqa_launch_facts", "mla_decode", "mla_launch_facts", "sparse_mla_decode",
           "sparse_mla_launch_facts"]
