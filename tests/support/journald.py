"""A real systemd-journald for one test, on a host whose PID 1 is not systemd.

``journal.send`` (systemd-python, sd_journal_sendv) writes to the fixed path
``/run/systemd/journal/socket``. :func:`private_journald` gives the calling thread a mount
namespace of its own (``unshare(CLONE_NEWNS)``, mounts private), puts empty tmpfs over
``/run/systemd``, ``/run/log`` and ``/var/log/journal`` there, and starts the real
``systemd-journald`` in it: what the test's thread sends (the gateway runs in the test's
event loop, in that thread) is stored by journald in ``/run/log/journal``, read back with
the real ``journalctl -D``. At the end journald stops, the mounts go and the thread
returns to the host's namespace (``setns``); the host's own ``/run`` was never touched.
Needs root (CAP_SYS_ADMIN); the caller skips otherwise, saying so.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

JOURNALD = "/lib/systemd/systemd-journald"
CLONE_NEWNS, CLONE_FS = 0x00020000, 0x00000200
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
MNT_DETACH = 2
MOUNTS = ("/run/systemd", "/run/log", "/var/log/journal")
JOURNAL_DIR = "/run/log/journal"


def unavailable() -> str:
    """Why a private journald cannot run here ('' when it can)."""
    if os.geteuid() != 0:
        return "a private mount namespace for journald needs root"
    if not os.path.exists(JOURNALD):
        return f"no {JOURNALD} (Debian's systemd package)"
    if not all(os.path.isdir(m) for m in MOUNTS):
        return f"one of {', '.join(MOUNTS)} is not a directory to mount over"
    return ""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


@dataclass
class Journald:
    directory: str                     # its journal files (for ``journalctl -D``)
    proc: subprocess.Popen[bytes]      # systemd-journald


@contextlib.contextmanager
def private_journald() -> Iterator[Journald]:
    """journald serving this thread's ``/run/systemd/journal/socket``."""
    libc = ctypes.CDLL(None, use_errno=True)
    host = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY)
    mounted: list[str] = []
    journald = None
    try:
        _check(libc.unshare(CLONE_NEWNS), "unshare")
        _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None),
               "mount --make-rprivate /")
        for m in MOUNTS:
            _check(libc.mount(b"tmpfs", m.encode(), b"tmpfs", 0, b"mode=0755"), f"mount {m}")
            mounted.append(m)
        journald = subprocess.Popen([JOURNALD], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not os.path.exists("/run/systemd/journal/socket"):
            assert journald.poll() is None, f"journald exited {journald.returncode}"
            assert time.monotonic() < deadline, "journald made no socket in 10 s"
            time.sleep(0.02)
        yield Journald(JOURNAL_DIR, journald)
    finally:
        if journald is not None and journald.poll() is None:
            journald.terminate()
            journald.wait(10)
        for m in reversed(mounted):
            libc.umount2(m.encode(), MNT_DETACH)
        # threads started meanwhile (the loop's executor) share this thread's root and
        # cwd, and setns refuses a shared one: this thread takes a copy of its own first
        _check(libc.unshare(CLONE_FS), "unshare(CLONE_FS)")
        _check(libc.setns(host, CLONE_NEWNS), "setns back to the host's mounts")
        back = os.stat("/proc/thread-self/ns/mnt").st_ino == os.fstat(host).st_ino
        os.close(host)
        assert back, "the test's thread is not back in the host's mount namespace"


def entries(directory: str, *matches: str) -> list[dict[str, str]]:
    """The journal's entries (``journalctl -D directory -o json`` with ``matches``), after
    journald wrote what it was sent (``journalctl --sync`` needs its varlink socket,
    which this journald has)."""
    import json

    subprocess.run(["journalctl", "--sync"], check=False, capture_output=True, timeout=30)
    out = subprocess.run(["journalctl", "-D", directory, "-o", "json", "--no-pager",
                          *matches], check=True, capture_output=True, text=True, timeout=30)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
