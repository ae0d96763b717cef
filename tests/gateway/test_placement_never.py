"""A preset that can never fit is learnt at the price of one eviction round, and its
clients are told why its starts failed (issue 45, item 13).

The real daemon (local runner), gateway and engine; the engine's wrapper limits its
address space (``ulimit -v``), so the KV cache of ``big`` (``ctx = 1000000``: 488 MiB)
can never be allocated, whatever the room (tests/gateway/test_placement_oom.py has the
one-engine case). ``[placement] host_memory = 2816M``; four other on-demand presets hold
1.1 GiB of it and are in use by clients between the requests for ``big``, as a team's
would be.

Before: each failed start raised big's need to what was free when it began plus an
eighth, so each next start evicted a few more idle engines (restarted meanwhile by their
clients) and failed again: in the walk, 4 failed starts and 11 evictions before the 503
``model_does_not_fit``, and the clients read the load's last progress line ("failed to
start: loading big (s.gguf): 0 s, 1 MiB resident"). Now a start that failed out of memory
has its need raised to all the device can hold: its next start evicts what it must once,
and a failure then makes it one that never fits; a start that had the whole device
already is one that never fits at once. The failed start's reply says it ran out of
memory, with the daemon's figures.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import until
from support.models import write_llama

from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SMALL = ("s1", "s2", "s3", "s4")


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"   # written on first use
    wrapper = tmp_path / "bin" / "llama-server"
    wrapper.parent.mkdir()
    # big's engine alone runs out of address space; the small ones serve a model of
    # 258 MiB that each holds resident (~290 MiB measured), four of them 1.1 GiB of the
    # host's 2.75 GiB: big's estimate (1.5 GiB) fits beside them
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" 1000000 "*) ulimit -v 600000 ;; esac\n'
                       f'exec {engine} "$@"\n')
    wrapper.chmod(0o755)
    (tmp_path / "fat").mkdir()
    write_llama(tmp_path / "fat" / "fat.gguf", n_layers=4, n_embd=1024, n_head=8,
                n_head_kv=8, n_ff=4096)
    config = write_config(tmp_path, str(wrapper), [models.dir, tmp_path / "fat"])
    toml = config / "lokid.toml"
    toml.write_text(toml.read_text() + '[placement]\nhost_memory = "2816M"\n')
    write_preset(config, "big", f'model = "llama.gguf"\nctx = 1000000\nport = {free_port()}\n'
                 'extra_args = ["-np", "1"]\n[serve]\non_demand = true\n')
    for name in SMALL:
        write_preset(config, name, f'model = "fat.gguf"\nctx = 512\nport = {free_port()}\n'
                     "[serve]\non_demand = true\n")
    return config


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def starts(running: Running, name: str) -> int:
    return sum(1 for ev in running.events if ev[0] == name and ev[1] == "loading"
               and "restarting" not in ev[2])


async def test_a_preset_that_never_fits_costs_one_eviction_round_and_says_why(
        running: Running, gateway: Gateway) -> None:
    answers: list[tuple[int, str, str]] = []
    async with httpx.AsyncClient(base_url=gateway.url, timeout=180) as c:  # type: ignore[attr-defined]
        for _ in range(6):
            for name in SMALL:   # the team's clients: each small preset in use again
                r = await c.post("/v1/chat/completions", json=chat(name))
                assert r.status_code == 200, r.text
            r = await c.post("/v1/chat/completions", json=chat("big"))
            error = r.json().get("error", {})
            answers.append((r.status_code, error.get("code", ""), error.get("message", "")))
            if error.get("code") == "model_does_not_fit":
                break

            async def settled() -> bool:   # its failure handled: stopped, record raised
                state = running.daemon.runner.state("big").state
                return state in ("inactive", "failed") and not running.daemon.telemetry \
                    .footprints.correcting.get("big")
            await until(settled, 60, "big's failed start settled")
    codes = [a[1] for a in answers]
    assert codes[-1] == "model_does_not_fit", answers
    assert set(codes[:-1]) == {"model_start_failed"}, answers
    # at most two starts: the estimate's, and the one with all the room
    assert starts(running, "big") <= 2, (starts(running, "big"), answers)
    # one eviction round: no small engine evicted twice for big
    evicted = Counter({p: n for (p, _), n in gateway.placer.evictions.items()})
    assert all(n <= 1 for n in evicted.values()), evicted
    # the clients were told it ran out of memory, with the daemon's figures
    for _, _, message in answers[:-1]:
        assert "out of memory" in message, answers
        assert "loading big" not in message, message
