"""The benchmark's side slot and repeated runs against the real llama-server b11434.

Every engine here runs with ``--cache-ram 0``: with the engine's RAM prompt cache (on by
default) a conversation evicted from its slot is restored from RAM when it comes back
(measured: 1285 of 1286 tokens, one slot), which would hide whether the benchmark left
the slot alone. Without it, what the slot holds is all the engine has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonproc import daemon_on_bus
from support.enginekit import free_port, running, write_config, write_preset

from lokid.bench import protocol
from lokid.core import errors
from lokid.core.bench import rules as benchrules
from lokid.planning.gather import make_plan
from lokid.store.state import StateDB

pytestmark = [pytest.mark.engine, pytest.mark.slow]

CONVERSATION = "A user's long conversation about foxes and dogs, kept in cache. " * 16
QUICK = protocol.Options(benchrules.QUICK, prompt=300, predict=8)


@contextmanager
def engine_with(tmp_path: Path, engine: str, model: str, *args: str) -> Iterator[str]:
    port = free_port()
    argv = [engine, "-m", model, "-c", "4096", "--host", "127.0.0.1", "--port", str(port),
            "--cache-ram", "0", *args]
    with running(argv, tmp_path / "engine.log") as eng:
        yield eng.url


def converse(url: str, slot: int | None = None) -> dict[str, Any]:
    """The conversation's request (cache_prompt on, as a chat client sends it): its
    timings, where prompt_n is what the engine computed and cache_n what it reused."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": CONVERSATION}],
                            "max_tokens": 4, "temperature": 0, "cache_prompt": True}
    if slot is not None:
        body["id_slot"] = slot
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    t: dict[str, Any] = r.json()["timings"]
    return t


def slots(url: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = httpx.get(url + "/slots", timeout=10).json()
    return out


async def bench(url: str, opts: protocol.Options = QUICK) -> benchrules.Result:
    async with httpx.AsyncClient() as client:
        return await protocol.run(protocol.Engine(url, client), opts, protocol.Setup())


@contextmanager
def busy(url: str, slot: int) -> Iterator[None]:
    """Slot ``slot`` generating (a streamed completion) until the block ends."""
    stop = threading.Event()

    def generate() -> None:
        with httpx.stream("POST", url + "/completion", timeout=120, json={
                "prompt": "Count on and on:", "n_predict": 1500, "ignore_eos": True,
                "stream": True, "id_slot": slot}) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    return

    t = threading.Thread(target=generate, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not slots(url)[slot]["is_processing"]:
        assert time.monotonic() < deadline, "the slot never started"
        time.sleep(0.02)
    try:
        yield
    finally:
        stop.set()
        t.join(30)


async def test_a_conversation_in_slot_0_keeps_its_cache_through_a_bench(
        tmp_path: Path, engine: str, models: Any) -> None:
    (tmp_path / "slots").mkdir()
    with engine_with(tmp_path, engine, models.llama, "--parallel", "2",
                     "--slot-save-path", str(tmp_path / "slots")) as url:
        first = converse(url, slot=0)
        assert first["cache_n"] == 0 and first["prompt_n"] > 900, first
        r = await bench(url)
        again = converse(url, slot=0)
        # the whole conversation came from cache: one token computed (the engine always
        # evaluates at least one), not the ~1000 of the first time
        assert again["prompt_n"] <= 2 and again["cache_n"] >= first["prompt_n"] - 2, again
        assert (r.slot, r.slots) == (1, 2) and r.savable
        assert r.slot_note == ("ran in slot 1 of 2, which held no prompt: the conversations' "
                               "caches kept; erased after")
        assert slots(url)[1]["n_prompt_tokens"] == 0  # the bench's prompt erased


async def test_a_fresh_engine_s_first_conversation_sits_in_the_last_slot_and_keeps_it(
        tmp_path: Path, engine: str, models: Any) -> None:
    """An unpinned conversation on a fresh engine lands in the LAST slot (its LRU ties):
    the benchmark takes the empty one. No --slot-save-path: the erase is refused, and said."""
    with engine_with(tmp_path, engine, models.llama, "--parallel", "2") as url:
        first = converse(url)
        assert [s.get("n_prompt_tokens", 0) > 0 for s in slots(url)] == [False, True]
        r = await bench(url)
        again = converse(url)
        assert again["prompt_n"] <= 2 and again["cache_n"] >= first["prompt_n"] - 2, again
        assert r.slot == 0 and r.savable
        assert r.slot_note.endswith("the engine refuses slot actions (start it with "
                                    "--slot-save-path to let the benchmark erase its slot)")


async def test_with_one_slot_the_report_says_the_cache_was_taken(
        tmp_path: Path, engine: str, models: Any) -> None:
    with engine_with(tmp_path, engine, models.llama, "--parallel", "1") as url:
        first = converse(url)
        r = await bench(url)
        again = converse(url)
        # the bench's prompts replaced it: computed again but the template's first tokens
        assert again["prompt_n"] >= first["prompt_n"] - 50 and again["cache_n"] < 50, again
        assert r.slot is None and r.slots == 1
        assert r.slot_note.startswith("one slot: the benchmark ran in the conversations' slot "
                                      f"and took its cached prompt ({first['prompt_n'] + 3} "
                                      "tokens;"), r.slot_note
        assert f"  Slot       {r.slot_note}" in benchrules.report(r)


async def test_the_busy_check_looks_at_the_bench_slot_only(
        tmp_path: Path, engine: str, models: Any) -> None:
    with engine_with(tmp_path, engine, models.llama, "--parallel", "2") as url:
        with busy(url, 0):
            r = await bench(url)
        assert r.slot == 1 and r.prompt_n > 0
        assert benchrules.not_saved_reason(r) == ("slot 0 served a request when the benchmark "
                                                  "started: the figures shared the engine "
                                                  "with it")
        with busy(url, 0), busy(url, 1), pytest.raises(errors.EngineBusyError,
                                                       match="already serving a request"):
            await bench(url)


def test_lokid_bench_repeat_keeps_medians_and_spreads(tmp_path: Path, engine: str,
                                                      models: Any) -> None:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "r", f'model = "{models.llama}"\nctx = 4096\nport = {free_port()}\n'
                 'extra_args = ["--parallel", "2", "--cache-ram", "0"]\n')
    env = {**os.environ, "LOKI_STATE_DIR": str(tmp_path / "state")}

    def lokid(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lokid", "--config-dir", str(config),
                               "bench", "r", "--prompt", "300", "--predict", "8", *args],
                              capture_output=True, text=True, timeout=300, env=env)

    for bad in ("0", "21", "x"):
        r = lokid("--repeat", bad)
        assert r.returncode == 2 and f"argument --repeat: '{bad}' is not a count of 1 to 20" \
            in r.stderr, r.stderr
    plan = make_plan(str(config), "r")
    with running(plan.argv, tmp_path / "engine.log"):
        r = lokid("--repeat", "3", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        res = out["result"]
        assert out["saved"] and res["repeat"] == 3 and len(res["runs"]) == 3
        assert res["slot"] == 1 and res["slots"] == 2
        for key in ("prompt_per_second", "predicted_per_second"):
            s = res["stats"][key]
            assert s["low"] <= s["median"] <= s["high"] and s["spread"] >= 0
            assert res[key] == s["median"]
            assert sorted(run[key] for run in res["runs"])[1] == s["median"]
        with StateDB(env["LOKI_STATE_DIR"]) as db:
            saved = db.bench("r", fingerprint=out["fingerprint"])
        assert saved is not None and saved.result["stats"] == res["stats"]
        assert saved.result["runs"] == res["runs"] and saved.result["repeat"] == 3
        r = lokid("--repeat", "2")
        assert r.returncode == 0, r.stderr
        assert "short line (300 + 8 tokens), run 2/2" in r.stderr
        # the first bench's prompt is still in slot 1 (no --slot-save-path, no erase): the
        # empty slot 0 is taken now
        assert "[median of 2: spread" in r.stdout and "  Slot       ran in slot 0 of 2" \
            in r.stdout
        single = json.loads(lokid("--json").stdout)["result"]
        assert not {"repeat", "stats", "runs"} & set(single)


def test_lokictl_bench_repeat_through_the_daemon(tmp_path: Path, engine: str, models: Any,
                                                 bus_address: str) -> None:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "tiny", f'model = "{Path(models.llama).name}"\nctx = 4096\n'
                 f'port = {free_port()}\nextra_args = ["--parallel", "2"]\n')

    def lokictl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", bus_address,
                               *args], capture_output=True, text=True, timeout=300)

    with daemon_on_bus(config, tmp_path, bus_address):
        r = lokictl("bench", "tiny", "--repeat", "21")
        assert r.returncode == 2 and "--repeat: 1 to 20" in r.stderr, r.stderr
        assert lokictl("start", "tiny", "--wait").returncode == 0
        try:
            r = lokictl("bench", "tiny", "--prompt", "300", "--predict", "8", "--repeat", "2",
                        "--json")
            assert r.returncode == 0, r.stderr
            res = json.loads(r.stdout)["result"]
            assert res["repeat"] == 2 and len(res["runs"]) == 2 and res["slot"] == 1
            assert set(res["stats"]) >= {"prompt_per_second", "predicted_per_second"}
            show = json.loads(lokictl("show", "tiny", "--json").stdout)
            assert show["LastBench"]["result"]["stats"] == res["stats"]
            r = lokictl("bench", "tiny", "--prompt", "300", "--predict", "8", "--repeat", "2")
            assert r.returncode == 0 and r.stdout.startswith("tiny: quick benchmark at "), r
            assert "(300 + 8 tokens), run 2/2" in r.stderr and "[median of 2: " in r.stdout
        finally:
            lokictl("stop", "tiny", "--wait")
