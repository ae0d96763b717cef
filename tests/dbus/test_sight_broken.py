"""A broken on-demand preset waits for no request: a request is refused with its reason
(503), so its OnDemandState says nothing rather than "waiting for a request" (the
operator walk saw `lokictl presets` print both)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.daemonkit import daemon_on
from support.enginekit import free_port, write_config, write_preset

from lokid.core.names import PRESET_INTERFACE, preset_object_path


async def test_a_broken_on_demand_preset_is_not_waiting_for_a_request(
        tmp_path: Path, engine: str, models: Any, bus_address: str) -> None:
    config = write_config(tmp_path, engine, [models.dir])
    serve = f"port = {free_port()}\n[serve]\non_demand = true\n"
    write_preset(config, "good", f'model = "{Path(models.llama).name}"\n' + serve)
    write_preset(config, "broken", 'model = "absent.gguf"\n' + serve)
    async with daemon_on(config, tmp_path, bus_address) as running:
        good = await running.iface(preset_object_path("good"), PRESET_INTERFACE)
        broken = await running.iface(preset_object_path("broken"), PRESET_INTERFACE)
        assert await good.get_on_demand_state() == "waiting for a request"
        assert await broken.get_on_demand_state() == ""
        assert any("absent.gguf" in note for note in await broken.get_notes())
