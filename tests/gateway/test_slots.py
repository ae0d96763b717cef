"""A GPU group's swap keeps the users' caches (issue 22, item 7), with the real engines
the daemon's local runner starts on a private bus: two on-demand presets in one group.

A long prompt to alpha, a request to beta (alpha swapped out), the same long prompt to
alpha again (beta swapped out, alpha back): the engine evaluates only the prompt's last
tokens, its slot restored from the file saved before alpha's stop. The same round with
the restore left out (the gateway's record of it dropped) evaluates the whole prompt
again: the restore, not some other cache, is what saved the prefill."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import write_config, write_preset
from test_groups import alpha_running

from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# The byte tokenizer: one token a character. Long enough that a cold prefill stands out.
LONG = "".join(f"turn {i}: the user asks, the model answers at length. " for i in range(48))


@pytest.fixture(params=["open", "keyed"])
def config(request: pytest.FixtureRequest, tmp_path: Path, engine: str, models: Any,
           ports: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> Path:
    """The two presets; "keyed": each engine with its own API key (api_key_file), which
    the gateway must send to the slot endpoints too. The gateway reads the slot files'
    sizes where the daemon's engines list them (their runtime directory)."""
    monkeypatch.setenv("LOKI_RUNTIME_DIR", str(tmp_path / "run"))
    assert Path(models.llama).name == "llama.gguf"   # written on first use
    config = write_config(tmp_path, engine, [models.dir])
    key = ""
    if request.param == "keyed":
        (tmp_path / "engine.key").write_text("sk-engine-only\n")
        (tmp_path / "engine.key").chmod(0o600)
        key = f'api_key_file = "{tmp_path / "engine.key"}"\n'
    for name, port in ports.items():
        write_preset(config, name, f'model = "llama.gguf"\nctx = 8192\nport = {port}\n{key}'
                     'extra_args = ["-np", "2"]\n'
                     '[serve]\non_demand = true\ngroup = "gpu0"\ndrain = "2min"\n')
    return config


async def prompt_n(c: httpx.AsyncClient, model: str, prompt: str) -> tuple[int, int]:
    r = await c.post("/completion", json={"model": model, "prompt": prompt, "n_predict": 2,
                                          "temperature": 0, "cache_prompt": True})
    assert r.status_code == 200, r.text
    timings = r.json()["timings"]
    return int(timings["prompt_n"]), int(timings.get("cache_n", 0))


async def test_a_swap_back_restores_the_slots_and_skips_the_prefill(
        running: Running, gateway: Gateway, tmp_path: Path) -> None:
    await alpha_running(running, gateway)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as c:  # type: ignore[attr-defined]
        cold, _ = await prompt_n(c, "alpha", LONG)
        assert cold >= len(LONG) - 8   # every token of it evaluated once

        assert (await prompt_n(c, "beta", "Hi"))[0] > 0   # alpha swapped out
        assert running.daemon.engine_state("alpha").state == "inactive"
        warm, cached = await prompt_n(c, "alpha", LONG)   # beta swapped out, alpha back
        assert gateway.groups.groups["gpu0"].swaps == 2
        assert warm <= 8 and cached >= len(LONG) - 8, (warm, cached)

        slots = gateway.groups.slots
        # the engine wrote the file where the plan told it to (the state directory)
        saved = os.listdir(tmp_path / "state" / "slots" / "alpha")
        assert slots.saved["alpha"] and {n for n, _ in slots.saved["alpha"].values()} <= set(saved)

        # the same round without the restore: the whole prompt evaluated again
        assert (await prompt_n(c, "beta", "Hi"))[0] > 0
        assert "alpha" in slots.pending
        slots.pending.discard("alpha")
        again, _ = await prompt_n(c, "alpha", LONG)
        assert again >= len(LONG) - 8, again
    print(f"\nprompt tokens evaluated after a swap back: {warm} restored, {again} without "
          f"(first request {cold})")
