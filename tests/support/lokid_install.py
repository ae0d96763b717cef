"""lokid installed into the systemd test container, laid out as its Debian package does.

The package itself is built and installed in tests/packaging/test_deb.py. The other
container tests need the repository's code as it is being changed, so this
module lays out the same files by hand in a booted container
(tests/support/systemd_harness.py), with the repository bound read-only at /opt/lokid:

- ``/usr/bin/lokid`` and ``/usr/bin/lokictl``: Debian's python3 running the repository's
  lokid;
- the ``loki`` system user and group, a member of ``video`` and ``render``,
  created by ``systemd-sysusers`` from the shipped ``data/sysusers.d/lokid.conf``;
- ``units/loki-engine@.service`` in /etc/systemd/system (unmodified),
  ``units/loki-port@.socket`` and ``.service`` in /usr/lib/systemd/system (where the
  generator's links point) and ``units/lokid-engine-generator`` in
  /etc/systemd/system-generators;
- ``/etc/loki/lokid.toml`` naming the engine and ``/var/lib/loki-models``;
- the daemon: ``units/lokid.service``, the bus policy, the D-Bus activation
  file, the polkit action and rules files (read by the container's polkitd)
  and the tmpfiles.d entry that creates /var/lib/loki and /run/loki for loki.

:class:`LokidSystem` then writes presets, models, test-only drop-ins and
engine wrappers, and remembers what it wrote so :meth:`LokidSystem.cleanup`
can stop the units and remove it all after each test.
"""
from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .enginekit import free_port
from .systemd_harness import REPO, Container

INSIDE_REPO = "/opt/lokid"
CONFIG_DIR = "/etc/loki"
MODEL_DIR = "/var/lib/loki-models"
STATE_DIR = "/var/lib/loki"
STATE_DB = f"{STATE_DIR}/state.db"
RUNTIME_DIR = "/run/loki"
UNIT_DIR = "/etc/systemd/system"
GENERATOR_DIR = "/etc/systemd/system-generators"
# The generator's "normal" output directory, where systemd 252 puts its drop-ins.
GENERATED_DIR = "/run/systemd/generator"
TEMPLATE = "loki-engine@.service"
PORT_TEMPLATES = ("loki-port@.socket", "loki-port@.service")
RPC_TEMPLATE = "loki-rpc@.service"   # the RPC workers' (rpc/<name>.toml)
GATEWAY_UNITS = ("loki-gateway.socket", "loki-gateway.service")
PACKAGE_UNIT_DIR = "/usr/lib/systemd/system"
GENERATOR = "lokid-engine-generator"
DAEMON_UNIT = "lokid.service"
BUS_NAME = "org.lokid.Lokid1"

PTH = "/usr/lib/python3/dist-packages/zz-lokid-test.pth"
# A stand-in for the Debian package's /usr/bin/lokid: Debian's own python3 and
# libraries (python3-systemd, ...) run the repository's code.
LOKID_WRAPPER = f"""#!/bin/sh
# Test stand-in for the Debian package's /usr/bin/lokid.
PYTHONPATH={INSIDE_REPO} exec /usr/bin/python3 -m lokid.cli "$@"
"""
LOKICTL_WRAPPER = f"""#!/bin/sh
# Test stand-in for the Debian package's /usr/bin/lokictl.
PYTHONPATH={INSIDE_REPO} exec /usr/bin/python3 -m lokid.ctl "$@"
"""


# Reads the attempt token and the failed marks of one preset, as JSON. Plain
# sqlite3 rather than lokid.store.state: StateDB() migrates, i.e. writes, on open.
STATE_QUERY = """
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
attempt = db.execute("SELECT mark, since FROM attempt WHERE preset = ?", (sys.argv[2],)).fetchall()
failed = db.execute("SELECT mark, reason FROM failed WHERE preset = ? ORDER BY at, rowid",
                    (sys.argv[2],)).fetchall()
print(json.dumps({"attempt": attempt, "failed": failed}))
"""


def unit(name: str) -> str:
    return f"loki-engine@{name}.service"


class LokidSystem:
    """lokid installed in ``ct``, with ``engine`` (the real llama-server) configured."""

    def __init__(self, ct: Container, engine: str) -> None:
        self.ct = ct
        self.engine = engine
        self._presets: set[str] = set()
        self._ports: set[int] = set()    # drawn by preset() for this test's presets
        self._units: set[str] = set()
        self._files: set[str] = set()
        self._engine_changed = False

    # installation -------------------------------------------------------------------

    def install(self) -> None:
        """Install lokid; idempotent (a second call rewrites the same files)."""
        ct = self.ct
        ct.write_file("/usr/bin/lokid", LOKID_WRAPPER, mode=0o755)
        ct.write_file("/usr/bin/lokictl", LOKICTL_WRAPPER, mode=0o755)
        # lokid importable by Debian's python3 itself, as the package's dist-packages makes
        # it: a model pull's transient unit runs `python3 -m lokid pull-worker` (the
        # daemon's interpreter), with no wrapper's PYTHONPATH on the way
        ct.write_file(PTH, f"{INSIDE_REPO}\n")
        # The user as the package creates it: in video and render (the GPU device
        # nodes' groups, which the unit's SupplementaryGroups= needs), render made
        # if missing (Debian creates it with udev, which a minimal container lacks).
        ct.write_file("/usr/lib/sysusers.d/lokid.conf",
                      (REPO / "data" / "sysusers.d" / "lokid.conf").read_bytes())
        ct.run(["systemd-sysusers", "lokid.conf"])
        ct.write_file(f"{UNIT_DIR}/{TEMPLATE}", (REPO / "units" / TEMPLATE).read_bytes())
        # An on-demand preset's port units, where the package puts them: the generator's
        # sockets.target.wants link names that path, and an on-demand engine's drop-in
        # wants its socket (its engine listens on /run/loki/<preset>.sock then).
        for name in (*PORT_TEMPLATES, RPC_TEMPLATE):
            ct.write_file(f"{PACKAGE_UNIT_DIR}/{name}", (REPO / "units" / name).read_bytes())
        ct.write_file(f"{GENERATOR_DIR}/{GENERATOR}", (REPO / "units" / GENERATOR).read_bytes(),
                      mode=0o755)
        # The daemon: its unit, its bus policy and its D-Bus activation file.
        ct.write_file(f"{UNIT_DIR}/{DAEMON_UNIT}", (REPO / "units" / DAEMON_UNIT).read_bytes())
        ct.write_file(f"/usr/share/dbus-1/system.d/{BUS_NAME}.conf",
                      (REPO / "data" / "dbus" / f"{BUS_NAME}.conf").read_bytes())
        ct.write_file(f"/usr/share/dbus-1/system-services/{BUS_NAME}.service",
                      (REPO / "data" / "dbus" / f"{BUS_NAME}.service").read_bytes())
        ct.write_file("/usr/share/polkit-1/actions/org.lokid.lokid1.policy",
                      (REPO / "data" / "polkit" / "org.lokid.lokid1.policy").read_bytes())
        ct.write_file("/usr/share/polkit-1/rules.d/50-lokid.rules",
                      (REPO / "data" / "polkit" / "50-lokid.rules").read_bytes())
        ct.write_file("/usr/lib/tmpfiles.d/lokid.conf",
                      (REPO / "data" / "tmpfiles.d" / "lokid.conf").read_bytes())
        ct.run(["systemd-tmpfiles", "--create", "/usr/lib/tmpfiles.d/lokid.conf"])
        ct.run(["busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus",
                "org.freedesktop.DBus", "ReloadConfig"])
        self.set_engine(self.engine)
        self._engine_changed = False
        ct.run(["mkdir", "-p", f"{CONFIG_DIR}/presets", MODEL_DIR])
        self.reload()

    def set_engine(self, path: str) -> None:
        """Point lokid.toml at ``path`` (cleanup() points it back at the real engine)."""
        self.ct.write_file(f"{CONFIG_DIR}/lokid.toml",
                           f"engine = {json.dumps(path)}\n"
                           f"model_dirs = [{json.dumps(MODEL_DIR)}]\n")
        self._engine_changed = path != self.engine

    def add_model(self, host_path: str) -> str:
        """Copy a generated model into the model directory; its bare file name."""
        name = Path(host_path).name
        self.ct.write_file(f"{MODEL_DIR}/{name}", Path(host_path).read_bytes(), mode=0o644)
        return name

    def reload(self) -> None:
        """``systemctl daemon-reload``: reruns the generator (presets → drop-ins)."""
        self.ct.systemctl("daemon-reload")

    # per test ----------------------------------------------------------------------

    def preset(self, name: str, body: str, *, port: int | None = None,
               reload: bool = True) -> int:
        """Write presets/<name>.toml (a free port, ctx 2048, then ``body``); its port.

        The free port is one no other preset of this test was given: the kernel hands
        out a port it just gave again (of 50 presets, two shared one often enough that
        one of them was broken by the port conflict and a CI run failed)."""
        while port is None:
            port = free_port()
            port = None if port in self._ports else port
        self._ports.add(port)
        self.write_preset_text(name, f"port = {port}\nctx = 2048\n{body}", reload=reload)
        return port

    def write_preset_text(self, name: str, text: str, *, reload: bool = True) -> None:
        """Write presets/<name>.toml verbatim."""
        self._presets.add(name)
        self._units.add(unit(name))
        self.ct.write_file(f"{CONFIG_DIR}/presets/{name}.toml", text)
        if reload:
            self.reload()

    def dropin(self, name: str, service: dict[str, str], *, reload: bool = True) -> None:
        """A test-only drop-in for ``loki-engine@<name>`` (90-test.conf, [Service] keys)."""
        self._units.add(unit(name))
        path = f"{UNIT_DIR}/{unit(name)}.d/90-test.conf"
        self._files.add(f"{UNIT_DIR}/{unit(name)}.d")
        lines = ["# Test-only timing (tests/support/lokid_install.py)", "[Service]"]
        lines += [f"{k}={v}" for k, v in service.items()]
        self.ct.write_file(path, "\n".join(lines) + "\n")
        if reload:
            self.reload()

    def engine_wrapper(self, name: str, body: str) -> str:
        """A shell script /usr/local/bin/<name> (``$ENGINE`` is the real engine); its path."""
        path = f"/usr/local/bin/{name}"
        self._files.add(path)
        script = f"#!/bin/sh\nENGINE={shlex.quote(self.engine)}\n{body}"
        self.ct.write_file(path, script, mode=0o755)
        return path

    def track_unit(self, name: str) -> None:
        """Another unit (a transient one) for cleanup() to stop."""
        self._units.add(name)

    def track_path(self, path: str) -> None:
        """Another file or directory for cleanup() to remove."""
        self._files.add(path)

    def cleanup(self) -> None:
        """Stop every unit this test used, remove its files, restore lokid.toml."""
        ct = self.ct
        # an on-demand preset's port units too (the generator's, started with its engine)
        ports = [f"loki-port@{n}.{kind}" for n in self._presets for kind in ("socket", "service")]
        for u in sorted(self._units) + sorted(ports):
            ct.systemctl("stop", u, check=False, timeout=120)
            ct.systemctl("reset-failed", u, check=False)
        paths = [f"{CONFIG_DIR}/presets/{n}.toml" for n in self._presets]
        paths += [f"{RUNTIME_DIR}/{n}.json" for n in self._presets]
        paths += sorted(self._files)
        if paths:
            ct.run(["rm", "-rf", "--", *paths], check=False)
        if self._engine_changed:
            self.set_engine(self.engine)
        if self._presets or self._files:
            self.reload()
        self._presets.clear()
        self._ports.clear()
        self._units.clear()
        self._files.clear()

    # looking --------------------------------------------------------------------------

    def show(self, name: str, *props: str) -> dict[str, str]:
        return self.ct.show(unit(name), *props)

    def health(self, port: int) -> int:
        """HTTP status of /health asked with curl inside the container; 0 = no answer."""
        r = self.ct.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                         "--max-time", "3", f"http://127.0.0.1:{port}/health"], check=False)
        code = r.stdout.strip()
        return int(code) if code.isdigit() else 0

    def chat(self, port: int, content: str = "Hello", max_tokens: int = 32) -> dict[str, Any]:
        """One /v1/chat/completions request with curl inside the container."""
        body = json.dumps({"messages": [{"role": "user", "content": content}],
                           "max_tokens": max_tokens, "seed": 1, "temperature": 0})
        r = self.ct.run(["curl", "-sS", "--fail-with-body", "--max-time", "120",
                         "-H", "Content-Type: application/json", "--data-binary", body,
                         f"http://127.0.0.1:{port}/v1/chat/completions"], timeout=150)
        data: dict[str, Any] = json.loads(r.stdout)
        return data

    def processes(self, name: str) -> list[tuple[int, str, str]]:
        """(pid, user, command name) of every process in the unit's cgroup."""
        cgroup = self.show(name, "ControlGroup")["ControlGroup"]
        if not cgroup:
            return []
        r = self.ct.run(["cat", f"/sys/fs/cgroup{cgroup}/cgroup.procs"], check=False)
        pids = r.stdout.split()
        if not pids:
            return []
        out = self.ct.run(["ps", "-o", "pid=,user=,comm=", "-p", ",".join(pids)],
                          check=False).stdout
        return [(int(p), u, c) for p, u, c in (line.split(None, 2) for line in out.splitlines())]

    def engine_pid(self, name: str) -> int:
        """The llama-server process of the unit (exactly one)."""
        found = [pid for pid, _, comm in self.processes(name) if comm == "llama-server"]
        assert len(found) == 1, self.processes(name)
        return found[0]

    def runtime_plan(self, name: str) -> dict[str, Any]:
        """/run/loki/<name>.json: the plan prestart wrote for the current start."""
        data: dict[str, Any] = json.loads(self.ct.read_file(f"{RUNTIME_DIR}/{name}.json"))
        return data

    def state(self, name: str) -> dict[str, list[list[Any]]]:
        """The attempt token and failed marks of preset ``name`` in the state DB."""
        # As loki: root would leave root-owned -wal/-shm files behind for the units.
        r = self.ct.run(["runuser", "-u", "loki", "--", "python3", "-c", STATE_QUERY,
                         STATE_DB, name])
        data: dict[str, list[list[Any]]] = json.loads(r.stdout)
        return data

    def journal(self, name: str, since_cursor: str | None = None) -> str:
        return self.ct.journal(unit(name), since_cursor=since_cursor)

    def wait_restarts(self, name: str, count: int, timeout: float) -> float:
        """Wait until the unit's NRestarts reaches ``count``; the seconds it took."""
        t0 = time.monotonic()
        while True:
            n = int(self.show(name, "NRestarts")["NRestarts"])
            if n >= count:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise AssertionError(
                    f"{unit(name)}: NRestarts still {n} after {timeout:.0f} s (wanted "
                    f"{count})\n{self.journal(name)[-3000:]}")
            time.sleep(0.1)


def install(ct: Container, engine: str, models: Iterable[str] = (), *,
            gateway: bool = False) -> LokidSystem:
    """lokid installed in ``ct`` with ``models`` (host paths) in its model directory;
    ``gateway``: with loki-gateway.socket and .service where the package puts them
    (removed and stopped by cleanup())."""
    system = LokidSystem(ct, engine)
    system.install()
    for path in models:
        system.add_model(path)
    if gateway:
        for name in GATEWAY_UNITS:
            ct.write_file(f"{PACKAGE_UNIT_DIR}/{name}", (REPO / "units" / name).read_bytes())
            system.track_path(f"{PACKAGE_UNIT_DIR}/{name}")
            system.track_unit(name)
    return system


def serve_gateway(ct: Container, engine: str, model_dir: str, port: int) -> None:
    """lokid.toml naming ``engine``, ``model_dir`` and a gateway on 127.0.0.1:``port``;
    the generators rerun, the daemon restarted and loki-gateway.socket listening, as a
    boot would leave them (the benchmarks' set-up under systemd)."""
    ct.write_file(f"{CONFIG_DIR}/lokid.toml",
                  f"engine = {json.dumps(engine)}\n"
                  f"model_dirs = [{json.dumps(model_dir)}]\n"
                  f'[gateway]\nlisten = ["127.0.0.1:{port}"]\n')
    ct.systemctl("daemon-reload")
    ct.systemctl("restart", "lokid.service", timeout=120)
    ct.systemctl("start", "loki-gateway.socket", "sockets.target")
    ct.wait_for("loki-gateway.socket", "active", timeout=60)


def curl(ct: Container, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One request from inside the container: its HTTP status (0: no answer) and its
    body, as JSON where it is some."""
    args = ["curl", "-sS", "--max-time", "150", "-o", "/dev/stdout", "-w", "\n%{http_code}"]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
    r = ct.run([*args, url], timeout=180, check=False)
    text, _, code = r.stdout.rpartition("\n")
    assert code.isdigit(), (r.stdout, r.stderr)
    return int(code), json.loads(text) if text.strip().startswith(("{", "[")) else text
