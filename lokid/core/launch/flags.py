"""What llama-server's flags mean to lokid, in one place: reading them, and what they imply.

Reading: both spellings count, ``--flag value`` and ``--flag=value``; the last
occurrence wins, as in the engine; a flag beats its ``LLAMA_ARG_*`` variable.
Values are not validated here; the engine does that.

Meaning, for the planner (:mod:`lokid.core.launch.spec`) and the benchmark
(:mod:`lokid.core.bench.rules`) alike, so the two never contradict each other
in front of the operator:

- :func:`placement`: whether layer placement is set by hand (then ``--fit``,
  which only adjusts *unset* arguments, cannot budget a draft's memory), and
  whether some weights stay in RAM (a decode bound by RAM bandwidth; the
  benchmark caps its depth);
- :func:`spec_by_hand`: whether the operator configures speculation himself.

Spellings are those of llama.cpp b11434's ``--help`` (``tests/data/engine/``).
"""

from __future__ import annotations

from ..record import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing on a start's path
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# A flag: its spellings and the environment variable the engine reads for it.
Flag = tuple[tuple[str, ...], str]

# Layer placement.
GPU_LAYERS: Flag = ("-ngl", "--gpu-layers", "--n-gpu-layers"), "LLAMA_ARG_N_GPU_LAYERS"
TENSOR_SPLIT: Flag = ("-ts", "--tensor-split"), "LLAMA_ARG_TENSOR_SPLIT"
OVERRIDE_TENSOR: Flag = ("-ot", "--override-tensor"), "LLAMA_ARG_OVERRIDE_TENSOR"
CPU_MOE: Flag = ("-cmoe", "--cpu-moe"), "LLAMA_ARG_CPU_MOE"
N_CPU_MOE: Flag = ("-ncmoe", "--n-cpu-moe"), "LLAMA_ARG_N_CPU_MOE"
N_CPU_FFN: Flag = ("-ncffn", "--n-cpu-ffn"), "LLAMA_ARG_N_CPU_FFN"
SPLIT_MODE: Flag = ("-sm", "--split-mode"), "LLAMA_ARG_SPLIT_MODE"
FIT: Flag = ("-fit", "--fit"), "LLAMA_ARG_FIT"
DEVICE: Flag = ("-dev", "--device"), "LLAMA_ARG_DEVICE"
# Other flags lokid reads.
UBATCH: Flag = ("-ub", "--ubatch-size"), "LLAMA_ARG_UBATCH"
CACHE_TYPE_K: Flag = ("-ctk", "--cache-type-k"), "LLAMA_ARG_CACHE_TYPE_K"
CACHE_TYPE_V: Flag = ("-ctv", "--cache-type-v"), "LLAMA_ARG_CACHE_TYPE_V"
CTX_SIZE: Flag = ("-c", "--ctx-size"), "LLAMA_ARG_CTX_SIZE"
# Flags lokid adds from a preset unless the operator sets them (the plan).
ALIAS: Flag = ("-a", "--alias"), "LLAMA_ARG_ALIAS"
TEMPERATURE: Flag = ("--temp", "--temperature"), "LLAMA_ARG_TEMPERATURE"
TOP_P: Flag = ("--top-p",), "LLAMA_ARG_TOP_P"
TOP_K: Flag = ("--top-k",), "LLAMA_ARG_TOP_K"
MIN_P: Flag = ("--min-p",), "LLAMA_ARG_MIN_P"
REASONING_EFFORT: Flag = ("--reasoning-effort",), "LLAMA_ARG_REASONING_EFFORT"
# Where the engine saves and restores its slots (no variable in b11434).
SLOT_SAVE_PATH: Flag = ("--slot-save-path",), ""

# Secrets. A value given to one of these is never shown to a caller without the right
# to edit presets, nor logged (lokid.core.config.secrets masks it): every local user reads an
# argv in `ps`. A flag naming a file (--api-key-file, --ssl-key-file) is no secret
# itself: its path is shown, the file is never read by lokid.
API_KEY: Flag = ("--api-key",), "LLAMA_API_KEY"
HF_TOKEN: Flag = ("-hft", "--hf-token"), "HF_TOKEN"
SECRET_FLAGS: tuple[Flag, ...] = (API_KEY, HF_TOKEN)
API_KEY_FILE: Flag = ("--api-key-file",), "LLAMA_ARG_API_KEY_FILE"

# Flags and variables by which an operator sets speculation by hand.
SPEC_FLAGS = (
    "--spec-type", "--spec_type", "-md", "--model-draft", "--spec-draft-model",
    "-hfd", "-hfrd", "--spec-draft-hf", "--hf-repo-draft", "--spec-default",
)
SPEC_ENV = (
    "LLAMA_ARG_SPEC_TYPE", "LLAMA_ARG_SPEC_DRAFT_MODEL", "LLAMA_ARG_SPEC_DRAFT_HF_REPO",
)


def _match(arg: str, flags: Sequence[str]) -> str | None:
    for flag in flags:
        if arg == flag or arg.startswith(flag + "="):
            return flag
    return None


def has_flag(args: Sequence[str], *flags: str) -> bool:
    """True when any of ``flags`` appears in ``args``."""
    return any(_match(arg, flags) for arg in args)


def has_prefix(args: Sequence[str], *prefixes: str) -> bool:
    """True when a flag starting with one of ``prefixes`` appears (``--spec-ngram-`` …)."""
    return any(arg.startswith(p) for arg in args for p in prefixes)


def flag_values(args: Sequence[str], *flags: str) -> list[str]:
    """Every value given to any of ``flags``, in order."""
    values = []
    for i, arg in enumerate(args):
        flag = _match(arg, flags)
        if flag is None:
            continue
        if arg != flag:
            values.append(arg[len(flag) + 1:])
        elif i + 1 < len(args):
            values.append(args[i + 1])
        else:
            values.append("")
    return values


def flag_value(args: Sequence[str], *flags: str) -> str | None:
    """The value of the last occurrence of any of ``flags`` (the one the engine keeps)."""
    values = flag_values(args, *flags)
    return values[-1] if values else None


def setting(args: Sequence[str], env: Mapping[str, str],
            flag: Flag) -> str | None:
    """The value the engine will use for ``flag`` (spellings, variable): the last one on
    the command line, else the environment's when not blank, else None. A flag without
    a value (``--cpu-moe``) reads as ""."""
    spellings, var = flag
    value = flag_value(args, *spellings)
    if value is not None:
        return value
    from_env = env.get(var, "")
    return from_env if from_env.strip() else None


def is_set(args: Sequence[str], env: Mapping[str, str], flag: Flag) -> bool:
    return setting(args, env, flag) is not None


@record
class Placement:
    """Where the flags put the model's layers, each answer with its reason ("" = no)."""

    by_hand: str   # placement set by hand: --fit will not move layers to make room
    on_cpu: str    # some weights stay in RAM


def placement(args: Sequence[str], env: Mapping[str, str], block_count: int = 0,
              gpu_layers: str | None = None) -> Placement:
    """The layer placement of an engine started with ``args`` and ``env``.

    ``args`` is a command line or a preset's ``extra_args``; ``gpu_layers`` the preset's
    setting of that name (its ``-ngl``, before ``args``: an ``-ngl`` there wins).
    ``block_count`` is the model's (0: unknown); ``-ngl`` counts its repeating layers
    plus the output layer, so ``-ngl 33`` puts a 32-block model wholly on the GPU.
    """
    from_preset = gpu_layers is not None and flag_value(args, *GPU_LAYERS[0]) is None
    ngl = gpu_layers if from_preset else setting(args, env, GPU_LAYERS)
    ngl = ngl.strip().lower() if ngl is not None else None
    return Placement(by_hand=_by_hand(args, env, ngl, from_preset),
                     on_cpu=_on_cpu(args, env, ngl, block_count))


def _by_hand(args: Sequence[str], env: Mapping[str, str], ngl: str | None,
             from_preset: bool) -> str:
    if ngl is not None and ngl != "auto":  # auto is the default: --fit decides
        return f"gpu_layers = {ngl}" if from_preset else "-ngl"
    for flag, label in ((TENSOR_SPLIT, "-ts"), (OVERRIDE_TENSOR, "-ot"), (CPU_MOE, "--cpu-moe"),
                        (N_CPU_MOE, "--n-cpu-moe"), (N_CPU_FFN, "--n-cpu-ffn")):
        if is_set(args, env, flag):
            return label
    if (setting(args, env, SPLIT_MODE) or "").strip().lower() == "row":
        return "-sm row"
    if (setting(args, env, FIT) or "").strip().lower() in ("off", "0", "false", "no"):
        return "--fit off"
    if is_set(args, env, DEVICE):
        return "--device"
    return ""


def _on_cpu(args: Sequence[str], env: Mapping[str, str], ngl: str | None,
            block_count: int) -> str:
    if is_set(args, env, CPU_MOE):
        return "--cpu-moe"
    for flag, label in ((N_CPU_MOE, "--n-cpu-moe"), (N_CPU_FFN, "--n-cpu-ffn")):
        n = (setting(args, env, flag) or "").strip()
        if n and n != "0":
            return f"{label} {n}"
    overrides = setting(args, env, OVERRIDE_TENSOR)
    if overrides is not None and any(
            rule.rpartition("=")[2].strip().upper().startswith("CPU")
            for rule in overrides.split(",")):
        return "-ot"   # a pattern kept in a CPU buffer (=CPU); =CUDA1 moves it, to a GPU
    devices = (setting(args, env, DEVICE) or "").strip().lower()
    if devices == "none":
        return "-dev none"
    if ngl is not None and ngl.isdigit():
        layers = int(ngl)
        total = block_count + 1 if block_count else 0
        if total and layers < total:
            return f"-ngl {layers} of {total}"
        if layers == 0:
            return "-ngl 0"
    return ""


def spec_by_hand(args: Sequence[str], env: Mapping[str, str], ngram_only: bool) -> bool:
    """The operator already configures speculation by hand (with n-gram alone, the
    draft-model tuning flags count too: they are someone's speculation setup)."""
    if has_flag(args, *SPEC_FLAGS) or has_prefix(args, "--spec-ngram-"):
        return True
    if ngram_only and has_prefix(args, "--spec-draft-"):
        return True
    for key, value in env.items():
        if not value.strip():
            continue
        if key in SPEC_ENV or key.startswith("LLAMA_ARG_SPEC_NGRAM_"):
            return True
        if ngram_only and key.startswith("LLAMA_ARG_SPEC_DRAFT_"):
            return True
    return False
