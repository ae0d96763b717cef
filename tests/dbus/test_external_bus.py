"""External presets on the real daemon (local runner, a private real dbus-daemon): listed
with Kind, Url, UpstreamModel and KeyFile; never broken; StartPreset, StopPreset,
RestartPreset, UnloadPreset (issue 28, item 17), Plan and Bench refused with the reason
(Bench with the seed's); Reachable as the daemon sees a real HTTP server answer (401
included) or nothing answer, and announced; `lokid plan` and `lokid bench` say the same
(issue 22, item 5)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import DBusError
from support.daemonkit import Running, daemon_on
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import app_on_loopback

from lokid.core.config.external import BENCH_REFUSAL
from lokid.core.errors import ENGINE_FAILED
from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH, PRESET_INTERFACE
from lokid.core.names import preset_object_path as path_of


@pytest.fixture
async def api() -> AsyncIterator[str]:
    """A real HTTP server that answers the model list with 401, as a keyed API does."""
    from aiohttp import web

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"error": "key?"}, status=401)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    async with app_on_loopback(app) as url:
        yield f"{url}/v1"


@pytest.fixture
def config(tmp_path: Path, api: str) -> Path:
    config = write_config(tmp_path, "/nonexistent/llama-server", [tmp_path])
    write_preset(config, "remote", f'kind = "external"\nurl = "{api}"\nupstream_model = "big"\n'
                 'api_key_file = "/etc/loki/keys/remote.key"\n')
    write_preset(config, "gone", f'kind = "external"\nurl = "http://127.0.0.1:{free_port()}/v1"\n')
    return config


async def until(check: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_an_external_preset_is_listed_never_started_and_its_reach_is_seen(
        config: Path, tmp_path: Path, bus_address: str, api: str) -> None:
    async with daemon_on(config, tmp_path, bus_address) as running:
        m = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        assert sorted(await m.get_presets()) == [path_of("gone"), path_of("remote")]
        assert await m.get_broken_presets() == {}
        remote = await running.iface(path_of("remote"), PRESET_INTERFACE)
        assert await remote.get_kind() == "external"
        assert await remote.get_url() == api
        assert await remote.get_upstream_model() == "big"
        assert await remote.get_key_file() == "/etc/loki/keys/remote.key"
        assert (await remote.get_notes())[0].startswith(f"external API at {api}: nothing runs")
        for verb in ("start_preset", "stop_preset", "restart_preset", "unload_preset"):
            with pytest.raises(DBusError) as refused:
                await getattr(m, f"call_{verb}")("remote")
            assert refused.value.type == ENGINE_FAILED
            assert refused.value.text == (f"preset 'remote' is an external API at {api}: "
                                          "nothing runs here (the gateway relays its requests "
                                          "there)")
        with pytest.raises(DBusError) as refused:
            await m.call_bench("remote", "quick", 0, 0)
        assert (refused.value.type, refused.value.text) == (ENGINE_FAILED, BENCH_REFUSAL)
        with pytest.raises(DBusError, match="nothing runs here"):
            await remote.call_plan()
        assert running.daemon.runner is not None
        assert running.daemon.runner.state("remote").state == "inactive"
        # Reachable: checked at the load; a 401 still answers
        async def seen() -> bool:
            return str(await remote.get_reachable()).startswith("reachable")

        await until(seen)
        assert await remote.get_reachable() == f"reachable (GET {api}/models: HTTP 401)"
        gone = await running.iface(path_of("gone"), PRESET_INTERFACE)

        async def down() -> bool:
            return str(await gone.get_reachable()).startswith("unreachable")

        await until(down)


async def test_a_reachability_change_is_announced(config: Path, tmp_path: Path,
                                                  bus_address: str) -> None:
    """The API goes away and comes back: PropertiesChanged carries each change (at most
    one check per 30 s while someone reads: here the period is shortened)."""
    from lokid.dbus import reach

    async with daemon_on(config, tmp_path, bus_address) as running:
        running_check = reach.CHECK_EVERY
        reach.CHECK_EVERY = 0.2
        try:
            await announced(running)
        finally:
            reach.CHECK_EVERY = running_check


async def announced(running: Running) -> None:
    gone = await running.iface(path_of("gone"), PRESET_INTERFACE)
    props = await running.iface(path_of("gone"), "org.freedesktop.DBus.Properties")
    changes: list[str] = []
    props.on_properties_changed(
        lambda _i, c, _x: changes.append(c["Reachable"].value) if "Reachable" in c else None)

    async def down() -> bool:
        return str(await gone.get_reachable()).startswith("unreachable")

    await until(down)
    url = await gone.get_url()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    from aiohttp import web

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": []})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    async with app_on_loopback(app, port):
        async def up() -> bool:
            return str(await gone.get_reachable()).startswith("reachable")

        await until(up)
        await until(lambda: _true(any(c.startswith("reachable") for c in changes)))
        assert changes[-1] == f"reachable (GET {url}/models: HTTP 200)"
    # a read once the last result is due for a check: that result, with its age
    await asyncio.sleep(0.3)
    stale = str(await gone.get_reachable())
    assert stale.startswith(f"reachable (GET {url}/models: HTTP 200), checked "), stale
    assert stale.endswith("ago: checking again"), stale
    await until(down)


async def _true(value: bool) -> bool:
    return value


def test_lokid_plan_and_bench_say_what_an_external_preset_is(config: Path) -> None:
    env = {"LOKI_STATE_DIR": str(config.parent / "state"),
           "LOKI_RUNTIME_DIR": str(config.parent / "run"), "PATH": "/usr/bin:/bin"}

    def lokid(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lokid.cli", "--config-dir", str(config),
                               *args], capture_output=True, text=True, check=False,
                              env=env, timeout=60)

    r = lokid("plan", "remote")
    assert r.returncode == 0, r.stderr
    assert "external API at http://127.0.0.1:" in r.stdout and "nothing runs here" in r.stdout
    r = lokid("bench", "remote")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert f"remote: {BENCH_REFUSAL}" in r.stderr
