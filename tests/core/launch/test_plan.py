"""lokid.core.launch.plan: argv order, the environment lokid adds, and the JSON form."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.engine_data import B11434, ENGINE, caps_without
from support.headers import MTP, PLAIN

from lokid.core.config.files import ChatConfig, GlobalConfig, Preset, SpecConfig
from lokid.core.launch.plan import PlanInputs, build_plan

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


def test_base_argv_order_then_client_defaults_then_spec_then_extra_args_last() -> None:
    p = preset(mmproj="proj.gguf", gpu_layers="99", ubatch=512, ctx=8192,
               extra_args=("--jinja", "-t", "8"), spec=SpecConfig(mode="mtp"),
               chat=ChatConfig(temperature=0.6))
    plan = build_plan(inputs(p, mmproj_path="/m/proj.gguf"))
    assert plan.argv == (
        ENGINE, "-m", MTP.path, "--host", "127.0.0.1", "--port", "8080", "-c", "8192",
        "--mmproj", "/m/proj.gguf", "-ngl", "99", "-ub", "512",
        "--alias", "p", "--temp", "0.6",
        "--spec-type", "draft-mtp", "--spec-draft-sampling", "greedy",
        "--jinja", "-t", "8",
    )


def test_without_spec_the_command_line_has_no_spec_flag() -> None:
    plan = build_plan(inputs(preset()))
    assert plan.argv == (ENGINE, "-m", MTP.path, "--host", "127.0.0.1", "--port", "8080",
                         "-c", "32768", "--alias", "p")
    assert len(plan.notes) == 1 and plan.env == {}
    assert plan.spec.mode == "off" and plan.spec.types == () and not plan.spec.auto


def test_clients_see_the_preset_name_as_the_model_unless_an_alias_is_set_by_hand() -> None:
    plan = build_plan(inputs(preset(name="qwen-chat")))
    assert plan.argv[-2:] == ("--alias", "qwen-chat")
    assert plan.notes == ("--alias qwen-chat: clients (GET /v1/models, the model of each "
                          "reply) see the preset's name, not the model file's path (set -a "
                          "in extra_args to choose)",)
    for by_hand, environ in (({"extra_args": ("-a", "mine")}, {}),
                             ({"extra_args": ("--alias=mine",)}, {}),
                             ({"env": {"LLAMA_ARG_ALIAS": "mine"}}, {}),
                             ({}, {"LLAMA_ARG_ALIAS": "mine"})):
        own = build_plan(inputs(preset(name="qwen-chat", **by_hand), environ=environ))
        assert "qwen-chat" not in own.argv and own.notes == (), by_hand


def test_no_alias_on_an_engine_that_does_not_know_the_flag() -> None:
    plan = build_plan(inputs(preset(), caps=caps_without("--alias")))
    assert "--alias" not in plan.argv
    assert plan.notes == ("this engine does not know --alias: clients see the model file's "
                          "path as the model's name",)


ALL_CHAT = ChatConfig(reasoning_effort="high", temperature=0.7, top_p=0.95, top_k=20, min_p=0.0)


def test_chat_values_become_the_engine_defaults_each_with_its_note() -> None:
    plan = build_plan(inputs(preset(chat=ALL_CHAT)))
    assert plan.argv[-12:] == ("--alias", "p", "--temp", "0.7", "--top-p", "0.95",
                               "--top-k", "20", "--min-p", "0.0",
                               "--reasoning-effort", "high")
    for key, flag, value in (("temperature", "--temp", "0.7"), ("top_p", "--top-p", "0.95"),
                             ("top_k", "--top-k", "20"), ("min_p", "--min-p", "0.0"),
                             ("reasoning_effort", "--reasoning-effort", "high")):
        assert (f"chat.{key} = {value} → {flag} {value}: the engine's default for requests "
                "that do not set it") in plan.notes


@pytest.mark.parametrize("extra,env,flag", [
    (("--temperature", "1.0"), {}, "--temp"),
    (("--temp=1.0",), {}, "--temp"),
    ((), {"LLAMA_ARG_TOP_K": "40"}, "--top-k"),
    (("--reasoning-effort", "low"), {}, "--reasoning-effort"),
])
def test_a_chat_flag_set_by_hand_is_left_to_the_operator(
        extra: tuple[str, ...], env: dict[str, str], flag: str) -> None:
    plan = build_plan(inputs(preset(chat=ALL_CHAT, extra_args=extra, env=env)))
    lokids = plan.argv[:len(plan.argv) - len(extra)]
    assert flag not in lokids
    assert any(n.startswith("chat.") and f"sets {flag} (the benchmark still sends" in n
               for n in plan.notes), plan.notes
    assert sum("→" in n for n in plan.notes) == 4  # the other four are passed


def test_a_chat_flag_the_engine_does_not_know_is_not_passed() -> None:
    plan = build_plan(inputs(preset(chat=ChatConfig(reasoning_effort="low", top_k=5)),
                             caps=caps_without("--reasoning-effort")))
    assert "--reasoning-effort" not in plan.argv and plan.argv[-2:] == ("--top-k", "5")
    assert ("this engine does not know --reasoning-effort: chat.reasoning_effort reaches "
            "only the benchmark's requests") in plan.notes
    assert plan.spec.mode == "off" and plan.spec.types == () and not plan.spec.auto


def test_environment_lokid_adds() -> None:
    p = preset(gpus="0,1", op_offload_min_batch=128, env={"LLAMA_ARG_THREADS": "8"})
    plan = build_plan(inputs(p))
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                        "GGML_OP_OFFLOAD_MIN_BATCH": "128", "LLAMA_ARG_THREADS": "8"}


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
    assert set(data) == {"preset", "argv", "env", "notes", "spec", "secrets"}
    assert set(data["spec"]) == {"mode", "types", "auto"}
    assert data["preset"] == "p" and data["argv"][0] == ENGINE
    assert data["env"] == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
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


AUTO = SpecConfig(mode="auto")


def test_log_verbosity_4_when_the_engine_has_a_gpu_backend() -> None:
    plan = build_plan(inputs(preset(spec=AUTO), caps=replace(B11434, gpu_backends=("cuda",))))
    assert plan.argv[-2:] == ("-lv", "4")
    assert ("automatic speculation: the engine has the CUDA backend: engine log verbosity 4, "
            "so that the journal shows whether every layer reached the GPU (set -lv in "
            "extra_args to choose)") in plan.notes
    two = build_plan(inputs(preset(spec=AUTO),
                            caps=replace(B11434, gpu_backends=("cuda", "vulkan"))))
    assert any("the CUDA and Vulkan backends: engine log verbosity 4" in n for n in two.notes)


def test_no_log_verbosity_4_on_a_cpu_only_engine() -> None:
    """A CPU-only engine never prints offload lines; 4 would only multiply the journal."""
    plan = build_plan(inputs(preset(spec=AUTO), caps=replace(B11434, gpu_backends=())))
    assert plan.spec.auto and "-lv" not in plan.argv
    assert ("automatic speculation: engine log verbosity left at its default, the engine has "
            "no GPU backend (only CPU libraries beside it), so it prints no offload lines to "
            "check") in plan.notes


def test_log_verbosity_4_when_lokid_cannot_tell_the_backends() -> None:
    plan = build_plan(inputs(preset(spec=AUTO), caps=replace(B11434, gpu_backends=None)))
    assert plan.argv[-2:] == ("-lv", "4")
    assert any(n.startswith("automatic speculation: lokid cannot tell whether this engine has "
                            "a GPU backend (no libggml-* library beside it): engine log "
                            "verbosity 4") for n in plan.notes)


def test_verbosity_is_not_touched_without_automatic_speculation() -> None:
    for caps in (replace(B11434, gpu_backends=("cuda",)), replace(B11434, gpu_backends=())):
        plan = build_plan(inputs(preset(spec=SpecConfig(mode="mtp")), caps=caps))
        assert "-lv" not in plan.argv and not any("verbosity" in n for n in plan.notes)
