"""Swaps and restarts past systemd's default start limit, under a real systemd (issue 28,
item 1): every port and the gateway still answer.

systemd's default limit is 5 starts in 10 s. An on-demand preset's relay
(``loki-port@<preset>.service``) is stopped with its engine at every swap or stop
(``PartOf=``) and started again by the next connection: after a few swaps it hit
``start-limit-hit``, which failed its socket too (``service-start-limit-hit``), and the
port stopped listening while lokictl still said "waiting for a request". The sockets and
the daemon are started again by operators (and the daemon by itself, on bus loss): the
same trap. Each loop here starts a unit more often than that limit allows, then asks.

Generous bounds only: the container shares a noisy machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from support.enginekit import free_port
from support.lokid_install import CONFIG_DIR, MODEL_DIR, LokidSystem, curl, install, unit
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

SOCKET, RELAY = "loki-port@hot.socket", "loki-port@hot.service"
GATEWAY_SOCKET, GATEWAY = "loki-gateway.socket", "loki-gateway.service"
DAEMON = "lokid.service"
PAST_THE_LIMIT = 8   # systemd's default burst is 5 in 10 s


@pytest.fixture(scope="module")
def lk(systemd_container: Container, container_engine: str, models: Any
       ) -> Iterator[LokidSystem]:
    ct = systemd_container
    system = install(ct, container_engine, [models.llama], gateway=True)
    for name in (SOCKET, RELAY):
        system.track_unit(name)
    system.hot_port = system.preset(  # type: ignore[attr-defined]
        "hot", 'model = "llama.gguf"\n[serve]\non_demand = true\n', reload=False)
    system.gateway_port = free_port()  # type: ignore[attr-defined]
    ct.write_file(f"{CONFIG_DIR}/lokid.toml",
                  f"engine = {json.dumps(system.engine)}\n"
                  f"model_dirs = [{json.dumps(MODEL_DIR)}]\n"
                  f'[gateway]\nlisten = ["127.0.0.1:{system.gateway_port}"]\n')
    yield system
    ct.systemctl("stop", GATEWAY_SOCKET, GATEWAY, SOCKET, RELAY, check=False)
    ct.systemctl("stop", DAEMON, check=False)
    system.set_engine(system.engine)   # lokid.toml without [gateway] again
    system.cleanup()


def state(ct: Container, name: str) -> str:
    return ct.show(name, "ActiveState")["ActiveState"]


def port_answers(lk: LokidSystem) -> None:
    """The preset's own port answers /health (through the relay, from its engine)."""
    code = lk.health(lk.hot_port)  # type: ignore[attr-defined]
    assert code == 200, (code, state(lk.ct, SOCKET), state(lk.ct, RELAY),
                         lk.ct.systemctl("status", "--no-pager", SOCKET, RELAY,
                                         check=False).stdout[-3000:])


def gateway_answers(lk: LokidSystem) -> None:
    port = lk.gateway_port  # type: ignore[attr-defined]
    code, body = curl(lk.ct, f"http://127.0.0.1:{port}/health")
    assert code == 200, (code, body, state(lk.ct, GATEWAY_SOCKET), state(lk.ct, GATEWAY))


def test_swaps_and_restarts_past_systemds_default_limit_leave_every_port_answering(
        lk: LokidSystem) -> None:
    ct = lk.ct
    ct.systemctl("start", DAEMON)
    ct.systemctl("daemon-reload")
    ct.systemctl("start", "sockets.target")   # what boot does: the generator's links
    ct.wait_for(SOCKET, "active", timeout=30)
    ct.wait_for(GATEWAY_SOCKET, "active", timeout=30)
    cursor = ct.cursor()

    # a swap's path: the engine stopped, its relay with it; the next request starts both
    for _ in range(3):
        port_answers(lk)
        ct.systemctl("stop", unit("hot"), timeout=120)
        assert state(ct, RELAY) == "inactive"
    # the relay stopped as often as a busy group swaps it (the engine left running, so
    # that the starts come within systemd's 10 s): each next connection starts it again
    port_answers(lk)
    for _ in range(PAST_THE_LIMIT):
        ct.systemctl("stop", RELAY)
        port_answers(lk)
    # an operator restarting the sockets and the daemon while tuning
    for _ in range(PAST_THE_LIMIT):
        ct.systemctl("restart", SOCKET)
        port_answers(lk)
    for _ in range(PAST_THE_LIMIT):
        ct.systemctl("restart", GATEWAY_SOCKET)
        gateway_answers(lk)
    for _ in range(PAST_THE_LIMIT):
        ct.systemctl("restart", DAEMON, timeout=120)
    ct.wait_for(DAEMON, "active", timeout=60)
    # through the gateway too: it asks the (restarted) daemon, then relays
    code, reply = curl(ct, f"http://127.0.0.1:{lk.gateway_port}/v1/chat/completions",  # type: ignore[attr-defined]
                       {"model": "hot", "messages": [{"role": "user", "content": "Hi"}],
                        "max_tokens": 4, "temperature": 0})
    assert code == 200, reply

    for name in (SOCKET, RELAY, GATEWAY_SOCKET, DAEMON):
        assert state(ct, name) == "active", name
        assert ct.show(name, "Result")["Result"] == "success", name
    said = "".join(ct.journal(name, since_cursor=cursor)
                   for name in (SOCKET, RELAY, GATEWAY_SOCKET, GATEWAY, DAEMON))
    assert "start-limit-hit" not in said and "Start request repeated too quickly" not in said
    assert "Trigger limit hit" not in said
