"""A throwaway system user for permission tests: the unit's ``loki``, stood in for.

The name is unique per test process (a parallel run never deletes another's
user), and the user is deleted when the test is done, unless it existed before.
Creating users needs root: tests that need one skip without it.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def throwaway_user() -> Iterator[pwd.struct_passwd]:
    name = f"lokit{os.getpid()}"
    try:
        yield pwd.getpwnam(name)
        return
    except KeyError:
        pass
    subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                    "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
