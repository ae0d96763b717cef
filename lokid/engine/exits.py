"""Release 0.1.0's name for :mod:`lokid.store.exits` (see :mod:`lokid.engine`)."""

import sys

from ..store import exits

sys.modules[__name__] = exits
