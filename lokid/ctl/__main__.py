"""``python -m lokid.ctl``: the ``lokictl`` command."""

import sys

from .main import main

sys.exit(main())
