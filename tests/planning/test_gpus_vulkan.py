"""``gpus`` on a real Vulkan engine (issue 44, item 7): the engine uses the GPUs lokid
books, and no other.

The engine is the real prebuilt Vulkan llama-server (support.vulkanengine) on two
lavapipe devices, ``Vulkan0`` and ``Vulkan1``. ggml-vulkan ignores
``CUDA_VISIBLE_DEVICES``: before lokid passed ``--device`` (``LLAMA_ARG_DEVICE``), a
preset with ``gpus = [1]`` loaded onto both (``using device Vulkan0`` and ``Vulkan1``,
buffers on each) while lokid booked GPU1 alone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset
from support.vulkanengine import TWO_DEVICES, vulkan_engine

NO_ENGINE_USER = {"LOKI_ENGINE_USER": "lokid-test-no-such-user"}
# the engine's own lines naming the devices it loads onto (verbosity 4)
USING = re.compile(r"using device (Vulkan\d+) ")
BUFFER = re.compile(r"(Vulkan\d+) (?:model|KV|compute) buffer size")


def engine_environ(root: int) -> dict[str, str]:
    """The environment of the llama-server below ``root`` (its child or grandchild)."""
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            if argv0.endswith(b"llama-server"):
                data = Path(f"/proc/{pid}/environ").read_bytes()
                return dict(item.decode().partition("=")[::2]
                            for item in data.split(b"\0") if b"=" in item)
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        todo += [int(c) for c in children]
    raise AssertionError(f"no llama-server below pid {root}")


@pytest.fixture
def config(tmp_path: Path, models: Any) -> tuple[Path, dict[str, str]]:
    engine = vulkan_engine()
    config = write_config(tmp_path, engine, [Path(models.llama).parent])
    write_preset(config, "one", f'model = "{Path(models.llama).name}"\nctx = 512\n'
                 f'port = {free_port()}\ngpus = [1]\n')
    env = {**os.environ, **NO_ENGINE_USER, **TWO_DEVICES, "LOKI_CONFIG_DIR": str(config),
           "LOKI_STATE_DIR": str(tmp_path / "state"),
           "LOKI_RUNTIME_DIR": str(tmp_path / "run"),
           # the llama library's load lines (which devices, which buffers)
           "LLAMA_ARG_LOG_VERBOSITY": "4"}
    return config, env


def test_lokid_plan_books_gpu1_and_passes_the_engine_vulkan1(
        config: tuple[Path, dict[str, str]]) -> None:
    _, env = config
    r = subprocess.run([sys.executable, "-m", "lokid.cli", "plan", "one", "--json"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["env"]["LLAMA_ARG_DEVICE"] == "Vulkan1"
    assert any(n.startswith("gpus = 1 on the Vulkan backend") for n in plan["notes"])
    # the room as the engine lists it: two GPUs; the need: GPU1 (and the host) only
    assert [d["device"] for d in plan["devices"] if d["device"] != "host"] == ["GPU0", "GPU1"]
    assert set(plan["memory"]["needs"]) == {"GPU1", "host"}, plan["memory"]


def test_lokid_run_loads_only_onto_the_gpu_lokid_books(
        config: tuple[Path, dict[str, str]]) -> None:
    """The real engine under ``lokid run`` (the plan, the supervisor, the environment it
    hands the engine): its load lines name Vulkan1 alone."""
    _, env = config
    proc = subprocess.Popen([sys.executable, "-m", "lokid.cli", "run", "one"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "lokid: ready at " in line:
                ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert ready.wait(60), "".join(lines)
        url = "".join(lines).split("lokid: ready at ", 1)[1].split()[0]
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        # what the engine process itself was handed (one numbering: item 4 too)
        environ = engine_environ(proc.pid)
        assert environ["LLAMA_ARG_DEVICE"] == "Vulkan1"
        assert environ["CUDA_VISIBLE_DEVICES"] == "1"
        assert environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    reader.join(10)   # the last lines, read once the pipe closes
    text = "".join(lines)
    assert set(USING.findall(text)) == {"Vulkan1"}, text
    assert BUFFER.findall(text) and set(BUFFER.findall(text)) == {"Vulkan1"}, text
