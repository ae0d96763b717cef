"""The engine process behind a port, and its disk reads: the benchmark's thrash hint (Linux).

The benchmark knows the engine by its address only (a preset started by its
unit, by ``lokid run`` or by the daemon's local runner). The process is found
the way ``ss -ltnp`` finds it: the listening socket's inode in
``/proc/net/tcp{,6}``, then the process holding that inode among its fds.
``/proc/<pid>/io`` needs ptrace access to the process: as another user
without CAP_SYS_PTRACE it is unreadable, and the hint is simply absent.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .supervisor import resident_kib

LISTEN = "0A"


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(inode)
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return inodes


def pid_listening_on(port: int) -> int | None:
    """The process listening on TCP ``port`` (one we may look into), or None."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not wanted:
        return None
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            for fd in os.listdir(fd_dir):
                if os.readlink(f"{fd_dir}/{fd}") in wanted:
                    return int(entry)
        except OSError:
            continue
    return None


def io_sample(pid: int) -> tuple[int, int] | None:
    """(bytes read from storage, resident bytes) of ``pid``, or None when unreadable."""
    try:
        with open(f"/proc/{pid}/io") as f:
            read = next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    rss = resident_kib(pid)
    return None if rss is None else (read, rss * 1024)


def sampler_for_port(port: int) -> Callable[[], tuple[int, int] | None] | None:
    """A sampler of the engine listening on ``port``, or None when it cannot be read."""
    pid = pid_listening_on(port)
    if pid is None or io_sample(pid) is None:
        return None
    return lambda: io_sample(pid)
