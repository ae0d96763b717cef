"""lokid.unit.supervisor: nothing of the engine's process group outlives it (real processes)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from support.enginekit import alive, free_port

from lokid.unit import supervisor


def launch(script: str, port: int) -> supervisor.Launch:
    return supervisor.Launch(["/bin/sh", "-c", script], {}, "127.0.0.1", port, "stand-in")


def test_what_an_engine_leaves_behind_when_it_exits_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # a child that would outlive its parent: it ignores SIGTERM, and nothing waits for it
    script = f"(trap '' TERM; exec sleep 300) & echo $! > {pidfile}; exit 3"
    logged: list[str] = []
    rc = supervisor.supervise(launch(script, free_port()), log=logged.append)
    child = int(pidfile.read_text())
    assert rc == 3
    assert not alive(child), logged
    assert any("left 1 process(es) of its group behind" in m and str(child) in m
               for m in logged), logged


HEALTHY = """
import http.server, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a stubborn engine behind the wrapper
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_stop_reaches_the_whole_group_and_kills_what_ignores_it(tmp_path: Path) -> None:
    import os
    import threading

    port = free_port()
    server = tmp_path / "server.py"
    server.write_text(HEALTHY)
    pidfile = tmp_path / "server.pid"
    # the wrapper runs the engine as its child (no exec) and dies on SIGTERM itself
    script = f'"{sys.executable}" {server} {port} & echo $! > {pidfile}; wait'
    logged: list[str] = []

    def on_ready(url: str) -> None:
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()

    started = time.monotonic()
    rc = supervisor.supervise(launch(script, port), log=logged.append, on_ready=on_ready)
    assert rc == 0, logged  # the wrapper died of our SIGTERM: a clean stop
    assert not alive(int(pidfile.read_text())), logged
    assert not any("sending it again" in m for m in logged), logged   # the first did it
    assert time.monotonic() - started < 30, logged


def test_a_failing_on_ready_never_stops_a_healthy_engine(tmp_path: Path) -> None:
    """What the caller does at READY (clear a token in a state DB on a full disk) may fail
    with any error: one logged line, and the engine keeps serving until it is stopped."""
    import os
    import sqlite3
    import threading

    from lokid.planning.endpoint import health_status

    port = free_port()
    server = tmp_path / "server.py"
    server.write_text(HEALTHY)
    script = f'"{sys.executable}" {server} {port} & wait'
    logged: list[str] = []
    answered: list[int | None] = []

    def later() -> None:
        answered.append(health_status("127.0.0.1", port, timeout=2))
        os.kill(os.getpid(), signal.SIGTERM)

    def on_ready(url: str) -> None:
        threading.Timer(1.0, later).start()
        raise sqlite3.OperationalError("database or disk is full")

    rc = supervisor.supervise(launch(script, port), log=logged.append, on_ready=on_ready)
    assert answered == [200], logged  # still serving a second after the failure
    assert rc == 0, logged            # and ended by the stop, not by the error
    assert any("OperationalError: database or disk is full" in m for m in logged), logged


def test_a_pause_ends_at_the_engines_exit_or_at_a_signal_not_at_its_timeout() -> None:
    """The supervisor's pauses (its stop path, issue 31's swaps) end when the engine
    exits or a signal (a stop's SIGTERM) arrives: 30 s pauses that each end well before
    their time."""
    import os
    import subprocess
    import threading

    got: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda signum, _frame: got.append(signum))
    child = subprocess.Popen(["sleep", "0.3"])
    waker = supervisor._Waker(child.pid)
    try:
        t = time.monotonic()
        waker.wait(30)                  # the child's exit
        exited = time.monotonic() - t
        assert child.wait(5) == 0
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        waker.close()                   # an exited child's pidfd stays readable: a new one
        waker = supervisor._Waker(os.getpid())   # this process: it does not exit
        t = time.monotonic()
        waker.wait(30)                  # the signal
        signalled = time.monotonic() - t
        timer.join()
    finally:
        waker.close()
        signal.signal(signal.SIGUSR1, old)
    assert exited < 15 and signalled < 15, (exited, signalled)
    assert got == [signal.SIGUSR1]
    assert signal.set_wakeup_fd(-1) == -1   # what was there before is back (none)


class Told:
    """What the supervisor tells systemd, in order (its notifier's interface)."""
    enabled = True
    watchdog_interval = None

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def send(self, *fields: str) -> None:
        self.events.append(fields[0])


def test_the_callers_work_while_loading_never_delays_a_ready_engines_ready(
        tmp_path: Path) -> None:
    """``while_loading`` (the step's imports, the plan's log line) runs once the engine has
    loaded for WORK_AFTER seconds; an engine that answers sooner gets READY=1 first (a small
    model answered in ~20 ms, and the work done before the first probe delayed it), and one
    that exits before it answers still gets it done (the plan's line is in its journal)."""
    import os
    import subprocess
    import threading

    def run(script: str, port: int) -> tuple[int, list[str]]:
        events: list[str] = []

        def on_ready(url: str) -> None:
            events.append("on_ready")
            threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()

        rc = supervisor.supervise(launch(script, port), log=lambda m: events.append(m),
                                  notifier=Told(events), on_ready=on_ready,  # type: ignore[arg-type]
                                  on_spawned=lambda: events.append("spawned"),
                                  while_loading=lambda: events.append("work"))
        return rc, events

    def at(events: list[str], what: str) -> int:
        return next(i for i, e in enumerate(events) if e.startswith(what))

    server = tmp_path / "server.py"   # one that a SIGTERM ends (there is no systemd here
    server.write_text(HEALTHY.replace(  # to kill one that does not: the notifier is on)
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)", ""))
    # answering at once: an engine whose port already answers (the first probe's 200)
    port = free_port()
    up = subprocess.Popen([sys.executable, str(server), str(port)])
    try:
        while True:
            from lokid.planning.endpoint import health_status

            if health_status("127.0.0.1", port, timeout=1) == 200:
                break
            time.sleep(0.01)
        rc, events = run("exec sleep 30", port)
    finally:
        up.kill()
        up.wait()
    assert rc == 0, events
    assert at(events, "spawned") < at(events, "READY=1") < at(events, "work") \
        < at(events, "on_ready"), events
    assert events.count("work") == 1, events

    # loading for a while: the work is done meanwhile, before READY=1
    port = free_port()
    rc, events = run(f'sleep 0.4; exec "{sys.executable}" {server} {port}', port)
    assert rc == 0, events
    assert at(events, "spawned") < at(events, "work") < at(events, "READY=1"), events
    assert events.count("work") == 1, events

    # exiting before it ever answered: the work done all the same, before the exit's line
    rc, events = run("exit 3", free_port())
    assert rc == 3, events
    assert events.count("work") == 1 and at(events, "work") < at(events, "the engine exited"), \
        events
