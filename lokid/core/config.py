"""Config files: ``lokid.toml`` and ``presets/<name>.toml`` → typed, validated values.

The layout (``$LOKI_CONFIG_DIR``, default ``/etc/loki``)::

    lokid.toml            engine, model_dirs, host, port, metrics_textfile
    presets/<name>.toml   one preset per file

Files are read with tomllib, within bounds: a regular file of at most
:data:`MAX_FILE_BYTES`, opened without blocking, its text checked by
:mod:`lokid.core.tomlscan` before and after tomllib reads it. Every error
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
the engine still starts.

This module is part of the pure core: it reads files, nothing else.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import flags, secrets, tomlscan
from .errors import ConfigError, NotFoundError
from .presetname import check_preset_name

GLOBAL_FILE = "lokid.toml"
PRESETS_DIR = "presets"
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

DEFAULT_ENGINE = "llama-server"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_CTX = 32768
# Real presets are 1 to 3 KB; the cap keeps a runaway file (a log written to the
# wrong place) from filling memory.
MAX_FILE_BYTES = 64 * 1024

GLOBAL_KEYS = ("engine", "model_dirs", "host", "port", "metrics_textfile")
# Debian's prometheus-node-exporter reads /var/lib/prometheus/node-exporter/*.prom (its
# textfile collector): the daemon writes its metrics there when that directory exists.
DEFAULT_METRICS_TEXTFILE = "/var/lib/prometheus/node-exporter/lokid.prom"
PRESET_KEYS = (
    "model", "mmproj", "ctx", "gpus", "gpu_layers", "ubatch", "port",
    "extra_args", "env", "op_offload_min_batch", "spec", "chat", "api_key_file", "secrets",
)
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
    gpu_layers: str | None = None  # "N", "auto" or "all": passed to -ngl as is
    ubatch: int | None = None
    port: int | None = None
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    op_offload_min_batch: int | None = None
    spec: SpecConfig = field(default_factory=SpecConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    # Secrets, by the file each is read from (lokid.core.secrets): the engine's API keys,
    # and environment variables by name.
    api_key_file: str | None = None
    secrets: Mapping[str, str] = field(default_factory=dict)


# --- reading TOML with locations -------------------------------------------------

_TOML_AT = re.compile(r"\(at line (\d+), column \d+\)")


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> str:
    kind = next((name for test, name in _KINDS if test(mode)), "not a plain file")
    return f"cannot read: is {kind}, not a regular file"


def _read_file(path: str) -> bytes:
    """The bytes of ``path``: a regular file (after links) of at most MAX_FILE_BYTES.

    A FIFO would block the reader forever and /dev/zero would fill memory, so
    the file is checked before it is opened (opening a device can act: a
    watchdog starts), opened without blocking, and checked again on the
    descriptor, since it may have been replaced in between.
    """
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(_not_regular(st.st_mode), path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError("no such file", path) from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(_not_regular(st.st_mode), path)
        if st.st_size > MAX_FILE_BYTES:
            raise _too_large(f"{st.st_size} bytes", path)
        chunks: list[bytes] = []
        size = 0
        # st_size can lie (a file still growing, one of /proc): read at most one
        # byte more than the cap, whatever it said.
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", path) from None
    finally:
        os.close(fd)
    if size > MAX_FILE_BYTES:
        raise _too_large(f"more than {MAX_FILE_BYTES} bytes", path)
    return b"".join(chunks)


def _too_large(size: str, path: str) -> ConfigError:
    return ConfigError(f"too large: {size}, the limit is {MAX_FILE_BYTES} bytes "
                       "(a preset is a few KB)", path)


def _read_text(path: str) -> str:
    """The text of ``path`` (:func:`_read_file`), which must be UTF-8."""
    raw = _read_file(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (byte {e.start})", path) from None


def _read_toml(path: str) -> tuple[dict[str, Any], str]:
    text = _read_text(path)
    return _parse_toml(text, path), text


def _parse_toml(text: str, path: str) -> dict[str, Any]:
    """``text`` read as TOML within the bounds of a file; ``path`` is named in errors.

    A text that does not come from a file (a candidate preset sent over the bus)
    gets the same bounds as one read from disk: its UTF-8 size, then tomlscan.
    """
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as e:
        # a lone surrogate: no file holds one, and it cannot be written to one
        raise ConfigError(f"not UTF-8 text (character {e.start})", path) from None
    if size > MAX_FILE_BYTES:
        raise _too_large(f"{size} bytes", path)
    suspects = tomlscan.check_text(text, path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        message = str(e)
        m = _TOML_AT.search(message)
        line = int(m.group(1)) if m else None
        message = _TOML_AT.sub("", message).strip()
        raise ConfigError(f"TOML syntax error: {message}", path, line) from None
    except (RecursionError, MemoryError) as e:
        # check_text bounds the nesting and the file is small: should either still
        # happen, it is this file's error, not the daemon's.
        raise ConfigError(f"cannot be parsed ({type(e).__name__})", path) from None
    tomlscan.check_values(data, text, path, suspects)
    return data


def _key_line(text: str, key: str, table: str = "") -> int | None:
    """The line where ``key`` is assigned (inside ``[table]`` if given), when findable.

    tomllib gives no positions for values, so this scans the text. It
    understands plain and quoted keys, ``[table]`` headers and dotted keys
    (``spec.mode = …``); anything fancier just yields no line number.

    No backtracking regex: a line of a multi-line string can be 60 KB of spaces,
    and a lazy group before the ``=`` took seconds on it.
    """
    current = ""
    dotted = f"{table}.{key}" if table else key
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("[") and not stripped.startswith("[["):
            end = stripped.find("]")
            rest = stripped[end + 1:].lstrip()
            inner = stripped[1:end].strip()
            if end > 0 and inner and "[" not in inner and (not rest or rest[0] == "#"):
                current = _plain_key(inner)
                continue
        name, equals, _ = stripped.partition("=")
        if not equals or not _KEY_CHARS.fullmatch(name.rstrip()):
            continue
        full = f"{current}.{_plain_key(name)}" if current else _plain_key(name)
        if full == dotted:
            return number
    return None


_KEY_CHARS = re.compile(r"""[A-Za-z0-9_."' -]+""")


def _plain_key(written: str) -> str:
    return written.replace('"', "").replace("'", "").replace(" ", "")


class _Checker:
    """Typed access to one parsed file, raising errors that say where and what."""

    def __init__(self, path: str, text: str, data: dict[str, Any], table: str = ""):
        self.path = path
        self.text = text
        self.data = data
        self.table = table

    def error(self, key: str, message: str) -> ConfigError:
        key_shown = tomlscan.show_key(key)
        shown = f"{self.table}.{key_shown}" if self.table else key_shown
        return ConfigError(message, self.path, _key_line(self.text, key, self.table), shown)

    def reject_unknown(self, known: tuple[str, ...]) -> None:
        for key in self.data:
            if key not in known:
                hint = _close_match(key, known)
                raise self.error(
                    key, f"unknown key{hint}; valid keys: {', '.join(known)}"
                )

    def string(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, not {_tname(value)}")
        if "\0" in value:
            raise self.error(key, "must not contain a NUL character")
        return value

    def integer(self, key: str, lo: int, hi: int, what: str) -> int | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be an integer ({what}), not {_tname(value)}")
        if not lo <= value <= hi:
            raise self.error(key, f"{value} is out of range ({what})")
        return value

    def string_list(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.error(key, f"must be a list of strings, not {_tname(value)}")
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.error(key, f"item {i} must be a string, not {_tname(item)}")
            if "\0" in item:
                raise self.error(key, f"item {i} must not contain a NUL character")
            out.append(item)
        return tuple(out)


def _tname(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "a table"}
    return names.get(type(value), type(value).__name__)


def _close_match(key: str, known: tuple[str, ...]) -> str:
    import difflib

    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _path_setting(c: _Checker, key: str, value: str) -> str:
    """A model-like setting: a bare file name (looked up in model_dirs) or an absolute path."""
    if not value.strip():
        raise c.error(key, "must not be empty")
    if "/" in value and not os.path.isabs(value):
        raise c.error(
            key, f"{value!r} is a relative path: use a bare file name found in model_dirs, "
            "or an absolute path"
        )
    return value


# --- lokid.toml -------------------------------------------------------------------


def load_global(config_dir: str) -> GlobalConfig:
    """Read ``lokid.toml``; a missing file means all defaults."""
    path = os.path.join(config_dir, GLOBAL_FILE)
    if not os.path.exists(path):
        return GlobalConfig()
    data, text = _read_toml(path)
    c = _Checker(path, text, data)
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
    """Read the file ``path`` (within the bounds of :func:`_read_file`) and validate it
    as preset ``name`` (:func:`parse_preset_text`)."""
    return parse_preset_text(name, path, _read_text(path))


def parse_preset_text(name: str, path: str, text: str) -> Preset:
    """Validate ``text`` as preset ``name``, without a file: the checks and errors of
    :func:`parse_preset` after it has read the file (``path`` is where errors say the
    text is, and the Preset's ``path``; it is not opened).

    A candidate text (an edit not yet written) is validated here before it
    replaces the file, so that what is saved is what would load.
    """
    data = _parse_toml(text, path)
    c = _Checker(path, text, data)
    c.reject_unknown(PRESET_KEYS)

    model = c.string("model")
    if model is None:
        raise ConfigError(
            "missing required key 'model' (a file name found in model_dirs, or an absolute path)",
            path, None, "model",
        )
    model = _path_setting(c, "model", model)
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
        gpu_layers=_gpu_layers(c),
        ubatch=ubatch,
        port=port,
        extra_args=extra_args,
        env=env,
        op_offload_min_batch=offload,
        spec=_spec(c),
        chat=_chat(c),
        api_key_file=api_key_file,
        secrets=secret_files,
    )


def _gpus(c: _Checker, env: Mapping[str, str]) -> str | None:
    value = c.data.get("gpus")
    if value is None:
        return None
    items: list[object] = value if isinstance(value, list) else [value]
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise c.error("gpus", f"must be GPU indices or UUIDs, not {_tname(item)}")
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


def _gpu_layers(c: _Checker) -> str | None:
    value = c.data.get("gpu_layers")
    if value is None:
        return None
    if isinstance(value, str) and value in ("auto", "all"):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise c.error("gpu_layers", f"{value!r} is not valid: an integer ≥ 0, \"auto\" or \"all\"")
    return str(value)


def _extra_args(c: _Checker) -> tuple[str, ...]:
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


def _env(c: _Checker) -> dict[str, str]:
    value = c.data.get("env")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise c.error("env", f"must be a table of NAME = \"value\", not {_tname(value)}")
    out = {}
    for key, item in value.items():
        if not ENV_NAME_RE.fullmatch(key):
            raise c.error("env", f"{key!r} is not a valid environment variable name")
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise c.error("env", f"{key}: must be a string or an integer, not {_tname(item)}")
        text = str(item)
        if "\0" in text:
            raise c.error("env", f"{key}: must not contain a NUL character")
        out[key] = text
    return out


def _secrets(c: _Checker, env: Mapping[str, str],
             extra_args: tuple[str, ...]) -> tuple[str | None, dict[str, str]]:
    """``api_key_file`` and the ``[secrets]`` table: files, never values
    (:mod:`lokid.core.secrets`). One way to set each thing: a key given both as a file
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
                      f"variable read from its file at start), not {_tname(value)}")
    t = _Checker(c.path, c.text, value, "secrets")
    out = {}
    for key, item in value.items():
        if not ENV_NAME_RE.fullmatch(key):
            raise t.error(key, f"{key!r} is not a valid environment variable name")
        if not isinstance(item, str):
            raise t.error(key, f"must be the path of the file holding the value, not "
                          f"{_tname(item)}")
        problem = secrets.source_problem(item)
        if problem:
            raise t.error(key, problem)
        if key in env:
            raise t.error(key, f"env.{key} is set too: keep only one of them")
        out[key] = item
    return api_key_file, out


def _choice(c: _Checker, key: str, valid: tuple[str, ...]) -> str | None:
    """A value from a fixed set, read case- and space-insensitively ("MTP + ngram")."""
    value = c.data.get(key)
    if value is None:
        return None
    listed = ", ".join(valid)
    if not isinstance(value, str):
        raise c.error(key, f"must be a string, one of: {listed} (not {_tname(value)})")
    normal = value.strip().lower().replace(" ", "")
    if normal not in valid:
        hint = _close_match(normal, valid)
        raise c.error(key, f"{value!r} is not valid{hint}; valid values: {listed}")
    return normal


def _table(c: _Checker, name: str, known: tuple[str, ...]) -> _Checker | None:
    """The checker of the preset's ``[name]`` table (its keys checked), None when absent."""
    value = c.data.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise c.error(name, f"must be a table ([{name}]), not {_tname(value)}")
    t = _Checker(c.path, c.text, value, name)
    t.reject_unknown(known)
    return t


def _spec(c: _Checker) -> SpecConfig:
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


def _chat(c: _Checker) -> ChatConfig:
    t = _table(c, "chat", CHAT_KEYS)
    if t is None:
        return ChatConfig()
    effort = t.string("reasoning_effort")
    if effort is not None and effort not in EFFORT_LEVELS:
        hint = _close_match(effort, EFFORT_LEVELS)
        raise t.error("reasoning_effort", f"{effort!r} is not a level{hint}: "
                      f"{', '.join(EFFORT_LEVELS)}")

    def number(key: str, lo: float, hi: float) -> float | None:
        v = t.data.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise t.error(key, f"must be a number, not {_tname(v)}")
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

    A bare name is tried as given, then with ``.gguf`` added, in each
    directory in order. ``None`` when nothing exists; the caller says what
    that means for its setting.
    """
    if os.path.isabs(value):
        return value if os.path.exists(value) else None
    for directory in model_dirs:
        for candidate in (value, value + ".gguf"):
            path = os.path.join(directory, candidate)
            if os.path.isfile(path):
                return path
    return None
