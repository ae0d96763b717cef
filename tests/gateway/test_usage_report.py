"""The usage report when the daemon is away (issue 46, item 2): the real ``lokid daemon`` as
a process on a private bus, the real engine, the gateway in the test's event loop. Counts
made while the daemon is stopped stay in the gateway (the failure said once, however many
reports fail), and a new daemon on the same state gets them once: its ``Usage`` answer is
the sum of the timings the client read, to the token, nothing lost, nothing twice."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from dbus_fast import Variant
from dbus_fast.aio import MessageBus
from support.daemonproc import daemon_on_bus
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import gateway_on, until

from lokid.core.names import BUS_NAME, OBJECT_PATH

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"   # written on first use
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", f'model = "llama.gguf"\nport = {free_port()}\n'
                 '[serve]\non_demand = true\n')
    return config


async def usage_of(bus_address: str) -> dict[str, int]:
    bus = await MessageBus(bus_address=bus_address).connect()
    try:
        intro = await bus.introspect(BUS_NAME, OBJECT_PATH)
        usage = bus.get_proxy_object(BUS_NAME, OBJECT_PATH, intro).get_interface(
            BUS_NAME + ".Usage")
        rows = await usage.call_usage({"by": Variant("as", ["preset"]),   # type: ignore[attr-defined]
                                       "preset": Variant("s", "alpha")})
    finally:
        bus.disconnect()
    return {k: v.value for row in rows for k, v in row.items() if k != "preset"}


async def has(bus_address: str, n: int) -> bool:
    return (await usage_of(bus_address)).get("requests", 0) >= n


async def test_counts_kept_while_the_daemon_is_away(config: Path, tmp_path: Path,
                                                    bus_address: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "lokid.gateway")
    sums = {"requests": 0, "prompt_tokens": 0, "generated_tokens": 0}

    async def ask(c: httpx.AsyncClient, text: str) -> None:
        r = await c.post("/v1/chat/completions", json={
            "model": "alpha", "messages": [{"role": "user", "content": text}],
            "max_tokens": 7})
        assert r.status_code == 200, r.text
        t = r.json()["timings"]
        sums["requests"] += 1
        sums["prompt_tokens"] += t["prompt_n"] + t["cache_n"]
        sums["generated_tokens"] += t["predicted_n"]

    root = tmp_path / "daemon"
    root.mkdir()
    with contextlib.ExitStack() as daemon:
        daemon.enter_context(daemon_on_bus(config, root, bus_address))
        async with gateway_on(bus_address) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=120) as c:  # type: ignore[attr-defined]
                await ask(c, "First")   # its engine started on demand
                await until(lambda: has(bus_address, 1), 15, "the first count at the daemon")
                assert gw.report.task is not None
                gw.report.task.cancel()   # the reports are sent by hand from here
                await ask(c, "Second")
                await ask(c, "Third one")
            kept = {row: dict(counts) for row, counts in gw.usage.pending.items()}
            assert sum(counts["requests"] for counts in kept.values()) == 2
            daemon.close()   # the daemon stops (its engine with it, the local runner's)
            for _ in range(3):
                await gw.report.send_usage()
            assert gw.usage.pending == kept   # nothing lost, nothing sent
            said = [r.getMessage() for r in caplog.records
                    if "did not take the gateway's usage" in r.getMessage()]
            assert len(said) == 1, said   # said once, not per report
            (root / "notify").unlink()   # the first daemon's notify socket (left there)
            daemon.enter_context(daemon_on_bus(config, root, bus_address))   # same state
            await gw.report.send_usage()
            assert not gw.usage.pending
            assert any("takes the gateway's usage again" in r.getMessage()
                       for r in caplog.records)
            got = await usage_of(bus_address)
            assert {k: got.get(k, 0) for k in sums} == sums
