"""Speculative decoding: which flags lokid adds for a preset's ``[spec]`` table, and why.

Speculative decoding never changes what the model says: every emitted token is
sampled by the target model and a drafted token is kept only when it agrees.
Its costs are elsewhere: 1-2 GB of extra VRAM for an MTP head or a draft
model, sometimes a slower prefill, and engine features recent enough to stop
the engine from starting. Hence:

- ``off`` (the default) adds nothing, whatever else is set;
- ``auto`` adds an MTP head or a draft model only when every guard in
  :func:`auto_blocker` passes, and the attempt verdict allows it (a model
  with nothing to draft with, no MTP head and no ``draft``, gets a note);
- ``mtp`` forces it, with a warning for each guard it overrides;
- ``ngram`` adds llama.cpp's n-gram drafter (no model: it proposes the
  continuation of text already in the context), ``mtp+ngram`` both.

Settings the operator already made in ``extra_args`` or ``LLAMA_ARG_*`` win:
lokid then adds nothing, since ``--spec-type`` accumulates and a second draft
would be loaded. Anything that cannot apply is dropped with a note that says
why and what to do; the engine always starts. (A value that means nothing,
such as ``mode = "eagle"``, never gets here: :mod:`lokid.core.config.files` rejects
it with the valid ones.)

Pure: the caller has resolved files, read GGUF headers and the engine's help.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..config.files import SpecConfig
from ..model.modelinfo import ModelInfo
from . import flags
from .caps import EngineCaps
from .flags import flag_value, flag_values, has_flag, has_prefix

# First official build where automatic MTP is trusted (server-side MTP landed
# in llama.cpp PR #22673 and follow-ups). An unknown build (0) is refused too:
# a local build or a fork may know the flag without honouring it.
AUTO_MIN_BUILD = 11009

# n-gram drafter, always in its explicit form: --spec-default's content is an
# upstream TODO and may change under us with an engine update.
NGRAM_ARGS = (
    "--spec-ngram-mod-n-match", "24",
    "--spec-ngram-mod-n-min", "48",
    "--spec-ngram-mod-n-max", "64",
)
# One n-gram verification step evaluates up to n_max + 1 tokens at once.
NGRAM_VERIFY_BATCH = 65
SUGGESTED_OFFLOAD_MIN_BATCH = 128

# Speculation heads that are not standalone models: -md with draft-simple
# cannot load them; their --spec-type is set by hand.
SIDECAR_ARCHS = ("eagle3", "dflash")


@dataclass(frozen=True)
class DraftInput:
    """``spec.draft`` as the caller found it on disk."""

    setting: str
    path: str | None = None          # resolved file, None when not found
    error: str = ""                  # why it was not found or could not be read
    info: ModelInfo | None = None    # its GGUF header, None when unreadable
    is_model: bool = False           # the same file as the preset's model


@dataclass(frozen=True)
class SpecInputs:
    spec: SpecConfig
    extra_args: Sequence[str]
    arg_env: Mapping[str, str]       # LLAMA_ARG_* / GGML_* the engine will see
    model: ModelInfo
    draft: DraftInput | None
    caps: EngineCaps
    gpu_layers: str | None           # the preset's gpu_layers
    ctx: int                         # the preset's ctx
    mmproj: bool                     # a vision projector is loaded
    offload_min_batch: int | None    # GGML_OP_OFFLOAD_MIN_BATCH the engine will see
    host_memory: int = 0             # bytes of RAM, 0 = unknown
    auto_blocked: str = ""           # attempt verdict: why auto is cut for this config


@dataclass
class SpecResult:
    mode: str
    args: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    auto: bool = False               # flags added by auto: the attempt token applies


# --- small readers -----------------------------------------------------------------


def supports_mtp(caps: EngineCaps) -> bool:
    # The current token-count flag too: an engine with only the old
    # --draft-max is from a generation where MTP does not exist.
    return caps.mentions("draft-mtp") and caps.knows("--spec-draft-n-max")


def supports_ngram(caps: EngineCaps) -> bool:
    # Not the bare word ngram-mod: engines from before the rename list it too.
    return caps.knows("--spec-ngram-mod-n-match")


def ctx_fixed(ctx: int, extra: Sequence[str]) -> bool:
    """Whether the context the engine will use is a fixed number.

    With 0 (or an unreadable -c), --fit may shrink the context to make room:
    information the model silently loses.
    """
    value = flag_value(extra, *flags.CTX_SIZE[0])
    if value is None:
        return ctx > 0
    try:
        return int(value) > 0
    except ValueError:
        return False


def _placement(inp: SpecInputs) -> flags.Placement:
    return flags.placement(inp.extra_args, inp.arg_env, inp.model.block_count, inp.gpu_layers)


def stateful_sampler(extra: Sequence[str]) -> str:
    """A sampler whose state advances per draw (mirostat, adaptive-p), or "".

    Probabilistic acceptance makes the target model draw first and may then
    emit another token: such a sampler would advance on a token the answer
    does not contain. Greedy acceptance stays exact.
    """
    for value in flag_values(extra, "--mirostat"):
        if value.strip() not in ("", "0"):
            return "--mirostat " + value.strip()
    for value in flag_values(extra, "--samplers"):
        if "adaptive_p" in value.lower().replace("-", "_"):
            return "--samplers adaptive-p"
    for value in flag_values(extra, "--sampling-seq", "--sampler-seq"):
        if "a" in value:
            return "--sampling-seq with adaptive-p (a)"
    return ""


def auto_blocker(inp: SpecInputs) -> str:
    """Why ``auto`` does not switch speculation on, or "" when it may.

    Each guard answers a real failure:
    - qwen4exp: its MTP support is days old and out-of-memory reports exist
      on multi-GPU hosts;
    - manual placement: only --fit budgets the head's VRAM;
    - a context that is not fixed: --fit could shrink it to make room;
    - a vision projector: a second model already squeezes VRAM;
    - an unknown or older engine build;
    - the last automatic launch of this same configuration never answered.
    """
    if inp.model.arch.lower() == "qwen4exp":
        return "qwen4exp: its MTP support is too new in this engine (mode = \"mtp\" forces it)"
    placement = _placement(inp).by_hand
    if placement:
        return f"manual placement ({placement}): --fit does not budget the draft's VRAM"
    if not ctx_fixed(inp.ctx, inp.extra_args):
        return "ctx is not fixed: --fit could shrink the context to fit the draft"
    if inp.mmproj or has_flag(inp.extra_args, "--mmproj", "-mm"):
        return "a vision projector is loaded"
    if inp.caps.build < AUTO_MIN_BUILD:
        if inp.caps.build <= 0:
            return "the engine's build is unknown (a local build or a fork)"
        return f"engine build b{inp.caps.build} is older than b{AUTO_MIN_BUILD}"
    return inp.auto_blocked


# --- the decision --------------------------------------------------------------------


def _draft_source(inp: SpecInputs, mode: str) -> tuple[list[str], str, str, str]:
    """Where drafts come from for a mode using a model (auto, mtp, mtp+ngram).

    Returns (args, spec type, label, why-not). Like llama.cpp, the head is
    recognised by its tensors: a nextn_predict_layers key alone does not
    prove the head is in the file (the engine aborts on such a file).
    """
    d = inp.draft
    if d is not None and not d.is_model:
        if d.path is None:
            why = f"spec.draft = {d.setting!r} not found"
            return [], "", "", why + (f" ({d.error})" if d.error else "")
        if d.info is None:
            reason = f": {d.error}" if d.error else ""
            return [], "", "", (f"spec.draft is unreadable{reason} "
                                "(an incomplete GGUF, or still downloading?)")
        if d.info.has_nextn_tensor:
            if not supports_mtp(inp.caps):
                return [], "", "", "this engine does not know --spec-type draft-mtp"
            # The type is explicit: llama.cpp only guesses it for the first split.
            return ["-md", d.path], "draft-mtp", "MTP head " + _base(d.path), ""
        if d.info.arch.lower() in SIDECAR_ARCHS:
            return [], "", "", (f"spec.draft is an {d.info.arch} head, not a draft model: "
                                "set -md and --spec-type in extra_args")
        if mode == "mtp+ngram":
            return [], "", "", f"spec.draft {_base(d.path)} is not an MTP head"
        if not (inp.caps.knows("--spec-type") and inp.caps.mentions("draft-simple")):
            return [], "", "", "this engine does not know --spec-type draft-simple"
        # Without an explicit type, a draft that is not an MTP head would be
        # loaded into VRAM and never used.
        return ["-md", d.path], "draft-simple", "draft model " + _base(d.path), ""

    m = inp.model
    if not m.has_nextn_tensor:
        if mode != "auto" or m.nextn_predict_layers > 0:
            return [], "", "", ("no MTP head in this file (published separately? "
                                "set spec.draft = \"mtp-….gguf\")")
        # Said, not silent: an operator who asked for auto should learn that it
        # does nothing here rather than believe speculation is on.
        draft = "names the model itself" if d is not None else "is not set"
        return [], "", "", (f"nothing to draft with: the model has no MTP head and spec.draft "
                            f"{draft} (set it to an MTP head file or a small draft model)")
    if not supports_mtp(inp.caps):
        return [], "", "", "this engine does not know --spec-type draft-mtp"
    return [], "draft-mtp", "the model's MTP head", ""


def _base(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _forced_warnings(inp: SpecInputs) -> list[str]:
    """What a forced mode overrides, said once in its note."""
    out = []
    placement = _placement(inp).by_hand
    if placement:
        out.append(f"manual placement ({placement}): --fit does not budget the draft, "
                   "place it with -devd / -ngld if VRAM runs short")
    if not ctx_fixed(inp.ctx, inp.extra_args):
        out.append("ctx is not fixed: --fit could shrink it to fit the draft")
    if inp.model.arch.lower() == "qwen4exp":
        out.append("qwen4exp MTP is very new")
    return out


def plan_spec(inp: SpecInputs) -> SpecResult:
    """The speculative-decoding part of the plan."""
    mode = inp.spec.mode
    res = SpecResult(mode=mode)
    notes = res.notes
    _synth_warning(inp, notes)

    if mode == "off":
        if inp.spec.draft is not None:
            notes.append("spec.draft ignored: spec.mode is off (auto or mtp would use it)")
        return res
    if flags.spec_by_hand(inp.extra_args, inp.arg_env, ngram_only=mode == "ngram"):
        notes.append("speculative decoding is already set in extra_args or LLAMA_ARG_*: "
                     f"spec.mode = {mode} ignored")
        return res

    def skip(why: str) -> SpecResult:
        notes.append(f"spec.mode = {mode}: {why}; starting without speculative decoding")
        return res

    want_model = mode in ("auto", "mtp", "mtp+ngram")
    want_ngram = mode in ("ngram", "mtp+ngram")
    args: list[str] = []
    types: list[str] = []
    label = ""

    if want_model:
        src_args, src_type, label, why = _draft_source(inp, mode)
        if not src_type:
            if mode != "mtp+ngram":
                return skip(why)
            notes.append(f"spec.mode = mtp+ngram: {why}; using n-grams alone")
            want_model = False
        else:
            args += src_args
            types.append(src_type)
        if want_model and inp.draft is not None and inp.draft.is_model:
            notes.append("spec.draft is the model itself: ignored, its integrated MTP head "
                         "drafts without -md (a second copy would be loaded otherwise)")

    if want_model and mode == "auto":
        why = auto_blocker(inp)
        if why:
            return skip(why)
        res.auto = True
        notes.append(f"spec.mode = auto → {label}: output unchanged (every token is verified "
                     "by the model), ~1-2 GB more VRAM; measure prefill, set mode = \"off\" "
                     "to disable")
    elif want_model:
        extra = "; ".join(_forced_warnings(inp))
        notes.append(f"spec.mode = {mode} → {label} forced: output unchanged, ~1-2 GB more "
                     "VRAM" + (f"; {extra}" if extra else ""))

    if want_ngram:
        ngram_why = _ngram_blocker(inp)
        if ngram_why and not want_model:
            return skip(ngram_why)
        if ngram_why:
            notes.append(f"spec.mode = {mode}: n-grams dropped, {ngram_why}; MTP alone")
            want_ngram = False
        else:
            types.append("ngram-mod")
            _ngram_warnings(inp, mode, notes)

    if not types:
        return res
    args += ["--spec-type", ",".join(types)]
    if want_ngram:
        args += NGRAM_ARGS
    if want_model:
        args += _n_max_args(inp, notes)
    elif inp.spec.n_max is not None:
        notes.append("spec.n_max applies to MTP heads and draft models, not to n-grams: ignored")
    args += _sampling_args(inp, mode, notes)
    res.args = args
    res.types = types
    return res


def _synth_warning(inp: SpecInputs, notes: list[str]) -> None:
    if has_prefix(inp.extra_args, "--spec-synth-") or any(
        k.startswith("LLAMA_ARG_SPEC_SYNTH") and v.strip() for k, v in inp.arg_env.items()
    ):
        notes.append("warning: --spec-synth-* accepts drafts at random (an engine test "
                     "feature): speeds and acceptance are not real; lokid never sets it")


def _ngram_blocker(inp: SpecInputs) -> str:
    if not supports_ngram(inp.caps):
        return "this engine does not know --spec-ngram-mod-n-match"
    cpu = _placement(inp).on_cpu
    if cpu and (inp.offload_min_batch is None or inp.offload_min_batch <= NGRAM_VERIFY_BATCH):
        have = "unset" if inp.offload_min_batch is None else str(inp.offload_min_batch)
        return (f"weights on CPU ({cpu}) with GGML_OP_OFFLOAD_MIN_BATCH {have}: every "
                f"{NGRAM_VERIFY_BATCH}-token verification batch would copy them to the GPU; "
                f"set op_offload_min_batch = {SUGGESTED_OFFLOAD_MIN_BATCH}")
    return ""


def _ngram_warnings(inp: SpecInputs, mode: str, notes: list[str]) -> None:
    m = inp.model
    cpu = _placement(inp).on_cpu
    if cpu and inp.host_memory and m.file_size > inp.host_memory:
        notes.append(f"warning: the model ({m.file_size / 2**30:.1f} GiB) is larger than RAM "
                     f"({inp.host_memory / 2**30:.1f} GiB) with weights on CPU: n-gram "
                     "verification batches will read them from disk")
    if m.hybrid:
        notes.append(f"warning: {m.arch} is a hybrid model: a rejected draft rolls its "
                     "recurrent state back to a checkpoint, so n-grams gain less and the "
                     "checkpoints take memory")
    if inp.gpu_layers is not None and inp.gpu_layers.isdigit():
        notes.append("warning: gpu_layers is fixed: n-gram verification computes logits for "
                     f"up to {NGRAM_VERIFY_BATCH} tokens per step, a buffer a hand-made "
                     "placement does not budget")
    if mode == "ngram":
        if m.has_nextn_tensor:
            notes.append("the model's MTP head is unused with mode = \"ngram\" "
                         "(mode = \"mtp+ngram\" would use it)")
        if inp.spec.draft is not None:
            notes.append("spec.draft is unused with mode = \"ngram\" "
                         "(mode = \"mtp+ngram\" would use an MTP head)")


def _n_max_args(inp: SpecInputs, notes: list[str]) -> list[str]:
    n = inp.spec.n_max
    if n is None:
        return []  # the engine's default (3)
    if not inp.caps.knows("--spec-draft-n-max"):
        notes.append("this engine does not know --spec-draft-n-max: spec.n_max ignored")
        return []
    if has_flag(inp.extra_args, "--spec-draft-n-max") or inp.arg_env.get(
        "LLAMA_ARG_SPEC_DRAFT_N_MAX", ""
    ).strip():
        return []  # the operator's own value wins
    return ["--spec-draft-n-max", str(n)]


def _sampling_args(inp: SpecInputs, mode: str, notes: list[str]) -> list[str]:
    """Draft sampling: greedy is exact whatever the sampler chain, so it is pinned
    whenever the engine knows the flag (an upstream default change changes nothing)."""
    sampling = "greedy"
    if inp.spec.sampling == "probabilistic":
        sampler = stateful_sampler(inp.extra_args)
        if mode != "mtp":
            notes.append(f"spec.sampling = probabilistic ignored with mode = {mode} "
                         "(only mode = \"mtp\" allows it): greedy")
        elif sampler:
            notes.append(f"spec.sampling = probabilistic refused with {sampler} (that sampler "
                         "would advance on rejected tokens): greedy")
        elif not inp.caps.mentions("probabilistic"):
            notes.append("this engine does not know --spec-draft-sampling probabilistic: greedy")
        else:
            sampling = "probabilistic"
    if not inp.caps.knows("--spec-draft-sampling"):
        return []
    if has_flag(inp.extra_args, "--spec-draft-sampling") or inp.arg_env.get(
        "LLAMA_ARG_SPEC_DRAFT_SAMPLING", ""
    ).strip():
        return []
    return ["--spec-draft-sampling", sampling]
