"""The fleet from the real Debian package (issue 30, "done when"): two hosts on the test's
private network with lokid installed by ``dpkg -i`` of the .deb this session built
(support.debpkg), peered gateways, and the collection's rolling upgrade to the next
build run by ``ansible-playbook`` over ssh, one host at a time, while a client keeps
asking host a for a model of each host, streaming: no request fails, and both hosts
end on the new version with lokid running."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import REPO
from support.debpkg import NEXT, Build, cached_build
from support.fleetkit import FleetHost, fleet, headers, ssh_key
from support.systemd_harness import PACKAGES

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

# ssh for Ansible, python3-apt for its apt module (the .deb's install)
FLEET_PACKAGES = (*PACKAGES, "openssh-server", "python3-apt")
ON_DEMAND = 'model = "llama.gguf"\n[serve]\non_demand = true\n'


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    b = cached_build("bookworm", tmp_path_factory.mktemp("deb-bookworm"))
    assert b.rc == 0 and b.next_deb is not None, b.log[-4000:]
    return b


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ssh_key(tmp_path_factory.mktemp("ssh"))


@pytest.fixture(scope="module")
def hosts(build: Build, models: Any, key: Path) -> Iterator[dict[str, FleetHost]]:
    with fleet(("a", "b"), [models.llama], FLEET_PACKAGES, deb=build.deb) as found:
        serves = {"a": ("shared",), "b": ("beta", "shared")}
        for name, h in found.items():
            h.gateway([p for p in found.values() if p is not h],
                      {preset: ON_DEMAND for preset in serves[name]})
            h.ssh_root(Path(f"{key}.pub").read_text())
        yield found


def version(h: FleetHost) -> str:
    return h.ct.run(["dpkg-query", "-W", "-f", "${Version}", "lokid"]).stdout.strip()


class Client(threading.Thread):
    """Streams from host a, beta (on b) and shared in turn, until told to stop. As the
    openai client does (max_retries), a request whose connection closed before any
    answer (a kept-alive connection a restarting gateway closed as the request went out:
    HTTP/1.1's own race) is sent again, once; those are counted apart."""

    def __init__(self, a: FleetHost):
        super().__init__(daemon=True)
        self.a = a
        self.stop = threading.Event()
        self.done = 0
        self.retried = 0
        self.failed: list[str] = []

    def one(self, c: httpx.Client, model: str) -> str:
        """"" when the stream ended in full; else what went wrong. Raises for a
        connection that closed before the answer's head."""
        with c.stream("POST", self.a.url + "/v1/chat/completions", json={
                "model": model, "stream": True, "max_tokens": 16,
                "messages": [{"role": "user", "content": "Hello"}]}) as s:
            try:
                text = "".join(s.iter_text())
            except httpx.HTTPError as e:   # after the head: the request failed
                return f"{model}: mid-stream {type(e).__name__}: {e}"
        if s.status_code != 200 or not text.rstrip().endswith("data: [DONE]") \
                or '"error"' in text:
            return f"{model}: {s.status_code} {text[-300:]}"
        return ""

    def run(self) -> None:
        models = ("beta", "shared")
        with httpx.Client(headers=headers(), timeout=180) as c:
            while not self.stop.is_set():
                model = models[self.done % 2]
                for attempt in range(2):
                    try:
                        failed = self.one(c, model)
                        break
                    except (httpx.ConnectError, httpx.ReadError,
                            httpx.RemoteProtocolError) as e:
                        failed = f"{model}: {type(e).__name__}: {e}"
                        self.retried += attempt == 0
                if failed:
                    self.failed.append(failed)
                self.done += 1


def test_the_rolling_upgrade_of_the_package_loses_no_request_of_a_client(
        hosts: dict[str, FleetHost], build: Build, key: Path, tmp_path: Path) -> None:
    a, b = hosts["a"], hosts["b"]
    assert version(a) == version(b) == build.version
    deadline = time.monotonic() + 60
    while True:   # a reads b: beta listed through a
        r = httpx.get(a.url + "/v1/models", headers=headers(), timeout=30)
        if r.status_code == 200 and "beta" in {m["id"] for m in r.json()["data"]}:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.5)
    inventory = tmp_path / "inventory.ini"
    inventory.write_text("[lokid]\n" + "".join(
        f"{h.name} ansible_host={h.address} ansible_user=root "
        f"ansible_ssh_private_key_file={key} ansible_python_interpreter=/usr/bin/python3 "
        "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null'"
        "\n" for h in hosts.values()))
    client = Client(a)
    client.start()
    try:
        time.sleep(3)   # the client under way, its engines started on demand
        r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                            str(inventory), "lokid.fleet.rolling_upgrade",
                            "-e", f"lokid_deb={build.next_deb}"],
                           capture_output=True, text=True, timeout=900,
                           env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(REPO / "ansible"),
                                "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_NOCOLOR": "1"})
        time.sleep(3)   # and after it
    finally:
        client.stop.set()
        client.join(200)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    print(f"fleet_deb: {client.done} streamed requests through a during the rolling upgrade, "
          f"{len(client.failed)} failed, {client.retried} sent again (closed unanswered)")
    assert client.done >= 10 and client.failed == [], client.failed[:5]
    for h in hosts.values():
        assert version(h) == build.version + NEXT, h.name
        assert h.ct.run(["systemctl", "is-active", "lokid.service"],
                        check=False).stdout.strip() == "active"
