"""lokid.service under a real systemd with the real system bus (Debian 12: dbus-fast 1.84).

The daemon runs as root with its hardening, owns org.lokid.Lokid1 by the shipped bus
policy, is started by D-Bus activation, and anyone may read from it. Its verbs drive
loki-engine@ units through systemd's D-Bus API. Who may call them is decided by the
real polkitd with the shipped action and rules files (group loki yes, others no)
and, with polkitd taken away, by the daemon's own fallback (root or group loki);
a refusal is PermissionDenied.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from support.apidoc import documented, members
from support.enginekit import free_port
from support.lokid_install import LokidSystem, install, unit
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

BUS = "org.lokid.Lokid1"
PATH = "/org/lokid/Lokid1"
MANAGER = "org.lokid.Lokid1.Manager"
EXPOSURE_GOAL = 3.0


@pytest.fixture(scope="module")
def lk(systemd_container: Container, container_engine: str, models: Any
       ) -> Iterator[LokidSystem]:
    system = install(systemd_container, container_engine, [models.llama])
    port = system.preset("demo", 'model = "llama.gguf"\n[spec]\nmode = "ngram"\n')
    system.track_unit(unit("demo"))
    system.demo_port = port  # type: ignore[attr-defined]
    yield system
    systemd_container.systemctl("stop", "lokid.service", check=False)
    system.cleanup()


def as_user(user: str | None, argv: list[str]) -> list[str]:
    """argv run as ``user``: nobody with no groups, or a user with its own groups."""
    if user == "nobody":
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv]
    if user:
        return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *argv]
    return argv


def busctl(ct: Container, *args: str, user: str | None = None, timeout: float = 60) -> Any:
    return ct.run(as_user(user, ["busctl", "--json=short", *args]), check=False,
                  timeout=timeout)


def prop(ct: Container, path: str, interface: str, name: str) -> Any:
    r = busctl(ct, "get-property", BUS, path, interface, name)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["data"]


def wait_prop(ct: Container, path: str, interface: str, name: str, value: Any,
              timeout: float = 120) -> None:
    import time

    deadline = time.monotonic() + timeout
    while (got := prop(ct, path, interface, name)) != value:
        assert time.monotonic() < deadline, f"{name} is {got!r}, not {value!r}"
        time.sleep(0.2)


# The error name of a call as an unprivileged user (busctl prints only the message).
ERROR_NAME_OF_START = """
import asyncio, sys
from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus
async def main():
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    reply = await bus.call(Message(destination="org.lokid.Lokid1", path="/org/lokid/Lokid1",
                                   interface="org.lokid.Lokid1.Manager", member="StartPreset",
                                   signature="s", body=["demo"]))
    print(reply.error_name if reply.message_type == MessageType.ERROR else "ok")
asyncio.run(main())
"""


def test_the_daemon_starts_on_the_first_call_and_serves_the_presets(lk: LokidSystem) -> None:
    ct = lk.ct
    ct.systemctl("stop", "lokid.service", check=False)
    r = busctl(ct, "get-property", BUS, PATH, MANAGER, "Presets")
    assert r.returncode == 0, r.stderr  # D-Bus activation started lokid.service
    assert json.loads(r.stdout)["data"] == ["/org/lokid/Lokid1/preset/demo"]
    # The daemon answers as soon as it owns its name and sends READY=1 right after;
    # systemd reads that datagram on its own schedule, which can come after this call's
    # reply: the unit may still say "activating" for a moment (seen in CI).
    ct.wait_for("lokid.service", "active", timeout=30)
    props = lk.ct.run(["systemctl", "show", "lokid.service", "-p", "ActiveState,MainPID,"
                       "StatusText"]).stdout
    assert "ActiveState=active" in props and re.search(r"StatusText=serving 1 preset\b", props)
    pid = re.search(r"MainPID=(\d+)", props)
    assert pid is not None
    user = ct.run(["ps", "-o", "user=", "-p", pid.group(1)]).stdout.strip()
    assert user == "root"
    r = busctl(ct, "call", BUS, PATH, MANAGER, "GetPreset", "s", "demo")
    assert json.loads(r.stdout)["data"] == ["/org/lokid/Lokid1/preset/demo"], r.stderr
    r = busctl(ct, "introspect", BUS, "/org/lokid/Lokid1/preset/demo")
    assert ".Plan" in r.stdout and ".Argv" in r.stdout, r.stderr


def test_anyone_may_read_but_only_root_or_loki_may_own_the_name(lk: LokidSystem) -> None:
    ct = lk.ct
    ct.systemctl("start", "lokid.service")
    r = busctl(ct, "get-property", BUS, PATH, MANAGER, "Version", user="nobody")
    assert r.returncode == 0, r.stderr
    r = busctl(ct, "call", BUS, "/org/lokid/Lokid1/preset/demo", "org.lokid.Lokid1.Preset",
               "Plan", user="nobody")
    assert r.returncode == 0 and '"argv"' in r.stdout, r.stderr
    owner = ct.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                    "python3", "-c", "import sys; sys.path.insert(0, '/opt/lokid');"
                    "import asyncio; from dbus_fast.aio import MessageBus;"
                    "from dbus_fast import BusType\n"
                    "async def main():\n"
                    "    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()\n"
                    "    print((await bus.request_name('org.lokid.Lokid1')).name)\n"
                    "asyncio.run(main())"], check=False)
    assert owner.returncode != 0, owner
    assert 'not allowed to own the service "org.lokid.Lokid1"' in owner.stderr, owner.stderr
    # deny by default: a member the policy does not list never reaches the daemon
    r = busctl(ct, "call", BUS, PATH, MANAGER, "Frobnicate",
               user="nobody")
    assert r.returncode != 0 and "Access denied" in r.stderr, r.stderr


def test_hardening_exposure(lk: LokidSystem) -> None:
    r = lk.ct.run(["systemd-analyze", "security", "--no-pager", "lokid.service"], check=False)
    m = re.search(r"Overall exposure level for lokid\.service: (\d+\.\d+)", r.stdout)
    assert m, r.stdout[-2000:]
    exposure = float(m.group(1))
    print(f"\nsystemd-analyze security lokid.service: {exposure}")
    assert exposure <= EXPOSURE_GOAL, r.stdout


PRESET_PATH = "/org/lokid/Lokid1/preset/demo"
PRESET = "org.lokid.Lokid1.Preset"


def test_root_starts_and_stops_an_engine_through_systemd(lk: LokidSystem) -> None:
    ct = lk.ct
    ct.systemctl("restart", "lokid.service")
    monitor = ct.popen(["busctl", "--system", "--json=short", "monitor",
                        "--match=type='signal',interface='org.lokid.Lokid1.Manager',"
                        "member='EngineStateChanged'"])
    try:
        r = busctl(ct, "call", BUS, PATH, MANAGER, "StartPreset", "s", "demo")
        assert r.returncode == 0, r.stderr
        wait_prop(ct, PRESET_PATH, PRESET, "State", "ready")
        assert lk.show("demo", "ActiveState")["ActiveState"] == "active"
        assert lk.health(lk.demo_port) == 200  # type: ignore[attr-defined]
        assert prop(ct, PRESET_PATH, PRESET, "Status").startswith("ready: demo (llama.gguf)")
        assert prop(ct, PRESET_PATH, PRESET, "SpecActive") == ["ngram-mod"]
        assert prop(ct, PATH, MANAGER, "ActivePresets") == ["demo"]
        r = busctl(ct, "call", BUS, PATH, MANAGER, "StopPreset", "s", "demo")
        assert r.returncode == 0, r.stderr
        wait_prop(ct, PRESET_PATH, PRESET, "State", "inactive")
        assert lk.show("demo", "ActiveState")["ActiveState"] == "inactive"
        assert prop(ct, PATH, MANAGER, "ActivePresets") == []
    finally:
        out = monitor.stop()
    states = [json.loads(line)["payload"]["data"][1] for line in out.splitlines()
              if line.startswith("{") and '"EngineStateChanged"' in line]
    assert states == ["loading", "ready", "stopping", "inactive"], out[-3000:]


def lokictl(ct: Container, *args: str, timeout: float = 120) -> Any:
    return ct.run(["env", "PYTHONPATH=/opt/lokid", "python3", "-m", "lokid.ctl", *args],
                  check=False, timeout=timeout)


def test_lokictl_wait_follows_the_job_truthfully(lk: LokidSystem) -> None:
    """--wait ends with the verb's job: ready after every restart (intermediate states are
    not failures), and a start systemd refuses ends at once with the unit's reason."""
    import time

    ct = lk.ct
    ct.systemctl("restart", "lokid.service")
    r = lokictl(ct, "start", "demo", "--wait")
    assert r.returncode == 0 and r.stdout.startswith("demo: ready"), (r.stdout, r.stderr)
    t0 = time.monotonic()
    for n in range(20):
        r = lokictl(ct, "restart", "demo", "--wait", "--timeout", "60")
        assert r.returncode == 0 and r.stdout.startswith("demo: ready"), (n, r.stdout,
                                                                          r.stderr)
        assert lk.show("demo", "ActiveState")["ActiveState"] == "active", n
    took = time.monotonic() - t0
    assert lk.health(lk.demo_port) == 200  # type: ignore[attr-defined]
    r = lokictl(ct, "stop", "demo", "--wait")
    assert r.returncode == 0 and r.stdout.startswith("demo: inactive"), (r.stdout, r.stderr)
    # right after: no "stopping" left of the ended run (systemd keeps its StatusText)
    assert "stopping" not in r.stdout, r.stdout
    assert prop(ct, PRESET_PATH, PRESET, "Status") != "stopping"
    assert prop(ct, PRESET_PATH, PRESET, "State") == "inactive"

    # the start fails in the unit (its port is taken by something else): exit 1 at once,
    # with systemd's result, lokid's one line and what to look at next
    holder = "demo-port-holder.service"
    lk.track_unit(holder)
    ct.run(["systemd-run", f"--unit={holder}", "--collect", "--", "python3", "-m",
            "http.server", "--bind", "127.0.0.1", str(lk.demo_port)])  # type: ignore[attr-defined]
    deadline = time.monotonic() + 20
    while lk.health(lk.demo_port) != 404:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline
        time.sleep(0.1)
    t1 = time.monotonic()
    r = lokictl(ct, "start", "demo", "--wait", "--timeout", "100")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert time.monotonic() - t1 < 30
    assert r.stderr.startswith("lokictl: demo: start failed: the unit failed (exit-code)"), \
        r.stderr
    assert "already in use" in r.stderr and "lokictl logs demo" in r.stderr
    ct.systemctl("stop", holder)
    ct.systemctl("reset-failed", unit("demo"))
    print(f"20 lokictl restart --wait in {took:.1f} s")


def gpuops(ct: Container) -> str:
    """A user in group loki (and not root)."""
    if ct.run(["getent", "passwd", "gpuops"], check=False).returncode != 0:
        ct.run(["useradd", "--create-home", "--user-group", "--groups", "loki", "gpuops"])
    return "gpuops"


def check_who_may_start(lk: LokidSystem, refusal: str) -> None:
    ct = lk.ct
    r = busctl(ct, "call", BUS, PATH, MANAGER, "StartPreset", "s", "demo", user="nobody")
    assert r.returncode != 0
    assert refusal in r.stderr, r.stderr
    r = ct.run(as_user("nobody", ["python3", "-c", ERROR_NAME_OF_START]), check=False)
    assert r.stdout.strip() == "org.lokid.Lokid1.Error.PermissionDenied", r
    assert lk.show("demo", "ActiveState")["ActiveState"] == "inactive"

    r = busctl(ct, "call", BUS, PATH, MANAGER, "StartPreset", "s", "demo", user=gpuops(ct))
    assert r.returncode == 0, r.stderr
    wait_prop(ct, PRESET_PATH, PRESET, "State", "ready")
    r = busctl(ct, "call", BUS, PATH, MANAGER, "StopPreset", "s", "demo", user="gpuops")
    assert r.returncode == 0, r.stderr
    wait_prop(ct, PRESET_PATH, PRESET, "State", "inactive")


def test_with_polkit_the_shipped_policy_and_rules_decide(lk: LokidSystem) -> None:
    # the real polkitd: nobody has no agent to authenticate with (the action says
    # auth_admin_keep), and only data/polkit/50-lokid.rules lets group loki in
    ct = lk.ct
    ct.systemctl("start", "lokid.service")
    check_who_may_start(lk, "not authorized by polkit for org.lokid.lokid1.manage")
    # without the rules file (polkitd rereads its rules when they change), group loki
    # is refused too: it was the rule that let it in
    rules = "/usr/share/polkit-1/rules.d/50-lokid.rules"
    ct.run(["mv", rules, "/root/50-lokid.rules"])
    try:
        import time

        deadline = time.monotonic() + 30
        while True:
            r = busctl(ct, "call", BUS, PRESET_PATH, PRESET, "ClearFailures", user="gpuops")
            if r.returncode != 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert "not authorized by polkit" in r.stderr, r
    finally:
        ct.run(["mv", "/root/50-lokid.rules", rules])


POLKIT_ACTIVATION = "/usr/share/dbus-1/system-services/org.freedesktop.PolicyKit1.service"


def test_without_polkit_root_and_group_loki_may(lk: LokidSystem) -> None:
    ct = lk.ct
    ct.systemctl("start", "lokid.service")
    ct.run(["mv", POLKIT_ACTIVATION, POLKIT_ACTIVATION + ".away"])
    try:
        ct.systemctl("stop", "polkit.service")
        ct.run(["busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus",
                "org.freedesktop.DBus", "ReloadConfig"])
        check_who_may_start(lk, "StartPreset needs root or membership of group 'loki'")
    finally:
        ct.run(["mv", POLKIT_ACTIVATION + ".away", POLKIT_ACTIVATION])
        ct.run(["busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus",
                "org.freedesktop.DBus", "ReloadConfig"])


def test_introspection_matches_the_documented_api(lk: LokidSystem) -> None:
    import xml.etree.ElementTree as ET

    lk.ct.systemctl("start", "lokid.service")
    doc = documented()
    for path, name in ((PATH, MANAGER), (PRESET_PATH, PRESET)):
        r = lk.ct.run(["busctl", "introspect", "--xml-interface", BUS, path])
        live = {i.get("name"): i for i in ET.fromstring(r.stdout) if i.tag == "interface"}
        assert members(live[name]) == members(doc[name]), name


def test_the_daemon_follows_systemd_across_a_reexec(lk: LokidSystem) -> None:
    # a systemd upgrade re-executes PID 1: it comes back with a new bus connection
    ct = lk.ct
    ct.systemctl("start", "lokid.service")
    ct.systemctl("daemon-reexec", timeout=120)
    r = busctl(ct, "call", BUS, PATH, MANAGER, "StartPreset", "s", "demo")
    assert r.returncode == 0, r.stderr
    wait_prop(ct, PRESET_PATH, PRESET, "State", "ready")
    r = busctl(ct, "call", BUS, PATH, MANAGER, "StopPreset", "s", "demo")
    assert r.returncode == 0, r.stderr
    wait_prop(ct, PRESET_PATH, PRESET, "State", "inactive")


def test_the_daemon_follows_the_files_and_systemd_follows_it(lk: LokidSystem) -> None:
    """No command: a new preset is served, and its unit's drop-in written (the daemon
    reloads systemd), within 2 s; an edit too. Reload() and a daemon-reload of anyone's
    read the presets as well."""
    import time

    ct = lk.ct
    ct.systemctl("start", "lokid.service")
    t0 = time.monotonic()
    lk.preset("added", 'model = "llama.gguf"\n', reload=False)  # no daemon-reload by the test
    while "/org/lokid/Lokid1/preset/added" not in prop(ct, PATH, MANAGER, "Presets") or \
            lk.show("added", "Description")["Description"] != "lokid engine added: llama.gguf":
        assert time.monotonic() - t0 < 2.0, lk.show("added", "Description")
        time.sleep(0.05)
    seen = time.monotonic() - t0
    path = "/org/lokid/Lokid1/preset/added"
    lk.preset("added", 'ubatch = 256\nmodel = "llama.gguf"\n', reload=False)
    t0 = time.monotonic()
    while "256" not in prop(ct, path, PRESET, "Argv"):
        assert time.monotonic() - t0 < 2.0
        time.sleep(0.05)
    edited = time.monotonic() - t0
    print(f"\nunder systemd: a new preset served with its drop-in in {seen * 1000:.0f} ms, "
          f"an edit in {edited * 1000:.0f} ms")
    r = busctl(ct, "call", BUS, PATH, MANAGER, "Reload")
    assert r.returncode == 0, r.stderr
    cursor = ct.cursor()
    ct.systemctl("daemon-reload")
    ct.wait_journal("lokid.service", "presets loaded", since_cursor=cursor, timeout=10)


def test_bench_over_the_bus_reaches_the_engine_from_the_sandbox(lk: LokidSystem) -> None:
    # the daemon's sandbox lets it reach the engines on loopback, and nothing else
    ct = lk.ct
    ct.systemctl("start", "lokid.service")
    r = busctl(ct, "call", BUS, PATH, MANAGER, "StartPreset", "s", "demo")
    assert r.returncode == 0, r.stderr
    try:
        wait_prop(ct, PRESET_PATH, PRESET, "State", "ready")
        r = busctl(ct, "--timeout=300", "call", BUS, PATH, MANAGER, "Bench", "ssuu", "demo",
                   "quick", "16", "300", timeout=320)
        assert r.returncode == 0, r.stderr
        outcome = json.loads(r.stdout)["data"][0]
        assert outcome["saved"]["data"] is True
        assert outcome["result"]["data"]["prompt_n"]["data"] > 0
        last = prop(ct, PRESET_PATH, PRESET, "LastBench")
        assert last["result"]["data"]["mode"]["data"] == "quick"
        r = busctl(ct, "call", BUS, PATH, MANAGER, "Bench", "ssuu", "demo", "quick", "16",
                   "300", user="nobody")
        assert r.returncode != 0 and "not authorized by polkit for org.lokid.lokid1.bench" \
            in r.stderr, r.stderr
        # BenchRepeat: the same action, its own bus policy line, through the sandbox too
        r = busctl(ct, "--timeout=300", "call", BUS, PATH, MANAGER, "BenchRepeat", "ssuuu",
                   "demo", "quick", "16", "300", "2", timeout=320)
        assert r.returncode == 0, r.stderr
        result = json.loads(r.stdout)["data"][0]["result"]["data"]
        assert len(result["runs"]["data"]) == 2 and "prompt_per_second" in result["stats"]["data"]
        r = busctl(ct, "call", BUS, PATH, MANAGER, "BenchRepeat", "ssuuu", "demo", "quick",
                   "16", "300", "2", user="nobody")
        assert r.returncode != 0 and "not authorized by polkit for org.lokid.lokid1.bench" \
            in r.stderr, r.stderr
        # the preset edited since its unit started: the daemon reads the start's runtime
        # plan from its sandbox (/run/loki), measures what runs and keeps nothing
        lk.preset("demo", 'ubatch = 256\nmodel = "llama.gguf"\n[spec]\nmode = "ngram"\n',
                  port=lk.demo_port, reload=False)  # type: ignore[attr-defined]
        r = busctl(ct, "--timeout=300", "call", BUS, PATH, MANAGER, "Bench", "ssuu", "demo",
                   "quick", "16", "300", timeout=320)
        assert r.returncode == 0, r.stderr
        outcome = json.loads(r.stdout)["data"][0]
        assert outcome["saved"]["data"] is False
        assert outcome["not_saved_reason"]["data"] == (
            "the preset's plan changed since its engine started (its command line differs "
            "now): restart it to keep a result")
    finally:
        lk.preset("demo", 'model = "llama.gguf"\n[spec]\nmode = "ngram"\n',
                  port=lk.demo_port, reload=False)  # type: ignore[attr-defined]
        busctl(ct, "call", BUS, PATH, MANAGER, "StopPreset", "s", "demo")
        wait_prop(ct, PRESET_PATH, PRESET, "State", "inactive")


def lan_address(ct: Container) -> str:
    """An IPv4 address of this host that is not loopback (the container shares the
    host's network)."""
    out = ct.run(["ip", "-4", "-o", "addr", "show", "scope", "global"]).stdout
    found = re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", out)
    assert found, f"this test needs a non-loopback IPv4 address on the host:\n{out}"
    return found[0]


def test_bench_over_the_bus_reaches_an_engine_on_a_lan_address(lk: LokidSystem) -> None:
    """The daemon's sandbox allows loopback, plus the addresses presets bind to (the
    generator's lokid.service drop-in, applied at the reload): nothing wider."""
    ct = lk.ct
    address = lan_address(ct)
    ct.systemctl("start", "lokid.service")
    port = lk.preset("lan", f'model = "llama.gguf"\nextra_args = ["--host", "{address}"]\n')
    try:
        dropin = ct.run(["systemctl", "cat", "lokid.service"]).stdout
        assert f"IPAddressAllow={address}" in dropin, dropin
        allowed = lk.ct.show("lokid.service", "IPAddressAllow")["IPAddressAllow"]
        assert sorted(allowed.split()) == sorted(["127.0.0.0/8", f"{address}/32", "::1/128"]), \
            allowed
        r = lokictl(ct, "start", "lan", "--wait")
        assert r.returncode == 0, (r.stdout, r.stderr)
        r = lokictl(ct, "bench", "lan", "--prompt", "300", "--predict", "16", "--json",
                    timeout=320)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["url"] == f"http://{address}:{port}" and out["result"]["prompt_n"] > 0
        r = lk.ct.run(["systemd-analyze", "security", "--no-pager", "lokid.service"],
                      check=False)
        m = re.search(r"Overall exposure level for lokid\.service: (\d+\.\d+)", r.stdout)
        assert m and float(m.group(1)) <= EXPOSURE_GOAL, r.stdout[-2000:]
        print(f"\nwith a LAN preset: systemd-analyze security lokid.service: {m.group(1)}")
    finally:
        lokictl(ct, "stop", "lan", "--wait")


# The daemon's systemd runner, on the container's system bus: its thrash-hint sampler of a
# preset's unit, printed as JSON (null when it gives none).
SAMPLE_UNIT = """
import asyncio, json, sys
sys.path.insert(0, "/opt/lokid")
from dbus_fast import BusType
from dbus_fast.aio import MessageBus
from lokid.runners.systemd_runner import SystemdRunner
async def main():
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    sampler = await SystemdRunner(bus, lambda *a: None).io_sampler(sys.argv[1])
    s = await sampler() if sampler else None
    print(json.dumps(s and [s.read_bytes, s.memory_bytes, s.memory]))
asyncio.run(main())
"""
UINT64_MAX = 2**64 - 1


def unit_counter(ct: Container, name: str, prop_name: str) -> int:
    """A cgroup counter of loki-engine@<name> as systemd's D-Bus API gives it (raw)."""
    r = busctl(ct, "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
               "org.freedesktop.systemd1.Manager", "GetUnit", "s", unit(name))
    path = json.loads(r.stdout)["data"][0]
    r = busctl(ct, "get-property", "org.freedesktop.systemd1", path,
               "org.freedesktop.systemd1.Service", prop_name)
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout)["data"])


def test_the_thrash_hint_reads_the_units_cgroup_counters_or_nothing(lk: LokidSystem) -> None:
    # lokid.service may not read the loki user's /proc/<pid>/io: systemd's counters of
    # the engine's unit stand in, and where systemd does not know them there is no hint
    ct = lk.ct
    # a daemon of its own: it says a missing counter once per unit (at the footprint's
    # reading after READY, or at the benchmark, whichever asks first), so count from here
    ct.systemctl("restart", "lokid.service")
    said = "no thrash hint for loki-engine@demo.service: systemd does not count"
    seen = ct.journal("lokid.service").count(said)
    assert lk.show("demo", "IOAccounting")["IOAccounting"] == "yes"
    r = busctl(ct, "call", BUS, PATH, MANAGER, "StartPreset", "s", "demo")
    assert r.returncode == 0, r.stderr
    try:
        wait_prop(ct, PRESET_PATH, PRESET, "State", "ready")
        before = unit_counter(ct, "demo", "IOReadBytes")
        memory = unit_counter(ct, "demo", "MemoryCurrent")
        r = ct.run(["python3", "-c", SAMPLE_UNIT, "demo"], check=False)
        assert r.returncode == 0, r.stderr
        sample = json.loads(r.stdout)
        after = unit_counter(ct, "demo", "IOReadBytes")
        print(f"\nloki-engine@demo.service: IOReadBytes {before}, MemoryCurrent {memory}")
        if before == UINT64_MAX:
            assert sample is None  # unknown to systemd (no io controller): no figure
        else:
            read, mem, label = sample
            assert before <= read <= after
            assert label == "memory of loki-engine@demo.service (its cgroup, page cache " \
                "included)"
            assert (mem is None) is (memory == UINT64_MAX)
        # the daemon in its sandbox takes the same sampler for a full benchmark (the depth
        # phase is skipped at ctx 2048: no hint to show), and says when there is none:
        # once for this daemon, whether the footprint's reading said it first or not
        r = busctl(ct, "--timeout=300", "call", BUS, PATH, MANAGER, "Bench", "ssuu", "demo",
                   "full", "16", "300", timeout=320)
        assert r.returncode == 0, r.stderr
        outcome = json.loads(r.stdout)["data"][0]
        assert outcome["result"]["data"]["depth"]["data"]["skipped"]["data"]
        told = ct.journal("lokid.service").count(said) - seen
        assert told == (1 if before == UINT64_MAX else 0), ct.journal("lokid.service")[-2000:]
    finally:
        busctl(ct, "call", BUS, PATH, MANAGER, "StopPreset", "s", "demo")
        wait_prop(ct, PRESET_PATH, PRESET, "State", "inactive")


def test_non_ascii_text_crosses_the_bus_with_debian_12s_dbus_fast(lk: LokidSystem,
                                                                    models: Any) -> None:
    """Debian 12's dbus-fast 1.84 writes a string's length in characters: a plan note's
    "→" made the bus daemon drop lokid.service at its start (InterfacesAdded), and an
    unknown name with an accent, from any user, did the same. lokid.dbus.wire writes such
    text in ASCII where dbus-fast needs it; the container is bookworm, so it must here."""
    ct = lk.ct
    mtp = lk.add_model(models.mtp_full)
    lk.preset("auto", f'model = "{mtp}"\n[spec]\nmode = "auto"\n')
    ct.systemctl("restart", "lokid.service")
    ct.wait_for("lokid.service", "active", timeout=30)
    notes = prop(ct, "/org/lokid/Lokid1/preset/auto", PRESET, "Notes")
    assert any(n.startswith("spec.mode = auto -> the model's MTP head") for n in notes), notes
    r = busctl(ct, "call", BUS, PATH, MANAGER, "GetPreset", "s", "modèle", user="nobody")
    assert r.returncode != 0 and "no preset 'mod\\u00e8le'" in r.stderr, (r.stdout, r.stderr)
    assert ct.systemctl("is-active", "lokid.service", check=False).stdout.strip() == "active"
    assert "/org/lokid/Lokid1/preset/auto" in prop(ct, PATH, MANAGER, "Presets")
    assert "Traceback" not in ct.journal("lokid.service")


def wait_requests(ct: Container, count: int, timeout: float = 20) -> Any:
    """The demo preset's Stats once they count ``count`` requests (busctl's JSON)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        stats = prop(ct, PRESET_PATH, PRESET, "Stats")
        if stats.get("requests", {}).get("data") == count:
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.2)


ENGINE_PIDS = """
import asyncio, json
from dbus_fast import BusType
from dbus_fast.aio import MessageBus
from lokid.runners.systemd_runner import SystemdRunner
async def main():
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    print(json.dumps(await SystemdRunner(bus, lambda *a: None).engine_pids("demo")))
asyncio.run(main())
"""


def test_stats_come_from_the_journal_the_daemon_follows(lk: LokidSystem) -> None:
    """Under systemd the engine's lines reach the daemon through the journal: its requests
    show in the preset's Stats; `lokictl stats --since` recomputes them from the journal
    itself, and `lokictl top --once` shows the row."""

    ct = lk.ct
    ct.systemctl("restart", "lokid.service")
    ct.wait_for("lokid.service", "active", timeout=30)
    ct.systemctl("start", unit("demo"), timeout=120)
    port = lk.demo_port  # type: ignore[attr-defined]
    generated = sum(lk.chat(port, f"Hello {i}", max_tokens=8 + i)["usage"]["completion_tokens"]
                    for i in range(3))
    stats = wait_requests(ct, 3)
    assert stats["generated_tokens"]["data"] == generated, stats
    assert stats["url"]["data"] == f"http://127.0.0.1:{port}", stats
    assert stats["restarts"]["data"] == 0, stats   # systemd's NRestarts of the unit
    # the processes the daemon would ask the NVIDIA driver about: the unit's, from systemd
    main_pid = int(ct.show(unit("demo"), "MainPID")["MainPID"])
    engine_pid = int(ct.run(["pgrep", "-P", str(main_pid), "llama-server"]).stdout.split()[0])
    listed = ct.run(["python3", "-c", ENGINE_PIDS], env={"PYTHONPATH": "/opt/lokid"}).stdout
    assert {main_pid, engine_pid} <= set(json.loads(listed)), (listed, main_pid, engine_pid)
    r = lokictl(ct, "stats", "demo", "--since", "10 min ago", "--json")
    assert r.returncode == 0, r.stderr
    window = json.loads(r.stdout)
    assert window["requests"] >= 3 and window["generated_tokens"] >= generated, window
    top = lokictl(ct, "top", "--once")
    assert top.returncode == 0 and any(line.startswith("demo ") and " ready " in line
                                       for line in top.stdout.splitlines()), top.stdout
    # issue 29: the host's room under the table, the running engine's need counted as lokid's
    devices = json.loads(lokictl(ct, "devices", "--json").stdout)
    (host,) = [d for d in devices if d["device"] == "host"]
    assert host["lokid"] > 0 and 0 < host["free"] <= host["total"], devices
    assert any(line.startswith("host ") for line in top.stdout.splitlines()), top.stdout
    # a restart of the daemon reads the running start's figures again from the journal
    invocation = stats["invocation"]["data"]
    ct.systemctl("restart", "lokid.service")
    ct.wait_for("lokid.service", "active", timeout=30)
    again = wait_requests(ct, 3)
    assert again["invocation"]["data"] == invocation, again
    assert again["generated_tokens"]["data"] == generated and "counted_from" not in again
    lk.chat(port, "One more", max_tokens=4)   # and what follows counts on
    wait_requests(ct, 4)
    assert "Traceback" not in ct.journal("lokid.service")
    ct.systemctl("stop", unit("demo"), timeout=60)


def test_presets_are_edited_over_the_bus_inside_the_sandbox(lk: LokidSystem) -> None:
    """lokid.service (ProtectSystem=strict) writes /etc/loki/presets and only there, for
    callers polkit allows (group loki, by the shipped rules): a key's line changes, the
    file keeps its owner and mode, a new preset gets its unit at once (the generator
    reruns), a removed one goes; nobody is refused and changes nothing."""
    ct = lk.ct
    ct.systemctl("restart", "lokid.service")
    ct.wait_for("lokid.service", "active", timeout=30)
    path = "/etc/loki/presets/demo.toml"
    ct.run(["chmod", "0640", path])
    ct.run(["chgrp", "loki", path])
    before = ct.run(["cat", path]).stdout
    r = busctl(ct, "call", BUS, PATH, MANAGER, "SetPresetKeys", "sa{sv}s", "demo", "1", "ctx",
               "x", "4096", "", user="nobody")
    assert r.returncode != 0, r
    assert "not authorized by polkit for org.lokid.lokid1.edit-presets" in r.stderr, r.stderr
    assert ct.run(["cat", path]).stdout == before
    r = busctl(ct, "call", BUS, PATH, MANAGER, "SetPresetKeys", "sa{sv}s", "demo", "1", "ctx",
               "x", "4096", "", user=gpuops(ct))
    assert r.returncode == 0, r.stderr
    after = ct.run(["cat", path]).stdout
    assert after == before.replace("ctx = 2048", "ctx = 4096"), (before, after)
    assert ct.run(["stat", "-c", "%U:%G %a", path]).stdout.strip() == "root:loki 640"
    assert "-c 4096" in " ".join(prop(ct, PRESET_PATH, PRESET, "Argv"))
    # a new preset: its unit exists on return (the generator ran), and it starts
    port = free_port()
    text = f'model = "llama.gguf"\nctx = 2048\nport = {port}\n'
    r = busctl(ct, "call", BUS, PATH, MANAGER, "CreatePreset", "ss", "made", text,
               user="gpuops")
    assert r.returncode == 0, r.stderr
    # created root:loki 0640: the engines (user loki) read it, other users do not
    assert ct.run(["stat", "-c", "%U:%G %a", "/etc/loki/presets/made.toml"]).stdout.strip() \
        == "root:loki 640"
    lk.track_unit(unit("made"))
    assert lk.show("made", "Description")["Description"] == "lokid engine made: llama.gguf"
    ct.systemctl("start", unit("made"), timeout=120)
    assert ct.run(["test", "-e", "/run/loki/made.json"], check=False).returncode == 0
    r = busctl(ct, "call", BUS, PATH, MANAGER, "DeletePreset", "sb", "made", "false",
               user="gpuops")
    assert r.returncode != 0 and "is running" in r.stderr, r.stderr
    r = busctl(ct, "call", BUS, PATH, MANAGER, "DeletePreset", "sb", "made", "true",
               user="gpuops", timeout=180)
    assert r.returncode == 0, r.stderr
    assert ct.run(["test", "-e", "/etc/loki/presets/made.toml"], check=False).returncode == 1
    assert lk.show("made", "ActiveState")["ActiveState"] == "inactive"
    # and its runtime files with it: a later preset of that name starts afresh
    left = ct.run(["find", "/run/loki", "-maxdepth", "1", "-name", "made.*"]).stdout.split()
    assert left == [], left
    assert "Traceback" not in ct.journal("lokid.service")
    ct.write_file(path, before)


def lokictl_as(ct: Container, user: str, *args: str, timeout: float = 120) -> Any:
    return ct.run(as_user(user, ["env", "PYTHONPATH=/opt/lokid", "python3", "-m", "lokid.ctl",
                                 *args]), check=False, timeout=timeout)


def test_group_loki_reads_the_engines_logs_through_the_daemon(lk: LokidSystem) -> None:
    """A member of group loki may not read the system journal (journalctl says so); the
    daemon reads the unit's journal for it: lokictl logs (-n, -f) and stats --since, by
    the shipped polkit rules. Nobody is refused with the action's name (issue 20, 7)."""
    import time

    ct = lk.ct
    ct.systemctl("restart", "lokid.service")
    ct.wait_for("lokid.service", "active", timeout=30)
    member = gpuops(ct)
    r = ct.run(as_user(member, ["journalctl", "--no-pager", "-u", unit("demo"), "-n", "3"]),
               check=False)
    assert "insufficient permissions" in r.stdout + r.stderr or not r.stdout.strip(), r
    assert lokictl(ct, "start", "demo", "--wait").returncode == 0
    try:
        r = lokictl_as(ct, member, "logs", "demo", "-n", "200")
        assert r.returncode == 0, (r.stdout, r.stderr)
        lines = r.stdout.splitlines()
        assert 0 < len(lines) <= 200, lines
        assert any(" llama-server: " in line for line in lines), lines[-20:]
        assert any(" lokid: " in line and "ready at http://" in line for line in lines), lines
        r = lokictl_as(ct, member, "logs", "demo", "-n", "2")
        assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r
        # -f: what comes after, here a request's lines
        follow = ct.popen(as_user(member, ["env", "PYTHONPATH=/opt/lokid", "python3", "-m",
                                           "lokid.ctl", "logs", "demo", "-n", "1", "-f"]))
        try:
            time.sleep(2)
            lk.chat(lk.demo_port, "Hello there", max_tokens=4)  # type: ignore[attr-defined]
            time.sleep(2)   # the follower polls every 0.5 s
        finally:
            out = follow.stop()
        assert "print_timing" in out, out[-3000:]
        # stats --since, as journalctl's "10min ago" would read "10min"
        r = lokictl_as(ct, member, "stats", "demo", "--since", "10min", "--json")
        assert r.returncode == 0, (r.stdout, r.stderr)
        window = json.loads(r.stdout)
        assert window["requests"] >= 1 and window["starts"] >= 1, window
        r = lokictl_as(ct, member, "stats", "demo", "--since", "10 parsecs")
        assert r.returncode == 2 and "use a time as journalctl takes it" in r.stderr, r
        # nobody: refused by polkit, with the action, exit 3, no line shown
        for args in (("logs", "demo"), ("stats", "demo", "--since", "today")):
            r = lokictl_as(ct, "nobody", *args)
            assert r.returncode == 3, (args, r.stdout, r.stderr)
            assert "not authorized by polkit for org.lokid.lokid1.read-logs" in r.stderr, r
            assert r.stdout == "", r.stdout
    finally:
        lokictl(ct, "stop", "demo", "--wait")
    assert "Traceback" not in ct.journal("lokid.service")


def test_a_start_the_engine_refuses_says_what_the_engine_said(lk: LokidSystem) -> None:
    """lokictl start --wait quotes the engine's own last error line, not the load's
    progress it reported last (issue 20, item 9)."""
    ct = lk.ct
    ct.systemctl("start", "lokid.service")
    lk.preset("badflag", 'model = "llama.gguf"\nextra_args = ["--no-such-flag"]\n')
    lk.track_unit(unit("badflag"))
    try:
        r = lokictl(ct, "start", "badflag", "--wait", "--timeout", "60")
        assert r.returncode == 1, (r.stdout, r.stderr)
        first = r.stderr.splitlines()[0]
        assert first.startswith("lokictl: badflag: start failed: "), r.stderr
        assert "error: invalid argument: --no-such-flag" in first, r.stderr
        assert "resident" not in first, r.stderr
    finally:
        lokictl(ct, "stop", "badflag", "--wait")
        ct.systemctl("reset-failed", unit("badflag"), check=False)


# The real CPU engine (b11434, built with the RPC backend) at -lv 4 -ngl 99: "offloaded 3/3
# layers to GPU" with CPU buffers only, a real start on the CPU on this machine.
ON_CPU = 'model = "llama.gguf"\nextra_args = ["-lv", "4", "-ngl", "99"]\n'


def test_the_engine_units_status_says_it_runs_on_the_cpu(lk: LokidSystem) -> None:
    """Issue 44, item 3: the daemon reads the engine's lines, the engine's unit says it
    (only its main process may: NotifyAccess=main), and cpu_fallback = "fail" ends the
    unit failed with the reason, not restarted."""
    import time

    ct = lk.ct
    runs = lk.preset("cpu-runs", ON_CPU, reload=False)
    lk.preset("cpu-fails", f'cpu_fallback = "fail"\n{ON_CPU}')
    ct.systemctl("restart", "lokid.service")
    try:
        ct.systemctl("start", unit("cpu-runs"), unit("cpu-fails"))
        deadline = time.monotonic() + 60
        while "running on the CPU" not in lk.show("cpu-runs", "StatusText")["StatusText"] or \
                lk.show("cpu-fails", "ActiveState")["ActiveState"] != "failed":
            assert time.monotonic() < deadline, (lk.journal("cpu-runs")[-2000:],
                                                 lk.journal("cpu-fails")[-2000:],
                                                 ct.journal("lokid.service")[-2000:])
            time.sleep(0.2)
        status = lk.show("cpu-runs", "StatusText", "ActiveState")
        assert status["ActiveState"] == "active" and lk.health(runs) == 200
        assert re.fullmatch(r"ready: cpu-runs \(llama.gguf\) at http://127\.0\.0\.1:\d+ "
                            r"\(loaded in [\d.]+ s\) — running on the CPU: it says offloaded "
                            r"3/3 layers to GPU.*", status["StatusText"]), status
        time.sleep(2)   # RestartSec= (5 s) has not passed, but the unit must not be pending
        failed = lk.show("cpu-fails", "ActiveState", "Result", "ExecMainStatus", "NRestarts",
                         "StatusText")
        assert failed["ActiveState"] == "failed" and failed["Result"] == "exit-code", failed
        assert failed["ExecMainStatus"] == "78" and failed["NRestarts"] == "0", failed
        assert failed["StatusText"].startswith("stopped: the engine runs on the CPU: it says "
                                               "offloaded 3/3 layers to GPU"), failed
        assert failed["StatusText"].endswith('(the preset says cpu_fallback = "fail"; a start '
                                             'by hand tries again)'), failed
        assert "Traceback" not in lk.journal("cpu-fails") + lk.journal("cpu-runs")
        assert "counted as a failure" not in lk.journal("cpu-fails")
        assert ct.run(["ls", "/run/loki"]).stdout.count(".oncpu") == 0   # both taken
    finally:
        ct.systemctl("stop", unit("cpu-runs"), unit("cpu-fails"), check=False)
        ct.systemctl("reset-failed", unit("cpu-fails"), check=False)


# An engine that first reads a file its unit then holds in the page cache only (a GPU
# engine's model after its copy to the GPU), then runs as the real engine.
READS_A_FILE = """\
for arg in "$@"; do
    case "$arg" in --help|--version) exec "$ENGINE" "$@" ;; esac
done
cat /var/lib/loki-models/pagecache.bin > /dev/null
exec "$ENGINE" "$@"
"""
# Written, synced and dropped from the page cache, so that the engine's read charges it
# to the engine's cgroup (a cached page is charged to the cgroup that first faulted it in).
UNCACHED_FILE = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for _ in range(192):
    os.write(fd, os.urandom(1 << 20))
os.fsync(fd)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)
"""
HELD = """
import asyncio, sys
sys.path.insert(0, "/opt/lokid")
from dbus_fast import BusType
from dbus_fast.aio import MessageBus
from lokid.runners.systemd_runner import SystemdRunner
async def main():
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    print(await SystemdRunner(bus, lambda *a: None).held_memory(sys.argv[1]))
asyncio.run(main())
"""


def test_a_footprints_host_figure_leaves_the_page_cache_of_files_read_out(
        lk: LokidSystem) -> None:
    """Issue 44, item 11, on a real cgroup (cgroup v2 under the container's systemd): the
    unit's MemoryCurrent counts the 192 MiB its engine read; what the runner says the
    engine holds (memory.stat, lokid.core.place.held) does not. Where the host leaves the
    container's cgroup2 without a memory controller (this machine kind: its controller is
    on cgroup v1), there is no memory.stat: then what is checked is that lokid says it
    cannot tell (None), which the footprint then takes MemoryCurrent's place for."""
    ct = lk.ct
    ct.run(["python3", "-c", UNCACHED_FILE, "/var/lib/loki-models/pagecache.bin"])
    lk.track_path("/var/lib/loki-models/pagecache.bin")
    lk.set_engine(lk.engine_wrapper("reads-a-file", READS_A_FILE))
    port = lk.preset("pagecache", 'model = "llama.gguf"\n')
    try:
        ct.systemctl("start", unit("pagecache"))
        assert lk.health(port) == 200
        current = unit_counter(ct, "pagecache", "MemoryCurrent")
        group = ct.run(["systemctl", "show", "-P", "ControlGroup", unit("pagecache")]).stdout
        read = ct.run(["cat", f"/sys/fs/cgroup{group.strip()}/memory.stat"], check=False)
        r = ct.run(["python3", "-c", HELD, "pagecache"], check=False)
        assert r.returncode == 0, r.stderr
        if read.returncode != 0:
            # a host whose memory controller is on cgroup v1 (this one's, in 2026) leaves
            # the container's cgroup2 without it: no memory.stat, and lokid says none
            assert r.stdout.strip() == "None" and current == UINT64_MAX, (r.stdout, current)
            print("\nthe container's cgroup2 has no memory controller (the host's is on "
                  "cgroup v1): no memory.stat; lokid says None")
            return
        stat = read.stdout
        held = int(r.stdout)
        print(f"\n{unit('pagecache')}: MemoryCurrent {current}, held {held}; memory.stat:\n"
              f"{stat}")
        assert current >= 150 * 2**20, stat    # the file's pages are the unit's
        assert 0 < held <= current - 150 * 2**20, (held, current, stat)
    finally:
        ct.systemctl("stop", unit("pagecache"), check=False)
        lk.set_engine(lk.engine)
