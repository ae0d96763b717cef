"""lokid as installed, for the benchmarks that time a start: its modules byte-compiled.

The Debian package byte-compiles lokid at install (dh_python3's ``py3compile -p
lokid`` in postinst), and a checkout run by a user writes ``__pycache__`` on its
first start. This machine's environment sets ``PYTHONDONTWRITEBYTECODE=1``, so a
benchmark that spawns ``python -m lokid.cli`` from the checkout would compile
every imported module from source at each start (about 40 ms of the start path,
measured with cProfile: ``builtins.compile``), a cost no installed lokid pays.

:func:`installed_env` compiles the checkout's ``lokid`` into a private cache
(``PYTHONPYCACHEPREFIX``, so the checkout is not touched) and returns the
environment that makes children read it. The standard library's own bytecode is
written to the same cache by the first child (the warm-up run each benchmark
already makes). :func:`source_env` is the other case, for comparison: nothing
compiled, nothing written.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping

from . import REPO


def installed_env(env: Mapping[str, str], cache_dir: str) -> dict[str, str]:
    """``env`` for children that find lokid byte-compiled in ``cache_dir``."""
    subprocess.run([sys.executable, "-X", f"pycache_prefix={cache_dir}", "-m", "compileall",
                    "-q", str(REPO / "lokid")], check=True)
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = cache_dir
    return out


def source_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for children that compile every module from source at each start."""
    out = {k: v for k, v in env.items() if k != "PYTHONPYCACHEPREFIX"}
    out["PYTHONDONTWRITEBYTECODE"] = "1"
    return out


def describe(env: Mapping[str, str]) -> str:
    """What the children's imports read, for a benchmark's report."""
    if env.get("PYTHONPYCACHEPREFIX"):
        return "lokid byte-compiled, as the Debian package installs it"
    return "lokid compiled from source at each start (PYTHONDONTWRITEBYTECODE=1, no bytecode)"
