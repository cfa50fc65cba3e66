"""The ``splitlab`` planner's former module name, kept for code that still imports it from here (scripts under
``experiments/``, the schedulers); the planner lives in ``splitlab.planners.splitlab``. This name is bound to that
very module (one registration, one set of constants), so patching an attribute through either name patches both."""

import sys

from splitlab.planners import splitlab as _planner

sys.modules[__name__] = _planner
