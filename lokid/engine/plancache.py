"""Release 0.1.0's name for :mod:`lokid.store.plancache` (see :mod:`lokid.engine`)."""

import sys

from ..store import plancache

sys.modules[__name__] = plancache
