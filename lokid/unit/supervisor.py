"""The engine supervisor: llama-server as a child, its readiness told to systemd.

Used by ``lokid engine`` (ExecStart of ``loki-engine@.service``) and by
``lokid run``. It starts llama-server with the plan's argv and environment,
its stdout/stderr inherited (under systemd: straight into the journal, never
through a Python pipe a stalled reader could block), then:

- while loading: ``STATUS=loading …`` with the elapsed time and the resident
  memory, ``EXTEND_TIMEOUT_USEC=`` while the process makes progress (CPU
  time, memory or I/O moving), and ``WATCHDOG=1`` while it is alive;
- once ``/health`` answers 200: ``READY=1`` and ``STATUS=ready: …``, then
  ``WATCHDOG=1`` only while ``/health`` keeps answering, so a hung engine is
  restarted by systemd's watchdog; the caller's ``on_ready`` runs then, and its
  failure is one logged line, never a reason to stop the healthy engine;
- while it serves, the caller's ``told`` is asked at each /health poll until it answers
  (the daemon's note that the engine runs on the CPU, :mod:`lokid.unit.oncpu`): its line
  joins the ready STATUS=, or, with an exit status, the engine is stopped and the start
  ends with that status and the line as STATUS=. Only this process may send STATUS=
  (``NotifyAccess=main``) and it never reads the engine's lines; a fault of ``told`` is
  one logged line, and it is not asked again;
- on SIGTERM/SIGINT: ``STOPPING=1``, SIGTERM to the engine, a second one
  :data:`STOP_RESEND` seconds later if it still runs (SIGKILL after a grace period
  outside systemd), and return the engine's status (0 when our SIGTERM
  killed it: a stop while loading is still a clean stop). A stop cuts the requests
  in flight; letting them end first is an unload's work (``lokictl unload``,
  :mod:`lokid.dbus.unload`, bounded by the preset's ``serve.drain``). llama-server
  b11434 ends its task loop at the first SIGTERM and then waits for its HTTP threads,
  which wait for results that no longer come: a busy engine stops generating and
  hangs, its clients' streams stalled, until the second SIGTERM ("terminating
  immediately"). That second signal came after 10 s: every stop of a busy engine
  waited 10 s and then cut anyway (issue 45, item 12); an idle engine exits at the
  first in milliseconds, so the second now follows after :data:`STOP_RESEND`. At a shutdown, a ready
  engine gets its SIGTERM once the gateway is gone, so the requests the gateway
  lets end run on it (:mod:`lokid.core.launch.drainmark`);
- if the engine dies on its own, report it (``unexpected_exit_fails``: as a
  failure even with status 0, so that ``Restart=on-failure`` applies); one that
  exits with a status before it was ready is asked ``refused`` (the caller's:
  whether it refused its own command line, :mod:`lokid.unit.argcheck`), and a
  refusal ends the start with the caller's status and line as STATUS=.

The engine runs in a process group of its own, and every signal goes to the
whole group: an ``engine`` that is a wrapper script running llama-server as
its child (no ``exec``) would otherwise lose only the wrapper, and the real
engine would keep serving on the port. Once the engine's main process has
exited, whatever is left of its group is killed (SIGKILL), and the supervisor
returns only when it is gone, so that nothing outlives ``lokid run`` or
``lokid engine``: systemd's ``KillMode=mixed``, for one process group.

Outside systemd (``NOTIFY_SOCKET`` unset) the notifications are no-ops
(:mod:`lokid.host.notify`). The ``/health`` probe is
:func:`lokid.planning.endpoint.health_status`; the /proc readers (progress,
resident memory, PR_SET_PDEATHSIG) are :mod:`lokid.host.proc`.
"""

from __future__ import annotations

import os
import signal
import time

from ..core.address import engine_url
from ..core.errors import EngineError
from ..core.launch import drainmark
from ..host.notify import Notifier
from ..host.proc import die_with_parent, group_members, progress_counters, resident_kib
from ..host.spawn import spawn as spawn_plain
from ..planning.endpoint import health_status

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from .oncpu import Told

# socket and ctypes are imported where used: the engine is spawned first, and
# what loads while it loads costs no readiness time.

POLL_LOADING = 0.002     # /health polls while loading (a refused connect costs ~0.1 ms)
POLL_FIRST = 0.001       # ... within the load's first FIRST_FOR seconds: a small model is
FIRST_FOR = 0.25         # ready in ~20 ms, and each poll's lag is on a cold start's path
POLL_READY = 1.0         # /health polls once ready (STATUS and watchdog)
WORK_AFTER = 0.05        # seconds of loading before the caller's while_loading runs
STATUS_EVERY = 2.0       # STATUS= refresh while loading
EXTEND_EVERY = 10.0      # EXTEND_TIMEOUT_USEC= cadence while loading progresses
EXTEND_BY = 30.0         # seconds granted per extension
STOP_GRACE = 30.0        # SIGTERM → SIGKILL when running outside systemd
STOP_RESEND = 1.0        # the second SIGTERM: a stop cuts (see _loop)
LEFTOVER_WAIT = 5.0      # how long the engine's group may take to die after SIGKILL
# Set by lokid's local runner for ``lokid engine``: the daemon's pid. The runner gives a
# notify socket but is no service manager: nothing else would take the engine down with
# its supervisor (so it gets PR_SET_PDEATHSIG here), nor the step down with the daemon
# (so the step sets its own: SIGTERM, which lets it stop its engine cleanly; spawned
# without a preexec_fn, the daemon's fork is a vfork, 2.5 ms less a start).
PARENT_PID = "LOKI_PARENT_PID"


def _resident(pid: int) -> str:
    kib = resident_kib(pid)
    if kib is None:
        return ""
    return f", {kib / 2**20:.1f} GiB resident" if kib >= 2**20 else \
        f", {kib / 1024:.0f} MiB resident"


class Launch:
    """What to supervise: a plan's argv, environment, address, and a label (for STATUS=).

    ``socket``: the UNIX socket the engine listens on where systemd holds host:port
    (an on-demand preset's port unit): /health is asked there; host:port stay the
    address clients use, which STATUS= shows."""

    __slots__ = ("argv", "env", "host", "port", "label", "socket", "preset")

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], host: str, port: int,
                 label: str, socket: str = "", preset: str = ""):
        self.argv = tuple(argv)
        self.env = dict(env)
        self.host = host
        self.port = port
        self.label = label
        self.socket = socket
        self.preset = preset   # "" outside a preset's unit (no drain to wait for)

    @classmethod
    def of(cls, preset: str, argv: Sequence[str], env: Mapping[str, str], host: str,
           port: int, socket: str = "") -> Launch:
        """A launch labelled with the preset and its model file's name."""
        model = argv[list(argv).index("-m") + 1] if "-m" in argv else ""
        label = f"{preset} ({model.rsplit('/', 1)[-1]})" if model else preset
        return cls(argv=tuple(argv), env=dict(env), host=host, port=port, label=label,
                   socket=socket, preset=preset)


def supervise(launch: Launch, *, log: Callable[[str], None],
              notifier: Notifier | None = None,
              on_ready: Callable[[str], None] | None = None,
              on_spawned: Callable[[], None] | None = None,
              while_loading: Callable[[], None] | None = None,
              unexpected_exit_fails: bool = False,
              refused: Callable[[], tuple[int, str] | None] | None = None,
              spawn: Callable[[list[str], dict[str, str]], Any] | None = None,
              told: Callable[[], Told | None] | None = None) -> int:
    """Run the engine until it exits or we are told to stop; return the exit status.

    The engine is spawned before anything else is set up; ``notifier`` None
    means one from this process's environment, made once the engine runs;
    ``on_spawned`` runs then too (what must follow the spawn at once); ``while_loading``
    (what the caller can do while the engine loads: imports, a log line) once the engine
    did not answer for :data:`WORK_AFTER` seconds, else at READY, after READY=1 (a small
    model answers in ~20 ms: work done before the first probes delayed its READY by as
    much as it took), or at the engine's exit before it answered.
    ``spawn``: how the engine is started, given its command line and environment (the
    local runner's spare step: a child forked ahead, :class:`lokid.unit.standby.Launcher`);
    by default its own process group: ``subprocess`` with PR_SET_PDEATHSIG outside
    systemd, ``posix_spawn`` under it (:mod:`lokid.host.spawn`).
    """
    stop: list[int] = []

    def request_stop(signum: int, _frame: object) -> None:
        stop.append(signum)

    old = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        # Under systemd, KillMode= takes the engine down with us; elsewhere
        # (lokid run, the daemon's local runner) PR_SET_PDEATHSIG does. The engine
        # has its own process group (Ctrl-C reaches the supervisor only, which stops
        # it once). SIGKILL: the supervisor only dies before its engine when it was
        # killed itself (a stop past its timeout), and an engine may not act on
        # SIGTERM (b11434 misses one sent just after it first answers /health, see
        # _loop): nothing else would take it down. PR_SET_PDEATHSIG reaches the
        # direct child only: a wrapper script's own children outlive a supervisor
        # killed with SIGKILL (under systemd, the cgroup does not let them).
        # (a ``spawn`` given sets up its child so itself: the local runner's spare step)
        try:
            if spawn is not None:
                proc = spawn(list(launch.argv), {**os.environ, **launch.env})
            elif "NOTIFY_SOCKET" not in os.environ or os.environ.get(PARENT_PID):
                import subprocess

                proc = subprocess.Popen(list(launch.argv), env={**os.environ, **launch.env},
                                        stdin=subprocess.DEVNULL, process_group=0,
                                        preexec_fn=die_with_parent(signal.SIGKILL))
            else:   # systemd's unit: nothing to run in the child (lokid.host.spawn)
                proc = spawn_plain(launch.argv, {**os.environ, **launch.env})
        except OSError as e:
            raise EngineError(f"cannot start {launch.argv[0]}: {e.strerror}") from None
        waker = _Waker(proc.pid)
        try:
            if on_spawned is not None:
                on_spawned()
            return _loop(proc, launch, notifier or Notifier(), log, on_ready, stop,
                         unexpected_exit_fails, refused, waker.wait, while_loading, told)
        finally:
            waker.close()
            _end_group(proc, log)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


class _Waker:
    """The supervisor's pauses, ended at once by what it waits for: a signal to this
    process (SIGTERM: a stop; through :func:`signal.set_wakeup_fd`) or the engine's exit
    (its pidfd turns readable). A stop and its end are seen when they happen, not at the
    next poll: a swap waits on both. Where either cannot be had (not the main thread, no
    pidfd), the pause is a plain sleep for that part."""

    def __init__(self, pid: int):
        self.old: int | None = None
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self.old = signal.set_wakeup_fd(self.w, warn_on_full_buffer=False)
        except ValueError:   # not the main thread: signals are seen at the next poll
            pass
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):   # Linux before 5.3: its exit at the next poll
            self.pidfd = -1

    def wait(self, seconds: float) -> None:
        import select

        fds = [fd for fd in (self.r, self.pidfd) if fd >= 0]
        ready, _, _ = select.select(fds, [], [], max(0.0, seconds))
        if self.r in ready:
            try:
                while os.read(self.r, 512):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        if self.old is not None:
            signal.set_wakeup_fd(self.old)
        for fd in (self.r, self.w, self.pidfd):
            if fd >= 0:
                os.close(fd)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """``sig`` to the engine's process group (its pid: ``process_group=0``)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass                            # the whole group is gone already
    except PermissionError:
        proc.send_signal(sig)           # members we may not signal (setuid): ours at least


def _end_group(proc: subprocess.Popen[bytes], log: Callable[[str], None]) -> None:
    """Kill what is left of the engine's process group once its main process has exited
    (or, on the way out of an error, the main process too), and wait until it is gone.

    The group's id stays the main process's pid while any member lives (Linux does
    not reuse a pid still in use as a process group id), so the SIGKILL cannot reach
    an unrelated process.
    """
    if proc.poll() is None:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
    left = group_members(proc.pid)
    if not left:
        return
    log(f"the engine exited and left {len(left)} process(es) of its group behind "
        f"(pid {', '.join(map(str, left))}): killing them")
    _signal_group(proc, signal.SIGKILL)
    deadline = time.monotonic() + LEFTOVER_WAIT
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def gateway_up(path: str = drainmark.GATEWAY_RUNTIME_DIR) -> bool:
    """Whether loki-gateway.service runs (its runtime directory exists)."""
    return os.path.isdir(path)


def system_state() -> str:
    """``systemctl is-system-running``'s word; "" when it cannot be read. Asked only for
    the stop of a ready engine while the gateway runs (a few ms of systemctl)."""
    import subprocess

    try:
        r = subprocess.run(["systemctl", "is-system-running"], capture_output=True,
                           text=True, timeout=2, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return r.stdout.strip()


def _ask(told: Callable[[], Told | None],
         log: Callable[[str], None]) -> tuple[Told | None, Callable[[], Told | None] | None]:
    """``told``'s answer, and ``told`` again while it has not answered (None once it has,
    or once it failed: a fault of ours is one line, never a traceback nor a stop)."""
    try:
        said = told()
    except Exception as e:
        log(f"what the daemon says of this start could not be read: {type(e).__name__}: {e}")
        return None, None
    return said, (told if said is None else None)


def _loop(proc: subprocess.Popen[bytes], launch: Launch, notifier: Notifier,
          log: Callable[[str], None], on_ready: Callable[[str], None] | None,
          stop: list[int], unexpected_exit_fails: bool,
          refused: Callable[[], tuple[int, str] | None] | None = None,
          pause: Callable[[float], None] = time.sleep,
          while_loading: Callable[[], None] | None = None,
          told: Callable[[], Told | None] | None = None) -> int:
    started = time.monotonic()
    pending = while_loading   # not run yet
    url = engine_url(launch.host, launch.port)
    ready = False
    stopping_since: float | None = None
    held_since: float | None = None   # the stop waits for the gateway's drain since
    asked_system = False   # whether the system's state was read for this stop
    resent = False
    next_status = started
    next_extend = started + EXTEND_EVERY
    last_progress = progress_counters(proc.pid)
    next_check = started
    watchdog_every = (notifier.watchdog_interval or 0) / 3 or None
    next_watchdog = started
    answering = True
    ready_line = ""     # STATUS= while it serves and answers
    ruled: Told | None = None   # what ``told`` said, with an exit status: the start ends
    notifier.send(f"STATUS=starting {launch.label}")
    share: Callable[[str], str] | None = None   # the socket's giver, loaded while it loads
    if launch.socket:
        from ..host.sockshare import share_with_gateway as share

    while True:
        rc = proc.poll()
        if rc is not None:
            break
        now = time.monotonic()
        if stop and stopping_since is None and held_since is None and not asked_system \
                and ready and launch.preset:
            asked_system = True
            up = gateway_up()
            if drainmark.waits_for_gateway(up, system_state() if up else ""):
                held_since = now
                notifier.send("STOPPING=1", "STATUS=stopping once the gateway has let its "
                              "requests end (the system is shutting down)")
                log("the system is shutting down: stopping the engine once the gateway "
                    "has let its requests end")
        if held_since is not None and stopping_since is None and (
                now - held_since >= drainmark.WAIT or not gateway_up()):
            held_since = None
        if stop and stopping_since is None and held_since is None:
            notifier.send("STOPPING=1", "STATUS=stopping")
            log("stopping the engine")
            _signal_group(proc, signal.SIGTERM)
            stopping_since = now
        if stopping_since is not None:
            if now - stopping_since > STOP_RESEND and not resent:
                # A busy llama-server b11434 hangs after the first SIGTERM (its task
                # loop ended, its HTTP threads wait for results that never come; see the
                # docstring); and it answers /health before it installs its signal
                # handler, so a SIGTERM in between is lost and the engine runs on. Its
                # answer to a second signal is an immediate exit: the stop's cut.
                log(f"the engine is still running {STOP_RESEND:.0f} s after SIGTERM "
                    "(requests in flight, or a signal it missed): sending it again")
                _signal_group(proc, signal.SIGTERM)
                resent = True
            if now - stopping_since > STOP_GRACE and not notifier.enabled:
                log(f"the engine ignored SIGTERM for {STOP_GRACE:.0f} s: killing it")
                _signal_group(proc, signal.SIGKILL)
            pause(0.05)   # the engine's exit ends it
            continue

        if not ready:
            if health_status(launch.host, launch.port, 1.0, launch.socket) == 200:
                ready = True
                took = now - started
                if share is not None:   # before READY: the gateway connects there at once
                    why = share(launch.socket)
                    if why:
                        log(f"the gateway reaches this engine through its port: its socket "
                            f"could not be given to the gateway's group ({why})")
                ready_line = f"ready: {launch.label} at {url} (loaded in {took:.1f} s)"
                notifier.send("READY=1", f"STATUS={ready_line}")
                if pending is not None:
                    work, pending = pending, None
                    work()
                log(f"ready at {url}")
                if watchdog_every:
                    notifier.send("WATCHDOG=1")
                    next_watchdog = now + watchdog_every
                if on_ready is not None:
                    try:
                        on_ready(url)
                    except Exception as e:  # never a reason to stop a healthy engine
                        log(f"ready, but what follows READY failed: {type(e).__name__}: {e}")
                next_check = now + min(POLL_READY, watchdog_every or POLL_READY)
                continue
            if pending is not None and now - started >= WORK_AFTER:
                work, pending = pending, None
                work()
                continue   # it took a while: probe again at once
            if now >= next_status:
                notifier.send(f"STATUS=loading {launch.label}: {now - started:.0f} s"
                              f"{_resident(proc.pid)}")
                next_status = now + STATUS_EVERY
            if now >= next_extend:
                progress = progress_counters(proc.pid)
                if progress != last_progress:
                    notifier.send(f"EXTEND_TIMEOUT_USEC={int(EXTEND_BY * 1e6)}")
                last_progress = progress
                next_extend = now + EXTEND_EVERY
            if watchdog_every and now >= next_watchdog:
                notifier.send("WATCHDOG=1")  # alive and loading: the start timeout judges
                next_watchdog = now + watchdog_every
            pause(POLL_FIRST if now - started < FIRST_FOR else POLL_LOADING)
            continue

        if now >= next_check:
            ok = health_status(launch.host, launch.port, 2.0, launch.socket) == 200
            if ok and watchdog_every and now >= next_watchdog:
                notifier.send("WATCHDOG=1")
                next_watchdog = now + watchdog_every
            if ok and told is not None:
                said, told = _ask(told, log)
                if said is not None and said.status:
                    ruled = said
                    notifier.send("STOPPING=1", f"STATUS={said.line}")
                    _signal_group(proc, signal.SIGTERM)
                    stopping_since = now
                    continue
                if said is not None:
                    ready_line = f"{ready_line} — {said.line}"
                    notifier.send(f"STATUS={ready_line}")
            if ok != answering:
                answering = ok
                if ok:
                    notifier.send(f"STATUS={ready_line}")
                    log("the engine answers /health again")
                else:
                    notifier.send(f"STATUS=not answering /health: {launch.label} at {url}")
                    log("the engine stopped answering /health")
            next_check = now + min(POLL_READY, watchdog_every or POLL_READY)
        pause(0.05)   # a stop's SIGTERM ends it

    if pending is not None:   # the engine ended before it answered: its plan is still said
        pending()
    if ruled is not None:   # stopped as told: the line stays the unit's word
        notifier.send(f"STATUS={ruled.line}")
        return ruled.status
    if stopping_since is not None and (rc == -signal.SIGTERM or (resent and rc == 1)):
        # The stop we asked for. llama-server installs its SIGTERM handler only once
        # the model is loaded, so a stop while loading kills it with our signal, and
        # after a resent SIGTERM it exits 1 at once ("terminating immediately");
        # either status would make systemd mark the unit failed after `systemctl stop`.
        return 0
    if rc < 0:
        rc = 128 - rc
    if stopping_since is not None:
        return rc
    log(f"the engine exited with status {rc}" + ("" if ready else " before it was ready"))
    if not ready and 0 < rc < 128 and refused is not None:
        refusal = refused()
        if refusal is not None:
            notifier.send(f"STATUS={refusal[1]}")
            return refusal[0]
    if unexpected_exit_fails and rc == 0:
        return 1
    return rc
