"""The running systemd's version, as a generator may learn it: ``systemctl --version``.

The generator must not talk to the manager (PID 1 runs it and waits for it: a D-Bus call
would deadlock a boot), so the manager's ``Version`` property is out of reach. Why
``systemctl --version`` rather than the other ways:

- it prints the version compiled into it and exits before any bus connection, on every
  release (252 and 257 measured in the Debian 12 and 13 containers);
- it ships in the same package, the same build, as PID 1 (Debian's ``systemd``), and that
  package's upgrade re-executes the manager, which reruns the generators: the two agree
  whenever a generator runs;
- ``libsystemd-shared-NNN.so`` names the version too, but its directory depends on the
  release and the architecture (``/usr/lib/x86_64-linux-gnu/systemd/`` on Debian 12 and 13,
  ``/usr/lib/systemd/`` elsewhere): a guess at paths, where systemctl is found by PATH.

Any failure (no systemctl, a timeout, an output without a version) gives None, "unknown",
and the caller then writes nothing that needs a version: a generator never fails a boot.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from ..core.telemetry.journalfilter import systemd_version

TIMEOUT = 5.0   # seconds: it prints one constant string; a hang must not hold a boot


def running_version() -> int | None:
    """systemd's version from ``systemctl --version``; None when it cannot be learnt."""
    systemctl = shutil.which("systemctl")   # systemd gives its generators a PATH
    if systemctl is None:
        return None
    env = dict(os.environ, SYSTEMD_PAGER="cat", SYSTEMD_COLORS="0", LC_ALL="C")
    try:
        r = subprocess.run([systemctl, "--version"], capture_output=True, text=True,
                           errors="replace", timeout=TIMEOUT, stdin=subprocess.DEVNULL,
                           env=env, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return systemd_version(r.stdout) if r.returncode == 0 else None
