"""``python -m lokid``: the ``lokid`` command (the daemon's local runner starts its helpers so)."""

import sys

from .cli import main

sys.exit(main())
