"""lokid.core.launch.spec: every speculative-decoding rule, one test (or table row) per
behaviour."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from support.engine_data import B11434, SKULK_BUILD1, caps_build, caps_without
from support.headers import DFLASH, DRAFT, EAGLE, HEAD, HYBRID, KEY_ONLY, MTP, PLAIN, QWEN4EXP

from lokid.core.config.files import SpecConfig
from lokid.core.launch.caps import EngineCaps
from lokid.core.launch.spec import NGRAM_ARGS, DraftInput, SpecInputs, SpecResult, plan_spec
from lokid.core.model.modelinfo import ModelInfo

GREEDY = ["--spec-draft-sampling", "greedy"]


def draft_of(info: ModelInfo | None, setting: str = "", **kw: object) -> DraftInput:
    path = kw.pop("path", info.path if info else None)
    return DraftInput(setting=setting or (info.path if info else "x.gguf"),
                      path=path, info=info, **kw)  # type: ignore[arg-type]


def run(mode: str = "off", *, draft: DraftInput | None = None, n_max: int | None = None,
        sampling: str | None = None, extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None, model: ModelInfo = MTP, caps: EngineCaps = B11434,
        gpu_layers: str | None = None, ctx: int = 32768, mmproj: bool = False,
        offload: int | None = None, host_memory: int = 0, auto_blocked: str = "") -> SpecResult:
    """The spec part of a plan; the values are valid ones (the config rejects the others:
    tests/core/config/test_config.py)."""
    spec = SpecConfig(mode=mode, draft=draft.setting if draft else None, n_max=n_max,
                      sampling=sampling)
    return plan_spec(SpecInputs(
        spec=spec, extra_args=list(extra), arg_env=dict(env or {}), model=model, draft=draft,
        caps=caps, gpu_layers=gpu_layers, ctx=ctx, mmproj=mmproj, offload_min_batch=offload,
        host_memory=host_memory, auto_blocked=auto_blocked,
    ))


def joined(res: SpecResult) -> str:
    return "\n".join(res.notes)


# --- modes -------------------------------------------------------------------------


def test_absent_spec_table_adds_nothing_and_says_nothing() -> None:
    res = run()
    assert (res.mode, res.args, res.types, res.notes, res.auto) == ("off", [], [], [], False)


def test_off_adds_nothing_even_with_a_draft_and_says_the_draft_is_ignored() -> None:
    res = run("off", draft=draft_of(HEAD))
    assert res.args == [] and not res.auto
    assert "spec.draft ignored: spec.mode is off" in joined(res)


def test_auto_uses_the_integrated_mtp_head_and_marks_the_launch_automatic() -> None:
    res = run("auto")
    assert res.args == ["--spec-type", "draft-mtp", *GREEDY]
    assert res.types == ["draft-mtp"] and res.auto
    assert "spec.mode = auto → the model's MTP head" in joined(res)


def test_auto_on_a_model_with_nothing_to_draft_with_says_so() -> None:
    res = run("auto", model=PLAIN)
    assert (res.args, res.auto) == ([], False)
    assert res.notes == ["spec.mode = auto: nothing to draft with: the model has no MTP head "
                         "and spec.draft is not set (set it to an MTP head file or a small "
                         "draft model); starting without speculative decoding"]
    itself = run("auto", model=PLAIN, draft=draft_of(PLAIN, is_model=True))
    assert "spec.draft names the model itself" in joined(itself) and itself.args == []


def test_a_nextn_key_without_the_tensor_is_not_a_head() -> None:
    # The engine aborts (GGML_ASSERT nextn.eh_proj) on draft-mtp with such a file.
    for mode in ("auto", "mtp"):
        res = run(mode, model=KEY_ONLY)
        assert res.args == []
        assert "no MTP head in this file" in joined(res)
        assert "mtp-….gguf" in joined(res)


def test_mtp_forced_on_a_model_without_head_is_skipped_with_the_reason() -> None:
    res = run("mtp", model=PLAIN)
    assert res.args == [] and "no MTP head in this file" in joined(res)


def test_mtp_forced_adds_the_head_without_auto_guards_and_is_not_automatic() -> None:
    res = run("mtp", caps=caps_build(0), ctx=0, gpu_layers="20", model=QWEN4EXP, mmproj=True)
    assert res.types == ["draft-mtp"] and not res.auto
    notes = joined(res)
    assert "forced" in notes
    assert "manual placement (gpu_layers = 20)" in notes and "-devd / -ngld" in notes
    assert "ctx is not fixed" in notes
    assert "qwen4exp MTP is very new" in notes


# --- the operator's own settings win ---------------------------------------------------


@pytest.mark.parametrize("extra", [
    ["--spec-type", "draft-mtp"], ["--spec-type=ngram-mod"], ["--spec_type", "draft-mtp"],
    ["-md", "/m/d.gguf"], ["--model-draft", "/m/d.gguf"], ["--spec-draft-model", "/m/d.gguf"],
    ["-hfd", "org/repo"], ["-hfrd", "org/repo"], ["--spec-draft-hf", "org/repo"],
    ["--hf-repo-draft", "org/repo"], ["--spec-default"], ["--spec-ngram-mod-n-match", "8"],
    ["--spec-ngram-mod-n-max=16"],
])
@pytest.mark.parametrize("mode", ["auto", "mtp", "ngram", "mtp+ngram"])
def test_speculation_set_in_extra_args_silences_lokid(extra: list[str], mode: str) -> None:
    res = run(mode, extra=extra)
    assert res.args == [] and res.types == [] and not res.auto
    assert "already set in extra_args or LLAMA_ARG_*" in joined(res)


@pytest.mark.parametrize("var", ["LLAMA_ARG_SPEC_TYPE", "LLAMA_ARG_SPEC_DRAFT_MODEL",
                                 "LLAMA_ARG_SPEC_DRAFT_HF_REPO",
                                 "LLAMA_ARG_SPEC_NGRAM_MOD_N_MATCH"])
def test_speculation_set_in_llama_arg_env_silences_lokid(var: str) -> None:
    res = run("mtp+ngram", env={var: "x"})
    assert res.args == [] and "already set" in joined(res)


def test_an_empty_llama_arg_variable_does_not_count() -> None:
    assert run("auto", env={"LLAMA_ARG_SPEC_TYPE": " "}).types == ["draft-mtp"]


def test_spec_draft_flags_silence_lokid_for_ngram_alone_only() -> None:
    extra = ["--spec-draft-n-max", "5"]
    assert run("ngram", extra=extra).args == []
    assert run("ngram", env={"LLAMA_ARG_SPEC_DRAFT_N_MAX": "5"}).args == []
    res = run("mtp", extra=extra, n_max=4)
    assert res.types == ["draft-mtp"]
    assert "--spec-draft-n-max" not in res.args  # the operator's value is kept, not doubled


# --- drafts ------------------------------------------------------------------------


def test_a_separate_mtp_head_is_loaded_with_md_and_an_explicit_type() -> None:
    res = run("mtp", draft=draft_of(HEAD), model=PLAIN)
    assert res.args == ["-md", HEAD.path, "--spec-type", "draft-mtp", *GREEDY]
    assert "MTP head mtp-head.gguf" in joined(res)


def test_auto_with_a_separate_mtp_head() -> None:
    res = run("auto", draft=draft_of(HEAD), model=PLAIN)
    assert res.args[:4] == ["-md", HEAD.path, "--spec-type", "draft-mtp"] and res.auto


def test_an_ordinary_draft_model_gets_draft_simple() -> None:
    res = run("mtp", draft=draft_of(DRAFT), model=PLAIN)
    assert res.args == ["-md", DRAFT.path, "--spec-type", "draft-simple", *GREEDY]
    assert res.types == ["draft-simple"]


@pytest.mark.parametrize("head", [EAGLE, DFLASH])
def test_eagle3_and_dflash_heads_are_refused_with_a_pointer_to_extra_args(
        head: ModelInfo) -> None:
    res = run("mtp", draft=draft_of(head), model=PLAIN)
    assert res.args == []
    assert f"is an {head.arch} head, not a draft model" in joined(res)
    assert "-md and --spec-type in extra_args" in joined(res)


def test_the_model_itself_as_draft_is_ignored_and_the_integrated_head_serves() -> None:
    # A second full copy of the model would be loaded (9.6 GB on a 27B: engine dead).
    res = run("auto", draft=draft_of(MTP, is_model=True), model=MTP)
    assert "-md" not in res.args
    assert res.types == ["draft-mtp"]
    assert "spec.draft is the model itself: ignored" in joined(res)


def test_a_draft_not_found_does_not_block_the_launch() -> None:
    res = run("mtp", draft=DraftInput(setting="mtp-x.gguf", error="in model_dirs (/m)"),
              model=PLAIN)
    assert res.args == []
    assert "spec.draft = 'mtp-x.gguf' not found (in model_dirs (/m))" in joined(res)
    assert "starting without speculative decoding" in joined(res)


def test_an_unreadable_draft_is_skipped_with_the_reason() -> None:
    res = run("mtp", draft=DraftInput(setting="d.gguf", path="/m/d.gguf",
                                      error="truncated at byte 12"), model=PLAIN)
    assert res.args == []
    assert "spec.draft is unreadable: truncated at byte 12" in joined(res)


# --- help-text guards -----------------------------------------------------------------


def test_an_engine_without_draft_mtp_gets_no_mtp() -> None:
    res = run("mtp", caps=caps_without("draft-mtp"))
    assert res.args == [] and "does not know --spec-type draft-mtp" in joined(res)


def test_an_engine_with_draft_mtp_but_the_old_draft_max_flag_gets_no_mtp() -> None:
    res = run("auto", caps=caps_without("--spec-draft-n-max"))
    assert res.args == [] and "does not know --spec-type draft-mtp" in joined(res)


def test_an_engine_without_draft_simple_gets_no_draft_model() -> None:
    res = run("mtp", draft=draft_of(DRAFT), model=PLAIN, caps=caps_without("draft-simple"))
    assert res.args == [] and "does not know --spec-type draft-simple" in joined(res)


def test_ngram_uses_the_explicit_form_never_spec_default() -> None:
    res = run("ngram", model=PLAIN)
    assert res.args == ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "24",
                        "--spec-ngram-mod-n-min", "48", "--spec-ngram-mod-n-max", "64", *GREEDY]
    assert "--spec-default" not in res.args and not res.auto


def test_ngram_guard_needs_the_n_match_flag_not_just_the_word() -> None:
    caps = caps_without("--spec-ngram-mod-n-match")
    assert caps.mentions("ngram-mod")
    res = run("ngram", model=PLAIN, caps=caps)
    assert res.args == [] and "does not know --spec-ngram-mod-n-match" in joined(res)


# --- mtp+ngram ------------------------------------------------------------------------


def test_mtp_plus_ngram_with_a_real_head() -> None:
    res = run("mtp+ngram")
    assert res.args == ["--spec-type", "draft-mtp,ngram-mod", *NGRAM_ARGS, *GREEDY]
    assert res.types == ["draft-mtp", "ngram-mod"]


def test_mtp_plus_ngram_with_a_separate_head() -> None:
    res = run("mtp+ngram", draft=draft_of(HEAD), model=PLAIN)
    assert res.args[:4] == ["-md", HEAD.path, "--spec-type", "draft-mtp,ngram-mod"]


@pytest.mark.parametrize("model,draft,why", [
    (PLAIN, None, "no MTP head in this file"),
    (KEY_ONLY, None, "no MTP head in this file"),
    (PLAIN, DRAFT, "is not an MTP head"),
])
def test_mtp_plus_ngram_without_a_real_head_falls_back_to_ngram_with_the_reason(
        model: ModelInfo, draft: ModelInfo | None, why: str) -> None:
    res = run("mtp+ngram", model=model, draft=draft_of(draft) if draft else None)
    assert res.types == ["ngram-mod"]
    assert res.args[:2] == ["--spec-type", "ngram-mod"] and "-md" not in res.args
    assert why in joined(res) and "using n-grams alone" in joined(res)


def test_mtp_plus_ngram_on_an_engine_without_mtp_falls_back_to_ngram() -> None:
    res = run("mtp+ngram", caps=caps_without("draft-mtp"))
    assert res.types == ["ngram-mod"]


# --- automatic-mode blockers ------------------------------------------------------------


@pytest.mark.parametrize("kw,why", [
    ({"model": QWEN4EXP}, "qwen4exp"),
    ({"gpu_layers": "99"}, "manual placement (gpu_layers = 99)"),
    ({"gpu_layers": "all"}, "manual placement (gpu_layers = all)"),
    ({"extra": ["-ngl", "40"]}, "manual placement (-ngl)"),
    ({"extra": ["--n-gpu-layers=40"]}, "manual placement (-ngl)"),
    ({"env": {"LLAMA_ARG_N_GPU_LAYERS": "40"}}, "manual placement (-ngl)"),
    ({"extra": ["-ts", "3,1"]}, "manual placement (-ts)"),
    ({"extra": ["-ot", "exps=CPU"]}, "manual placement (-ot)"),
    ({"extra": ["--cpu-moe"]}, "manual placement (--cpu-moe)"),
    ({"extra": ["-ncmoe", "10"]}, "manual placement (--n-cpu-moe)"),
    ({"extra": ["-sm", "row"]}, "manual placement (-sm row)"),
    ({"env": {"LLAMA_ARG_SPLIT_MODE": "row"}}, "manual placement (-sm row)"),
    ({"extra": ["--fit", "off"]}, "manual placement (--fit off)"),
    ({"extra": ["-fit", "off"]}, "manual placement (--fit off)"),
    ({"extra": ["-dev", "CUDA0"]}, "manual placement (--device)"),
    ({"env": {"LLAMA_ARG_DEVICE": "CUDA1"}}, "manual placement (--device)"),
    ({"ctx": 0}, "ctx is not fixed"),
    ({"extra": ["-c", "0"]}, "ctx is not fixed"),
    ({"extra": ["--ctx-size", "lots"]}, "ctx is not fixed"),
    ({"mmproj": True}, "a vision projector is loaded"),
    ({"extra": ["--mmproj", "/m/p.gguf"]}, "a vision projector is loaded"),
    ({"caps": caps_build(0)}, "build is unknown"),
    ({"caps": caps_build(11008)}, "b11008 is older than b11009"),
    ({"auto_blocked": "the last launch with this configuration never answered"},
     "never answered"),
])
def test_auto_blockers_each_cut_auto_and_say_why(kw: dict[str, object], why: str) -> None:
    res = run("auto", **kw)  # type: ignore[arg-type]
    assert res.args == [] and res.types == [] and not res.auto
    assert why in joined(res)
    assert "starting without speculative decoding" in joined(res)


def test_auto_is_allowed_from_build_11009_and_with_fit_on_or_split_by_layer() -> None:
    for kw in ({"caps": caps_build(11009)}, {"extra": ["--fit", "on", "-sm", "layer"]},
               {"extra": ["-c", "8192"], "ctx": 0}):
        assert run("auto", **kw).auto, kw  # type: ignore[arg-type]


# --- weights on CPU and n-grams --------------------------------------------------------


@pytest.mark.parametrize("kw,cpu", [
    ({"extra": ["--cpu-moe"]}, "--cpu-moe"),
    ({"extra": ["--n-cpu-moe", "12"]}, "--n-cpu-moe 12"),
    ({"extra": ["-ot", "blk\\.1[0-9]\\.ffn=CPU"]}, "-ot"),
    ({"gpu_layers": "10"}, "-ngl 10 of 33"),
    ({"extra": ["-ngl", "0"]}, "-ngl 0 of 33"),
])
def test_ngram_with_weights_on_cpu_needs_a_raised_offload_batch(
        kw: dict[str, object], cpu: str) -> None:
    res = run("ngram", model=PLAIN, **kw)  # type: ignore[arg-type]
    assert res.args == []
    assert f"weights on CPU ({cpu})" in joined(res)
    assert "op_offload_min_batch = 128" in joined(res)
    for offload in (None, 32, 65):
        assert run("ngram", model=PLAIN, offload=offload, **kw).args == []  # type: ignore[arg-type]
    assert run("ngram", model=PLAIN, offload=66, **kw).types == ["ngram-mod"]  # type: ignore[arg-type]
    assert run("ngram", model=PLAIN, offload=128, **kw).types == ["ngram-mod"]  # type: ignore[arg-type]


def test_all_layers_on_gpu_is_not_weights_on_cpu_but_fixed_ngl_is_warned() -> None:
    res = run("ngram", model=PLAIN, gpu_layers="33")
    assert res.types == ["ngram-mod"]
    assert "gpu_layers is fixed" in joined(res)


def test_mtp_plus_ngram_with_weights_on_cpu_keeps_mtp_alone() -> None:
    res = run("mtp+ngram", extra=["--cpu-moe"])
    assert res.types == ["draft-mtp"]
    assert "n-grams dropped" in joined(res) and "MTP alone" in joined(res)
    assert not any(a.startswith("--spec-ngram") for a in res.args)


def test_ngram_warns_when_the_model_is_larger_than_ram_with_weights_on_cpu() -> None:
    res = run("ngram", model=PLAIN, extra=["--cpu-moe"], offload=128, host_memory=4 * 2**30)
    assert "larger than RAM" in joined(res)
    assert "larger than RAM" not in joined(run("ngram", model=PLAIN, host_memory=4 * 2**30))


def test_ngram_on_a_hybrid_model_warns_about_checkpoints() -> None:
    res = run("ngram", model=HYBRID)
    assert res.types == ["ngram-mod"] and "hybrid model" in joined(res)


def test_ngram_says_an_mtp_head_or_a_draft_is_left_unused() -> None:
    assert "MTP head is unused" in joined(run("ngram", model=MTP))
    res = run("ngram", model=PLAIN, draft=draft_of(HEAD))
    assert "spec.draft is unused" in joined(res) and "-md" not in res.args


# --- n_max ---------------------------------------------------------------------------------


def test_n_max_becomes_spec_draft_n_max() -> None:
    res = run("mtp", n_max=8)
    assert res.args == ["--spec-type", "draft-mtp", "--spec-draft-n-max", "8", *GREEDY]


def test_n_max_is_left_to_the_operator_when_set_by_hand() -> None:
    assert "--spec-draft-n-max" not in run(
        "mtp", n_max=8, env={"LLAMA_ARG_SPEC_DRAFT_N_MAX": "2"}).args


def test_n_max_does_not_apply_to_ngram_alone() -> None:
    res = run("ngram", model=PLAIN, n_max=8)
    assert "--spec-draft-n-max" not in res.args and "not to n-grams: ignored" in joined(res)


def test_n_max_on_an_engine_without_the_flag_is_ignored_with_a_note() -> None:
    # draft-simple on a pre-rename engine: the type is known, --spec-draft-n-max is not.
    caps = caps_without("--spec-draft-n-max")
    res = run("mtp", draft=draft_of(DRAFT), model=PLAIN, caps=caps, n_max=5)
    assert res.types == ["draft-simple"] and "--spec-draft-n-max" not in res.args
    assert "does not know --spec-draft-n-max: spec.n_max ignored" in joined(res)


# --- sampling ---------------------------------------------------------------------------------


def test_greedy_is_pinned_whenever_the_engine_knows_the_flag() -> None:
    for mode in ("auto", "mtp", "ngram", "mtp+ngram"):
        assert run(mode).args[-2:] == GREEDY, mode


def test_no_sampling_flag_on_an_engine_without_it() -> None:
    res = run("mtp", caps=caps_without("--spec-draft-sampling"))
    assert res.types == ["draft-mtp"] and "--spec-draft-sampling" not in res.args


def test_probabilistic_with_forced_mtp() -> None:
    assert run("mtp", sampling="probabilistic").args[-2:] == [
        "--spec-draft-sampling", "probabilistic"]


@pytest.mark.parametrize("mode", ["auto", "mtp+ngram", "ngram"])
def test_probabilistic_only_with_mode_mtp(mode: str) -> None:
    res = run(mode, sampling="probabilistic")
    assert res.args[-2:] == GREEDY
    assert "only mode = \"mtp\" allows it" in joined(res)


@pytest.mark.parametrize("kw,sampler", [
    ({"extra": ["--mirostat", "2"]}, "--mirostat 2"),
    ({"extra": ["--mirostat=1"]}, "--mirostat 1"),
    ({"extra": ["--samplers", "top_k;adaptive-p"]}, "adaptive-p"),
    ({"extra": ["--sampling-seq", "kta"]}, "adaptive-p"),
])
def test_probabilistic_is_refused_with_a_stateful_sampler(
        kw: dict[str, object], sampler: str) -> None:
    res = run("mtp", sampling="probabilistic", **kw)  # type: ignore[arg-type]
    assert res.args[-2:] == GREEDY
    assert "probabilistic refused with" in joined(res) and sampler in joined(res)


def test_mirostat_zero_is_not_stateful() -> None:
    assert run("mtp", sampling="probabilistic", extra=["--mirostat", "0"]).args[-1] == \
        "probabilistic"


def test_probabilistic_on_an_engine_that_does_not_know_it() -> None:
    res = run("mtp", sampling="probabilistic", caps=caps_without("probabilistic"))
    assert "does not know --spec-draft-sampling probabilistic" in joined(res)


def test_sampling_set_by_hand_is_left_alone() -> None:
    res = run("mtp", extra=["--spec-draft-sampling", "probabilistic"])
    assert res.types == ["draft-mtp"] and "--spec-draft-sampling" not in res.args


# --- warnings -------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [{"extra": ["--spec-synth-len", "8"]},
                                {"extra": ["--spec-synth-rates=0.5"]},
                                {"env": {"LLAMA_ARG_SPEC_SYNTH_LEN": "8"}}])
def test_spec_synth_flags_are_warned_about_in_every_mode(kw: dict[str, object]) -> None:
    for mode in ("off", "auto"):
        assert "--spec-synth-* accepts drafts at random" in joined(run(mode, **kw))  # type: ignore[arg-type]


# --- a real other build: prebuilt Vulkan llama-server reporting build 1 -------------------


def test_recorded_other_build_refuses_auto_by_its_build_number() -> None:
    assert SKULK_BUILD1.build == 1
    res = run("auto")
    assert res.auto
    res = run("auto", caps=SKULK_BUILD1)
    assert res.args == [] and "engine build b1 is older than b11009" in joined(res)


def test_recorded_other_build_without_draft_sampling_gets_mtp_and_ngram_unpinned() -> None:
    res = run("mtp+ngram", caps=SKULK_BUILD1, sampling="probabilistic")
    assert res.args == ["--spec-type", "draft-mtp,ngram-mod", *NGRAM_ARGS]
    res = run("mtp", caps=SKULK_BUILD1, sampling="probabilistic", n_max=5)
    assert res.args == ["--spec-type", "draft-mtp", "--spec-draft-n-max", "5"]
    assert "does not know --spec-draft-sampling probabilistic: greedy" in joined(res)
