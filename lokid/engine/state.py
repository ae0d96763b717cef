"""Release 0.1.0's name for :mod:`lokid.store.state` (see :mod:`lokid.engine`)."""

import sys

from ..store import state

sys.modules[__name__] = state
