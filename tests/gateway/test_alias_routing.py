"""Names for clients (issue 46, item 5), through the real daemon (local runner), its bus,
the gateway and the real engine: a preset's aliases route to it and are listed as models
of their own; a clash costs the alias, never a preset, and is named; ``lokictl set``
edits the aliases and refuses a clash; each model's context length and capabilities come
from its plan and its generated GGUF, over D-Bus and in /v1/models."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import models as gen
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import gateway_on, until

from lokid.core.names import PRESET_INTERFACE, preset_object_path
from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TOOLS_TEMPLATE = gen.CHAT_TEMPLATE + "{% if tools %}{{ tools | tojson }}{% endif %}"


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    d = tmp_path / "gguf"
    d.mkdir()
    gen.write_llama(d / "llama.gguf")
    gen.write_llama_uses(d / "coder.gguf", fim=True, chat_template=TOOLS_TEMPLATE)
    gen.write_llama_uses(d / "bare.gguf", chat_template=False, context_length=3072)
    config = write_config(tmp_path, engine, [d])
    # qwen loses "shared" to coder (the first by name); embed loses "coder" (a name)
    write_preset(config, "qwen", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                 'aliases = ["gpt-4o-mini", "shared"]\n[serve]\non_demand = true\n')
    write_preset(config, "coder", f'model = "coder.gguf"\nctx = 1024\nport = {free_port()}\n'
                 'aliases = ["shared"]\n[serve]\non_demand = true\n')
    write_preset(config, "embed", f'model = "bare.gguf"\nctx = 1024\nport = {free_port()}\n'
                 'extra_args = ["--embedding"]\naliases = ["coder", "vectors"]\n'
                 "[serve]\non_demand = true\n")
    write_preset(config, "bare", f'model = "bare.gguf"\nctx = 0\nport = {free_port()}\n'
                 "[serve]\non_demand = true\n")
    return config


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 4, "temperature": 0}


def lokictl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", address, *args],
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


async def props(running: Running, name: str) -> dict[str, Any]:
    preset = await running.iface(preset_object_path(name), PRESET_INTERFACE)
    return {"aliases": await preset.get_aliases(),
            "capabilities": await preset.get_capabilities(),
            "context": await preset.get_context_length(),
            "notes": await preset.get_notes()}


async def listed(c: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    r = await c.get("/v1/models")
    assert r.status_code == 200, r.text
    return {m["id"]: m for m in r.json()["data"]}


async def test_aliases_capabilities_and_context_over_dbus(running: Running) -> None:
    qwen, coder = await props(running, "qwen"), await props(running, "coder")
    embed, bare = await props(running, "embed"), await props(running, "bare")
    assert (qwen["aliases"], coder["aliases"], embed["aliases"], bare["aliases"]) == (
        ["gpt-4o-mini"], ["shared"], ["vectors"], [])
    # the clash is named in the notes of the preset that lost the alias: both presets
    # and the name
    (lost,) = [n for n in qwen["notes"] if "not served" in n]
    assert "'shared'" in lost and "'qwen'" in lost and "'coder'" in lost, lost
    (lost,) = [n for n in embed["notes"] if "not served" in n]
    assert "'coder'" in lost and "name of preset 'coder'" in lost, lost
    assert not [n for n in coder["notes"] + bare["notes"] if "not served" in n]
    # no preset is broken for a clash
    manager = await running.iface("/org/lokid/Lokid1", "org.lokid.Lokid1.Manager")
    assert await manager.get_broken_presets() == {}
    assert qwen["capabilities"] == ["chat", "completion"] and qwen["context"] == 2048
    assert coder["capabilities"] == ["chat", "completion", "tools", "infill"]
    assert coder["context"] == 1024
    assert embed["capabilities"] == ["embeddings"] and embed["context"] == 1024
    # ctx = 0: the model's training context, from its GGUF
    assert bare["capabilities"] == ["completion"] and bare["context"] == 3072


async def test_a_chat_by_alias_is_answered_by_its_presets_engine(
        running: Running, gateway: Gateway, bus_address: str) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as c:  # type: ignore[attr-defined]
        models = await listed(c)
        assert set(models) == {"bare", "coder", "embed", "qwen", "gpt-4o-mini", "shared",
                               "vectors"}
        assert models["gpt-4o-mini"]["lokid"]["alias_of"] == "qwen"
        assert models["shared"]["lokid"]["alias_of"] == "coder"
        assert models["qwen"]["aliases"] == ["gpt-4o-mini"]
        assert "alias_of" not in models["qwen"]["lokid"]
        for name, can, ctx in (("qwen", ["chat", "completion"], 2048),
                               ("gpt-4o-mini", ["chat", "completion"], 2048),
                               ("coder", ["chat", "completion", "tools", "infill"], 1024),
                               ("embed", ["embeddings"], 1024), ("bare", ["completion"], 3072)):
            assert models[name]["lokid"]["capabilities"] == can, name
            assert models[name]["lokid"]["context_length"] == ctx, name
            assert {"id", "object", "created", "owned_by"} <= set(models[name]), name
        one = await c.get("/v1/models/gpt-4o-mini")
        assert one.status_code == 200 and one.json()["id"] == "gpt-4o-mini"
        assert one.json()["lokid"]["alias_of"] == "qwen"

        r = await c.post("/v1/chat/completions", json=chat("gpt-4o-mini"))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["role"] == "assistant"
        assert [e[0] for e in running.events if e[1] == "loading"] == ["qwen"]
        # ?model= names a preset by its alias too (a GET: the engine is ready now)
        r = await c.get("/props", params={"model": "gpt-4o-mini"})
        assert r.status_code == 200, r.text
        # the losing preset is still served by its name; a lost alias routes to the
        # preset that kept it
        assert (await c.post("/v1/chat/completions", json=chat("qwen"))).status_code == 200
        r = await c.post("/v1/chat/completions", json={**chat("shared"), "stream": False})
        assert r.status_code == 200, r.text
        assert [e[0] for e in running.events if e[1] == "loading"] == ["qwen", "coder"]
    async with gateway_on(bus_address, default_model="gpt-4o-mini") as other:
        async with httpx.AsyncClient(base_url=other.url, timeout=120) as c:  # type: ignore[attr-defined]
            body = chat("")
            del body["model"]
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text


async def test_lokictl_set_aliases_and_a_clash_refused(running: Running, gateway: Gateway,
                                                       bus_address: str,
                                                       tmp_path: Path) -> None:
    path = tmp_path / "config" / "presets" / "bare.toml"
    before = path.read_text()
    r = await asyncio.to_thread(lokictl, bus_address, "set", "bare", 'aliases=["gpt-4o-mini"]')
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "'gpt-4o-mini'" in r.stderr and "'bare'" in r.stderr and "'qwen'" in r.stderr
    assert path.read_text() == before
    r = await asyncio.to_thread(lokictl, bus_address, "set", "bare", 'aliases=["qwen"]')
    assert r.returncode == 2 and "the name of preset 'qwen'" in r.stderr, r.stderr
    r = await asyncio.to_thread(lokictl, bus_address, "set", "bare",
                                'aliases=["tiny", "small"]')
    assert r.returncode == 0, r.stderr
    assert (await props(running, "bare"))["aliases"] == ["tiny", "small"]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:  # type: ignore[attr-defined]
        async def shown() -> bool:
            models = await listed(c)
            return models.get("small", {}).get("lokid", {}).get("alias_of") == "bare"
        await until(shown, 10, "the new alias listed")
    r = await asyncio.to_thread(lokictl, bus_address, "unset", "bare", "aliases")
    assert r.returncode == 0, r.stderr
    assert (await props(running, "bare"))["aliases"] == []


async def test_a_keys_scope_matches_a_presets_name_or_any_alias(
        running: Running, bus_address: str, tmp_path: Path) -> None:
    from lokid.core.serve.keys import digest

    keys = tmp_path / "keys.toml"
    keys.write_text(f'[keys.mini]\nhash = "{digest("sk-mini")}"\nmodels = ["gpt-4o-mini"]\n'
                    f'[keys.coding]\nhash = "{digest("sk-coding")}"\nmodels = ["cod*"]\n')
    async with gateway_on(bus_address, keys_file=str(keys)) as gw:
        def as_key(key: str) -> httpx.AsyncClient:
            return httpx.AsyncClient(base_url=gw.url, timeout=60,  # type: ignore[attr-defined]
                                     headers={"Authorization": f"Bearer {key}"})

        async with as_key("sk-mini") as c:   # scoped to an alias: its preset by either name
            assert sorted(await listed(c)) == ["gpt-4o-mini", "qwen"]
            assert (await c.get("/v1/models/qwen")).status_code == 200
            r = await c.get("/v1/models/shared")
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        async with as_key("sk-coding") as c:   # scoped to a name: its aliases too
            assert sorted(await listed(c)) == ["coder", "shared"]
            for name in ("gpt-4o-mini", "qwen"):
                r = await c.post("/v1/chat/completions", json=chat(name))
                assert r.status_code == 404, r.text
                assert r.json()["error"]["code"] == "model_not_found"
    assert not [e for e in running.events if e[1] == "loading"]   # nothing was started
