"""lokid.dbus.footprints on GPU lines (issue 44, items 5 and 6): which GPU an engine's
failure is booked on, and a compute-time out of memory raising the record.

No GPU here: the lines are ggml-cuda's own formats (``ggml_cuda_error`` of b11434:
``CUDA error: out of memory`` then ``  current device: %d, in function %s at %s:%d``),
fed as the daemon feeds every engine line; the room and the registry are the parts the
measurement reads (:class:`lokid.dbus.footprints.Telemetry`), a real state DB keeps the
record.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lokid.core.place.footprint import BUFFERS, NVML, OOM, Footprint
from lokid.dbus.footprints import Footprints
from lokid.dbus.registry import PresetView
from lokid.runners.runner import FAILED, LOADING, READY, EngineState
from lokid.store.state import StateDB

GiB = 2**30
COMPUTE_OOM = ["0.12.003.114 E CUDA error: out of memory",
               "0.12.003.120 E   current device: 0, in function ggml_backend_cuda_graph_compute "
               "at /build/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:3912",
               "0.12.003.121 E   cudaGraphLaunch(cuda_ctx->cuda_graph->instance, "
               "cuda_ctx->stream())"]


def _setup(tmp_path: Path, visible: tuple[str, ...], record: Footprint | None,
           free: dict[str, int]) -> tuple[Footprints, Any]:
    view = PresetView("p", "", "m.gguf", "off", None, memory_key="k", footprint=record)
    registry = SimpleNamespace(presets={"p": view}, state_dir=str(tmp_path))
    devices = [SimpleNamespace(name=n, capacity=80 * GiB) for n in ("GPU0", "GPU1", "GPU2")]
    room = SimpleNamespace(room=SimpleNamespace(free=free, devices=devices),
                           changed=lambda *a: None, sizing=lambda *a, **k: None)
    telemetry = SimpleNamespace(daemon=SimpleNamespace(registry=registry, runner=None),
                                meters=SimpleNamespace(dirty=set()), room=room)
    fp = Footprints(telemetry)  # type: ignore[arg-type]
    fp._visible = lambda name: visible  # type: ignore[method-assign]  # the runtime plan's
    return fp, view


def _run(fp: Footprints, lines: list[str]) -> Footprint | None:
    fp.on_state("p", EngineState(LOADING, "", ""))
    fp.on_state("p", EngineState(READY, "", ""))
    for line in lines:
        fp.on_line("p", line)
    fp.on_state("p", EngineState(FAILED, "", ""))
    return asyncio.run(fp.correct("p"))


def test_a_compute_time_oom_raises_the_gpu_the_start_sees(tmp_path: Path) -> None:
    # CUDA_VISIBLE_DEVICES=2: the engine's device 0 is GPU2, measured at 30 GiB when ready
    record = Footprint("k", {"GPU2": 30 * GiB, "host": GiB}, {"GPU2": NVML, "host": "cgroup"})
    fp, view = _setup(tmp_path, ("2",), record, {"GPU2": 20 * GiB})
    found = _run(fp, COMPUTE_OOM)
    assert found is not None
    # it held 30 GiB and asked for more, how much is not said: all GPU2 can hold, so that
    # its next start evicts once (issue 45, item 13), not an eighth more at each failure
    assert found.held["GPU2"] == 80 * GiB and found.sources["GPU2"] == OOM
    assert "GPU0" not in found.held and found.held["host"] == GiB
    assert fp.telemetry.daemon.registry.presets["p"].footprint == found
    with StateDB(str(tmp_path)) as db:
        assert db.footprint("p", "k") == found


def test_a_gpu_pinned_by_uuid_is_corrected(tmp_path: Path) -> None:
    # gpus = "GPU-8f6a…": the driver measured the engine on GPU1; a load-time failure
    line = "alloc_tensor_range: failed to allocate CUDA0 buffer of size 42949672960"
    record = Footprint("k", {"GPU1": 30 * GiB}, {"GPU1": NVML})
    fp, _ = _setup(tmp_path, ("GPU-8f6a0c2e",), record, {"GPU1": 10 * GiB})
    found = _run(fp, [line])
    # put on GPU1, raised to all it can hold (a failure says only a lower bound)
    assert found is not None and found.held["GPU1"] == 80 * GiB
    # never measured: the failure is kept under the UUID, the per-GPU need of the preset
    fp, _ = _setup(tmp_path, ("GPU-8f6a0c2e",), Footprint("k", {"host": GiB}, {"host": BUFFERS}),
                   {})
    found = _run(fp, [line])
    assert found is not None and found.held["GPU-8f6a0c2e"] == 45 * GiB


def test_buffer_lines_measure_the_gpu_the_start_sees(tmp_path: Path) -> None:
    from lokid.core.telemetry.requestlog import EngineLog

    # the recorded H200 line's form; the start has CUDA_VISIBLE_DEVICES=2
    log = EngineLog()
    log.feed("0.00.241.592 I load_tensors:        CUDA0 model buffer size =   920.22 MiB", 0.0)
    fp, view = _setup(tmp_path, ("2",), None, {})
    fp.telemetry.daemon.registry.presets["p"] = replace(
        view, plan=SimpleNamespace(argv=["llama-server"]))
    runner = SimpleNamespace(engine_pids=_none, io_sampler=_none)
    fp.telemetry.daemon.runner = runner
    fp.telemetry.meters = SimpleNamespace(
        dirty=set(), starts={"p": SimpleNamespace(log=log)}, snapshot=lambda name: {})
    fp.telemetry.has_gpu = _false
    found = asyncio.run(fp.measure("p"))
    assert found is not None and set(found.held) == {"GPU2"} and \
        found.sources["GPU2"] == BUFFERS


def test_the_host_figure_is_what_the_engine_holds_not_the_models_page_cache(
        tmp_path: Path) -> None:
    """Issue 44, item 11: under systemd the unit's MemoryCurrent counts the page cache of
    the model file a GPU engine read once (here 40 GiB); the host figure is what its
    cgroup's memory.stat says it holds (the runner's held_memory: tests/dbus/
    test_daemon_systemd.py reads a real unit's), MemoryCurrent only where that is
    unknown."""
    from lokid.core.bench.iosample import IOSample
    from lokid.core.place.footprint import CGROUP
    from lokid.core.telemetry.requestlog import EngineLog

    log = EngineLog()
    log.feed("0.00.241.592 I load_tensors:        CUDA0 model buffer size =   920.22 MiB", 0.0)

    async def sampler() -> IOSample:
        return IOSample(0, 40 * GiB, "memory of loki-engine@p.service")

    async def io_sampler(name: str) -> Any:
        return sampler

    def measured(held: int | None) -> Any:
        fp, view = _setup(tmp_path, ("0",), None, {})
        fp.telemetry.daemon.registry.presets["p"] = replace(
            view, plan=SimpleNamespace(argv=["llama-server"]))

        async def held_memory(name: str) -> int | None:
            return held

        fp.telemetry.daemon.runner = SimpleNamespace(
            engine_pids=_none, io_sampler=io_sampler, held_memory=held_memory)
        fp.telemetry.meters = SimpleNamespace(
            dirty=set(), starts={"p": SimpleNamespace(log=log)}, snapshot=lambda name: {})
        fp.telemetry.has_gpu = _false
        return asyncio.run(fp.measure("p"))

    found = measured(300 * 2**20)
    assert found is not None and found.held["host"] == 300 * 2**20, found
    assert found.sources["host"] == CGROUP and found.held["GPU0"] > 900 * 2**20
    found = measured(None)   # memory.stat not readable: MemoryCurrent, as before
    assert found is not None and found.held["host"] == 40 * GiB


async def _none(*_a: Any) -> None:
    return None


async def _false(*_a: Any) -> bool:
    return False


def test_a_start_on_the_cpu_is_told_and_stopped_by_the_daemon_only_when_not_taken(
        tmp_path: Path) -> None:
    """Issue 44, item 3: lokid.dbus.oncpu, handed what the journal watcher found, leaves the
    start its note (its engine step says it, and ends a "fail" preset's start failed:
    tests/unit/test_unit_oncpu.py); the daemon stops that start itself only where the note
    cannot be written, or is not taken in time by the same start (a step of a release
    before notes)."""
    from lokid.dbus.oncpu import OnCpu
    from lokid.runners.runner import READY, EngineState
    from lokid.store.oncpunote import note_path, read_note, take_note
    from lokid.store.runtimedir import write_runtime_plan
    from lokid.watch.journalwatch import AutoCut

    stopped: list[str] = []

    async def stop(name: str) -> str:
        stopped.append(name)
        return "stopped"

    run = tmp_path / "run"
    run.mkdir()
    presets = ("runs", "fails", "taken", "unwritable")
    names = (*presets, "fails:2", "runs:2")   # replicas: their preset's cpu_fallback
    for name in names:
        write_runtime_plan(str(run), _runtime_plan(name, "inv"))
    views = {n: PresetView(n, "", "m.gguf", "off", None,
                           cpu_fallback="run" if n == "runs" else "fail") for n in presets}
    host = SimpleNamespace(registry=SimpleNamespace(presets=views), runtime_dir=str(run),
                           runner=SimpleNamespace(stop=stop, state=lambda n: EngineState(READY)))
    on_cpu = OnCpu(host, grace=0.3)  # type: ignore[arg-type]
    (run / "unwritable.oncpu").mkdir()   # the note cannot be put in its place

    async def main() -> None:
        for name in names:
            on_cpu(AutoCut(name, "inv", "its GPU backend did not start (CUDA: …)"))
        assert take_note(str(run), "taken", "inv") is not None   # its step acts on it
        while on_cpu.stops:
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert sorted(stopped) == ["fails", "fails:2", "unwritable"] == sorted(on_cpu.stopped)
    for name in ("runs", "runs:2"):
        runs = read_note(str(run), name, "inv")
        assert runs is not None and not runs.fail and runs.reason.startswith("its GPU backend")
    replica = read_note(str(run), "fails:2", "inv")
    assert replica is not None and replica.fail
    assert os.path.exists(note_path(str(run), "fails"))


def _runtime_plan(name: str, invocation: str) -> Any:
    from lokid.core.launch.attempt import Mark
    from lokid.core.launch.runtimeplan import RuntimePlan

    return RuntimePlan(name, ("/e",), {}, "127.0.0.1", 8080, Mark("f", "/e", 1),
                       invocation=invocation)
