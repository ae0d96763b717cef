"""A real systemd for the tests: Debian's systemd as PID 1 in a systemd-nspawn container.

lokid's units (``loki-engine@<preset>.service``, Type=notify) are tested against
the real system manager, not a mock of it. This module builds a minimal Debian
root file system once with mmdebstrap (bookworm unless told otherwise; cached as
``.cache/rootfs/<suite>-<key>.tar.zst``), unpacks it into a fresh tmpfs per
container, boots it with ``systemd-nspawn -b`` and enters it with ``nsenter``.

It works on hosts whose PID 1 is not systemd (CI containers and VMs), which is
why it uses ``--register=no --keep-unit`` (no machined to register with) and
puts the launcher into a cgroup of its own first. The recipe it follows was
proven on this machine kind: /work/shared/recipes/ (nspawn-harness.sh, README).

    with Container(binds={"/opt/lokid": "/work/main"}) as ct:
        ct.systemctl("start", "foo.service")
        print(ct.journal("foo.service"))

Needs root and the Debian packages systemd-container, mmdebstrap, zstd and
util-linux (scripts/setup-system installs them).
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from . import REPO

# Bump when the build recipe changes in a way the key below does not see.
HARNESS_VERSION = 1

SUITE = "bookworm"   # the default; the Debian package is also tested on trixie


def mirrors(suite: str) -> tuple[str, ...]:
    """Debian's archive for ``suite``, with its updates and security pockets."""
    return (f"deb http://deb.debian.org/debian {suite} main",
            f"deb http://deb.debian.org/debian {suite}-updates main",
            f"deb http://deb.debian.org/debian-security {suite}-security main")


MIRRORS = mirrors(SUITE)

# What lokid's units need under a real systemd, from Debian rather than PyPI:
# the Debian package of lokid will run on exactly these.
PACKAGES = (
    "systemd", "systemd-sysv", "dbus",
    "python3", "python3-systemd", "python3-httpx",
    "python3-dbus-fast",     # 1.84.2 in bookworm
    "python3-tomlkit",       # 0.11.7 in bookworm: preset edits that keep comments
    "python3-sdnotify",      # 0.3.2: the unit helpers' READY/STATUS/WATCHDOG
    "python3-aiohttp",       # 3.8.4: the gateway's HTTP server and client
    # lokid's verbs are authorised by polkit where it runs: the container tests check
    # the shipped action and rules files against the real polkitd (and the fallback
    # with polkitd taken away).
    "polkitd",
    "procps", "iproute2", "curl",
    # llama-server b11434 (CPU build) links these beyond its own libs, which
    # sit next to it in the wheel (RUNPATH $ORIGIN): see `ldd llama-server`.
    "libgomp1", "libssl3", "libstdc++6", "libgcc-s1",
)

# Run by mmdebstrap in the finished tree ("$1" is its root).
CUSTOMIZE_HOOKS = (
    'echo lokid-harness > "$1/etc/hostname"',
    # An empty machine-id: each boot gets a fresh transient one, as a new machine would.
    'rm -f "$1/etc/machine-id" && : > "$1/etc/machine-id"',
    # Volatile journal (it lives and dies with the tmpfs) and no rate limit: tests
    # look for specific lines, and a dropped one would be a flaky failure.
    'mkdir -p "$1/etc/systemd/journald.conf.d" && '
    'printf "[Journal]\\nStorage=volatile\\nRateLimitBurst=0\\n" '
    '> "$1/etc/systemd/journald.conf.d/lokid-harness.conf"',
    # Nobody logs in on the console; a getty there only adds noise to its log.
    'ln -sf /dev/null "$1/etc/systemd/system/console-getty.service"',
)

CACHE_DIR = REPO / ".cache" / "rootfs"

CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Work dirs and cgroups carry the owner's pid, so a later run can tell a leftover
# of a killed session (owner gone) from a live container of a parallel one.
WORKDIR_PREFIX = "lokid-systemd-"
CGROUP_PREFIX = "lokid-harness-"

HOST_TOOLS = {  # command -> the Debian package that provides it
    "systemd-nspawn": "systemd-container",
    "mmdebstrap": "mmdebstrap",
    "zstd": "zstd",
    "nsenter": "util-linux",
    "tar": "tar",
    "mount": "mount",
}

PR_SET_PDEATHSIG = 1
PROPAGATE_DIR = Path("/run/systemd/nspawn/propagate")


class HarnessError(RuntimeError):
    """The harness cannot build, boot or control the container; the message says why."""


class Background:
    """A command running in the container, from :meth:`Container.popen`."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.proc = proc

    def stop(self) -> str:
        """SIGTERM to its process group; everything it printed."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            out, _ = self.proc.communicate()
        return out or ""


class ContainerCommandError(subprocess.CalledProcessError):
    """A command inside the container failed; str() carries its output."""

    def __str__(self) -> str:
        out = (self.stdout or "").strip()[-2000:]
        err = (self.stderr or "").strip()[-2000:]
        return (f"{super().__str__()}"
                + (f"\n--- stdout\n{out}" if out else "")
                + (f"\n--- stderr\n{err}" if err else ""))


def until(what: str, check: Callable[[], Any], timeout: float = 60.0,
          every: float = 0.1) -> Any:
    """Poll ``check`` (a look into a container: a unit's state, a file, a log) every
    ``every`` seconds until it gives something true, and return that; AssertionError
    naming ``what`` past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(every)


def _say(msg: str) -> None:
    # Straight to the terminal, past pytest's capture: a build takes a minute
    # and CI logs should say why nothing happens meanwhile.
    stream = sys.__stderr__ or sys.stderr
    print(f"systemd_harness: {msg}", file=stream, flush=True)


# --- host ------------------------------------------------------------------------


def check_host() -> None:
    """Raise HarnessError naming the Debian packages when the host cannot run containers."""
    if os.geteuid() != 0:
        raise HarnessError("the systemd harness needs root (systemd-nspawn, mount, cgroups)")
    missing = sorted({pkg for cmd, pkg in HOST_TOOLS.items() if shutil.which(cmd) is None})
    if missing:
        raise HarnessError(
            "the systemd harness needs host tools that are missing; install them with: "
            f"apt-get install -y {' '.join(missing)} (or run scripts/setup-system as root)")


def _cgroup_roots() -> list[Path]:
    """Host hierarchies in which the launcher needs a cgroup of its own."""
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():  # a pure cgroup2 host
        return [base]
    return [h for h in (base / "systemd", base / "unified") if h.is_dir()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cgroup_pids(cg: Path) -> list[int]:
    pids: list[int] = []
    for procs in cg.rglob("cgroup.procs"):
        try:
            pids += [int(p) for p in procs.read_text().split()]
        except OSError:
            pass
    return pids


def _remove_cgroup(cg: Path) -> None:
    """Kill what is left in ``cg`` and remove it, children first."""
    if not cg.is_dir():
        return
    for _ in range(50):
        pids = _cgroup_pids(cg)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    dirs = sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                  reverse=True)
    for d in [*dirs, cg]:
        try:
            d.rmdir()
        except OSError:
            pass


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` in our mount namespace, deepest first."""
    top = str(path)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            # mountinfo escapes blanks in paths as octal (\040).
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if mp == top or mp.startswith(top + "/"):
                found.append(mp)
    return sorted(found, key=len, reverse=True)


def _remove_tree(top: Path) -> None:
    """Unmount what is mounted at or below ``top``, then delete it.

    Deleting with a bind mount still in place would delete the bind's source
    (the repository itself), so nothing is removed while any mount is left.
    """
    if not top.exists():
        return
    for mp in _mounts_under(top):
        if subprocess.run(["umount", mp], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", mp], capture_output=True)
    left = _mounts_under(top)
    if left:
        _say(f"not removing {top}: still mounted there: {', '.join(left)}")
        return
    shutil.rmtree(top, ignore_errors=True)


def reap_stale() -> None:
    """Remove containers left behind by a test session that was killed (its pid is gone).

    A session killed with SIGKILL or SIGTERM runs no finalizer; its nspawn got
    SIGTERM from the kernel (PR_SET_PDEATHSIG) and halted its container, and
    this removes what remains: processes, cgroups, the tmpfs and files.
    """
    def stale(name: str, prefix: str) -> str | None:
        m = re.fullmatch(re.escape(prefix) + r"(lokid-(\d+)-[0-9a-f]+)", name)
        return m.group(1) if m and not _pid_alive(int(m.group(2))) else None

    # Processes first: nothing may still use the mounts removed below.
    for root in _cgroup_roots():
        for cg in root.glob(CGROUP_PREFIX + "*"):
            if stale(cg.name, CGROUP_PREFIX):
                _remove_cgroup(cg)
    for d in Path(tempfile.gettempdir()).glob(WORKDIR_PREFIX + "*"):
        machine = stale(d.name, WORKDIR_PREFIX)
        if machine:
            _remove_tree(d)
            _remove_tree(PROPAGATE_DIR / machine)


# --- the root file system ----------------------------------------------------------


def rootfs_key(suite: str = SUITE, packages: Iterable[str] = PACKAGES) -> str:
    """Cache key: changes whenever what the build would produce changes."""
    blob = json.dumps({"version": HARNESS_VERSION, "suite": suite, "mirrors": mirrors(suite),
                       "packages": sorted(set(packages)), "hooks": CUSTOMIZE_HOOKS},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def ensure_rootfs(packages: Sequence[str] = PACKAGES, *, cache_dir: Path = CACHE_DIR,
                  suite: str = SUITE) -> Path:
    """The cached rootfs tarball for ``packages``, built first when missing.

    The build downloads ~90 MB from deb.debian.org: half a minute on an idle
    machine, a few minutes on a busy one.
    """
    check_host()
    cache_dir.mkdir(parents=True, exist_ok=True)
    tarball = cache_dir / f"{suite}-{rootfs_key(suite, packages)}.tar.zst"
    if tarball.is_file():
        return tarball
    # Two sessions starting at once (CI and a developer) build once.
    with open(cache_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tarball.is_file():
            return tarball
        # mmdebstrap picks the format by the name, so the temp name ends in .tar.zst too.
        tmp = cache_dir / f".{tarball.name[:-len('.tar.zst')]}.{os.getpid()}.tar.zst"
        log = cache_dir / f"{tarball.name}.log"
        argv = ["mmdebstrap", "--variant=minbase", "--mode=root",
                "--include=" + ",".join(packages),
                *(f"--customize-hook={hook}" for hook in CUSTOMIZE_HOOKS),
                suite, str(tmp), *mirrors(suite)]
        _say(f"building the {suite} rootfs for the systemd tests ({tarball.name})")
        t0 = time.monotonic()
        with open(log, "w") as out:
            rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL).returncode
        if rc != 0:
            tmp.unlink(missing_ok=True)
            tail = "".join(log.read_text(errors="replace").splitlines(True)[-25:])
            raise HarnessError(f"mmdebstrap failed (exit {rc}); full log in {log}:\n{tail}")
        os.replace(tmp, tarball)
        _say(f"rootfs built in {time.monotonic() - t0:.1f} s "
             f"({tarball.stat().st_size / 2**20:.0f} MiB)")
        return tarball


# --- the container -----------------------------------------------------------------


_live: set[Container] = set()


@atexit.register
def _stop_all() -> None:
    # The last line of defence: a session that ends without running its
    # finalizers (an internal error, sys.exit in a test) still stops its containers.
    for ct in list(_live):
        ct.stop()


def _escape_bind(path: str) -> str:
    # systemd-nspawn splits --bind=SRC:DST[:OPTS] at colons.
    return path.replace("\\", "\\\\").replace(":", "\\:")


class Container:
    """One booted container: Debian (``suite``, bookworm by default) with systemd as PID 1.

    ``packages`` is what its rootfs holds (:data:`PACKAGES` is bookworm's).
    ``binds`` and ``rw_binds`` map a path inside the container to a host path,
    bound read-only and read-write. The container shares the host's network
    (pick ports with a free-port helper); ``private_network=True`` gives it a
    loopback of its own instead, and ``network_bridge`` a network of its own whose
    interface ``host0`` is joined to that host bridge (:mod:`support.fleetkit`).
    """

    def __init__(self, binds: Mapping[str, str] | None = None, *,
                 rw_binds: Mapping[str, str] | None = None,
                 packages: Sequence[str] = PACKAGES,
                 suite: str = SUITE,
                 private_network: bool = False,
                 network_bridge: str = "",
                 boot_timeout: float = 90.0) -> None:
        self.binds = dict(binds or {})
        self.rw_binds = dict(rw_binds or {})
        for inside in [*self.binds, *self.rw_binds]:
            if not inside.startswith("/"):
                raise ValueError(f"bind target must be an absolute path: {inside!r}")
        self.packages = tuple(packages)
        self.suite = suite
        self.private_network = private_network
        self.network_bridge = network_bridge   # a host bridge its veth (host0) joins
        self.boot_timeout = boot_timeout
        self.name = f"lokid-{os.getpid()}-{secrets.token_hex(4)}"
        self.workdir: Path | None = None
        self.leader = 0            # host pid of the container's PID 1
        self.boot_seconds = 0.0
        self.shutdown_console = ""   # the console of the last reboot's shutdown
        self.failed_units: list[str] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._rootdir: Path | None = None
        self._cgroups: list[Path] = []

    # context manager ------------------------------------------------------------

    def __enter__(self) -> Container:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # start / stop ------------------------------------------------------------------

    @property
    def console_log(self) -> Path:
        assert self.workdir is not None, "container not started"
        return self.workdir / "console.log"

    def console(self, tail: int = 80) -> str:
        """The last ``tail`` lines of the container's console (systemd's boot messages)."""
        try:
            lines = self.console_log.read_text(errors="replace").splitlines()
        except (OSError, AssertionError):
            return ""
        return "\n".join(lines[-tail:])

    def start(self) -> None:
        """Unpack the rootfs, boot it and wait until systemd says running or degraded."""
        if self._proc is not None:
            raise HarnessError(f"container {self.name} was already started")
        check_host()
        reap_stale()
        tarball = ensure_rootfs(self.packages, suite=self.suite)
        _live.add(self)
        try:
            self._unpack(tarball)
            self._boot()
        except BaseException:
            self.stop()
            raise

    def _unpack(self, tarball: Path) -> None:
        # The name is unique already (pid + random token), and reap_stale parses it.
        self.workdir = Path(tempfile.gettempdir()) / (WORKDIR_PREFIX + self.name)
        self.workdir.mkdir(mode=0o700)
        root = self._rootdir = self.workdir / "root"
        root.mkdir(mode=0o755)
        # A tmpfs root: unpacking ~15k files onto the VM's disk costs ~10 s of
        # system time, onto tmpfs well under a second; and it leaves nothing behind.
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=4G", "tmpfs", str(root)],
                       check=False, capture_output=True)
        # --numeric-owner: system users (messagebus, systemd-journal, _apt) have
        # other ids on the host than in the container.
        r = subprocess.run(["tar", "--zstd", "--numeric-owner", "-xpf", str(tarball),
                            "-C", str(root)], capture_output=True, text=True)
        if r.returncode != 0:
            raise HarnessError(f"cannot unpack {tarball}: {r.stderr.strip()[-2000:]}")

    def _nspawn_argv(self) -> list[str]:
        assert self._rootdir is not None
        argv = ["systemd-nspawn", "--directory", str(self._rootdir), "--machine", self.name,
                "--boot",
                # No systemd on the host: nothing to register with, no scope to
                # create; the cgroup we put the launcher in becomes the container's.
                "--register=no", "--keep-unit",
                # read-only drains the console into our log; with "passive" a full
                # console pty blocks PID 1.
                "--console=read-only",
                # Without bpf the container's systemd silently ignores IPAddressDeny=
                # and DevicePolicy=: tests would pass on options that do nothing.
                "--system-call-filter=bpf",
                "--link-journal=no", "--settings=no"]
        if self.network_bridge:   # a network of its own, on the test's bridge
            argv.append(f"--network-bridge={self.network_bridge}")
        elif self.private_network:
            argv.append("--private-network")
        for inside, host in self.binds.items():
            argv.append(f"--bind-ro={_escape_bind(host)}:{_escape_bind(inside)}")
        for inside, host in self.rw_binds.items():
            argv.append(f"--bind={_escape_bind(host)}:{_escape_bind(inside)}")
        return argv

    def _boot(self) -> None:
        self._cgroups = [root / (CGROUP_PREFIX + self.name) for root in _cgroup_roots()]
        for cg in self._cgroups:
            cg.mkdir()
        procs = [str(cg / "cgroup.procs") for cg in self._cgroups]

        def in_own_cgroup() -> None:
            # Runs in the child between fork and exec: only plain system calls here.
            for path in procs:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.write(fd, b"0")   # "0" moves the writing process itself
                finally:
                    os.close(fd)
            # If this session dies without its finalizers, the kernel sends nspawn
            # SIGTERM, which halts the container cleanly.
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

        env = {"PATH": os.environ.get("PATH", CONTAINER_PATH),
               # pure cgroup2 inside, whatever the host mixes
               "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}
        t0 = time.monotonic()
        with open(self.console_log, "wb") as console:
            self._proc = subprocess.Popen(
                self._nspawn_argv(), stdin=subprocess.DEVNULL, stdout=console,
                stderr=subprocess.STDOUT, env=env, preexec_fn=in_own_cgroup,
                # Ctrl-C in pytest must not reach nspawn directly: stop() does the shutdown.
                start_new_session=True)
        deadline = t0 + self.boot_timeout
        self.leader = self._find_leader(deadline)
        state = ""
        while True:
            if self._proc.poll() is not None:
                raise HarnessError(f"container exited during boot (nspawn status "
                                   f"{self._proc.returncode}); console:\n{self.console()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise HarnessError(f"container did not finish booting in {self.boot_timeout:.0f}"
                                   f" s (last state {state!r}); console:\n{self.console()}")
            try:
                r = self.run(["systemctl", "is-system-running", "--wait"], check=False,
                             timeout=left)
            except subprocess.TimeoutExpired:
                continue
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                break
            if state in ("maintenance", "stopping"):
                raise HarnessError(f"container's systemd is {state!r}; console:\n"
                                   f"{self.console()}")
            # Too early for systemctl to reach PID 1 ("offline", no bus yet): retry.
            time.sleep(0.1)
        self.boot_seconds = time.monotonic() - t0
        if state == "degraded":
            r = self.systemctl("list-units", "--failed", "--plain", "--no-legend", check=False)
            self.failed_units = [line.split()[0] for line in r.stdout.splitlines() if line]

    def _find_leader(self, deadline: float) -> int:
        """Host pid of the container's PID 1: nspawn's child once it has exec'ed systemd."""
        assert self._proc is not None
        while time.monotonic() < deadline:
            for stat in Path("/proc").glob("[0-9]*/stat"):
                try:
                    text = stat.read_text()
                    comm = (stat.parent / "comm").read_text().strip()
                except OSError:
                    continue
                ppid = int(text.rsplit(")", 1)[1].split()[1])
                if ppid == self._proc.pid and comm == "systemd":
                    return int(stat.parent.name)
            if self._proc.poll() is not None:
                raise HarnessError(f"systemd-nspawn exited with status {self._proc.returncode}"
                                   f"; its output:\n{self.console()}")
            time.sleep(0.05)
        raise HarnessError(f"systemd did not start in the container; nspawn output:\n"
                           f"{self.console()}")

    def stop(self, timeout: float = 30.0) -> None:
        """Power off, wait (kill when stuck), remove cgroups, mounts and files. Idempotent;
        never raises, so it is safe in ``finally``."""
        proc = self._proc
        try:
            if proc is not None and proc.poll() is None:
                try:
                    self.run(["systemctl", "poweroff", "--no-block"], check=False, timeout=10)
                except (OSError, subprocess.SubprocessError):
                    # systemctl could not be run: SIGRTMIN+4 asks PID 1 to power off too.
                    self._signal(self.leader, signal.SIGRTMIN + 4)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    _say(f"container {self.name} did not power off in {timeout:.0f} s; "
                         "killing it")
                    self._signal(self.leader, signal.SIGKILL)
                    self._signal(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        except Exception as e:  # the cleanup below runs whatever went wrong
            _say(f"stopping container {self.name}: {e!r}")
            if proc is not None:
                self._signal(proc.pid, signal.SIGKILL)
        finally:
            for cg in self._cgroups:
                _remove_cgroup(cg)
            if self.workdir is not None:
                _remove_tree(self.workdir)
            # nspawn leaves its propagation dir behind: it refuses to delete
            # recursively on a disk file system, and /run is no tmpfs on such hosts.
            _remove_tree(PROPAGATE_DIR / self.name)
            self._cgroups = []
            self.leader = 0
            _live.discard(self)

    def reboot(self, timeout: float = 60.0) -> None:
        """``systemctl reboot`` inside, as an operator does: nspawn exits asking to be run
        again (status 133), and the same root is booted again; what was written inside
        stays (its tmpfs is the host's), what ran or was configured at run time (an
        address added by hand) is gone."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise HarnessError(f"container {self.name} is not running")
        self.run(["systemctl", "reboot", "--no-block"], check=False, timeout=10)
        try:
            status = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"container {self.name} did not reboot in {timeout:.0f} s"
                               ) from None
        # what the shutdown printed (the next boot writes the console anew)
        self.shutdown_console = self.console(200)
        if status != 133:
            raise HarnessError(f"systemd-nspawn exited with {status} on a reboot, not 133")
        for cg in self._cgroups:
            _remove_cgroup(cg)
        self._proc, self.leader = None, 0
        self._boot()

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        if pid > 0:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self.leader > 0

    # commands ---------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 60.0,
            input: str | None = None, env: Mapping[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the container (all its namespaces, a clean environment).

        Like ``subprocess.run(..., capture_output=True, text=True)``; ``check``
        raises ContainerCommandError, whose message carries stdout and stderr.
        The command runs outside any unit: wrap it in ``systemd-run`` to get one.
        """
        if self.leader <= 0:
            raise HarnessError(f"container {self.name} is not running")
        base = {"PATH": CONTAINER_PATH, "LANG": "C.UTF-8", "HOME": "/root", "TERM": "dumb",
                "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}
        assigns = [f"{k}={v}" for k, v in {**base, **(env or {})}.items()]
        full = ["nsenter", "--target", str(self.leader), "--all",
                "env", "-i", *assigns, *argv]
        # A session of its own: on a timeout the whole group goes (nsenter forks
        # to enter the PID namespace, and killing nsenter alone would leave the command).
        with subprocess.Popen(full, stdin=subprocess.PIPE if input is not None
                              else subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              start_new_session=True) as p:
            try:
                out, err = p.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
                raise
        result = subprocess.CompletedProcess(list(argv), p.returncode, out, err)
        if check and result.returncode != 0:
            raise ContainerCommandError(result.returncode, list(argv), out, err)
        return result

    def popen(self, argv: Sequence[str]) -> Background:
        """Start ``argv`` inside the container in the background (e.g. ``busctl monitor``);
        :meth:`Background.stop` ends it and returns what it printed."""
        if self.leader <= 0:
            raise HarnessError(f"container {self.name} is not running")
        full = ["nsenter", "--target", str(self.leader), "--all", "env", "-i",
                f"PATH={CONTAINER_PATH}", "LANG=C.UTF-8", *argv]
        proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        time.sleep(0.5)  # let it subscribe before the caller acts
        return Background(proc)

    def systemctl(self, *args: str, check: bool = True, timeout: float = 60.0,
                  ) -> subprocess.CompletedProcess[str]:
        return self.run(["systemctl", *args], check=check, timeout=timeout)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """``systemctl show`` as a dict; only ``props`` when given."""
        argv = ["show", unit, *(f"--property={p}" for p in props)]
        out = self.systemctl(*argv).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def wait_for(self, unit: str, state: str, timeout: float = 30.0) -> None:
        """Wait until ``unit``'s ActiveState is ``state`` (active, inactive, failed...).

        Gives up at once when the unit fails while waiting for another state.
        """
        deadline = time.monotonic() + timeout
        current = ""
        while time.monotonic() < deadline:
            current = self.show(unit, "ActiveState")["ActiveState"]
            if current == state:
                return
            if current == "failed":
                break
            time.sleep(0.1)
        status = self.systemctl("status", "--no-pager", "--lines=0", unit, check=False).stdout
        raise AssertionError(
            f"{unit} is {current!r}, wanted {state!r} (waited up to {timeout:.0f} s)\n"
            f"{status}\n--- journal\n{self.journal(unit)[-3000:]}")

    # journal ------------------------------------------------------------------------

    def cursor(self) -> str:
        """The journal's current end: pass it to journal()/wait_journal() as since_cursor."""
        out = self.run(["journalctl", "--lines=1", "--output=json", "--no-pager"]).stdout
        return str(json.loads(out)["__CURSOR"]) if out.strip() else ""

    def journal(self, unit: str, *, since_cursor: str | None = None) -> str:
        """The messages of ``unit`` (journalctl -u UNIT -o cat), optionally only after a cursor."""
        argv = ["journalctl", "--unit", unit, "--output=cat", "--no-pager", "--quiet"]
        if since_cursor:
            argv.append(f"--after-cursor={since_cursor}")
        return self.run(argv).stdout

    def wait_journal(self, unit: str, text: str, *, timeout: float = 30.0,
                     since_cursor: str | None = None) -> str:
        """Wait until ``text`` is in ``unit``'s journal (it arrives asynchronously); return it."""
        deadline = time.monotonic() + timeout
        while True:
            log = self.journal(unit, since_cursor=since_cursor)
            if text in log:
                return log
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not in the journal of {unit} after "
                                     f"{timeout:.0f} s:\n{log[-3000:]}")
            time.sleep(0.1)

    # files --------------------------------------------------------------------------

    def host_path(self, path: str, *, follow_last: bool = True) -> Path:
        """Where ``path`` of the container is on the host (under /proc/<pid1>/root).

        Symlinks are resolved inside the container: an absolute link (/var/run
        -> /run) would otherwise point into the host's own file system.
        """
        if not path.startswith("/"):
            raise ValueError(f"container paths are absolute: {path!r}")
        if self.leader <= 0:
            raise HarnessError(f"container {self.name} is not running")
        top = Path(f"/proc/{self.leader}/root")
        todo = [c for c in path.split("/") if c]
        done: list[str] = []
        hops = 0
        while todo:
            part = todo.pop(0)
            if part == ".":
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            here = top.joinpath(*done, part)
            if here.is_symlink() and (todo or follow_last):
                hops += 1
                if hops > 40:
                    raise OSError(f"too many symlinks in {path!r}")
                target = os.readlink(here)
                if target.startswith("/"):
                    done = []
                todo = [c for c in target.split("/") if c] + todo
                continue
            done.append(part)
        return top.joinpath(*done)

    def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Write a file inside the container (parents created), atomically."""
        dest = self.host_path(path, follow_last=False)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.harness-{secrets.token_hex(4)}")
        try:
            if isinstance(data, str):
                tmp.write_text(data)
            else:
                tmp.write_bytes(data)
            os.chmod(tmp, mode)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def read_file(self, path: str) -> str:
        return self.host_path(path).read_text()
