"""The on-demand sight under a real systemd, as shipped (issue 22, item 6): the gateway
(``loki-gateway.service``, user ``loki-gateway``, Debian 12's aiohttp and dbus-fast)
asks a cold start with StartForRequest and reports its requests with GatewayReport,
which the daemon takes from that user (polkit's rule, then the reporter check); the
preset's Stats say so, ``lokictl show`` too, and ``lokictl unload`` stops the engine.

Generous bounds only: the container shares a noisy machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.enginekit import free_port
from support.lokid_install import CONFIG_DIR, INSIDE_REPO, MODEL_DIR, LokidSystem, install, unit
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

SOCKET, SERVICE = "loki-gateway.socket", "loki-gateway.service"


@pytest.fixture(scope="module")
def lk(systemd_container: Container, container_engine: str, models: Any
       ) -> Iterator[LokidSystem]:
    ct = systemd_container
    system = install(ct, container_engine, [models.llama], gateway=True)
    system.preset("lazy", 'model = "llama.gguf"\n[serve]\non_demand = true\n', reload=False)
    system.gateway_port = free_port()  # type: ignore[attr-defined]
    yield system
    ct.systemctl("stop", SOCKET, SERVICE, check=False)
    ct.systemctl("stop", "lokid.service", check=False)
    system.set_engine(system.engine)   # lokid.toml without [gateway] again
    system.cleanup()


def lokictl(ct: Container, *args: str) -> str:
    r = ct.run(["env", f"PYTHONPATH={INSIDE_REPO}", "python3", "-m", "lokid.ctl", *args],
               timeout=180, check=False)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return str(r.stdout)


def test_the_gateways_cold_start_and_requests_reach_the_daemons_stats(lk: LokidSystem
                                                                       ) -> None:
    ct = lk.ct
    port = lk.gateway_port  # type: ignore[attr-defined]
    ct.systemctl("stop", "lokid.service", check=False)
    ct.write_file(f"{CONFIG_DIR}/lokid.toml",
                  f"engine = {json.dumps(lk.engine)}\nmodel_dirs = [{json.dumps(MODEL_DIR)}]\n"
                  f'[gateway]\nlisten = ["127.0.0.1:{port}"]\n')
    ct.systemctl("daemon-reload")
    ct.systemctl("start", "sockets.target")
    ct.wait_for(SOCKET, "active", timeout=30)
    cursor = ct.cursor()
    body = json.dumps({"model": "lazy", "messages": [{"role": "user", "content": "Hello"}],
                       "max_tokens": 8, "temperature": 0})
    r = ct.run(["curl", "-sS", "--max-time", "150", "-o", "/dev/null", "-w", "%{http_code}",
                "-H", "Content-Type: application/json", "--data-binary", body,
                f"http://127.0.0.1:{port}/v1/chat/completions"], timeout=180, check=False)
    assert r.stdout.strip() == "200", (r.stdout, r.stderr)
    deadline = time.monotonic() + 30
    while True:
        stats = json.loads(lokictl(ct, "stats", "lazy", "--json"))
        if stats.get("gateway_requests") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert stats.get("gateway_requests") == {"200": 1}, stats
    assert stats["cold_starts"] == 1 and stats["cold_start_waits"] == 1, stats
    assert stats["cold_start_wait_seconds"] > 0, stats
    show = lokictl(ct, "show", "lazy")
    assert "OnDemandState: ready" in show, show
    assert "OnDemandCounters: 1 cold start (mean wait " in show, show
    journal = ct.journal(SERVICE, since_cursor=cursor)
    assert "did not take the gateway's figures" not in journal, journal[-3000:]
    assert "Traceback" not in journal

    out = lokictl(ct, "unload", "lazy")
    assert out.strip() == "lazy: inactive (no request in flight, then stopped)", out
    assert ct.show(unit("lazy"), "ActiveState")["ActiveState"] == "inactive"
    assert "OnDemandState: waiting for a request" in lokictl(ct, "show", "lazy")
