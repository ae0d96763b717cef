"""lokid.bench.protocol against the real llama-server, and its failure cases
against a small fake engine written for them.

The real engine serves the generated tiny llama with lokid's own plan: quick mode,
and full mode at a 16k context (the smallest round size where depth fits: 7648 tokens
of depth and three turns), with the n-gram drafter so draft acceptance is read for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, running, write_config, write_preset

from lokid.bench import measure, protocol
from lokid.core import errors
from lokid.core.bench import rules as benchrules
from lokid.core.bench.iosample import IOSample
from lokid.planning.gather import make_plan
from lokid.store.state import StateDB


async def run_against(url: str, opts: protocol.Options, setup: protocol.Setup | None = None,
                      budget: float = benchrules.REQUEST_BUDGET, **kw: Any) -> benchrules.Result:
    async with httpx.AsyncClient() as client:
        return await protocol.run(protocol.Engine(url, client, budget), opts,
                               setup or protocol.Setup(), **kw)


class Served:
    def __init__(self, url: str, config: Path, root: Path):
        self.url, self.config, self.root = url, config, root


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine: str, models: Any
           ) -> Iterator[Served]:
    """Preset "b" running (its plan's command line, as `lokid run b` starts it)."""
    root = tmp_path_factory.mktemp("bench")
    config = write_config(root, engine, [models.dir])
    # one slot: with the engine's default of several, each conversation gets a share
    # of the context (/props says so), and the depth is computed on that share
    write_preset(config, "b", f'model = "{models.llama_long}"\nctx = 16384\n'
                 f'port = {free_port()}\nextra_args = ["--parallel", "1"]\n'
                 '[spec]\nmode = "ngram"\n')
    plan = make_plan(str(config), "b")
    with running(plan.argv, root / "engine.log") as eng:
        yield Served(eng.url, config, root)


@pytest.fixture
def ngram_engine(served: Served) -> str:
    return served.url


@pytest.mark.engine
@pytest.mark.slow
async def test_quick_mode_on_the_real_engine(ngram_engine: str) -> None:
    phases: list[tuple[str, int, int]] = []
    # Greedy, as a preset's sampling may ask: the random tiny model then falls into loops
    # that the n-gram drafter predicts, so drafts happen for real.
    setup = protocol.Setup(sampling={"temperature": 0})
    opts = protocol.Options(benchrules.QUICK, prompt=1000, predict=300)
    r = await run_against(ngram_engine, opts, setup, progress=lambda *p: phases.append(p))
    assert [p[1:] for p in phases] == [(1, 2), (2, 2)]
    assert phases[1][0] == "short line (1000 + 300 tokens)"
    # about the size asked: the prose is cut at a line end (the seed's rule), and the
    # template and the instruction come on top
    assert 700 <= r.prompt_n <= 1200, r
    assert 0 < r.predicted_n <= 300 and r.predicted_per_second > 0 and r.prompt_per_second > 0
    assert r.engine.startswith("b11434") and r.depth is None and r.savable
    assert r.draft is not None and 0 < r.draft.accepted <= r.draft.n, r.draft


@pytest.mark.engine
@pytest.mark.slow
async def test_full_mode_on_the_real_engine(ngram_engine: str) -> None:
    phases: list[str] = []
    r = await run_against(ngram_engine, protocol.Options(benchrules.FULL, prompt=500, predict=32),
                          progress=lambda name, step, steps: phases.append(name))
    d = r.depth
    assert d is not None and not d.skipped, d
    assert d.ctx == 16384 and d.target == 7648
    assert phases[2] == "cold prefill at depth (7648 tokens)"
    # about the depth asked: the code is cut at a line end, the ratio is a sample's
    assert d.cold is not None and 0.85 * 7648 <= d.cold.new <= 1.1 * 7648, d.cold.new
    assert len(d.turns) == benchrules.TURNS and not d.partial, d.partial
    for t in d.turns:
        # each turn computes only what is new: the conversation so far comes from cache
        assert t.cached is not None and t.cached > 0 and t.new < t.expected, t
    assert d.reuse is not None and d.reuse > 0.9, (d.reuse, d.reuse_note)
    assert d.cached_per_second and d.decode_per_second
    assert r.savable
    text = "\n".join(benchrules.report(r))
    assert "Prefill@D" in text and "Cache reuse" in text


@pytest.mark.engine
@pytest.mark.slow
def test_lokid_bench_measures_a_running_preset_and_saves_the_result(served: Served,
                                                                     tmp_path: Path) -> None:
    env = {**os.environ, "LOKI_STATE_DIR": str(tmp_path / "state")}
    r = subprocess.run([sys.executable, "-m", "lokid", "--config-dir", str(served.config),
                        "bench", "b", "--prompt", "300", "--predict", "16", "--json"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["saved"] and out["url"] == served.url and out["result"]["protocol"] == 2
    plan, inputs = measure.planned(str(served.config), str(tmp_path / "state"), "b")
    assert out["fingerprint"] == benchrules.bench_fingerprint(plan, inputs)
    with StateDB(str(tmp_path / "state")) as db:
        saved = db.bench("b", fingerprint=out["fingerprint"])
    assert saved is not None and saved.model == "llama-long.gguf"
    assert saved.result["prompt_per_second"] == out["result"]["prompt_per_second"]
    assert saved.engine.startswith("b11434")
    r = subprocess.run([sys.executable, "-m", "lokid", "--config-dir", str(served.config),
                        "bench", "b", "--prompt", "300", "--predict", "16"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "  Prefill " in r.stdout and "  [2/2] short line" in r.stderr


@pytest.mark.engine
@pytest.mark.slow
def test_a_full_disk_shows_the_measurement_and_says_it_was_not_stored(
        served: Served, tmp_path: Path) -> None:
    """Issue 45, item 11: the measurement was discarded and only the state DB's error
    printed. Now it is shown, with why it is not kept; then stored once there is room."""
    from support.smallfs import fill, small_tmpfs

    with small_tmpfs(tmp_path / "state") as state:
        StateDB(str(state)).close()   # the database an installed host has
        filler = fill(state)
        env = {**os.environ, "LOKI_STATE_DIR": str(state)}
        argv = [sys.executable, "-m", "lokid", "--config-dir", str(served.config), "bench",
                "b", "--prompt", "300", "--predict", "16"]
        r = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=300,
                           env=env)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["result"]["prompt_per_second"] > 0 and not out["saved"]
        assert out["not_saved_reason"].startswith("it could not be stored: the state database")
        assert "No space left on device" in out["not_saved_reason"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0 and "  Prefill " in r.stdout, r.stderr
        assert "(not saved: it could not be stored: " in r.stdout, r.stdout
        filler.unlink()
        r = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=300,
                           env=env)
        assert r.returncode == 0 and json.loads(r.stdout)["saved"], r.stdout + r.stderr


CHANGED = ("the preset's plan changed since its engine started (its command line differs "
           "now): restart it to keep a result")


@pytest.mark.engine
@pytest.mark.slow
def test_a_preset_changed_since_its_engine_started_is_measured_but_not_saved(
        tmp_path: Path, engine: str, models: Any) -> None:
    config = write_config(tmp_path, engine, [models.dir])
    port = free_port()
    write_preset(config, "e", f'model = "llama.gguf"\nctx = 2048\nport = {port}\n')
    assert Path(models.llama).exists()
    env = {"LOKI_STATE_DIR": str(tmp_path / "state"), "LOKI_RUNTIME_DIR": str(tmp_path / "run")}

    def lokid(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lokid", "--config-dir", str(config),
                               *args], capture_output=True, text=True, timeout=300,
                              env={**os.environ, **env})

    def bench_json() -> dict[str, Any]:
        r = lokid("bench", "e", "--prompt", "300", "--predict", "16", "--json")
        assert r.returncode == 0, r.stderr
        out: dict[str, Any] = json.loads(r.stdout)
        return out

    # started as its unit starts it: `lokid engine` writes the runtime plan, then runs it
    with running([sys.executable, "-m", "lokid", "engine", "e"], tmp_path / "engine.log",
                 env={**env, "LOKI_CONFIG_DIR": str(config)}, port=port) as eng:
        out = bench_json()
        assert out["saved"] and out["not_saved_reason"] == ""

        write_preset(config, "e", f'model = "llama.gguf"\nctx = 4096\nport = {port}\n')
        out = bench_json()
        assert not out["saved"] and out["not_saved_reason"] == CHANGED
        assert out["url"] == eng.url and out["result"]["prompt_n"] > 0  # still measured
        with StateDB(env["LOKI_STATE_DIR"]) as db:
            assert db.bench("e", fingerprint=out["fingerprint"]) is None
        r = lokid("bench", "e", "--prompt", "300", "--predict", "16")
        assert r.returncode == 0 and r.stdout.splitlines()[-1] == f"  (not saved: {CHANGED})"

        # a new port too: the engine is found where it was started, and measured there
        write_preset(config, "e", f'model = "llama.gguf"\nctx = 4096\nport = {free_port()}\n')
        out = bench_json()
        assert out["url"] == eng.url and not out["saved"]

    # stopped, its runtime plan stays behind (/run/loki keeps the plans of every preset);
    # `lokid run` writes none, and the leftover is not the plan of what runs now
    write_preset(config, "e", f'model = "llama.gguf"\nctx = 4096\nport = {port}\n')
    assert (tmp_path / "run" / "e.json").exists()
    with running([sys.executable, "-m", "lokid", "--config-dir", str(config), "run", "e"],
                 tmp_path / "run.log", env=env, port=port):
        out = bench_json()
        assert out["saved"] and out["not_saved_reason"] == ""


def test_lokid_bench_without_a_running_engine_says_how_to_start_it(
        tmp_path: Path, engine: str, models: Any) -> None:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "idle", f'model = "{models.llama}"\nport = {free_port()}\n')
    r = subprocess.run([sys.executable, "-m", "lokid", "--config-dir", str(config), "bench",
                        "idle"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "LOKI_STATE_DIR": str(tmp_path / "state")})
    assert r.returncode == 2
    assert "preset 'idle' has no ready engine at http://127.0.0.1:" in r.stderr, r.stderr
    assert "lokictl start idle, or lokid run idle" in r.stderr and "Traceback" not in r.stderr


# --- the fake engine ------------------------------------------------------------------

Handler = Callable[[str, dict[str, Any]], tuple[int, Any]]


def timings(prompt_n: int = 100, cache_n: int | None = 0, **more: Any) -> dict[str, Any]:
    t = {"prompt_n": prompt_n, "prompt_ms": 50.0, "predicted_n": 20, "predicted_ms": 200.0,
         **more}
    if cache_n is not None:
        t["cache_n"] = cache_n
    return t


def chat_ok(prompt_n: int = 100, cache_n: int | None = 0, **more: Any) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": "ok"}}],
            "timings": timings(prompt_n, cache_n, **more),
            "usage": {"prompt_tokens": prompt_n + (cache_n or 0)}}


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up waiting (the budget test): nothing to report


class Fake:
    """An OpenAI-compatible engine that answers what the test says, and records."""

    def __init__(self, handle: Handler):
        self.handle = handle
        self.requests: list[tuple[str, dict[str, Any]]] = []
        fake = self

        class H(BaseHTTPRequestHandler):
            def _reply(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.requests.append((self.path, body))
                status, data = fake.handle(self.path, body)
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _reply

            def log_message(self, *args: Any) -> None:
                pass

        self.server = QuietServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def chats(self) -> list[dict[str, Any]]:
        return [b for p, b in self.requests if p == "/v1/chat/completions"]


@pytest.fixture
def fake() -> Iterator[Callable[[Handler], Fake]]:
    made: list[Fake] = []

    def make(handle: Handler) -> Fake:
        made.append(Fake(handle))
        return made[-1]

    yield make
    for f in made:
        f.server.shutdown()


def engine_props(n_ctx: int = 16384) -> dict[str, Any]:
    return {"default_generation_settings": {"n_ctx": n_ctx}, "build_info": "b1-fake"}


def basic(path: str, body: dict[str, Any]) -> tuple[int, Any]:
    if path == "/props":
        return 200, engine_props()
    if path == "/tokenize":
        return 200, {"tokens": list(range(len(body["content"]) // 4))}
    if path == "/slots":
        return 501, {"error": "slots disabled"}
    return 200, chat_ok()


async def test_a_template_refusing_the_effort_level_is_retried_once_with_the_one_it_names(
        fake: Callable[[Handler], Fake]) -> None:
    def handle(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/v1/chat/completions" and body.get("reasoning_effort") == "high":
            return 500, {"error": {"message": "reasoning_effort 'high' is not supported by "
                                   "this template; supported: low, medium"}}
        return basic(path, body)

    f = fake(handle)
    learned: list[tuple[str, str]] = []
    setup = protocol.Setup(effort="high", learn=lambda w, g: learned.append((w, g)))
    r = await run_against(f.url, protocol.Options(benchrules.QUICK), setup)
    assert learned == [("high", "medium")]
    assert [c.get("reasoning_effort") for c in f.chats()] == ["high", "medium", "medium"]
    assert r.prompt_n == 100 and r.savable


async def test_a_500_that_is_not_an_effort_refusal_fails_the_phase(
        fake: Callable[[Handler], Fake]) -> None:
    f = fake(lambda p, b: (500, {"error": "out of memory"}) if p == "/v1/chat/completions"
             else basic(p, b))
    with pytest.raises(errors.BenchError, match="^warm-up: POST /v1/chat/completions: HTTP 500"):
        await run_against(f.url, protocol.Options(benchrules.QUICK), protocol.Setup(effort="high"))
    assert len(f.chats()) == 1


async def test_a_response_without_timings_is_no_measurement(
        fake: Callable[[Handler], Fake]) -> None:
    f = fake(lambda p, b: (200, {"choices": []}) if p == "/v1/chat/completions"
             else basic(p, b))
    with pytest.raises(errors.BenchError, match="returned no timings"):
        await run_against(f.url, protocol.Options(benchrules.QUICK))


async def test_a_missing_cache_counter_stays_unknown(fake: Callable[[Handler], Fake]) -> None:
    f = fake(lambda p, b: (200, chat_ok(cache_n=None)) if p == "/v1/chat/completions"
             else basic(p, b))
    r = await run_against(f.url, protocol.Options(benchrules.FULL), code="x = 1\n" * 40000)
    d = r.depth
    assert d is not None and len(d.turns) == benchrules.TURNS
    assert all(t.cached is None for t in d.turns)
    assert d.reuse is None and "does not say" in d.reuse_note
    assert "Cache reuse n/a" in "\n".join(benchrules.report(r))


async def test_cached_tokens_from_usage_when_timings_lack_cache_n(
        fake: Callable[[Handler], Fake]) -> None:
    reply = chat_ok(cache_n=None)
    reply["usage"]["prompt_tokens_details"] = {"cached_tokens": 4000}
    f = fake(lambda p, b: (200, reply) if p == "/v1/chat/completions" else basic(p, b))
    r = await run_against(f.url, protocol.Options(benchrules.FULL), code="x = 1\n" * 40000)
    assert r.depth is not None and [t.cached for t in r.depth.turns] == [4000] * benchrules.TURNS


async def test_a_busy_engine_is_refused(fake: Callable[[Handler], Fake]) -> None:
    f = fake(lambda p, b: (200, [{"id": 0, "is_processing": True}]) if p == "/slots"
             else basic(p, b))
    with pytest.raises(errors.EngineBusyError, match="already serving a request"):
        await run_against(f.url, protocol.Options(benchrules.QUICK))
    assert f.chats() == []


async def test_a_turn_past_its_budget_makes_the_depth_phase_partial(
        fake: Callable[[Handler], Fake]) -> None:
    def handle(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/v1/chat/completions" and body.get("cache_prompt"):
            if len(body["messages"]) >= 5:  # the second turn
                time.sleep(1.5)
        return basic(path, body)

    f = fake(handle)
    r = await run_against(f.url, protocol.Options(benchrules.FULL), budget=1.0,
                          code="x = 1\n" * 40000)
    d = r.depth
    assert d is not None and len(d.turns) == 1
    assert d.partial == "turn 2 interrupted after 1 s"
    assert not r.savable and "  (partial: not saved)" in benchrules.report(r)


async def test_turns_are_one_growing_conversation(fake: Callable[[Handler], Fake]) -> None:
    f = fake(basic)
    await run_against(f.url, protocol.Options(benchrules.FULL), code="".join(
        f"line {i} of never-repeating code\n" for i in range(20000)))
    chats = f.chats()
    assert [c["cache_prompt"] for c in chats] == [False, False, False, True, True, True]
    roles = [[m["role"] for m in c["messages"]] for c in chats[2:]]
    assert roles == [["user"], ["user", "assistant", "user"],
                     ["user", "assistant", "user", "assistant", "user"],
                     ["user", "assistant", "user", "assistant", "user", "assistant", "user"]]
    assert chats[3]["messages"][:1] == chats[2]["messages"]  # the same conversation
    texts = [c["messages"][-1]["content"] for c in chats[3:]]
    assert len(set(texts)) == 3  # never the same code twice
    assert all(c["seed"] == benchrules.SEED for c in chats)


async def test_disk_reads_are_sampled_around_the_turns_for_the_thrash_hint(
        fake: Callable[[Handler], Fake]) -> None:
    f = fake(basic)
    at: list[int] = []

    async def sampler() -> IOSample | None:
        at.append(len(f.chats()))
        return IOSample(len(at) << 30, 3 << 30, "memory of the test's cgroup")

    r = await run_against(f.url, protocol.Options(benchrules.FULL), code="x = 1\n" * 40000,
                          io_sampler=sampler)
    # after the cold prefill (warm-up, short line, cold: 3 requests), after the 3 turns;
    # 1 GiB over 3 x 20 generated tokens
    assert at == [3, 6]
    assert r.depth is not None and r.depth.hint == (
        "possible thrash: 4.3 GiB read from disk per 256 generated tokens (memory of the "
        "test's cgroup: 3.0 GiB): the model probably does not fit in RAM")
    assert r.to_json()["depth"]["hint"] == "" and r.savable  # shown, never saved

    async def unknown() -> IOSample | None:
        at.append(-1)
        return None

    at.clear()
    r = await run_against(f.url, protocol.Options(benchrules.FULL), code="x = 1\n" * 40000,
                          io_sampler=unknown)
    assert at == [-1] and r.depth is not None and r.depth.hint == ""


async def test_a_learned_effort_translation_is_used_at_once_next_time(
        fake: Callable[[Handler], Fake], tmp_path: Path, engine: str, models: Any) -> None:
    # a preset whose engine is the fake (its port), planned with the real engine binary
    def handle(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/v1/chat/completions" and body.get("reasoning_effort") == "high":
            return 500, {"error": "reasoning_effort: 'high' is not accepted, use one of: low, "
                                  "medium"}
        return basic(path, body)

    f = fake(handle)
    port = int(f.url.rsplit(":", 1)[1])
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "r", f'model = "{models.llama}"\nport = {port}\n[chat]\n'
                 'reasoning_effort = "high"\ntemperature = 0.2\n')
    state = str(tmp_path / "state")
    out = await measure.measure(str(config), state, "r", protocol.Options(benchrules.QUICK))
    assert out.saved
    assert [c.get("reasoning_effort") for c in f.chats()] == ["high", "medium", "medium"]
    assert {c["temperature"] for c in f.chats()} == {0.2}  # the preset's sampling
    with StateDB(state) as db:
        assert db.effort("llama.gguf", "high") == "medium"
    f.requests.clear()
    await measure.measure(str(config), state, "r", protocol.Options(benchrules.QUICK))
    assert [c.get("reasoning_effort") for c in f.chats()] == ["medium", "medium"]


# --- the side slot and repeated runs, against the fake ------------------------------------


def two_slots(erase: int = 200, busy0: bool = False) -> Handler:
    """/slots as b11434 answers with --parallel 2: slot 0 holding a conversation."""
    def handle(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/slots":
            return 200, [{"id": 0, "is_processing": busy0, "id_task": 3, "n_prompt_tokens": 900},
                         {"id": 1, "is_processing": False}]
        if path == "/props":
            return 200, {**engine_props(), "total_slots": 2}
        if path.startswith("/slots/1?action=erase"):
            return (200, {"id_slot": 1, "n_erased": 1300}) if erase == 200 else (
                erase, {"error": {"code": 501, "message": "This server does not support slots "
                                  "action. Start it with `--slot-save-path`"}})
        return basic(path, body)
    return handle


async def test_every_request_goes_to_the_side_slot_which_is_erased_after(
        fake: Callable[[Handler], Fake]) -> None:
    f = fake(two_slots())
    phases: list[str] = []
    r = await run_against(f.url, protocol.Options(benchrules.QUICK, repeat=2),
                          progress=lambda name, step, steps: phases.append(f"{step}/{steps} "
                                                                           f"{name}"))
    assert [c.get("id_slot") for c in f.chats()] == [1, 1, 1]
    assert [p for p, _ in f.requests if p.startswith("/slots/")] == ["/slots/1?action=erase"]
    assert f.requests[-1][0] == "/slots/1?action=erase"  # after the last measurement
    assert phases == ["1/3 warm-up", "2/3 short line (2000 + 300 tokens), run 1/2",
                      "3/3 short line (2000 + 300 tokens), run 2/2"]
    assert (r.slot, r.slots, r.repeat) == (1, 2, 2) and r.stats and r.savable
    assert r.slot_note == ("ran in slot 1 of 2, which held no prompt: the conversations' "
                           "caches kept; erased after")
    assert f"  Slot       {r.slot_note}" in benchrules.report(r)


async def test_an_engine_refusing_slot_actions_is_said_not_failed(
        fake: Callable[[Handler], Fake]) -> None:
    f = fake(two_slots(erase=501))
    r = await run_against(f.url, protocol.Options(benchrules.QUICK))
    assert r.slot == 1 and r.savable and r.slot_note.endswith(
        "; its prompt stays there: the engine refuses slot actions (start it with "
        "--slot-save-path to let the benchmark erase its slot)")


async def test_a_failed_benchmark_still_erases_its_slot(fake: Callable[[Handler], Fake]) -> None:
    def handle(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/v1/chat/completions" and body.get("max_tokens") == 300:
            return 500, {"error": "out of memory"}
        return two_slots()(path, body)

    f = fake(handle)
    with pytest.raises(errors.BenchError, match="^short line: "):
        await run_against(f.url, protocol.Options(benchrules.QUICK))
    assert f.requests[-1][0] == "/slots/1?action=erase"


async def test_a_conversation_served_in_another_slot_does_not_refuse_but_is_not_kept(
        fake: Callable[[Handler], Fake]) -> None:
    f = fake(two_slots(busy0=True))
    r = await run_against(f.url, protocol.Options(benchrules.QUICK))
    assert r.slot == 1 and r.prompt_n == 100
    assert benchrules.not_saved_reason(r) == ("slot 0 served a request when the benchmark "
                                              "started: the figures shared the engine with it")
