"""What an operator sees of the presets served on demand (issue 22, item 6), with the real
daemon (local runner), the real engines and the real gateway on a private bus: the
on-demand states a request walks a stopped preset through, the group's holder, the
counters of cold starts, swaps and the gateway's requests in Stats and in the
Prometheus textfile, and "stopped when idle" after the idle stop.

``promtool check metrics`` is not run: promtool is not installed on this host (the
format is checked line by line in tests/watch instead)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import until

from lokid.core.names import BUS_NAME, PRESET_INTERFACE, preset_object_path
from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

IDLE = 3.0


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    (tmp_path / "metrics").mkdir()
    toml = config / "lokid.toml"
    toml.write_text(toml.read_text().replace(
        'metrics_textfile = ""', f'metrics_textfile = "{tmp_path / "metrics" / "lokid.prom"}"'))
    body = 'model = "llama.gguf"\nctx = 2048\nport = {}\n[serve]\non_demand = true\ngroup = "g"\n'
    write_preset(config, "lazy", body.format(free_port()))
    write_preset(config, "other", body.format(free_port()) + f'idle_stop = "{IDLE:g}s"\n')
    return config


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 4, "temperature": 0}


async def follow(running: Running, name: str, prop: str) -> list[Any]:
    """Every value PropertiesChanged says of ``prop`` of the preset, in order."""
    path = preset_object_path(name)
    intro = await running.client.introspect(BUS_NAME, path)
    props = running.client.get_proxy_object(BUS_NAME, path, intro).get_interface(
        "org.freedesktop.DBus.Properties")
    seen: list[Any] = []

    def changed(iface: str, values: dict[str, Any], _invalidated: list[str]) -> None:
        if iface == PRESET_INTERFACE and prop in values:
            seen.append(values[prop].value)
    props.on_properties_changed(changed)
    return seen


def stats(value: Any) -> dict[str, Any]:
    from lokid.host.buscall import plain

    return dict(plain(value))


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one series of the textfile (labels in the order written)."""
    pairs = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^{re.escape(name)}\{{{re.escape(pairs)}\}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def lokictl(address: str, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", address, *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r
    return r.stdout


async def test_a_request_walks_a_stopped_preset_through_its_states_and_is_counted(
        running: Running, gateway: Gateway, tmp_path: Path, bus_address: str) -> None:
    lazy = await running.iface(preset_object_path("lazy"), PRESET_INTERFACE)
    other = await running.iface(preset_object_path("other"), PRESET_INTERFACE)
    assert await lazy.get_on_demand_state() == "waiting for a request"
    assert await lazy.get_group_holder() == "" and await lazy.get_last_request_at() == 0.0
    states = await follow(running, "lazy", "OnDemandState")
    other_states = await follow(running, "other", "OnDemandState")
    prom = tmp_path / "metrics" / "lokid.prom"
    url = gateway.url  # type: ignore[attr-defined]

    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        asked = time.time()
        r = await c.post("/v1/chat/completions", json=chat("lazy"))
        assert r.status_code == 200, r.text
        answered = time.time()
        assert (await c.post("/v1/chat/completions", json=chat("nope"))).status_code == 404
        # the states the start passed through, in order, as PropertiesChanged said them
        await until(lambda: asyncio.sleep(0, "ready" in states), 5, "ready")
        assert states[:2] == ["starting for a request", "ready"], states
        assert await lazy.get_group_holder() == "lazy"
        assert await other.get_group_holder() == "lazy"   # who holds the group, from either
        # from the engine's own log lines, which the daemon may read after the reply left
        last = await until(lazy.get_last_request_at, 5, "a last request")
        assert asked <= last <= time.time()

        async def counted() -> dict[str, Any]:
            s = stats(await lazy.get_stats())
            return s if s.get("gateway_requests") else {}
        s = await until(counted, 5, "reported by the gateway")
        assert s["gateway_requests"] == {"200": 1}   # the 404 named no preset: not counted
        assert s["cold_starts"] == 1 and s["cold_start_waits"] == 1
        assert 0 < s["cold_start_wait_seconds"] <= answered - asked
        assert s["cold_start_last_wait_seconds"] == s["cold_start_wait_seconds"]

        async def written() -> str:
            text = prom.read_text() if prom.exists() else ""
            return text if "lokid_gateway_requests_total{" in text else ""
        text = await until(written, 20, "in the textfile")
        lazy_labels = {"preset": "lazy", "model": "llama.gguf"}
        assert sample(text, "lokid_cold_starts_total", **lazy_labels) == 1
        assert sample(text, "lokid_cold_start_wait_seconds_count", **lazy_labels) == 1
        assert sample(text, "lokid_cold_start_wait_seconds_sum", **lazy_labels) == \
            pytest.approx(s["cold_start_wait_seconds"], abs=0.001)
        assert sample(text, "lokid_gateway_requests_total", **lazy_labels, code="200") == 1
        assert "# TYPE lokid_cold_start_wait_seconds summary" in text

        # a request for the group's other preset: a swap (lazy stopped for it)
        r = await c.post("/v1/chat/completions", json=chat("other"))
        assert r.status_code == 200, r.text
        assert await other.get_group_holder() == "other"
        assert await lazy.get_on_demand_state() == "waiting for a request"   # not idle

        async def swapped() -> dict[str, Any]:
            s = stats(await other.get_stats())
            # the swap and the request may come in two reports (a second apart)
            return s if s.get("group_swaps") and s.get("gateway_requests") else {}
        s = await until(swapped, 5, "a swap and its request reported")
        assert s["group_swaps"] == 1 and s["cold_starts"] == 1
        assert s["gateway_requests"] == {"200": 1}
        assert stats(await lazy.get_stats())["group_swaps"] == 1   # the group's, on each

        async def swap_written() -> str:
            text = prom.read_text()
            return text if 'lokid_group_swaps_total{group="g"} 1' in text else ""
        await until(swap_written, 20, "the swap in the textfile")

        # what lokictl shows of it
        show = await asyncio.to_thread(lokictl, bus_address, "show", "other")
        assert "OnDemandState: ready" in show, show
        assert "GroupHolder: other (group g held by other)" in show, show
        assert "OnDemandCounters: 1 cold start (mean wait " in show, show
        assert "1 group swap, gateway: 200 x1" in show, show
        presets = await asyncio.to_thread(lokictl, bus_address, "presets")
        lazy_line = next(line for line in presets.splitlines() if line.startswith("lazy "))
        assert "(waiting for a request, last request " in lazy_line, presets
        assert "group g held by other)" in lazy_line, presets
        top = await asyncio.to_thread(lokictl, bus_address, "top", "--once")
        assert "inactive (waiting for a request)" in top, top

    # the idle stop of the preset that holds the group now
    await until(lambda: asyncio.sleep(0, "stopped when idle" in other_states), IDLE + 20,
                "stopped when idle")
    assert await other.get_on_demand_state() == "stopped when idle"
    assert await other.get_group_holder() == "" and await lazy.get_group_holder() == ""
    assert other_states[:2] == ["starting for a request", "ready"], other_states
