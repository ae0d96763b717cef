"""``loki-engine@<preset>.service`` end to end under a real systemd 252 (Debian 12).

lokid is installed in the session's container as its Debian package will be
(tests/support/lokid_install.py): the unit file and the generator unmodified, the
``loki`` user, /etc/loki. The engine is the real llama-server b11434; where a
test needs an engine that misbehaves, a shell wrapper around it in
/usr/local/bin plays that engine, and only that test uses it. Timings that
would make a test slow (RestartSec=, TimeoutStartSec=, WatchdogSec=) are
shortened by a test-only drop-in, the way an administrator would.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.lokid_install import GENERATED_DIR, STATE_DB, LokidSystem, install, unit
from support.systemd_harness import Container

from lokid.store.state import NEVER_ANSWERED

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

LLAMA = "llama.gguf"
MTP = "glm4moe-mtp-full.gguf"
AUTO = '[spec]\nmode = "auto"\n'

# An engine that takes 3 s before it even listens (a big model loading); it answers
# --help and --version at once, so lokid probes it like the real one.
SLOW_ENGINE = """\
for arg in "$@"; do
    case "$arg" in --help|--version) exec "$ENGINE" "$@" ;; esac
done
sleep 3
exec "$ENGINE" "$@"
"""

_durations: dict[str, float] = {}
_notes: list[str] = []


def _say(config: pytest.Config, message: str) -> None:
    """A line on the terminal even under pytest's capture: the timings belong in CI logs."""
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\ntest_unit_systemd: {message}", file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def lokid_system(systemd_container: Container, container_engine: str, models: Any,
                 pytestconfig: pytest.Config) -> Iterator[LokidSystem]:
    t0 = time.monotonic()
    system = install(systemd_container, container_engine, [models.llama, models.mtp_full])
    installed = time.monotonic() - t0
    yield system
    total = time.monotonic() - t0
    per_test = ", ".join(f"{k} {v:.1f} s" for k, v in _durations.items())
    _say(pytestconfig, f"module took {total:.1f} s (install {installed:.1f} s; {per_test})"
         + "".join(f"; {note}" for note in _notes))


@pytest.fixture
def lk(lokid_system: LokidSystem, request: pytest.FixtureRequest) -> Iterator[LokidSystem]:
    """lokid in the container; what the test adds is stopped and removed afterwards."""
    t0 = time.monotonic()
    try:
        yield lokid_system
    finally:
        lokid_system.cleanup()
        _durations[request.node.name.removeprefix("test_")] = time.monotonic() - t0


def test_a_preset_runs_as_a_notify_unit(lk: LokidSystem) -> None:
    ct = lk.ct
    name = "tiny-llama.v1_a"   # "-", "." and "_": %i must pass it through verbatim
    port = lk.preset(name, f'model = "{LLAMA}"\n')
    ct.systemctl("start", unit(name))
    # Type=notify: start returns once READY=1 arrived, i.e. once /health answered.
    assert lk.show(name, "ActiveState")["ActiveState"] == "active"
    assert lk.health(port) == 200
    props = lk.show(name, "StatusText", "Description", "TimeoutStartUSec", "MainPID")
    assert props["StatusText"].startswith(f"ready: {name} ({LLAMA}) at http://127.0.0.1:{port}")
    # The generator's drop-in: the model in the Description, the start timeout.
    assert props["Description"] == f"lokid engine {name}: {LLAMA}"
    assert props["TimeoutStartUSec"] == "2min"
    cat = ct.systemctl("cat", unit(name)).stdout
    assert f"# {GENERATED_DIR}/{unit(name)}.d/50-lokid-preset.conf" in cat
    assert f"Description=lokid engine {name}: {LLAMA}" in cat
    assert "TimeoutStartSec=120" in cat
    # The engine's own output and lokid's plan line, both in the unit's journal.
    log = ct.wait_journal(unit(name), "llama_server: listening on")
    log = ct.wait_journal(unit(name), f"plan: {lk.engine} -m /var/lib/loki-models/{LLAMA}")
    assert f"--port {port}" in log
    # ... told apart by identifier: the engine's lines are llama-server's, the plan lokid's.
    by_id = {ident: ct.run(["journalctl", "-u", unit(name), f"SYSLOG_IDENTIFIER={ident}",
                            "-o", "cat", "--no-pager"]).stdout for ident in ("llama-server",
                                                                              "lokid")}
    assert "llama_server: listening on" in by_id["llama-server"]
    assert "plan: " not in by_id["llama-server"] and "plan: " in by_id["lokid"]
    # Everything runs as loki: the supervisor (MainPID) and the engine.
    procs = lk.processes(name)
    assert {comm for _, _, comm in procs} == {"python3", "llama-server"}, procs
    assert {user for _, user, _ in procs} == {"loki"}, procs
    assert int(props["MainPID"]) in [pid for pid, _, comm in procs if comm == "python3"]
    owner = ct.run(["stat", "-c", "%U:%G %a", STATE_DB, "/var/lib/loki"]).stdout.split("\n")
    assert owner[0].startswith("loki:loki ") and owner[1] == "loki:loki 750", owner


def test_active_exactly_when_the_engine_answers(lk: LokidSystem) -> None:
    ct = lk.ct
    name = "slow"
    slow = lk.engine_wrapper("slow-llama-server", SLOW_ENGINE)
    lk.set_engine(slow)
    port = lk.preset(name, f'model = "{LLAMA}"\n')
    t0 = time.monotonic()
    ct.systemctl("start", "--no-block", unit(name))
    samples: list[tuple[str, str, int]] = []   # (SubState, StatusText, /health)
    while True:
        before = lk.show(name, "ActiveState", "SubState", "StatusText")
        if before["ActiveState"] != "activating":
            break
        code = lk.health(port)
        after = lk.show(name, "ActiveState")["ActiveState"]
        if after == "activating":
            # Activating both before and after the request: it did not answer 200,
            # or the unit lags behind the engine.
            assert code != 200, (before, samples)
            samples.append((before["SubState"], before["StatusText"], code))
        assert time.monotonic() - t0 < 60, samples
        time.sleep(0.1)
    assert before["ActiveState"] == "active", (before, ct.journal(unit(name))[-3000:])
    assert lk.health(port) == 200
    loading = [s for s in samples if s[0] == "start" and s[1].startswith("loading ")]
    assert len(loading) >= 3, samples
    assert loading[0][1].startswith(f"loading {name} ({LLAMA}): ")
    assert not [s for s in samples if s[1].startswith("ready")], samples
    status = lk.show(name, "StatusText")["StatusText"]
    assert status.startswith(f"ready: {name} ({LLAMA})")
    loaded_in = float(status.rsplit("loaded in ", 1)[1].split()[0])
    assert loaded_in >= 2.9, status


def test_stop_while_loading_is_a_clean_stop(lk: LokidSystem) -> None:
    ct = lk.ct
    name = "stop-loading"
    # llama-server installs its SIGTERM handler only once the model is loaded
    # (b11434, tools/server/server.cpp): until then SIGTERM kills it outright.
    # This wrapper dies the same way while it "loads": the shell waiting for sleep
    # has no SIGTERM handler either.
    lk.set_engine(lk.engine_wrapper("slow-llama-server", SLOW_ENGINE))
    port = lk.preset(name, f'model = "{LLAMA}"\n')
    ct.systemctl("start", "--no-block", unit(name))
    deadline = time.monotonic() + 30
    while not lk.show(name, "StatusText")["StatusText"].startswith("loading "):
        assert time.monotonic() < deadline, lk.journal(name)[-3000:]
        time.sleep(0.05)
    ct.systemctl("stop", unit(name))
    # An administrator's stop is not a failure, whatever the engine was doing.
    props = lk.show(name, "ActiveState", "Result")
    assert props == {"ActiveState": "inactive", "Result": "success"}, \
        (props, lk.journal(name)[-3000:])
    assert lk.processes(name) == []
    assert lk.health(port) == 0


def test_a_stop_while_loading_leaves_automatic_speculation_allowed(lk: LokidSystem) -> None:
    """The operator's stop (systemctl stop, lokictl stop, apt remove, shutdown: all a clean
    stop to systemd) is not the launch failing; a timeout is (test_attempt_token_under_systemd)."""
    ct = lk.ct
    name = "stop-auto"
    lk.set_engine(lk.engine_wrapper("slow-llama-server", SLOW_ENGINE))
    port = lk.preset(name, f'model = "{MTP}"\n{AUTO}')
    for _ in range(2):  # twice: a second stop while loading must not count either
        ct.systemctl("start", "--no-block", unit(name))
        deadline = time.monotonic() + 30
        while not lk.show(name, "StatusText")["StatusText"].startswith("loading "):
            assert time.monotonic() < deadline, lk.journal(name)[-3000:]
            time.sleep(0.05)
        assert len(lk.state(name)["attempt"]) == 1   # the automatic launch is under way
        ct.systemctl("stop", unit(name))
        assert lk.show(name, "Result")["Result"] == "success"
        assert lk.state(name) == {"attempt": [], "failed": []}
    ct.wait_journal(unit(name), "stopped while loading: not counted against automatic")
    ct.systemctl("start", unit(name))
    assert lk.health(port) == 200
    assert lk.runtime_plan(name)["spec"]["auto"]


def test_restarts_by_hand_never_trip_the_crash_loop_rule(lk: LokidSystem) -> None:
    """systemd's StartLimitBurst=5 counted these: the sixth restart left the unit failed."""
    ct = lk.ct
    name = "tuning"
    port = lk.preset(name, f'model = "{LLAMA}"\n')
    ct.systemctl("start", unit(name))
    t0 = time.monotonic()
    for n in range(20):
        r = ct.systemctl("restart", unit(name), check=False)
        assert r.returncode == 0, (n, r.stderr, lk.journal(name)[-2000:])
        assert lk.show(name, "ActiveState")["ActiveState"] == "active", n
    assert lk.health(port) == 200
    assert lk.show(name, "NRestarts")["NRestarts"] == "0"
    _notes.append(f"20 restarts by hand in {time.monotonic() - t0:.1f} s")
    # nothing changed and nothing to settle: the planning step of the last one handed the
    # kept plan over (lokid.unit.keptstart), under systemd's own INVOCATION_ID
    handed = json.loads(ct.read_file(f"/run/loki/{name}.prestart"))
    invocation = lk.show(name, "InvocationID")["InvocationID"]
    assert handed == {"invocation": invocation, "kept": True}, handed
    assert lk.runtime_plan(name)["invocation"] == invocation


DIES_AT_START = """\
for arg in "$@"; do
    case "$arg" in --help|--version) exec "$ENGINE" "$@" ;; esac
done
echo "this engine dies at every start" >&2
exit 3
"""


def test_a_crash_loop_stops_after_five_failures_and_says_why(lk: LokidSystem) -> None:
    ct = lk.ct
    name = "crashloop"
    lk.set_engine(lk.engine_wrapper("dying-llama-server", DIES_AT_START))
    lk.preset(name, f'model = "{LLAMA}"\n')
    lk.dropin(name, {"RestartSec": "1"})
    ct.systemctl("start", "--no-block", unit(name))
    deadline = time.monotonic() + 60
    while lk.show(name, "ActiveState")["ActiveState"] != "failed":
        assert time.monotonic() < deadline, lk.journal(name)[-3000:]
        time.sleep(0.2)
    time.sleep(2.5)  # two RestartSec= later: stopped for good
    props = lk.show(name, "ActiveState", "NRestarts", "ExecMainStatus", "StatusText")
    assert props["ActiveState"] == "failed" and props["ExecMainStatus"] == "69", props
    assert props["NRestarts"] == "5", props   # 5 failed starts, the 6th refused
    status = props["StatusText"]
    assert status.startswith("5 failures in 10 min (the last: the engine helper exited with "
                             "status 3 while loading): not restarted again"), status
    assert "`systemctl start loki-engine@crashloop.service`" in status
    log = lk.journal(name)
    assert log.count("counted as a failure") == 5, log[-3000:]
    assert log.count("this engine dies at every start") == 5
    # A start by hand forgets the failures before it: one more try, then the rule again.
    cursor = ct.cursor()
    ct.systemctl("start", "--no-block", unit(name))
    ct.wait_journal(unit(name), "this engine dies at every start", since_cursor=cursor)
    deadline = time.monotonic() + 60
    while lk.show(name, "ExecMainStatus")["ExecMainStatus"] != "69" or \
            lk.show(name, "ActiveState")["ActiveState"] != "failed":
        assert time.monotonic() < deadline, lk.journal(name)[-3000:]
        time.sleep(0.2)
    assert lk.journal(name, since_cursor=cursor).count("this engine dies at every start") == 5


def test_a_killed_engine_is_restarted_and_stop_leaves_nothing(lk: LokidSystem) -> None:
    ct = lk.ct
    name = "kill9"
    port = lk.preset(name, f'model = "{LLAMA}"\n')
    lk.dropin(name, {"RestartSec": "1"})
    ct.systemctl("start", unit(name))
    first = lk.show(name, "MainPID", "NRestarts")
    assert first["NRestarts"] == "0"
    ct.run(["kill", "-KILL", str(lk.engine_pid(name))])
    lk.wait_restarts(name, 1, timeout=30)
    ct.wait_for(unit(name), "active", timeout=30)
    assert lk.show(name, "MainPID")["MainPID"] != first["MainPID"]
    assert lk.health(port) == 200
    ct.wait_journal(unit(name), "the engine exited with status 137")
    ct.systemctl("stop", unit(name))
    assert lk.show(name, "ActiveState")["ActiveState"] == "inactive"
    assert ct.run(["pgrep", "-x", "llama-server"], check=False).returncode == 1
    assert lk.health(port) == 0


# The stop step as systemd 257 (Debian 13) leaves it after `systemctl kill -s KILL` (the
# whole cgroup, by the kernel's cgroup.kill): spawned into the killed cgroup, it dies by
# SIGKILL before its first line (ExecStopPost's code=killed, status=9/KILL). Debian 12's
# systemd 252 runs it, so this container's step is made to die the same way.
STOP_STEP_KILLED = "\nExecStopPost=-/bin/sh -c 'kill -KILL $$$$'"   # "$$$$": sh's $$


def test_a_kill_of_the_whole_unit_counts_though_its_stop_step_dies(lk: LokidSystem) -> None:
    """Six such kills in a row never tripped the crash-loop rule: nothing counted them."""
    ct = lk.ct
    name = "cgkill"
    port = lk.preset(name, f'model = "{LLAMA}"\n')
    lk.dropin(name, {"RestartSec": "1", "ExecStopPost": STOP_STEP_KILLED})
    ct.systemctl("start", unit(name))
    # `lokid engine` marks the start ready just after its READY=1: killed after that
    invocation = lk.show(name, "InvocationID")["InvocationID"]
    deadline = time.monotonic() + 10
    while ct.run(["cat", f"/run/loki/{name}.ready"], check=False).stdout != invocation:
        assert time.monotonic() < deadline, lk.journal(name)[-2000:]
        time.sleep(0.1)
    ct.systemctl("kill", "-s", "KILL", unit(name))
    lk.wait_restarts(name, 1, timeout=30)
    ct.wait_for(unit(name), "active", timeout=30)
    failures = json.loads(ct.read_file(f"/run/loki/{name}.failures"))
    assert [(f["ready"], f["why"]) for f in failures] == [
        (True, "the engine was killed after it was ready, its stop step with it (the unit's "
               "cgroup killed, as `systemctl kill -s KILL` does)")], failures
    log = lk.journal(name)
    assert "restart after a failure (1 of 5 before lokid stops restarting" in log, log[-2000:]
    assert "killed by signal" not in log   # the stop step's own line: it never ran
    assert lk.health(port) == 200
    # The operator's stop (its step killed too) and start by hand count nothing.
    ct.systemctl("stop", unit(name))
    ct.systemctl("start", unit(name))
    assert ct.run(["test", "-e", f"/run/loki/{name}.failures"], check=False).returncode == 1
    ct.run(["rm", "-f", f"/run/loki/{name}.started"])


def test_attempt_token_under_systemd(lk: LokidSystem) -> None:
    ct = lk.ct
    name = "spec-breaks"
    # An engine that speculation breaks: with --spec-type it never listens.
    breaks = lk.engine_wrapper("spec-breaks-llama-server", """\
for arg in "$@"; do
    case "$arg" in --spec-type) exec sleep infinity ;; esac
done
exec "$ENGINE" "$@"
""")
    lk.set_engine(breaks)
    port = lk.preset(name, f'model = "{MTP}"\n{AUTO}')
    lk.dropin(name, {"TimeoutStartSec": "6", "Restart": "no"})

    # 1. automatic MTP, and the engine hangs: the start times out.
    r = ct.systemctl("start", unit(name), check=False)
    assert r.returncode != 0
    plan = lk.runtime_plan(name)
    assert plan["spec"]["auto"] and "--spec-type" in plan["argv"]
    assert lk.show(name, "ActiveState", "Result") == {"ActiveState": "failed",
                                                      "Result": "timeout"}
    token = lk.state(name)
    assert len(token["attempt"]) == 1 and token["failed"] == [], token

    # 2. the token is still there: that configuration never answered, start without it.
    cursor = ct.cursor()
    ct.systemctl("start", unit(name))
    assert lk.health(port) == 200
    plan = lk.runtime_plan(name)
    assert not plan["spec"]["auto"] and "--spec-type" not in plan["argv"]
    ct.wait_journal(unit(name), NEVER_ANSWERED, since_cursor=cursor)
    first_mark = token["attempt"][0][0]
    assert lk.state(name) == {"attempt": [], "failed": [[first_mark, NEVER_ANSWERED]]}

    # 3. an edited preset is a new configuration: auto is retried, and fails again.
    lk.preset(name, f'model = "{MTP}"\nubatch = 256\n{AUTO}', port=port)
    r = ct.systemctl("restart", unit(name), check=False)
    assert r.returncode != 0
    plan = lk.runtime_plan(name)
    assert plan["spec"]["auto"] and "--spec-type" in plan["argv"]
    assert plan["argv"][plan["argv"].index("-ub") + 1] == "256"
    assert lk.show(name, "Result")["Result"] == "timeout"

    # 4. another engine is a new mark too: retried, and this one answers.
    lk.set_engine(lk.engine)
    ct.systemctl("start", unit(name))
    assert lk.health(port) == 200
    plan = lk.runtime_plan(name)
    assert plan["spec"]["auto"] and plan["argv"][0] == lk.engine
    i = plan["argv"].index("--spec-type")
    assert plan["argv"][i + 1] == "draft-mtp"
    reply = lk.chat(port)
    assert reply["timings"]["draft_n"] > 0, reply["timings"]
    # READY cleared this launch's token. The first mark stays remembered as failed;
    # the edited one's token was consumed by this start of another mark, unrecorded
    # (a failure is only recorded when the same mark starts again).
    state = lk.state(name)
    assert state == {"attempt": [], "failed": [[first_mark, NEVER_ANSWERED]]}, state


def test_a_hung_engine_is_restarted_by_the_watchdog(lk: LokidSystem) -> None:
    ct = lk.ct
    name = "hung"
    port = lk.preset(name, f'model = "{LLAMA}"\n')
    lk.dropin(name, {"WatchdogSec": "3", "RestartSec": "1"})
    ct.systemctl("start", unit(name))
    assert lk.show(name, "WatchdogUSec")["WatchdogUSec"] == "3s"
    time.sleep(4)   # longer than WatchdogSec: a healthy engine keeps the unit alive
    assert lk.show(name, "ActiveState", "NRestarts") == {"ActiveState": "active",
                                                         "NRestarts": "0"}
    cursor = ct.cursor()
    ct.run(["kill", "-STOP", str(lk.engine_pid(name))])   # alive, but never answers
    took = lk.wait_restarts(name, 1, timeout=15)
    assert took <= 10, took
    ct.wait_for(unit(name), "active", timeout=30)
    assert lk.health(port) == 200
    log = ct.wait_journal(unit(name), "Watchdog timeout", since_cursor=cursor)
    assert "Watchdog timeout (limit 3s)" in log
    _notes.append(f"watchdog: SIGSTOP to restart in {took:.1f} s")


def lokid_errors(ct: Any, unit_name: str) -> list[str]:
    """lokid's own error entries in the unit's journal (not the engine's lines)."""
    r = ct.run(["journalctl", "-u", unit_name, "SYSLOG_IDENTIFIER=lokid", "PRIORITY=3",
                "-o", "cat", "--no-pager"], check=False)
    return r.stdout.splitlines()


def test_an_invalid_preset_fails_once_with_its_error_as_status(lk: LokidSystem) -> None:
    ct = lk.ct
    bad = "broken"
    lk.write_preset_text(bad, f'model = "{LLAMA}"\nport = 9\nctx = "big"\n')
    lk.dropin(bad, {"RestartSec": "1"})
    r = ct.systemctl("start", unit(bad), check=False)
    assert r.returncode != 0
    expected = ("/etc/loki/presets/broken.toml:3: ctx: must be an integer "
                "(tokens; 0 = not fixed, --fit may shrink it), not a string")
    time.sleep(3)  # three RestartSec= later: still the one attempt
    props = lk.show(bad, "ActiveState", "Result", "NRestarts", "ExecMainStatus", "StatusText")
    assert props == {"ActiveState": "failed", "Result": "exit-code", "NRestarts": "0",
                     "ExecMainStatus": "78", "StatusText": expected}, props
    status = ct.run(["systemctl", "status", unit(bad), "--no-pager"], check=False).stdout
    assert f'Status: "{expected}"' in status and "status=78/CONFIG" in status, status
    # the planning step apart: it found the error and left it to the main process
    assert f"ExecStartPre=/usr/bin/lokid prestart {bad} (code=exited, status=0/SUCCESS)" \
        in status.replace("ExecStartPre=-/", "ExecStartPre=/"), status
    log = lk.journal(bad)
    # lokid's own entry (SYSLOG_IDENTIFIER=lokid, priority err), not the engine's output
    lines = [s for s in lokid_errors(ct, unit(bad)) if "broken.toml" in s]
    assert lines == [expected], log
    assert "Traceback" not in log, log
    # It affects no other preset: the generator skipped only the broken one (the
    # template's own Description, no drop-in), and the other one starts.
    good = "still-good"
    port = lk.preset(good, f'model = "{LLAMA}"\n')
    assert lk.show(bad, "Description")["Description"] == f"lokid engine {bad}"
    assert lk.show(good, "Description")["Description"] == f"lokid engine {good}: {LLAMA}"
    ct.systemctl("start", unit(good))
    assert lk.health(port) == 200


def test_a_busy_port_fails_without_touching_the_token(lk: LokidSystem) -> None:
    ct = lk.ct
    name = "busy"
    port = lk.preset(name, f'model = "{MTP}"\n{AUTO}')
    # A first start of this preset is still loading: its token is set, its engine
    # holds the port. `lokid prestart` run by hand as loki sets the token, and a
    # plain HTTP server plays the loading engine.
    ct.run(["install", "-d", "-o", "loki", "-g", "loki", "-m", "0750", "/var/lib/loki"])
    lk.track_path("/tmp/loki-seed")
    ct.run(["runuser", "-u", "loki", "--", "env", "LOKI_RUNTIME_DIR=/tmp/loki-seed",
            "lokid", "prestart", name])
    before = lk.state(name)
    assert len(before["attempt"]) == 1 and before["failed"] == [], before
    holder = "busy-port-holder.service"
    lk.track_unit(holder)
    ct.run(["systemd-run", f"--unit={holder}", "--collect", "--", "python3", "-m",
            "http.server", "--bind", "127.0.0.1", str(port)])
    deadline = time.monotonic() + 20
    while lk.health(port) != 404:   # http.server has no /health: 404 once it listens
        assert time.monotonic() < deadline, ct.journal(holder)
        time.sleep(0.1)

    r = ct.systemctl("start", unit(name), check=False)
    assert r.returncode != 0
    props = lk.show(name, "ActiveState", "Result", "ExecMainStatus")
    assert props == {"ActiveState": "failed", "Result": "exit-code",
                     "ExecMainStatus": "78"}, props   # no restart: the port stays taken
    log = ct.wait_journal(unit(name), "status=78/CONFIG")
    assert any(f"port {port} on 127.0.0.1 is already in use by another process" in line
               for line in lokid_errors(ct, unit(name))), log
    assert "Traceback" not in log
    # The other start's token is untouched: not consumed, not recorded as a failure.
    assert lk.state(name) == before


# An engine whose --help takes 3 s: `lokid prestart` probes it, so a stop or a restart
# lands while the unit is in ExecStartPre (SubState start-pre).
SLOW_HELP = """\
for arg in "$@"; do
    case "$arg" in --help) sleep 3; exec "$ENGINE" "$@" ;; esac
done
exec "$ENGINE" "$@"
"""


def _wait_substate(lk: LokidSystem, name: str, sub: str) -> None:
    deadline = time.monotonic() + 30
    while lk.show(name, "SubState")["SubState"] != sub:
        assert time.monotonic() < deadline, lk.journal(name)[-3000:]
        time.sleep(0.05)


def test_a_stop_or_restart_while_planning_is_a_clean_stop(lk: LokidSystem) -> None:
    """systemd counted the planning step killed by its SIGTERM as a failure: `failed
    (signal)` after a stop, and a restart that failed."""
    ct = lk.ct
    name = "stop-planning"
    port = lk.preset(name, f'model = "{MTP}"\n{AUTO}')
    for n in range(2):  # a new wrapper each time: the probe of the last one is not kept
        wrapper = lk.engine_wrapper(f"slow-help-{n}-llama-server", SLOW_HELP)
        lk.set_engine(wrapper)
        ct.systemctl("start", "--no-block", unit(name))
        _wait_substate(lk, name, "start-pre")
        deadline = time.monotonic() + 30
        while ct.run(["pgrep", "-f", f"{wrapper} --help"], check=False).returncode != 0:
            assert time.monotonic() < deadline, lk.journal(name)[-3000:]  # the probe runs
            time.sleep(0.05)
        if n == 0:
            ct.systemctl("stop", unit(name))
            props = lk.show(name, "ActiveState", "Result")
            assert props == {"ActiveState": "inactive", "Result": "success"}, \
                (props, lk.journal(name)[-3000:])
            assert lk.state(name)["failed"] == []
            assert not (lk.state(name)["attempt"])  # stopped before any token was set
        else:
            r = ct.systemctl("restart", unit(name), check=False)
            assert r.returncode == 0, (r.stderr, lk.journal(name)[-3000:])
            props = lk.show(name, "ActiveState", "Result", "NRestarts")
            assert props == {"ActiveState": "active", "Result": "success",
                             "NRestarts": "0"}, props
            assert lk.health(port) == 200
    log = lk.journal(name)
    # each stop reached it while it waited for the probe (the first lines of a Python
    # start are covered by the unit's "-", not by lokid)
    assert log.count("stopped while planning: a clean stop") == 2, log[-3000:]
    assert "counted as a failure" not in log and "Traceback" not in log, log[-3000:]


def test_an_engine_that_refuses_its_arguments_fails_once(lk: LokidSystem) -> None:
    """`error: invalid argument: …` cannot change on retry: retried 5 times (25 s) before."""
    ct = lk.ct
    name = "bad-flag"
    lk.preset(name, f'model = "{LLAMA}"\nextra_args = ["--no-such-flag"]\n')
    lk.dropin(name, {"RestartSec": "1"})
    r = ct.systemctl("start", unit(name), check=False)
    assert r.returncode != 0
    time.sleep(3)  # three RestartSec= later: still the one attempt
    props = lk.show(name, "ActiveState", "NRestarts", "ExecMainStatus", "StatusText")
    line = "error: invalid argument: --no-such-flag"
    assert props["ActiveState"] == "failed" and props["NRestarts"] == "0", props
    assert props["ExecMainStatus"] == "78", props
    assert props["StatusText"].startswith(f"{os.path.basename(lk.engine)}: {line}"), props
    engine_lines = ct.run(["journalctl", "-u", unit(name), "SYSLOG_IDENTIFIER=llama-server",
                           "-o", "cat", "--no-pager"]).stdout
    assert engine_lines.count(line) == 1, engine_lines   # the engine ran once
    assert "counted as a failure" not in lk.journal(name)
