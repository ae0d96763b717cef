"""Plans kept ready for cold starts (issue 22, item 8): the daemon writes the reuse
record of each preset that starts for requests, and that start runs it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from support.daemonkit import daemon_on
from support.enginekit import free_port, write_config, write_preset

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH
from lokid.store.plancache import AHEAD
from lokid.store.runtimedir import read_runtime_plan


async def _appears(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never written"
        await asyncio.sleep(0.1)


async def test_an_on_demand_start_runs_the_plan_the_daemon_kept_ready(
        tmp_path: Path, engine: str, models: Any, bus_address: str) -> None:
    config = write_config(tmp_path, engine, [models.dir])
    model = Path(models.llama).name
    write_preset(config, "lazy", f'model = "{model}"\nctx = 2048\nport = {free_port()}\n'
                 "[serve]\non_demand = true\n")
    write_preset(config, "steady", f'model = "{model}"\nctx = 2048\nport = {free_port()}\n')
    run = tmp_path / "run"
    async with daemon_on(config, tmp_path, bus_address) as running:
        # the files were written just now: the first try is inside the racy second,
        # the second one writes it
        await _appears(run / "lazy.reuse")
        assert not (run / "steady.reuse").exists()   # not a preset that starts for requests
        manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        job = await manager.call_start_preset("lazy")
        assert (await running.wait_job(job))[3:5] == ("done", "ready")
        plan = read_runtime_plan(str(run), "lazy")
        assert AHEAD in plan.notes, plan.notes
        assert "2048" in plan.argv
        job = await manager.call_stop_preset("lazy")
        await running.wait_job(job)

        # an edit: the old record no longer fits, and the daemon keeps a new one
        (run / "lazy.reuse").unlink()
        write_preset(config, "lazy", f'model = "{model}"\nctx = 1024\nport = {free_port()}\n'
                     "[serve]\non_demand = true\n")
        await _appears(run / "lazy.reuse")
        job = await manager.call_start_preset("lazy")
        assert (await running.wait_job(job))[3:5] == ("done", "ready")
        plan = read_runtime_plan(str(run), "lazy")
        assert AHEAD in plan.notes and "1024" in plan.argv, (plan.notes, plan.argv)
        job = await manager.call_stop_preset("lazy")
        await running.wait_job(job)
