"""The plan: a preset, with everything known about its files and engine → the exact launch.

:func:`build_plan` is a pure function. The argv is, in order: the engine,
``-m``, host, port, ``-c``, ``--mmproj``, ``-ngl``, ``-ub``; then what lokid
adds for clients (``--alias`` with the preset's name, the ``[chat]`` values as
the engine's defaults), the flags for speculative decoding
(:mod:`lokid.core.launch.spec`), the log verbosity the verdicts need, the secrets'
files and, for a preset in a GPU group, where its slots are saved; then the
preset's ``extra_args`` verbatim, last, so that the operator's own flags win.
``env`` is what lokid adds to the engine's environment (the preset's GPUs among it,
in lokid's one numbering: :mod:`lokid.core.launch.gpuselect`). ``notes`` say what was
decided and why, one sentence each.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import secrets
from ..config.files import GlobalConfig, Preset
from ..fleet.rpc import rpc_args
from ..model.modelinfo import ModelInfo
from ..serve.replicas import SEPARATOR, preset_of, replica_note, replica_notes
from ..serve.tables import serve_notes
from . import flags
from .caps import EngineCaps, backend_label
from .flags import flag_value, has_flag
from .gpuselect import DEVICE_VAR, order_note, visible_env, vulkan_devices
from .portunit import held_note
from .spec import DraftInput, SpecInputs, plan_spec

OFFLOAD_ENV = "GGML_OP_OFFLOAD_MIN_BATCH"
SECRET_NOTE = "secret: "
# At the engine's default verbosity (3) the llama library's load lines,
# "offloaded N/M layers to GPU" among them, are not printed; 4 prints them.
VERDICT_VERBOSITY = "4"
VERBOSITY_FLAGS = ("-lv", "--verbosity", "--log-verbosity", "-v", "--verbose", "--log-verbose")
# [chat] keys the engine takes as its defaults for requests that do not send them.
CHAT_FLAGS: tuple[tuple[str, flags.Flag], ...] = (
    ("temperature", flags.TEMPERATURE), ("top_p", flags.TOP_P), ("top_k", flags.TOP_K),
    ("min_p", flags.MIN_P), ("reasoning_effort", flags.REASONING_EFFORT),
)


@dataclass(frozen=True)
class PlanInputs:
    """Everything the plan depends on, gathered by the caller."""

    preset: Preset
    config: GlobalConfig
    model_path: str                      # resolved
    model: ModelInfo
    caps: EngineCaps
    mmproj_path: str | None = None       # resolved
    draft: DraftInput | None = None
    environ: Mapping[str, str] = field(default_factory=dict)  # lokid's own environment
    host_memory: int = 0                 # bytes, 0 = unknown
    auto_blocked: str = ""               # attempt verdict, "" = allowed
    # Where the unit's systemd credentials are (the secrets' copies), None where the
    # engine reads the secret files themselves (no systemd).
    credentials_dir: str | None = None
    # The mode bits of each secret file that any user may read.
    loose_secrets: Mapping[str, int] = field(default_factory=dict)
    # The UNIX socket the engine listens on when systemd holds the preset's port
    # (lokid.core.launch.portunit); "" = the engine listens on host:port itself.
    engine_socket: str = ""
    # Where the engine of a preset in a GPU group saves its slots (the caller's state
    # directory, slots/<preset>); "" = nowhere known: no --slot-save-path is planned.
    slot_dir: str = ""


@dataclass(frozen=True)
class SpecSummary:
    mode: str
    types: tuple[str, ...]
    auto: bool


@dataclass(frozen=True)
class Plan:
    preset: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    notes: tuple[str, ...]
    spec: SpecSummary
    host: str
    port: int
    secrets: tuple[secrets.Secret, ...] = ()   # where each is read at start; no value
    # Where the engine really listens when systemd holds host:port for it (an on-demand
    # preset's port unit, lokid.core.launch.portunit): a UNIX socket path; "" = host:port.
    # host and port stay the preset's public address: clients, the benchmark, the
    # gateway and port conflicts all go by them.
    socket: str = ""
    # The preset's gpus = "auto" (0) or gpu_count (N): the GPUs are chosen at start
    # (lokid.planning.gpuchoice sets CUDA_VISIBLE_DEVICES); None: not by lokid.
    gpu_choice: int | None = None

    def command_line(self) -> str:
        """The environment lokid adds and the argv, as one shell-quoted line (for logs:
        secret values masked)."""
        return secrets.command_line(self.env, self.argv)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form (``lokid plan --json``, and later the D-Bus Plan())."""
        return {
            "preset": self.preset,
            "argv": list(self.argv),
            "env": dict(self.env),
            "notes": list(self.notes),
            "spec": {"mode": self.spec.mode, "types": list(self.spec.types),
                     "auto": self.spec.auto},
            "secrets": [s.to_json() for s in self.secrets],
            **({"socket": self.socket} if self.socket else {}),
            **({"gpu_choice": self.gpu_choice} if self.gpu_choice is not None else {}),
        }


def engine_env(inp: PlanInputs) -> tuple[dict[str, str], list[str]]:
    """What lokid adds to the engine's environment, and the notes that say why."""
    p = inp.preset
    env = dict(p.env)
    notes = []
    if p.gpus is not None:
        selected, note = gpu_env(inp, p.gpus)
        env.update(selected)
        notes += [note] if note else []
    if p.gpus is not None or p.gpu_choice is not None:
        note = order_note(p.env)
        notes += [note] if note else []
    if p.op_offload_min_batch is not None:
        env[OFFLOAD_ENV] = str(p.op_offload_min_batch)
    return env, notes


def gpu_env(inp: PlanInputs, visible: str) -> tuple[dict[str, str], str]:
    """What the engine's environment gets for the GPUs ``visible`` names (the preset's
    ``gpus``, or those chosen at start), in lokid's one numbering
    (:mod:`lokid.core.launch.gpuselect`): CUDA_VISIBLE_DEVICES with CUDA_DEVICE_ORDER, and a
    Vulkan engine's --device; and a note on the Vulkan backend ("" for none)."""
    p = inp.preset
    env = visible_env(visible, p.env)
    by_hand = flags.is_set(p.extra_args, _effective_env(inp, p.env), flags.DEVICE)
    devices, note = vulkan_devices(visible, inp.caps, by_hand)
    env.update(devices)
    return env, note


def _effective_env(inp: PlanInputs, added: Mapping[str, str]) -> dict[str, str]:
    """The engine's LLAMA_ARG_* / GGML_* settings: lokid's own environment, then the preset's."""
    out = {k: v for k, v in inp.environ.items() if k.startswith(("LLAMA_ARG_", "GGML_"))}
    out.update(added)
    return out


def _offload_batch(env: Mapping[str, str]) -> int | None:
    value = env.get(OFFLOAD_ENV, "").strip()
    return int(value) if value.isdigit() else None


def _alias_args(inp: PlanInputs, arg_env: Mapping[str, str], notes: list[str]) -> list[str]:
    """``--alias <preset>``: clients listing models see the preset's name, not a path;
    a replica's too, never its instance's (``NAME:k``: the model of its answers, which
    changed with the engine a request went to)."""
    p = inp.preset
    name = preset_of(p.name)
    if flags.is_set(p.extra_args, arg_env, flags.ALIAS):
        return []  # the operator names the model himself
    if not inp.caps.knows("--alias"):
        notes.append("this engine does not know --alias: clients see the model file's path "
                     "as the model's name")
        return []
    notes.append(f"--alias {name}: clients (GET /v1/models, the model of each reply) see "
                 "the preset's name, not the model file's path (set -a in extra_args to "
                 "choose)")
    return ["--alias", name]


def _chat_args(inp: PlanInputs, arg_env: Mapping[str, str], notes: list[str]) -> list[str]:
    """The ``[chat]`` values as the engine's defaults, where it knows the flag and the
    operator has not set it by hand: a client that sends no sampling settings then gets
    what the preset says, as the benchmark (which sends them) measures."""
    p = inp.preset
    out: list[str] = []
    for key, flag in CHAT_FLAGS:
        value = getattr(p.chat, key)
        if value is None:
            continue
        spellings, var = flag
        text = str(value)
        if flags.is_set(p.extra_args, arg_env, flag):
            notes.append(f"chat.{key} = {text} is not passed to the engine: extra_args or "
                         f"{var} sets {spellings[0]} (the benchmark still sends {text})")
        elif not any(inp.caps.knows(s) for s in spellings):
            notes.append(f"this engine does not know {spellings[0]}: chat.{key} reaches "
                         "only the benchmark's requests")
        else:
            out += [spellings[0], text]
            notes.append(f"chat.{key} = {text} → {spellings[0]} {text}: the engine's default "
                         "for requests that do not set it")
    return out


def _secret_args(inp: PlanInputs, notes: list[str]) -> tuple[list[str],
                                                           tuple[secrets.Secret, ...]]:
    """The preset's secrets (files, :mod:`lokid.core.config.secrets`): ``--api-key-file`` for
    the API keys, the ``[secrets]`` variables for ``lokid engine`` to read at start; and
    a note for each secret left where others can read it."""
    p = inp.preset
    found = []
    if p.api_key_file is not None:
        found.append(secrets.secret(secrets.API_KEY_TARGET, p.api_key_file,
                                    inp.credentials_dir))
    found += [secrets.secret(name, source, inp.credentials_dir)
              for name, source in sorted(p.secrets.items())]
    args: list[str] = []
    for s in found:
        if not s.is_env:
            args += [s.target, s.path]
        notes.append(f"{SECRET_NOTE}{s.describe()}")
        mode = inp.loose_secrets.get(s.source)
        if mode is not None:
            notes.append(f"secret file {s.source} is mode {mode:04o}: every local user may "
                         f"read it; `chmod 600 {s.source}`")
    for spelling in secrets.secret_flags_in(p.extra_args):
        notes.append(f"extra_args gives {spelling} a value on the command line, which every "
                     "local user sees in `ps`: put it in a file (mode 0600) and name the file "
                     "in the preset (api_key_file = \"/path\" for --api-key, [secrets] for a "
                     "token the engine reads from its environment)")
    for name in sorted(p.env):
        if secrets.secret_name(name):
            notes.append(f"env.{name} looks like a secret: env values sit in the runtime plan "
                         f"and the engine's environment; move it to [secrets] ({name} = "
                         "\"/path/to/file\"), which reads it from a file at each start")
    return args, tuple(found)


def _verbosity_args(inp: PlanInputs, auto: bool, arg_env: Mapping[str, str],
                    notes: list[str]) -> list[str]:
    """``-lv 4`` on an automatic launch whose engine may print offload lines.

    The layers-in-RAM verdict reads ``offloaded N/M layers to GPU``, which the engine
    prints at verbosity 4 and only with a GPU backend; 4 also prints the engine's trace
    lines per request, two more per prompt in its prompt cache (79 lines after 20
    prompts, growing with the cache), so a CPU-only engine is left at its default.
    Unknown backends keep 4. Under systemd >= 253 journald drops those trace lines
    (``LogFilterPatterns=`` of :mod:`lokid.core.telemetry.journalfilter`, in the generator's drop-in
    of loki-engine@.service): the journal's cost per request stays bounded (issue 45,
    item 9).
    """
    p = inp.preset
    if not auto or not inp.caps.knows("-lv") or has_flag(p.extra_args, *VERBOSITY_FLAGS) \
            or arg_env.get("LLAMA_ARG_LOG_VERBOSITY", "").strip():
        return []
    backends = inp.caps.gpu_backends
    if backends == ():
        notes.append("automatic speculation: engine log verbosity left at its default, the "
                     "engine has no GPU backend (only CPU libraries beside it), so it prints "
                     "no offload lines to check")
        return []
    if backends is None:
        why = ("lokid cannot tell whether this engine has a GPU backend (no libggml-* "
               "library beside it)")
    else:
        why = f"the engine has {backend_label(backends)}"
    notes.append(f"automatic speculation: {why}: engine log verbosity {VERDICT_VERBOSITY}, so "
                 "that the journal shows whether every layer reached the GPU (set -lv in "
                 "extra_args to choose)")
    return ["-lv", VERDICT_VERBOSITY]


def _slot_args(inp: PlanInputs, arg_env: Mapping[str, str], notes: list[str]) -> list[str]:
    """``--slot-save-path`` for a preset in a GPU group: the gateway saves its slots (the
    users' prompt caches) before a swap stops it and restores them at its next start,
    so a long conversation does not pay its prefill again (issue 22, item 7)."""
    p = inp.preset
    if not p.serve.group or not inp.slot_dir:
        return []
    if flags.is_set(p.extra_args, arg_env, flags.SLOT_SAVE_PATH):
        notes.append("extra_args sets --slot-save-path: the gateway saves the slots there "
                     "before a swap and restores them after")
        return []
    if not inp.caps.knows("--slot-save-path"):
        notes.append(f"serve.group = {p.serve.group}: this engine does not know "
                     "--slot-save-path, so a swap loses the slots' prompt caches")
        return []
    notes.append(f"serve.group = {p.serve.group}: --slot-save-path {inp.slot_dir}/: before "
                 "a swap stops it, the gateway saves its slots (the users' prompt caches) "
                 "there and restores them at its next start")
    return ["--slot-save-path", inp.slot_dir + "/"]


def gpu_choice_note(choice: int) -> str:
    """What ``gpus = "auto"`` / ``gpu_count`` mean for a start (lokid plan's note)."""
    what = ("gpus = \"auto\": the fewest GPUs that hold it" if choice == 0 else
            f"gpu_count = {choice}: {choice} GPU{'s' if choice > 1 else ''}")
    return (f"{what}, chosen at each start by lokid prestart where the most fitting room "
            "is free now (best fit by the footprint measured, else the estimate); "
            "CUDA_VISIBLE_DEVICES is set then")


def build_plan(inp: PlanInputs) -> Plan:
    p = inp.preset
    port = p.port if p.port is not None else inp.config.port
    host = inp.config.host
    notes: list[str] = []

    # systemd holds host:port (portunit): the engine listens on its socket, no --port
    listen = ["--host", inp.engine_socket] if inp.engine_socket \
        else ["--host", host, "--port", str(port)]
    argv = [inp.caps.path, "-m", inp.model_path, *listen, "-c", str(p.ctx)]
    if inp.mmproj_path:
        argv += ["--mmproj", inp.mmproj_path]
    if p.gpu_layers is not None:
        argv += ["-ngl", p.gpu_layers]
    if p.ubatch is not None:
        argv += ["-ub", str(p.ubatch)]
    if p.ctx == 0:
        notes.append("ctx = 0: the context is not fixed, --fit may shrink it to fit VRAM")
    if p.gpu_choice is not None:
        notes.append(gpu_choice_note(p.gpu_choice))

    env, env_notes = engine_env(inp)
    notes += env_notes
    # the GPUs lokid passes a Vulkan engine (--device) are no placement by hand: the spec
    # rules judge the operator's flags (CUDA_VISIBLE_DEVICES is none either)
    arg_env = _effective_env(inp, {k: v for k, v in env.items()
                                   if k != DEVICE_VAR or k in p.env})
    argv += _alias_args(inp, arg_env, notes)
    argv += _chat_args(inp, arg_env, notes)
    spec = plan_spec(SpecInputs(
        spec=p.spec,
        extra_args=p.extra_args,
        arg_env=arg_env,
        model=inp.model,
        draft=inp.draft,
        caps=inp.caps,
        gpu_layers=p.gpu_layers,
        ctx=p.ctx,
        mmproj=inp.mmproj_path is not None,
        offload_min_batch=_offload_batch(arg_env),
        host_memory=inp.host_memory,
        auto_blocked=inp.auto_blocked,
    ))
    argv += spec.args
    notes += spec.notes
    argv += _verbosity_args(inp, spec.auto, arg_env, notes)
    secret_args, secret_list = _secret_args(inp, notes)
    argv += secret_args
    argv += _slot_args(inp, arg_env, notes)
    if p.rpc:
        argv += rpc_args(p.rpc)
        notes.append(f"rpc: the model is split with the RPC worker{'s' if len(p.rpc) > 1 else ''}"
                     f" {', '.join(p.rpc)} (ggml-rpc-server, loki-rpc@ there): each must "
                     "answer at every start, and serves one engine at a time")
    argv += p.extra_args
    notes += serve_notes(p.serve)

    # The operator's flags come last and win: host and port are where the
    # engine will really listen.
    extra_port = flag_value(p.extra_args, "--port")
    if extra_port is not None:
        if extra_port.isdigit() and 0 < int(extra_port) < 65536:
            port = int(extra_port)
            notes.append(f"extra_args sets --port {port}: it overrides the preset's port")
    extra_host = flag_value(p.extra_args, "--host")
    if extra_host:
        host = extra_host
    if inp.engine_socket:
        notes.append(held_note(p.name, port))
    if SEPARATOR not in p.name:   # the preset's own plan says what its replicas are
        notes += replica_notes(p, port)
    else:
        notes.append(replica_note(p.name, p.serve))

    return Plan(
        preset=p.name,
        argv=tuple(argv),
        env=env,
        notes=tuple(notes),
        spec=SpecSummary(mode=spec.mode, types=tuple(spec.types), auto=spec.auto),
        host=host,
        port=port,
        secrets=secret_list,
        socket=inp.engine_socket,
        gpu_choice=p.gpu_choice,
    )


def config_fingerprint(plan: Plan, model: ModelInfo) -> str:
    """What identifies a launch configuration for the attempt token.

    The plan as it would be with automatic speculation allowed (argv without
    the engine path, which the mark holds apart, and the environment lokid
    adds), plus the model file's size: editing the preset's settings, or
    replacing the model, makes a new configuration that deserves a new try.
    A comment-only edit does not.
    """
    data = json.dumps({"argv": list(plan.argv[1:]), "env": dict(sorted(plan.env.items())),
                       "model_size": model.file_size}, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:24]


def format_plan(plan: Plan) -> str:
    lines = [f"preset {plan.preset}"]
    if plan.env:
        lines.append("environment:")
        lines += [f"  {k}={shlex.quote(v)}" for k, v in sorted(plan.env.items())]
    lines.append("command:")
    lines.append("  " + shlex.join(secrets.mask_argv(plan.argv)))
    if plan.secrets:
        lines.append("secrets (never shown, logged or put in the command line):")
        lines += [f"  {s.describe()}" for s in plan.secrets]
    types = ",".join(plan.spec.types) or "none"
    lines.append(f"speculative decoding: mode {plan.spec.mode}, active {types}"
                 + (" (automatic)" if plan.spec.auto else ""))
    # the secrets' own notes say what the section above says
    notes = [n for n in plan.notes if not n.startswith(SECRET_NOTE)] if plan.secrets \
        else list(plan.notes)
    if notes:
        lines.append("notes:")
        lines += [f"  - {note}" for note in notes]
    return "\n".join(lines)
