"""lokid.planning.gpuchoice: ``gpus = "auto"`` / ``gpu_count``: the GPUs of one start,
chosen by prestart and written into the runtime plan.

The plan is the real one (the real engine probed, a generated GGUF read); the GPUs are
four H200 as the NVIDIA driver reports them, from the figures recorded on the real one
(shared/recipes, b11434-cuda-h200-*.log: 143155 MiB total, 142629 MiB free with no
engine): NVML is the one stand-in the issue allows where no GPU exists. The engine here
is a CPU build, so "it has a GPU backend" is said by the test (``gpu_engine=True``); the
start that follows on this machine (a CPU engine) chooses nothing, and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from support.enginekit import write_config, write_preset

from lokid.core.launch.attempt import Mark
from lokid.core.launch.runtimeplan import RuntimePlan
from lokid.host.nvml import GpuMemory
from lokid.planning.gpuchoice import choosing, claimed, place
from lokid.store.runtimedir import read_runtime_plan, write_runtime_plan
from lokid.unit import planview, steps

MiB, GiB = 2**20, 2**30
TOTAL, DRIVER = 143155 * MiB, (143155 - 142629) * MiB


def h200s(used: list[int], procs: dict[int, dict[int, int]] | None = None) -> GpuMemory:
    """pynvml's calls lokid makes, over len(used) H200s: ``used[i]`` bytes taken on GPU i
    by processes lokid does not manage, ``procs[i]`` pid → bytes listed on it."""
    procs = procs or {}
    mod = types.ModuleType("pynvml")

    def memory(i: int) -> Any:
        taken = DRIVER + used[i] + sum(procs.get(i, {}).values())
        return types.SimpleNamespace(total=TOTAL, used=taken, free=TOTAL - taken)

    mod.nvmlInit = lambda: None  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCount = lambda: len(used)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = memory  # type: ignore[attr-defined]
    mod.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # type: ignore[attr-defined]
    mod.nvmlDeviceGetComputeRunningProcesses = lambda i: [  # type: ignore[attr-defined]
        types.SimpleNamespace(pid=pid, usedGpuMemory=n) for pid, n in procs.get(i, {}).items()]
    return GpuMemory(lambda: mod)


@pytest.fixture
def tree(tmp_path: Path, engine: str, models: Any) -> dict[str, str]:
    config = write_config(tmp_path, engine, [Path(models.llama).parent])
    name = Path(models.llama).name
    write_preset(config, "auto", f'model = "{name}"\nctx = 512\ngpus = "auto"\n')
    write_preset(config, "two", f'model = "{name}"\nctx = 512\ngpu_count = 2\n')
    dirs = {"config": str(config), "state": str(tmp_path / "state"),
            "runtime": str(tmp_path / "run")}
    os.makedirs(dirs["runtime"])
    return dirs


def planned(tree: dict[str, str], name: str) -> tuple[Any, Any]:
    return planview.plan_inputs_now(tree["config"], tree["state"], tree["runtime"], name, {})


def test_auto_takes_the_best_fitting_gpu_and_says_why(tree: dict[str, str]) -> None:
    plan, inputs = planned(tree, "auto")
    assert plan.gpu_choice == 0 and "CUDA_VISIBLE_DEVICES" not in plan.env
    assert any(n.startswith('gpus = "auto": the fewest GPUs that hold it') for n in plan.notes)
    # GPU1 has the least room that still holds the tiny model; GPU3 has none left
    gpu = h200s([0, 139 * GiB, 60 * GiB, TOTAL - DRIVER])
    chosen, choice, claim = place(plan, inputs, tree["runtime"], tree["state"], gpu=gpu,
                                  gpu_engine=True)
    assert choice.gpus == ("GPU1",) and choice.fits
    assert chosen.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert chosen.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert chosen.notes[-1].startswith("GPUs chosen: GPU1 (needs ")
    assert chosen.notes[-1].endswith("the best fit of 4 GPUs)")
    assert set(claim) == {"GPU1"} and 0 < claim["GPU1"] < GiB
    # gpu_count = 2: the two that fit best
    plan2, inputs2 = planned(tree, "two")
    _, choice2, claim2 = place(plan2, inputs2, tree["runtime"], tree["state"], gpu=gpu,
                               gpu_engine=True)
    assert choice2.gpus == ("GPU1", "GPU2") and set(claim2) == {"GPU1", "GPU2"}


def test_auto_on_a_vulkan_engine_passes_it_the_chosen_gpu_by_device(
        tree: dict[str, str]) -> None:
    """ggml-vulkan ignores CUDA_VISIBLE_DEVICES: the choice reaches a Vulkan engine as
    llama.cpp's --device (LLAMA_ARG_DEVICE), as gpus = [n] does (issue 44, item 7)."""
    from dataclasses import replace

    plan, inputs = planned(tree, "auto")
    inputs = replace(inputs, caps=replace(inputs.caps, gpu_backends=("vulkan",)))
    gpu = h200s([0, 139 * GiB, 60 * GiB, TOTAL - DRIVER])
    chosen, choice, _ = place(plan, inputs, tree["runtime"], tree["state"], gpu=gpu,
                              gpu_engine=True)
    assert choice.gpus == ("GPU1",)
    assert chosen.env["LLAMA_ARG_DEVICE"] == "Vulkan1"
    assert chosen.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert chosen.notes[-2].startswith("GPUs chosen: GPU1 (needs ")
    assert chosen.notes[-1].startswith("gpus = 1 on the Vulkan backend: LLAMA_ARG_DEVICE="
                                       "Vulkan1")


def test_a_start_still_loading_counts_its_claim_less_what_it_holds(
        tree: dict[str, str]) -> None:
    plan, inputs = planned(tree, "auto")
    # without claims GPU1 fits best (2 GiB left); another start, still loading under a
    # supervisor that runs (this test's process), claimed 1.5 GiB of it
    used = [0, TOTAL - DRIVER - 2 * GiB, 60 * GiB]
    other = RuntimePlan.of(plan, Mark("fp", "/e", 1), "inv-1", pid=os.getpid())
    other = RuntimePlan(**{**other.__dict__, "preset": "other", "claim": {"GPU1": 2 * GiB}})
    write_runtime_plan(tree["runtime"], other)
    assert claimed(tree["runtime"], "auto", None) == {"GPU1": 2 * GiB}
    _, choice, _ = place(plan, inputs, tree["runtime"], tree["state"], gpu=h200s(used),
                         gpu_engine=True)
    assert choice.gpus == ("GPU2",)
    assert choice.why.endswith("counted as taken by starts still loading: 2.0 GiB on GPU1")
    # its engine (a child of its supervisor, for real) already holds 1.5 GiB of it
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        procs = {1: {child.pid: 3 * GiB // 2}}
        assert claimed(tree["runtime"], "auto", {"GPU1": procs[1]}) == {"GPU1": GiB // 2}
    finally:
        child.kill()
        child.wait()
    # once it answered (READY on record), nothing of its claim is pending
    from lokid.store import exits

    exits.mark_ready(tree["runtime"], "other", other.invocation)
    assert claimed(tree["runtime"], "auto", None) == {}


def test_a_claim_without_a_supervisor_counts_only_for_a_moment(tree: dict[str, str]) -> None:
    plan, _ = planned(tree, "auto")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    rp = RuntimePlan.of(plan, Mark("fp", "/e", 1), pid=int(gone.stdout))
    rp = RuntimePlan(**{**rp.__dict__, "preset": "other", "claim": {"GPU0": GiB}})
    path = write_runtime_plan(tree["runtime"], rp)
    # just written: prestart has exited and `lokid engine` has not written its pid yet
    assert claimed(tree["runtime"], "auto", None) == {"GPU0": GiB}
    old = os.stat(path).st_mtime - 60
    os.utime(path, (old, old))
    assert claimed(tree["runtime"], "auto", None) == {}
    # a damaged runtime plan beside them is no claim, and no error
    Path(tree["runtime"], "broken.json").write_text("{not json")
    assert claimed(tree["runtime"], "auto", None) == {}


def test_the_driver_missing_falls_back_to_the_engines_list(tree: dict[str, str]) -> None:
    """No NVML: the engine's --list-devices (here: the CPU build lists no GPU), so
    nothing is chosen, the note says why, and CUDA_DEVICE_ORDER is not set."""
    plan, inputs = planned(tree, "auto")

    def missing() -> types.ModuleType:
        raise ImportError("No module named 'pynvml'")

    chosen, choice, claim = place(plan, inputs, tree["runtime"], tree["state"],
                                  gpu=GpuMemory(missing), gpu_engine=True)
    assert choice.gpus == () and claim == {}
    assert "CUDA_VISIBLE_DEVICES" not in chosen.env and "CUDA_DEVICE_ORDER" not in chosen.env
    assert "no GPU to choose from" in chosen.notes[-1]
    assert "python3-pynvml is not installed" in chosen.notes[-1]


def test_prestart_on_this_cpu_engine_writes_the_choice_into_the_runtime_plan(
        tree: dict[str, str]) -> None:
    """The real prestart: the runtime plan says it chose (gpu_choice), no GPU was found,
    and a second start plans afresh rather than reuse a plan with the last choice."""
    with choosing(tree["runtime"]):   # the lock is free again after its block
        pass
    plan = steps.prestart(tree["config"], tree["state"], tree["runtime"], "auto", {})
    rp = read_runtime_plan(tree["runtime"], "auto")
    assert rp.gpu_choice == 0 and rp.claim == {} and "CUDA_VISIBLE_DEVICES" not in rp.env
    assert "no GPU to choose from" in plan.notes[-1]
    data = json.loads(Path(tree["runtime"], "auto.json").read_text())
    assert data["gpu_choice"] == 0
    assert steps._reuse(tree["state"], tree["runtime"], "auto", "", {}) is None


def test_a_replica_takes_a_gpu_of_its_own_beside_the_one_loading(tree: dict[str, str]) -> None:
    """Issue 47: replica 2 of a gpus = "auto" preset is placed as any start is, and apart
    from replica 1 (running, its supervisor this process): best fit alone would pack the
    tiny model beside it on GPU1, where the two would share one GPU's compute."""
    write_preset(Path(tree["config"]), "rr", Path(tree["config"], "presets", "auto.toml")
                 .read_text() + "[serve]\nreplicas = 2\n")
    gpu = h200s([0, TOTAL - DRIVER - 2 * GiB, 60 * GiB])
    plan, inputs = planned(tree, "rr")
    chosen, choice, claim = place(plan, inputs, tree["runtime"], tree["state"], gpu=gpu,
                                  gpu_engine=True)
    assert choice.gpus == ("GPU1",)
    first = RuntimePlan.of(chosen, Mark("fp", "/e", 1), "inv-1", pid=os.getpid())
    write_runtime_plan(tree["runtime"], RuntimePlan(**{**first.__dict__, "claim": claim}))
    plan2, inputs2 = planned(tree, "rr:2")
    assert plan2.preset == "rr:2" and plan2.gpu_choice == 0
    _, choice2, _ = place(plan2, inputs2, tree["runtime"], tree["state"], gpu=gpu,
                          gpu_engine=True)
    assert choice2.gpus == ("GPU2",), choice2.why
    assert "apart from its replicas on GPU1" in choice2.why
