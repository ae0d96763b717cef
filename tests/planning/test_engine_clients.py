"""What clients of a preset see, against the real llama-server b11434: the preset's name as
the model, and the preset's ``[chat]`` values as the engine's defaults.

The engine runs with the plan's own argv (``make_plan``, as ``lokid prestart`` plans it)
on the generated tiny llama (tests/support/models.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, running, write_config, write_preset

from lokid.planning.gather import make_plan

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_clients_see_the_preset_name_and_its_chat_defaults(tmp_path: Path, engine: str,
                                                           models: Any) -> None:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "house-chat", f'model = "{Path(models.llama).name}"\nctx = 2048\n'
                 f'port = {free_port()}\n[chat]\ntemperature = 0.3\ntop_p = 0.9\n'
                 'top_k = 7\nmin_p = 0.02\nreasoning_effort = "low"\n')
    plan = make_plan(str(config), "house-chat", environ={})
    assert "--alias" in plan.argv and "--temp" in plan.argv
    with running(plan.argv, tmp_path / "engine.log", plan.env) as eng:
        listed = httpx.get(eng.url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in listed["data"]] == ["house-chat"]
        params = httpx.get(eng.url + "/props", timeout=10).json()[
            "default_generation_settings"]["params"]
        # The engine keeps them as 32-bit floats.
        assert params["temperature"] == pytest.approx(0.3)
        assert params["top_p"] == pytest.approx(0.9)
        assert params["min_p"] == pytest.approx(0.02)
        assert params["top_k"] == 7
        # Replies name the preset too; a client's own "model" field is still accepted
        # (the benchmark sends "lokid-bench").
        reply = httpx.post(eng.url + "/v1/chat/completions", timeout=60, json={
            "model": "lokid-bench", "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hello"}]})
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == "house-chat"

