"""lokid.core.plan: argv order, the environment lokid adds, and the JSON form."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.engine_data import B11434, ENGINE
from support.headers import MTP, PLAIN

from lokid.core.config import GlobalConfig, Preset, SpecConfig
from lokid.core.plan import PlanInputs, build_plan

GLOBAL = GlobalConfig(engine=ENGINE, model_dirs=("/m",), host="127.0.0.1", port=8080)


def inputs(preset: Preset, **kw: object) -> PlanInputs:
    base: dict[str, object] = dict(preset=preset, config=GLOBAL, model_path=MTP.path, model=MTP,
                                   caps=B11434)
    base.update(kw)
    return PlanInputs(**base)  # type: ignore[arg-type]


def preset(**kw: object) -> Preset:
    base: dict[str, object] = dict(name="p", path="/etc/loki/presets/p.toml", model="mtp.gguf")
    base.update(kw)
    return Preset(**base)  # type: ignore[arg-type]


def test_base_argv_order_then_spec_then_extra_args_last() -> None:
    p = preset(mmproj="proj.gguf", gpu_layers="99", ubatch=512, ctx=8192,
               extra_args=("--jinja", "-t", "8"), spec=SpecConfig(mode="mtp"))
    plan = build_plan(inputs(p, mmproj_path="/m/proj.gguf"))
    assert plan.argv == (
        ENGINE, "-m", MTP.path, "--host", "127.0.0.1", "--port", "8080", "-c", "8192",
        "--mmproj", "/m/proj.gguf", "-ngl", "99", "-ub", "512",
        "--spec-type", "draft-mtp", "--spec-draft-sampling", "greedy",
        "--jinja", "-t", "8",
    )


def test_without_spec_the_command_line_has_no_spec_flag() -> None:
    plan = build_plan(inputs(preset()))
    assert plan.argv == (ENGINE, "-m", MTP.path, "--host", "127.0.0.1", "--port", "8080",
                         "-c", "32768")
    assert plan.notes == () and plan.env == {}
    assert plan.spec.mode == "off" and plan.spec.types == () and not plan.spec.auto


def test_environment_lokid_adds() -> None:
    p = preset(gpus="0,1", op_offload_min_batch=128, env={"LLAMA_ARG_THREADS": "8"})
    plan = build_plan(inputs(p))
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "0,1", "GGML_OP_OFFLOAD_MIN_BATCH": "128",
                        "LLAMA_ARG_THREADS": "8"}


def test_preset_port_and_global_host() -> None:
    plan = build_plan(inputs(preset(port=9001),
                             config=replace(GLOBAL, host="0.0.0.0", port=8000)))
    assert plan.argv[3:7] == ("--host", "0.0.0.0", "--port", "9001")
    assert (plan.host, plan.port) == ("0.0.0.0", 9001)


def test_port_in_extra_args_is_the_one_the_engine_uses_and_is_noted() -> None:
    plan = build_plan(inputs(preset(extra_args=("--port", "9100"))))
    assert plan.port == 9100 and plan.argv[-2:] == ("--port", "9100")
    assert any("overrides the preset's port" in n for n in plan.notes)


def test_ctx_zero_is_passed_and_noted() -> None:
    plan = build_plan(inputs(preset(ctx=0)))
    assert plan.argv[7:9] == ("-c", "0")
    assert any("ctx = 0" in n for n in plan.notes)


@pytest.mark.parametrize("where", ["preset", "process"])
def test_llama_arg_spec_type_from_preset_env_or_process_env_silences_spec(where: str) -> None:
    var = {"LLAMA_ARG_SPEC_TYPE": "draft-mtp"}
    p = preset(spec=SpecConfig(mode="auto"), env=var if where == "preset" else {})
    plan = build_plan(inputs(p, environ=var if where == "process" else {"HOME": "/root"}))
    assert plan.spec.types == () and "--spec-type" not in plan.argv
    assert any("already set" in n for n in plan.notes)


def test_offload_batch_from_the_process_environment_counts_for_the_ngram_guard() -> None:
    p = preset(spec=SpecConfig(mode="ngram"), extra_args=("--cpu-moe",))
    assert build_plan(inputs(p, model=PLAIN)).spec.types == ()
    plan = build_plan(inputs(p, model=PLAIN, environ={"GGML_OP_OFFLOAD_MIN_BATCH": "128"}))
    assert plan.spec.types == ("ngram-mod",)
    # lokid adds only what the preset sets; the process environment is inherited anyway
    assert "GGML_OP_OFFLOAD_MIN_BATCH" not in plan.env


def test_gpu_layers_blocks_auto_through_the_plan() -> None:
    plan = build_plan(inputs(preset(gpu_layers="99", spec=SpecConfig(mode="auto"))))
    assert plan.spec.types == () and not plan.spec.auto
    assert any("manual placement (gpu_layers = 99)" in n for n in plan.notes)


def test_attempt_verdict_blocks_auto() -> None:
    plan = build_plan(inputs(preset(spec=SpecConfig(mode="auto")),
                             auto_blocked="the last launch never answered"))
    assert plan.spec.types == () and any("never answered" in n for n in plan.notes)


def test_json_form_has_exactly_the_documented_keys() -> None:
    plan = build_plan(inputs(preset(spec=SpecConfig(mode="auto"), gpus="1")))
    data = plan.to_json()
    assert set(data) == {"preset", "argv", "env", "notes", "spec"}
    assert set(data["spec"]) == {"mode", "types", "auto"}
    assert data["preset"] == "p" and data["argv"][0] == ENGINE
    assert data["env"] == {"CUDA_VISIBLE_DEVICES": "1"}
    assert data["spec"] == {"mode": "auto", "types": ["draft-mtp"], "auto": True}
    assert all(isinstance(n, str) for n in data["notes"])


def test_an_automatic_launch_raises_the_engine_log_verbosity_for_the_verdict() -> None:
    plan = build_plan(inputs(preset(spec=SpecConfig(mode="auto"))))
    assert plan.spec.auto and plan.argv[-2:] == ("-lv", "4")
    assert any("log verbosity 4" in n for n in plan.notes)
    forced = build_plan(inputs(preset(spec=SpecConfig(mode="mtp"))))
    assert "-lv" not in forced.argv
    own = build_plan(inputs(preset(spec=SpecConfig(mode="auto"), extra_args=("-lv", "2"))))
    assert own.argv.count("-lv") == 1 and own.argv[-1] == "2"
    env = build_plan(inputs(preset(spec=SpecConfig(mode="auto"),
                                   env={"LLAMA_ARG_LOG_VERBOSITY": "3"})))
    assert "-lv" not in env.argv
