"""Release 0.1.0's name for :mod:`lokid.unit.argcheck` (see :mod:`lokid.engine`)."""

import sys

from ..unit import argcheck

sys.modules[__name__] = argcheck
