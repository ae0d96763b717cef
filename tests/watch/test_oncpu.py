"""Issue 44, item 3: a start whose GPU engine runs on the CPU is said in lokid's own
journal entries (MESSAGE_ID, LOKI_REASON) and handed to the daemon, at its "ready at",
whatever its speculation: the recorded Vulkan build without a device ("offloaded 3/3
layers to GPU", CPU buffers only), and ggml-cuda's failed start (its format string)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support import DATA

from lokid.core.names import ENGINE_SLICE, MESSAGE_ON_CPU
from lokid.watch.journalwatch import AutoCut, LoadJudge


def _entries(lines: list[str]) -> list[dict[str, str]]:
    unit = {"_SYSTEMD_UNIT": "loki-engine@p.service", "_SYSTEMD_SLICE": ENGINE_SLICE,
            "_SYSTEMD_INVOCATION_ID": "inv1"}
    return [{**unit, "MESSAGE": line, "SYSLOG_IDENTIFIER": "llama-server"} for line in lines] + [
        {**unit, "MESSAGE": "ready at http://127.0.0.1:8080", "SYSLOG_IDENTIFIER": "lokid",
         "LOKI_PRESET": "p"}]


def _judge(tmp_path: Path, lines: list[str]) -> tuple[list[tuple[str, dict[str, Any]]],
                                                      list[AutoCut]]:
    logged: list[tuple[str, dict[str, Any]]] = []
    found: list[AutoCut] = []
    judge = LoadJudge(str(tmp_path / "state"), str(tmp_path / "run"),
                      log=lambda msg, **kw: logged.append((msg, kw)), on_cpu=found.append)
    for entry in _entries(lines) * 2:   # a second "ready at" says nothing again
        judge.handle(entry)
    return logged, found


def test_offloaded_with_cpu_buffers_only_is_said(tmp_path: Path) -> None:
    text = (DATA / "engine-logs" / "vulkan-lavapipe-nodevice-lv4.log").read_text(
        errors="replace")
    logged, found = _judge(tmp_path, text.splitlines())
    said = [(m, kw) for m, kw in logged if kw.get("MESSAGE_ID") == MESSAGE_ON_CPU]
    assert len(said) == 1 and len(found) == 1
    msg, fields = said[0]
    assert msg.startswith("preset p: its engine runs on the CPU: it says offloaded 3/3")
    assert fields["LOKI_PRESET"] == "p" and fields["PRIORITY"] == 4
    assert found[0].preset == "p" and found[0].invocation == "inv1"
    assert found[0].reason == fields["LOKI_REASON"]


def test_a_cuda_backend_that_failed_to_start_is_said(tmp_path: Path) -> None:
    # ggml-cuda.cu b11434: "%s: failed to initialize " GGML_CUDA_NAME ": %s"; then the
    # recorded default-verbosity load of the H200 (no buffer, no offload line)
    text = (DATA / "engine-logs" / "b11434-cuda-h200-mid_off.log").read_text()
    lines = ["0.00.000.912 E ggml_cuda_init: failed to initialize CUDA: CUDA driver version "
             "is insufficient for CUDA runtime version", *text.splitlines()]
    _, found = _judge(tmp_path, lines)
    assert [f.reason for f in found] == [
        "its GPU backend did not start (CUDA: CUDA driver version is insufficient for CUDA "
        "runtime version): the model runs on the CPU"]


def test_the_healthy_gpu_load_says_nothing(tmp_path: Path) -> None:
    text = (DATA / "engine-logs" / "b11434-cuda-h200-mid_auto.log").read_text()
    logged, found = _judge(tmp_path, text.splitlines())
    assert found == [] and not any(kw.get("MESSAGE_ID") == MESSAGE_ON_CPU for _, kw in logged)
