"""The engine process seen through /proc (Linux): progress, memory, disk reads, its socket.

The supervisor reads its engine's progress counters and resident memory
(:func:`progress_counters`, :func:`resident_kib`), has it die with its
parent (:func:`die_with_parent`, prctl) and, once it has exited, looks for
what is left of its process group (:func:`group_members`). The rest serves
the benchmark's thrash hint.

``lokid bench`` knows the engine by its address only (a preset started by its
unit, by ``lokid run`` or by the daemon's local runner). The process is found
the way ``ss -ltnp`` finds it: the listening socket's inode in
``/proc/net/tcp{,6}``, then the process holding that inode among its fds.
The daemon's local runner knows its engine without a search: the child of the
``lokid engine`` it spawned (:func:`children`). ``lokid bench`` also reads the
engine's command line, to tell whether a runtime plan left in the runtime
directory is the running engine's (:func:`lokid.bench.measure.started_here`).
A busy port at start is reported with its holder found the same way
(:func:`pid_listening_on`, :func:`cmdline`, :func:`command_name`).

``/proc/<pid>/io`` needs ptrace access to the process: as another user
without CAP_SYS_PTRACE it is unreadable, and the hint is simply absent. Under
systemd the daemon reads the unit's cgroup counters instead
(:meth:`lokid.runners.systemd_runner.SystemdRunner.io_sampler`).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..core.bench.iosample import IOSample, IOSampler

# The supervisor (on the path to READY) imports this module: the sample type and
# ctypes are imported where used.

def guard_self(parent: int, sig: int) -> bool:
    """This process gets ``sig`` when its parent dies (PR_SET_PDEATHSIG, set by itself
    rather than by a ``preexec_fn``, which makes its spawn a fork of the whole parent
    instead of a vfork); False when ``parent`` is already gone (it died before the guard
    was set: nobody is there to stop this process)."""
    die_with_parent(sig)()
    return os.getppid() == parent


def die_with_parent(sig: int) -> Callable[[], None]:
    """A ``preexec_fn`` that has the child receive ``sig`` when its parent dies
    (PR_SET_PDEATHSIG). libc is loaded here, in the parent: the child only calls it."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None

    def guard() -> None:
        prctl(1, sig)  # PR_SET_PDEATHSIG

    return guard


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies left out: they hold no port
    and no memory, and only their parent can make them go)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []               # the common case, without a walk through /proc
    except PermissionError:
        pass                    # members exist, but none we may signal
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def progress_counters(pid: int) -> tuple[int, ...]:
    """Counters that move while a process works: CPU ticks, resident pages, bytes read."""
    out: list[int] = []
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        out += [int(fields[11]) + int(fields[12]), int(fields[21])]  # utime+stime, rss
    except (OSError, IndexError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            out += [int(line.split()[1]) for line in f if line.startswith((b"rchar", b"read_b"))]
    except (OSError, ValueError, IndexError):
        pass  # /proc/<pid>/io needs ptrace access: a different user may not have it
    return tuple(out)


def resident_kib(pid: int) -> int | None:
    """The process's resident memory (VmRSS), KiB; None when unreadable."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


RSS = "engine RSS"

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


def _unix_listening_inodes(path: str) -> set[str]:
    """The inodes of the UNIX stream sockets listening at ``path`` (/proc/net/unix: the
    flag __SO_ACCEPTCON, 0x10000, marks a listening socket)."""
    inodes = set()
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="surrogateescape") as f:
            next(f)
            for line in f:
                fields = line.split(None, 7)
                if len(fields) == 8 and fields[7].rstrip("\n") == path \
                        and int(fields[3], 16) & 0x10000:
                    inodes.add(fields[6])
    except (OSError, StopIteration, ValueError):
        pass
    return inodes


def listening(port: int) -> bool:
    """Whether some process listens on TCP ``port`` (whoever it is)."""
    return bool(_listening_inodes(port))


def cmdline(pid: int) -> list[str] | None:
    """The command line of ``pid``, or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0")[:-1]] or None


def command_name(pid: int) -> str | None:
    """The command name of ``pid`` (``comm``: what ps shows), or None."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().decode("utf-8", "replace").rstrip("\n") or None
    except OSError:
        return None


def pid_listening_on(port: int) -> int | None:
    """The process listening on TCP ``port`` (one we may look into), or None."""
    return _holder(_listening_inodes(port))


def pid_listening_at(path: str) -> int | None:
    """The process listening on the UNIX socket ``path`` (an on-demand preset's engine
    under systemd, whose TCP port systemd holds), or None."""
    return _holder(_unix_listening_inodes(path))


def _holder(inodes: set[str]) -> int | None:
    """The first process (one we may look into) with one of these sockets open."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
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


def children(pid: int) -> list[int]:
    """The child processes of ``pid``: its threads' ``children`` lists, or, on a kernel
    without them (CONFIG_PROC_CHILDREN), the processes whose parent it is."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    try:
        for tid in tids:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(p) for p in f.read().split()]
        return found
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        return []
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def io_sample(pid: int) -> IOSample | None:
    """Bytes read from storage and resident bytes of ``pid``, or None when unreadable."""
    try:
        with open(f"/proc/{pid}/io") as f:
            read = next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    rss = resident_kib(pid)
    from ..core.bench.iosample import IOSample

    return None if rss is None else IOSample(read, rss * 1024, RSS)


def sampler_for_pid(pid: int) -> IOSampler | None:
    """A sampler of process ``pid``, or None when its figures cannot be read. Two small
    /proc files per sample: read on the event loop."""
    if io_sample(pid) is None:
        return None

    async def sample() -> IOSample | None:
        return io_sample(pid)

    return sample


def sampler_for_port(port: int, socket_path: str = "") -> IOSampler | None:
    """A sampler of the engine listening on ``port`` (on the UNIX socket ``socket_path``
    instead, when given: systemd holds the port), or None when it cannot be read
    (blocking: a scan of every process's fds)."""
    pid = pid_listening_at(socket_path) if socket_path else pid_listening_on(port)
    return None if pid is None else sampler_for_pid(pid)
