"""A GPU group's start while another member stops (lokid.dbus.groupstops, issue 31 item 2),
with the daemon's local runner on a private bus.

The stopped member's engine ignores SIGTERM (it is killed at the runner's stop timeout,
shortened here): the new member's start is asked the moment after the stop and goes on at
once (it is loading while the old engine still runs), but its engine is spawned only once
every process of the old one is gone: never two engines of a group at the same time. Its
step says how long it waited. A start of a preset outside the group waits for nothing."""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.daemonkit import daemon_on
from support.enginekit import alive, deaf_engine, free_port, write_config, write_preset

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH
from lokid.runners import local_runner

pytestmark = [pytest.mark.engine, pytest.mark.slow]

STOP_TIMEOUT = 1.5


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return int(r.status) == 200
    except OSError:
        return False


async def test_a_groups_start_overlaps_the_stop_and_its_engine_waits_for_it(
        tmp_path: Path, engine: str, models: Any, bus_address: str,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(local_runner, "STOP_TIMEOUT", STOP_TIMEOUT)
    monkeypatch.setenv("DEAF_PID", str(tmp_path / "deaf.pid"))
    config = write_config(tmp_path, str(deaf_engine(tmp_path, engine)), [models.dir])
    ports = {name: free_port() for name in ("alpha", "beta", "other")}
    for name, port in ports.items():
        group = '[serve]\ngroup = "gpu0"\n' if name != "other" else ""
        write_preset(config, name, f'model = "llama.gguf"\nctx = 2048\nport = {port}\n{group}')
    assert Path(models.llama).exists()
    async with daemon_on(config, tmp_path, bus_address) as running:
        manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        await manager.call_start_preset("alpha")
        await running.wait_event("alpha", "ready")
        assert running.daemon.runner is not None
        old = await running.daemon.runner.engine_pids("alpha")   # its step and its engine
        assert len(old) >= 2, old
        n = len(running.events)
        t0 = time.monotonic()
        await manager.call_stop_preset("alpha")
        await manager.call_start_preset("beta")
        await running.wait_event("beta", "loading", after=n, timeout=10)
        assert any(alive(pid) for pid in old), "the start was held until the stop ended"
        # never both: beta's engine answers only once every process of alpha's is gone
        # (its engine deaf to SIGTERM: killed at the stop's timeout)
        while any(alive(pid) for pid in old):
            assert not answers(ports["beta"]), "beta's engine runs beside alpha's"
            assert time.monotonic() - t0 < 60
            await asyncio.sleep(0.02)
        assert time.monotonic() - t0 >= STOP_TIMEOUT - 0.1
        await running.wait_event("beta", "ready", after=n, timeout=60)
        assert answers(ports["beta"])
        order = [(ev[0], ev[1]) for ev in running.events[n:]]
        assert order.index(("beta", "loading")) < order.index(("alpha", "inactive")), order
        # outside the group: started at once, beside beta
        m = len(running.events)
        await manager.call_start_preset("other")
        await running.wait_event("other", "ready", after=m, timeout=60)
        assert answers(ports["beta"]) and answers(ports["other"])
    said = [r.getMessage() for r in caplog.records]
    waited = [m for m in said if "ms for alpha to stop (its GPU group's swap)" in m]
    assert len(waited) == 1, said[-40:]
    ms = int(waited[0].split("waited ", 1)[1].split(" ms", 1)[0])
    assert ms >= (STOP_TIMEOUT - 0.5) * 1000, waited
    assert any("preset beta starts while alpha is stopping" in m for m in said)
    assert not any("for" in m and "to stop (its GPU group" in m and "other" in m for m in said)
    assert not (tmp_path / "run" / "beta.after").exists()
