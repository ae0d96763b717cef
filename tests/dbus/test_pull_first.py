"""A preset that names its model by a hub reference (issue 48): ``model =
"org/repo:Q4_K_M"``. The real daemon (local runner) on a private real dbus-daemon, the
real engine, the hub's stand-in (:mod:`support.hubstand`) serving real GGUF files.

Not pulled yet, the preset is no broken preset and ``lokid plan`` says a start pulls it;
a start pulls it (the engine step, :mod:`lokid.unit.pullfirst`) and the engine becomes
ready on it; a model pulled with its projector is planned with ``--mmproj``, as llama.cpp's
``-hf`` loads it; a pull that cannot succeed fails the start with the pull's reason, and
is not restarted. Under real systemd (the daemon's pull unit, the engine unit's STATUS=):
tests/packaging/test_pull_systemd.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import REPO
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset
from support.hubstand import hub_running
from support.models import write_llama

from lokid.core.model import pulled
from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH, preset_object_path

pytestmark = pytest.mark.engine


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    root = tmp_path / "hub"
    (root / "org" / "chat-GGUF").mkdir(parents=True)
    write_llama(root / "org" / "chat-GGUF" / "chat-Q4_K_M.gguf")
    vision = root / "org" / "vision-GGUF"
    vision.mkdir(parents=True)
    write_llama(vision / "vision-Q8_0.gguf")
    write_llama(vision / "mmproj-vision-F16.gguf", n_embd=32)
    with hub_running(root) as base:
        # the daemon's environment, which its local runner's engine steps inherit
        monkeypatch.setenv("HF_ENDPOINT", base)
        yield base


@pytest.fixture
def models(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def ports() -> dict[str, int]:
    return {"chat": free_port(), "vision": free_port(), "gone": free_port()}


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Path, ports: dict[str, int], hub: str) -> Path:
    config = write_config(tmp_path, engine, [models])
    write_preset(config, "chat", f'model = "org/chat-GGUF:Q4_K_M"\nport = {ports["chat"]}\n'
                 "ctx = 512\n")
    write_preset(config, "vision", f'model = "org/vision-GGUF"\nport = {ports["vision"]}\n')
    write_preset(config, "gone", f'model = "org/nothing-GGUF:Q4_K_M"\nport = {ports["gone"]}\n')
    return config


def lokid_plan(config: Path, tmp_path: Path, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lokid.cli", "--config-dir", str(config),
                           "plan", name], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO),
                               "LOKI_STATE_DIR": str(tmp_path / "state"),
                               "LOKI_RUNTIME_DIR": str(tmp_path / "run")})


async def test_a_start_pulls_the_model_first_and_the_engine_answers_on_it(
        running: Running, config: Path, models: Path, ports: dict[str, int],
        tmp_path: Path) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    broken = await manager.get_broken_presets()
    assert "chat" not in broken and "vision" not in broken, broken   # no fault of theirs
    plan = lokid_plan(config, tmp_path, "chat")
    assert plan.returncode != 0
    assert "org/chat-GGUF:Q4_K_M is not pulled yet: a start pulls it into " \
           f"{models} first" in plan.stderr, plan.stderr
    await manager.call_start_preset("chat")
    ev = await running.wait_event("chat", "ready", timeout=120)
    assert httpx.get(f"http://127.0.0.1:{ports['chat']}/health").status_code == 200, ev
    assert (models / "chat-Q4_K_M.gguf").is_file()
    assert pulled.find("org/chat-GGUF:Q4_K_M", (str(models),)) == (
        str(models), pulled.Pulled("org/chat-GGUF:Q4_K_M", "chat-Q4_K_M.gguf", None))
    preset = await running.iface(preset_object_path("chat"), "org.lokid.Lokid1.Preset")
    argv = await preset.get_running_argv()
    assert str(models / "chat-Q4_K_M.gguf") in argv
    # planned now as any preset: lokid plan shows the command line
    plan = lokid_plan(config, tmp_path, "chat")
    assert plan.returncode == 0 and str(models / "chat-Q4_K_M.gguf") in plan.stdout, plan
    await manager.call_stop_preset("chat")
    await running.wait_event("chat", "inactive")


async def test_the_gateway_learns_where_a_pulled_model_s_engine_answers(
        running: Running, ports: dict[str, int]) -> None:
    """The gateway's own mirror of the presets (lokid.gateway.presets, on the bus as the
    gateway is) sees the engine ready *with its URL*: the preset had no plan, so no
    address, until its pull ended, and the daemon said the URL only with the engine's
    figures; a ready engine that logged nothing more left the README's first request
    waiting for an address until it gave up (issue 49, under real systemd)."""
    from lokid.gateway.presets import Presets

    seen = Presets(running.client)
    await seen.attach()
    assert not seen.presets["chat"].url   # not pulled: nowhere to answer yet
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    await manager.call_start_preset("chat")
    await running.wait_event("chat", "ready", timeout=120)
    deadline = asyncio.get_running_loop().time() + 10
    chat = seen.presets["chat"]
    while not (chat.state == "ready" and chat.url) and \
            asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert (chat.state, chat.url) == ("ready", f"http://127.0.0.1:{ports['chat']}")
    await manager.call_stop_preset("chat")
    await running.wait_event("chat", "inactive")


async def test_a_model_pulled_with_its_projector_is_planned_with_it(
        running: Running, config: Path, models: Path, tmp_path: Path, hub: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lokid.cli", "--config-dir", str(config), "pull-worker",
        "--dir", str(models), "--", "org/vision-GGUF", env={**os.environ,
                                                            "PYTHONPATH": str(REPO)})
    assert await asyncio.wait_for(proc.wait(), 120) == 0
    plan = lokid_plan(config, tmp_path, "vision")
    assert plan.returncode == 0, plan.stderr
    assert f"--mmproj {models / 'mmproj-vision-F16.gguf'}" in plan.stdout, plan.stdout
    assert str(models / "vision-Q8_0.gguf") in plan.stdout
    # the projector deleted by hand: planned without it, never with a missing file
    (models / "mmproj-vision-F16.gguf").unlink()
    plan = lokid_plan(config, tmp_path, "vision")
    assert plan.returncode == 0 and "--mmproj" not in plan.stdout, plan.stdout


async def test_a_pull_that_cannot_succeed_fails_the_start_with_its_reason(
        running: Running, models: Path) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    seen = len(running.events)
    await manager.call_start_preset("gone")
    ev = await running.wait_event("gone", "failed", timeout=120, after=seen)
    preset: Any = await running.iface(preset_object_path("gone"), "org.lokid.Lokid1.Preset")
    status = await preset.get_status()
    assert "org/nothing-GGUF" in status and "no such repository" in status, (ev, status)
    await asyncio.sleep(1.5)   # exit 78: not restarted (the local runner's RestartSec is 1 s)
    assert [e[1] for e in running.events[seen:] if e[0] == "gone"].count("loading") == 1
    assert list(models.iterdir()) == []
