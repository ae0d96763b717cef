"""Config files: ``lokid.toml`` and ``presets/<name>.toml`` → typed, validated values.

The layout (``$LOKI_CONFIG_DIR``, default ``/etc/loki``)::

    lokid.toml            engine, model_dirs, host, port, metrics_textfile, [gateway]
    presets/<name>.toml   one preset per file

Files are read with tomllib, within bounds (:mod:`lokid.core.config.tomlread`): a
regular file of at most :data:`MAX_FILE_BYTES`, opened without blocking, its
text checked by :mod:`lokid.core.config.tomlscan` before and after tomllib reads it.
Every error
names the file, the line when it can be found, the key, and what would be
valid. A broken preset is reported and skipped: it never hides the others
(:func:`load_presets`), whatever it holds. A preset's text not yet written
(an edit) is validated by :func:`parse_preset_text`, within the same bounds.

Unknown values are errors, like unknown keys: a typo such as ``spec.mode =
"eagle"`` would otherwise start the engine without what the operator asked
for, and say nothing. Every key whose value comes from a fixed set (the
``[spec]`` mode and sampling, ``[chat] reasoning_effort``, ``gpu_layers``)
names the valid ones. What a valid ``[spec]`` setting cannot do on a given
model or engine is the plan's business: it drops the setting with a note and
the engine still starts. A preset of ``kind = "external"`` (an API elsewhere) holds
other keys, read by :mod:`lokid.core.config.external`.

This module is part of the pure core: it reads files, nothing else.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ConfigError, NotFoundError
from ..fleet.rpc import parse_rpc
from ..launch import flags
from ..place.settings import PLACEMENT_KEYS, PlacementConfig, parse_placement
from ..serve.tables import (
    GATEWAY_KEYS,
    SERVE_KEYS,
    GatewayConfig,
    Serve,
    parse_gateway,
    parse_serve,
)
from ..serve.usage import USAGE_KEYS, UsageConfig, parse_usage
from . import external, secrets
from .aliases import parse_aliases
from .external import External
from .presetname import check_preset_name
from .tomlread import MAX_FILE_BYTES as MAX_FILE_BYTES  # its home; presets' bound
from .tomlread import Checker, close_match, parse_toml, read_text, read_toml, tname

GLOBAL_FILE = "lokid.toml"
PRESETS_DIR = "presets"
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

DEFAULT_ENGINE = "llama-server"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_CTX = 32768

GLOBAL_KEYS = ("engine", "model_dirs", "host", "port", "metrics_textfile", "gateway",
               "placement", "usage")
# Debian's prometheus-node-exporter reads /var/lib/prometheus/node-exporter/*.prom (its
# textfile collector): the daemon writes its metrics there when that directory exists.
DEFAULT_METRICS_TEXTFILE = "/var/lib/prometheus/node-exporter/lokid.prom"
PRESET_KEYS = (
    "model", "mmproj", "ctx", "gpus", "gpu_count", "gpu_layers", "ubatch", "port",
    "extra_args", "env", "op_offload_min_batch", "spec", "chat", "api_key_file", "secrets",
    "serve", "kind", "url", "upstream_model", "rpc", "cpu_fallback", "example", "aliases",
)
# example = true: the file is an example (the package's /etc/loki/presets/example.toml,
# whose model is missing by design): listed and explained like any preset, never started,
# and left out of lokid_preset_broken, whose alert fired on every fresh install (issue
# 45, item 14). It refuses every start, so a copy that keeps the line serves nothing
# rather than a real preset whose later breakage would go unalerted.
# cpu_fallback: what a start whose GPU engine runs on the CPU does (issue 44, item 3:
# a GPU backend that did not start, or "offloaded" with host buffers only): "run" (the
# default) serves and says so; "fail" stops it, for a preset that is useless 10-100x
# slower (lokid.dbus.oncpu).
CPU_FALLBACKS = ("run", "fail")
SPEC_KEYS = ("mode", "draft", "n_max", "sampling")
SPEC_MODES = ("off", "auto", "mtp", "ngram", "mtp+ngram")
SPEC_SAMPLINGS = ("greedy", "probabilistic")
SPEC_N_MAX_LIMIT = 64
CHAT_KEYS = ("reasoning_effort", "temperature", "top_p", "top_k", "min_p")
EFFORT_LEVELS = ("none", "minimal", "low", "medium", "high", "xhigh")


@dataclass(frozen=True)
class GlobalConfig:
    """``lokid.toml``: what every preset shares."""

    engine: str = DEFAULT_ENGINE
    model_dirs: tuple[str, ...] = ()
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    path: str = ""  # the file it came from, "" when absent (defaults)
    metrics_textfile: str = DEFAULT_METRICS_TEXTFILE   # "" = no Prometheus textfile
    gateway: GatewayConfig = field(default_factory=GatewayConfig)   # lokid.core.serve.tables
    # [placement]: engines placed by memory (lokid.core.place.settings)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    # [usage]: how long the gateway's usage counts are kept (lokid.core.serve.usage)
    usage: UsageConfig = field(default_factory=UsageConfig)


@dataclass(frozen=True)
class SpecConfig:
    """The ``[spec]`` table, validated: the plan decides what of it applies, and says why.

    ``mode`` is one of :data:`SPEC_MODES`; ``None`` means the key is absent
    (``draft``: no separate head; ``n_max``: the engine's default; ``sampling``:
    greedy).
    """

    mode: str = "off"
    draft: str | None = None
    n_max: int | None = None
    sampling: str | None = None


@dataclass(frozen=True)
class ChatConfig:
    """The ``[chat]`` table: how clients use this preset (the benchmark measures with it).

    None means the key is absent (the engine's default, or the client's).
    """

    reasoning_effort: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None

    def sampling(self) -> dict[str, float | int]:
        """The sampling fields of a chat request, as set."""
        fields = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                  "min_p": self.min_p}
        return {k: v for k, v in fields.items() if v is not None}


@dataclass(frozen=True)
class Preset:
    """One ``presets/<name>.toml``, validated."""

    name: str
    path: str
    model: str
    mmproj: str | None = None
    ctx: int = DEFAULT_CTX
    gpus: str | None = None
    # GPUs lokid chooses at each start (issue 29): None = not chosen by lokid (gpus, or
    # every GPU the engine sees); 0 = gpus = "auto", the fewest that hold it; N =
    # gpu_count = N. lokid prestart sets CUDA_VISIBLE_DEVICES (lokid.planning.gpuchoice).
    gpu_choice: int | None = None
    gpu_layers: str | None = None  # "N", "auto" or "all": passed to -ngl as is
    cpu_fallback: str = "run"      # one of CPU_FALLBACKS
    ubatch: int | None = None
    port: int | None = None
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    op_offload_min_batch: int | None = None
    spec: SpecConfig = field(default_factory=SpecConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    # Secrets, by the file each is read from (lokid.core.config.secrets): the engine's API keys,
    # and environment variables by name.
    api_key_file: str | None = None
    secrets: Mapping[str, str] = field(default_factory=dict)
    serve: Serve = field(default_factory=Serve)   # [serve]: on demand, idle stop, group
    # kind = "external": an API elsewhere (lokid.core.config.external), no engine; model is ""
    external: External | None = None
    # llama.cpp's RPC workers the model is split with (lokid.core.fleet.rpc): --rpc
    rpc: tuple[str, ...] = ()
    example: bool = False         # example = true: never started, not alerted on
    aliases: tuple[str, ...] = ()   # other names clients ask for it by (lokid.core.config.aliases)


def _path_setting(c: Checker, key: str, value: str, reference: bool = False) -> str:
    """A model-like setting: a bare file name (looked up in model_dirs) or an absolute path;
    for ``model`` (``reference``), also a hub reference a start pulls (:mod:`.pulled`)."""
    if not value.strip():
        raise c.error(key, "must not be empty")
    if "/" in value and not os.path.isabs(value):
        if reference:
            from ..model.pulled import canonical

            if canonical(value) is not None:
                return value
        raise c.error(
            key, f"{value!r} is a relative path: use a bare file name found in model_dirs, "
            "an absolute path" + (", or a hub reference to pull (org/repo:Q4_K_M)"
                                  if reference else "")
        )
    return value


# --- lokid.toml -------------------------------------------------------------------


def load_global(config_dir: str) -> GlobalConfig:
    """Read ``lokid.toml``; a missing file means all defaults."""
    path = os.path.join(config_dir, GLOBAL_FILE)
    if not os.path.exists(path):
        return GlobalConfig()
    data, text = read_toml(path)
    c = Checker(path, text, data)
    c.reject_unknown(GLOBAL_KEYS)
    engine = c.string("engine", DEFAULT_ENGINE) or ""
    if not engine.strip():
        raise c.error("engine", "must not be empty (the path to llama-server)")
    if "/" in engine and not os.path.isabs(engine):
        raise c.error("engine",
                      f"{engine!r}: use an absolute path, or a command name found in PATH")
    dirs = c.string_list("model_dirs")
    for d in dirs:
        if not os.path.isabs(d):
            raise c.error("model_dirs", f"{d!r} is not an absolute path")
    host = c.string("host", DEFAULT_HOST) or ""
    if not host.strip():
        raise c.error("host", "must not be empty (an address such as 127.0.0.1 or 0.0.0.0)")
    port = c.integer("port", 1, 65535, "1 to 65535")
    metrics = c.string("metrics_textfile", DEFAULT_METRICS_TEXTFILE) or ""
    if metrics and not (os.path.isabs(metrics) and metrics.endswith(".prom")
                        and len(os.path.basename(metrics)) > len(".prom")):
        # node_exporter's textfile collector reads *.prom only: another name is never seen
        raise c.error("metrics_textfile",
                      f"{metrics!r}: an absolute path ending in .prom (node_exporter reads "
                      "only *.prom files), or \"\" to write no metrics file")
    return GlobalConfig(
        engine=engine, model_dirs=dirs, host=host,
        port=DEFAULT_PORT if port is None else port, path=path, metrics_textfile=metrics,
        gateway=parse_gateway(_table(c, "gateway", GATEWAY_KEYS)),
        placement=parse_placement(_table(c, "placement", PLACEMENT_KEYS)),
        usage=parse_usage(_table(c, "usage", USAGE_KEYS)),
    )


# --- presets ----------------------------------------------------------------------


def preset_path(config_dir: str, name: str) -> str:
    return os.path.join(config_dir, PRESETS_DIR, name + ".toml")


def load_preset(config_dir: str, name: str) -> Preset:
    """Read and validate one preset; NotFoundError when it does not exist."""
    check_preset_name(name)
    path = preset_path(config_dir, name)
    if not os.path.exists(path):
        raise NotFoundError(f"no preset {name!r} (expected {path})")
    return parse_preset(name, path)


def parse_preset(name: str, path: str) -> Preset:
    """Read the file ``path`` (within the bounds of :func:`read_file`) and validate it
    as preset ``name`` (:func:`parse_preset_text`)."""
    return parse_preset_text(name, path, read_text(path))


def parse_preset_text(name: str, path: str, text: str) -> Preset:
    """Validate ``text`` as preset ``name``, without a file: the checks and errors of
    :func:`parse_preset` after it has read the file (``path`` is where errors say the
    text is, and the Preset's ``path``; it is not opened).

    A candidate text (an edit not yet written) is validated here before it
    replaces the file, so that what is saved is what would load.
    """
    data = parse_toml(text, path)
    c = Checker(path, text, data)
    c.reject_unknown(PRESET_KEYS)
    aliases = parse_aliases(c, name)
    if external.kind_of(c) == external.EXTERNAL:
        return Preset(name=name, path=path, model="", external=external.parse_external(c, name),
                      aliases=aliases)
    external.reject_external_keys(c)

    model = c.string("model")
    if model is None:
        raise ConfigError(
            "missing required key 'model' (a file name found in model_dirs, or an absolute path)",
            path, None, "model",
        )
    model = _path_setting(c, "model", model, reference=True)
    mmproj = c.string("mmproj")
    if mmproj is not None:
        mmproj = _path_setting(c, "mmproj", mmproj)

    ctx = c.integer("ctx", 0, 2**31 - 1, "tokens; 0 = not fixed, --fit may shrink it")
    ubatch = c.integer("ubatch", 1, 2**31 - 1, "tokens, at least 1")
    port = c.integer("port", 1, 65535, "1 to 65535")
    # env first: op_offload_min_batch and gpus look inside it.
    env = _env(c)
    offload = c.integer("op_offload_min_batch", 0, 2**31 - 1, "tokens, 0 or more")
    if offload is not None and "GGML_OP_OFFLOAD_MIN_BATCH" in env:
        raise c.error("op_offload_min_batch",
                      "env.GGML_OP_OFFLOAD_MIN_BATCH is set too: keep only one of them")

    extra_args = _extra_args(c)
    api_key_file, secret_files = _secrets(c, env, extra_args)
    return Preset(
        name=name,
        path=path,
        model=model,
        mmproj=mmproj,
        ctx=DEFAULT_CTX if ctx is None else ctx,
        gpus=_gpus(c, env),
        gpu_choice=_gpu_choice(c, env),
        gpu_layers=_gpu_layers(c),
        cpu_fallback=_choice(c, "cpu_fallback", CPU_FALLBACKS) or "run",
        ubatch=ubatch,
        port=port,
        extra_args=extra_args,
        env=env,
        op_offload_min_batch=offload,
        spec=_spec(c),
        chat=_chat(c),
        api_key_file=api_key_file,
        secrets=secret_files,
        serve=parse_serve(_table(c, "serve", SERVE_KEYS)),
        rpc=parse_rpc(c, extra_args),
        example=c.boolean("example", False),
        aliases=aliases,
    )


def _gpus(c: Checker, env: Mapping[str, str]) -> str | None:
    value = c.data.get("gpus")
    if value is None or value == "auto":
        return None
    items: list[object] = value if isinstance(value, list) else [value]
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise c.error("gpus", f"must be GPU indices or UUIDs, not {tname(item)}")
        text = str(item).strip()
        if isinstance(item, int) and item < 0:
            raise c.error("gpus", f"{item} is not a GPU index (0 or more)")
        if not re.fullmatch(r"[0-9]+|(GPU|MIG)-[A-Za-z0-9/-]+", text):
            raise c.error(
                "gpus", f"{text!r} is neither a GPU index nor a GPU-/MIG- UUID "
                "(e.g. gpus = [0, 1] or gpus = \"GPU-8f6a…\")"
            )
        out.append(text)
    if not out:
        raise c.error("gpus", "is empty: list at least one GPU, or remove the key")
    if "CUDA_VISIBLE_DEVICES" in env:
        raise c.error("gpus", "env.CUDA_VISIBLE_DEVICES is set too: keep only one of them")
    return ",".join(out)


def _gpu_choice(c: Checker, env: Mapping[str, str]) -> int | None:
    """``gpus = "auto"`` (0) or ``gpu_count = N`` (N): the GPUs chosen at each start."""
    auto = c.data.get("gpus") == "auto"
    count = c.integer("gpu_count", 1, 64, "GPUs, 1 to 64")
    if count is None and not auto:
        return None
    if count is not None and "gpus" in c.data:
        raise c.error("gpu_count", "gpus is set too: name the GPUs (gpus = [0, 1]), let "
                      "lokid choose them all (gpus = \"auto\"), or give their number "
                      "(gpu_count), only one of them")
    if "CUDA_VISIBLE_DEVICES" in env:
        raise c.error("gpu_count" if count is not None else "gpus",
                      "env.CUDA_VISIBLE_DEVICES is set too: lokid sets it at start to the "
                      "GPUs it chooses; keep only one of them")
    return count if count is not None else 0


def _gpu_layers(c: Checker) -> str | None:
    value = c.data.get("gpu_layers")
    if value is None:
        return None
    if isinstance(value, str) and value in ("auto", "all"):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise c.error("gpu_layers", f"{value!r} is not valid: an integer ≥ 0, \"auto\" or \"all\"")
    return str(value)


def _extra_args(c: Checker) -> tuple[str, ...]:
    args = c.string_list("extra_args")
    for arg in args:
        # One string per argument: "-c 4096" would reach llama-server as one
        # unknown flag, since nothing passes through a shell.
        if arg.startswith("-") and any(ch.isspace() for ch in arg.split("=", 1)[0]):
            parts = ", ".join(repr(p) for p in arg.split())
            raise c.error(
                "extra_args", f"{arg!r} holds several arguments: write each as its own "
                f"string, e.g. [{parts}]"
            )
    return args


def _env(c: Checker) -> dict[str, str]:
    value = c.data.get("env")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise c.error("env", f"must be a table of NAME = \"value\", not {tname(value)}")
    out = {}
    for key, item in value.items():
        if not ENV_NAME_RE.fullmatch(key):
            raise c.error("env", f"{key!r} is not a valid environment variable name")
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise c.error("env", f"{key}: must be a string or an integer, not {tname(item)}")
        text = str(item)
        if "\0" in text:
            raise c.error("env", f"{key}: must not contain a NUL character")
        out[key] = text
    return out


def _secrets(c: Checker, env: Mapping[str, str],
             extra_args: tuple[str, ...]) -> tuple[str | None, dict[str, str]]:
    """``api_key_file`` and the ``[secrets]`` table: files, never values
    (:mod:`lokid.core.config.secrets`). One way to set each thing: a key given both as a file
    and by hand is an error, not a guess about which wins."""
    api_key_file = c.string("api_key_file")
    if api_key_file is not None:
        problem = secrets.source_problem(api_key_file)
        if problem:
            raise c.error("api_key_file", problem)
        for spellings, var in (flags.API_KEY, flags.API_KEY_FILE):
            if flags.has_flag(extra_args, *spellings) or var in env:
                by = spellings[0] if flags.has_flag(extra_args, *spellings) else f"env.{var}"
                raise c.error("api_key_file", f"{by} is set too: keep only one of them")
    value = c.data.get("secrets")
    if value is None:
        return api_key_file, {}
    if not isinstance(value, dict):
        raise c.error("secrets", "must be a table of NAME = \"/path/to/file\" (each "
                      f"variable read from its file at start), not {tname(value)}")
    t = Checker(c.path, c.text, value, "secrets")
    out = {}
    for key, item in value.items():
        if not ENV_NAME_RE.fullmatch(key):
            raise t.error(key, f"{key!r} is not a valid environment variable name")
        if not isinstance(item, str):
            raise t.error(key, f"must be the path of the file holding the value, not "
                          f"{tname(item)}")
        problem = secrets.source_problem(item)
        if problem:
            raise t.error(key, problem)
        if key in env:
            raise t.error(key, f"env.{key} is set too: keep only one of them")
        out[key] = item
    return api_key_file, out


def _choice(c: Checker, key: str, valid: tuple[str, ...]) -> str | None:
    """A value from a fixed set, read case- and space-insensitively ("MTP + ngram")."""
    value = c.data.get(key)
    if value is None:
        return None
    listed = ", ".join(valid)
    if not isinstance(value, str):
        raise c.error(key, f"must be a string, one of: {listed} (not {tname(value)})")
    normal = value.strip().lower().replace(" ", "")
    if normal not in valid:
        hint = close_match(normal, valid)
        raise c.error(key, f"{value!r} is not valid{hint}; valid values: {listed}")
    return normal


def _table(c: Checker, name: str, known: tuple[str, ...]) -> Checker | None:
    """The checker of the preset's ``[name]`` table (its keys checked), None when absent."""
    value = c.data.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise c.error(name, f"must be a table ([{name}]), not {tname(value)}")
    t = Checker(c.path, c.text, value, name)
    t.reject_unknown(known)
    return t


def _spec(c: Checker) -> SpecConfig:
    t = _table(c, "spec", SPEC_KEYS)
    if t is None:
        return SpecConfig()
    draft = t.string("draft")
    if draft is not None:
        draft = _path_setting(t, "draft", draft)
    return SpecConfig(
        mode=_choice(t, "mode", SPEC_MODES) or "off",
        draft=draft,
        n_max=t.integer("n_max", 1, SPEC_N_MAX_LIMIT,
                        f"tokens drafted per step, 1 to {SPEC_N_MAX_LIMIT}"),
        sampling=_choice(t, "sampling", SPEC_SAMPLINGS),
    )


def _chat(c: Checker) -> ChatConfig:
    t = _table(c, "chat", CHAT_KEYS)
    if t is None:
        return ChatConfig()
    effort = t.string("reasoning_effort")
    if effort is not None and effort not in EFFORT_LEVELS:
        hint = close_match(effort, EFFORT_LEVELS)
        raise t.error("reasoning_effort", f"{effort!r} is not a level{hint}: "
                      f"{', '.join(EFFORT_LEVELS)}")

    def number(key: str, lo: float, hi: float) -> float | None:
        v = t.data.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise t.error(key, f"must be a number, not {tname(v)}")
        if not lo <= v <= hi:
            raise t.error(key, f"{v} is out of range ({lo:g} to {hi:g})")
        return float(v)

    return ChatConfig(reasoning_effort=effort, temperature=number("temperature", 0, 5),
                      top_p=number("top_p", 0, 1),
                      top_k=t.integer("top_k", 0, 2**31 - 1, "0 or more; 0 = off"),
                      min_p=number("min_p", 0, 1))


def preset_names(config_dir: str) -> list[str]:
    """Names of every ``presets/*.toml`` file, valid or not, sorted."""
    directory = os.path.join(config_dir, PRESETS_DIR)
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as e:  # not a directory, not readable
        raise ConfigError(f"cannot list the presets: {e.strerror}", directory) from None
    return sorted(e[:-5] for e in entries if e.endswith(".toml") and not e.startswith("."))


def load_presets(config_dir: str) -> tuple[dict[str, Preset], dict[str, ConfigError]]:
    """Every preset: the valid ones, and an error per broken one (never raised; a
    presets directory that cannot be listed raises ConfigError).

    Any exception while loading one preset becomes that preset's error: the
    checks should leave nothing but ConfigError, but should a bug let
    something else through, it costs one preset, not the daemon's start.
    """
    good: dict[str, Preset] = {}
    bad: dict[str, ConfigError] = {}
    for name in preset_names(config_dir):
        path = preset_path(config_dir, name)
        try:
            check_preset_name(name)
            good[name] = parse_preset(name, path)
        except ConfigError as e:
            if not e.path:
                e = ConfigError(e.reason, path, e.line, e.key)
            bad[name] = e
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else ""
            bad[name] = ConfigError(
                f"cannot be read: internal error ({type(e).__name__}: {first})", path)
    return good, bad


def resolve_file(value: str, model_dirs: tuple[str, ...]) -> str | None:
    """Where a model-like setting points: an absolute path as is, a bare name in model_dirs.

    A bare name is tried as given, then with ``.gguf`` added, in each directory in
    order; a hub reference is the model its finished pull left. ``None`` when nothing
    exists; the caller says what that means for its setting.
    """
    if os.path.isabs(value):
        return value if os.path.exists(value) else None
    if "/" in value:   # a hub reference: where its pull left the model (lokid.core.model.pulled)
        from ..model.pulled import find

        found = find(value, model_dirs)
        return None if found is None else os.path.join(found[0], found[1].model)
    for directory in model_dirs:
        for candidate in (value, value + ".gguf"):
            path = os.path.join(directory, candidate)
            if os.path.isfile(path):
                return path
    return None
