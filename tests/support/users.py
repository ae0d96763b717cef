"""A throwaway system user for permission tests: the unit's ``loki``, stood in for.

The name is unique per test process (a parallel run never deletes another's
user), and the user is deleted when the test is done, unless it existed before.
Creating users needs root: tests that need one skip without it.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Callable, Iterator
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


def run_as(user: pwd.struct_passwd, call: Callable[[], str],
           describe: Callable[[BaseException], str] = str) -> str:
    """What ``call`` returns, run as ``user`` in a forked child (no exec: the test's
    Python may live where that user cannot read); an exception as ``describe`` puts it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            text = call()
        except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
            text = describe(e)
        os.write(write, text.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out
