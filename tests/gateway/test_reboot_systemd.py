"""A host rebooted while a client streams through its gateway (issue 30's operator walk:
``systemctl reboot`` of a host mid-use cut the streams in flight on it).

One booted Debian container on a bridge of the test's own (support.fleetkit), lokid
laid out as the package does, its gateway on the container's address with client keys,
a preset of a slow generated model (tens of tokens a second) started by hand. The
client is this test, on the host's end of the bridge: it streams 6,000 tokens, and
once the stream is under way the container is rebooted. A shutdown stops the gateway
and the engine at once; the gateway lets the stream end (its drain), and the engine's
stop waits for the gateway to be gone (lokid.core.launch.drainmark). Without that wait the
engine stopped first, and the client read "failed mid-answer" after a few events."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.fleetkit import FleetHost, fleet, headers
from support.models import write_slow_llama

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

TOKENS = 6000


@pytest.fixture
def host(tmp_path: Path) -> Iterator[FleetHost]:
    slow = write_slow_llama(tmp_path / "slow.gguf")
    with fleet(("a",), [str(slow)]) as hosts:
        a = hosts["a"]
        a.gateway([], {})
        a.system.write_preset_text("slow", 'port = 8091\nctx = 8192\nmodel = "slow.gguf"\n'
                                   'extra_args = ["-t", "1"]\n')
        a.ct.systemctl("start", "loki-engine@slow.service", timeout=180)
        yield a


def test_at_a_reboot_the_engine_is_not_stopped_under_the_gateways_stream(
        host: FleetHost) -> None:
    """What the engine's wait guarantees (lokid.core.launch.drainmark): the engine is stopped
    only once the gateway has stopped. Whether the stream then ends in full is printed,
    not asserted: alone it always did (12 runs), in two full `make test` runs the
    gateway ended it at once (a truncated event; the shutdown's console is printed),
    which is the gateway's own drain, not the engine's stop (issue 30's closing note)."""
    events: list[dict[str, Any]] = []
    under_way = threading.Event()
    failure: list[str] = []

    def client() -> None:
        try:
            with httpx.stream("POST", host.url + "/completion", headers=headers(),
                              timeout=120, json={"model": "slow", "prompt": "Once",
                                                 "n_predict": TOKENS, "ignore_eos": True,
                                                 "stream": True}) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        if len(events) == 5:
                            under_way.set()
        except Exception as e:   # the connection cut
            failure.append(f"{type(e).__name__}: {e}")
            under_way.set()

    reader = threading.Thread(target=client, daemon=True)
    reader.start()
    assert under_way.wait(120) and not failure, failure
    t0 = time.monotonic()
    before = len(events)
    host.ct.reboot(timeout=120)
    took = time.monotonic() - t0
    reader.join(60)
    whole = not failure and bool(events) and events[-1].get("stop") is True \
        and events[-1].get("tokens_predicted") == TOKENS
    print(f"reboot_systemd: rebooted in {took:.1f} s with a stream in flight, "
          f"{len(events) - before} of its {len(events)} events read after the reboot "
          f"began; {'read whole' if whole else f'cut: {failure or events[-1:]}'}")
    # the engine was not stopped under the stream: the gateway's relay did not lose it
    # ("failed mid-answer", what the client read without the wait)
    outcome = f"{failure or events[-1:]}"
    assert "failed mid-answer" not in outcome, \
        f"{outcome}\nthe shutdown's console:\n{host.ct.shutdown_console}"
