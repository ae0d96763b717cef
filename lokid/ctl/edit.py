"""``lokictl new|set|unset|rm|mv|cat|edit``: preset files edited through the daemon.

The daemon writes them, not lokictl: it plans a new text before writing it
(what is saved is what would load; a refused edit leaves the file byte for
byte), writes atomically under one lock, refuses a whole-text edit over a
file that changed since it was read (the version, "etag", read with it), and
asks polkit (``org.lokid.lokid1.edit-presets``) for every edit. lokictl only
turns arguments into typed calls and prints the outcome.

``set`` sends typed values (``ctx=4096`` an int64, ``chat.temperature=0.7`` a
double, ``extra_args=["--jinja"]`` a string array) without a version: a
key-level change is merged into the file as it is under the daemon's lock, so
it cannot lose another edit. ``edit`` works as ``systemctl edit`` and
``visudo`` do: the text in a private temporary file, ``$VISUAL`` or
``$EDITOR`` on it (split as a shell would split it, run without a shell),
nothing written when nothing changed, the daemon's error and "Edit again?"
when the text does not plan (no question without a terminal: the answer is
no), a refused text kept in that file and named (as ``crontab -e`` and
``visudo`` keep it: the operator's work is not thrown away), and the
difference the edit makes to the engine's command line.

The pure parts (a ``KEY=VALUE`` argument as a typed Variant, which editor to
run, the command-line difference) are tested without a bus.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import shlex
import shutil
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dbus_fast import DBusError, Variant

from ..core import errors
from ..core.names import ERROR_PREFIX, PRESET_INTERFACE
from .client import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Client, CtlError

INT64 = range(-(2**63), 2**63)

# Every key `lokictl set` and `unset` complete (packaging/completion/lokid.bash lists them
# too, for bash); `env.` takes the variable's name after the dot. Every preset key is here
# but the secrets table (its files are named in lokictl edit).
KNOWN_KEYS = ("model", "ctx", "gpus", "gpu_count", "gpu_layers", "ubatch", "port", "mmproj",
              "extra_args", "env.", "op_offload_min_batch", "spec.mode", "spec.draft", "spec.n_max",
              "spec.sampling", "chat.reasoning_effort", "chat.temperature", "chat.top_p",
              "chat.top_k", "chat.min_p", "serve.on_demand", "serve.idle_stop", "serve.group",
              "serve.drain", "serve.keep", "kind", "url", "upstream_model", "rpc",
              "api_key_file", "cpu_fallback", "example", "aliases", "serve.replicas",
              "serve.max_replicas")


# --- the pure parts ---------------------------------------------------------------------


def assignment(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as the key and the value's TOML type (``presetedit.parse_value``)."""
    from ..core.config.presetedit import parse_value

    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise CtlError(f"{text!r}: KEY=VALUE expected (such as ctx=4096)", EXIT_USAGE)
    try:
        return key, parse_value(value)
    except (ValueError, errors.LokiError) as e:
        raise CtlError(f"{key}: {e}", EXIT_USAGE) from None


def assignments(texts: Iterable[str]) -> dict[str, Any]:
    """Every ``KEY=VALUE``, in order; a key given twice is a usage error (which one?)."""
    values: dict[str, Any] = {}
    for text in texts:
        key, value = assignment(text)
        if key in values:
            raise CtlError(f"{key}: given twice", EXIT_USAGE)
        values[key] = value
    return values


def variant(key: str, value: Any) -> Variant:
    """The D-Bus value of ``value`` for SetPresetKeys: b, x, d, s, as or ax.

    bool before int (True is an int in Python); an empty list is a string array, as
    ``extra_args = []`` is. Anything else (a table, a date, a mixed list) has no
    typed form here: ``lokictl edit`` writes it.
    """
    if isinstance(value, bool):
        return Variant("b", value)
    if isinstance(value, int):
        if value not in INT64:
            raise CtlError(f"{key}: {value} is out of range (a 64-bit integer)", EXIT_USAGE)
        return Variant("x", value)
    if isinstance(value, float):
        return Variant("d", value)
    if isinstance(value, str):
        return Variant("s", value)
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return Variant("as", value)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            if not all(v in INT64 for v in value):
                raise CtlError(f"{key}: an integer is out of range (64-bit)", EXIT_USAGE)
            return Variant("ax", value)
        raise CtlError(f"{key}: a list of strings or of integers only (use `lokictl edit` "
                       "for anything else)", EXIT_USAGE)
    raise CtlError(f"{key}: a string, number, boolean or list only, not a "
                   f"{type(value).__name__} (use `lokictl edit` for anything else)",
                   EXIT_USAGE)


def shown(value: Any) -> str:
    """A value as it reads in the TOML file (JSON's scalars and arrays are TOML's)."""
    return json.dumps(value, ensure_ascii=False)


def editor_argv(environ: Mapping[str, str],
                which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """The editor to run, as ``systemctl edit`` and ``visudo`` choose it: ``$VISUAL``, else
    ``$EDITOR``, else ``editor`` (Debian's alternative) when it is in PATH, else ``vi``.

    A variable is split as a shell splits words (``EDITOR="code --wait"``) and run without a
    shell, the file appended: its content is never read by a shell.
    """
    for variable in ("VISUAL", "EDITOR"):
        try:
            argv = shlex.split(environ.get(variable, ""))
        except ValueError as e:
            raise CtlError(f"${variable}: {e}", EXIT_USAGE) from None
        if argv:
            return argv
    return ["editor" if which("editor") else "vi"]


def plan_lines(plan: Mapping[str, Any]) -> list[str]:
    """The plan's environment and command line, one argument per line (a diff reads well)."""
    env = plan.get("env") or {}
    return ([f"{k}={shlex.quote(str(v))}" for k, v in sorted(env.items())]
            + [shlex.quote(str(arg)) for arg in plan.get("argv") or []])


def plan_diff(before: Sequence[str], after: Sequence[str]) -> list[str]:
    """A unified diff of two :func:`plan_lines`; empty when they are the same."""
    return list(difflib.unified_diff(before, after, "before", "after", lineterm=""))


def _value_at(text: str, key: str) -> tuple[bool, Any]:
    """Whether a dotted ``key`` is set in a preset's text, and its value (for "was")."""
    try:
        data: Any = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return False, None
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return False, None
        data = data[part]
    return True, data


# --- the commands -------------------------------------------------------------------------


async def _source(c: Client, name: str) -> tuple[str, str]:
    text, etag = await c.manager("GetPresetSource", "s", [name])
    return str(text), str(etag)


async def _pending_restart_hint(c: Client, name: str) -> None:
    props = await c.properties(await c.preset_path(name), PRESET_INTERFACE)
    if props.get("PendingRestart"):
        print(f"restart it to apply: lokictl restart {name}")


async def cmd_new(c: Client, name: str, model: str | None, pairs: Sequence[str]) -> int:
    from ..core.config.presetedit import new_text

    values = assignments(pairs)
    if "model" in values:
        raise CtlError("model: given with --model and as model=…: keep one", EXIT_USAGE)
    if model is None and values.get("kind") != "external":
        raise CtlError("--model is required (or kind=external url=URL for an API elsewhere)",
                       EXIT_USAGE)
    try:
        text = new_text({**({"model": model} if model is not None else {}), **values})
    except errors.ConfigError as e:
        raise CtlError(str(e), EXIT_USAGE) from None
    path, etag = await c.manager("CreatePreset", "ss", [name, text])
    print(f"{name}: created ({path}, version {etag})")
    print(f"  `lokictl plan {name}` shows its command line, `lokictl start {name}` starts it")
    return EXIT_OK


async def _before(c: Client, name: str) -> str | None:
    """The text before a key-level change, for "(was …)"; None when the caller may not
    read it: the change itself is then asked, and its refusal names its own method."""
    try:
        text, _ = await _source(c, name)
    except DBusError as e:
        if e.type in (errors.PERMISSION_DENIED, "org.freedesktop.DBus.Error.AccessDenied"):
            return None
        raise
    return text


async def cmd_set(c: Client, name: str, pairs: Sequence[str]) -> int:
    values = assignments(pairs)
    typed = {key: variant(key, value) for key, value in values.items()}
    before = await _before(c, name)
    await c.manager("SetPresetKeys", "sa{sv}s", [name, typed, ""])
    for key, value in values.items():
        was_set, was = _value_at(before, key) if before is not None else (True, None)
        if before is None:
            what = "(set)"
        elif not was_set:
            what = "(was not set)"
        elif was == value and type(was) is type(value):
            what = "(unchanged)"
        elif key.startswith("env."):
            what = "(replaced)"  # an old token or password is not printed
        else:
            what = f"(was {shown(was)})"
        print(f"{name}: {key} = {shown(value)} {what}")
    await _pending_restart_hint(c, name)
    return EXIT_OK


async def cmd_unset(c: Client, name: str, keys: Sequence[str]) -> int:
    before = await _before(c, name)
    await c.manager("UnsetPresetKeys", "sass", [name, list(keys), ""])
    for key in keys:
        was_set, was = _value_at(before, key) if before is not None else (True, None)
        if before is None:
            print(f"{name}: {key} removed")
        elif not was_set:
            print(f"{name}: {key} was not set")
        elif key.startswith("env."):
            print(f"{name}: {key} removed")  # an old token or password is not printed
        else:
            print(f"{name}: {key} removed (was {shown(was)})")
    await _pending_restart_hint(c, name)
    return EXIT_OK


def _busy_with_force_hint(e: DBusError, command: str, force: bool) -> DBusError:
    """The daemon's Busy, with how to override it when the message does not say."""
    if e.type != errors.BUSY or force or "force" in (e.text or "").lower():
        return e
    return DBusError(e.type, f"{e.text} (`lokictl {command} --force` overrides)")


async def cmd_rm(c: Client, name: str, force: bool) -> int:
    try:
        await c.manager("DeletePreset", "sb", [name, force])
    except DBusError as e:
        raise _busy_with_force_hint(e, f"rm {name}", force) from None
    print(f"{name}: deleted")
    return EXIT_OK


async def cmd_mv(c: Client, name: str, new_name: str, force: bool) -> int:
    try:
        await c.manager("RenamePreset", "ssb", [name, new_name, force])
    except DBusError as e:
        raise _busy_with_force_hint(e, f"mv {name} {new_name}", force) from None
    print(f"{name}: renamed to {new_name}")
    return EXIT_OK


async def cmd_cat(c: Client, name: str) -> int:
    text, _ = await _source(c, name)
    sys.stdout.write(text)
    return EXIT_OK


async def _plan_lines(c: Client, name: str) -> tuple[list[str] | None, str]:
    """The preset's plan as lines, or None and why there is none (a broken preset, an
    engine that cannot be probed): that is no reason not to edit the file."""
    try:
        return plan_lines(await c.plan(name)), ""
    except DBusError as e:
        if (e.type or "").startswith(ERROR_PREFIX):
            return None, e.text
        raise


def _edit_again() -> bool:
    """The operator's answer to "Edit again? [Y/n]"; no without a terminal to ask on."""
    if not sys.stdin.isatty():
        return False
    sys.stderr.write("Edit again? [Y/n] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    return answer != "" and answer.strip().lower() in ("", "y", "yes")


async def _run_editor(argv: Sequence[str], path: str) -> None:
    try:
        proc = await asyncio.create_subprocess_exec(*argv, path)
    except OSError as e:
        raise CtlError(f"cannot run the editor {argv[0]!r}: {e.strerror} (set $VISUAL or "
                       "$EDITOR)", EXIT_FAILED) from None
    status = await proc.wait()
    if status != 0:
        raise CtlError(f"the editor {argv[0]!r} exited with status {status}: nothing written",
                       EXIT_FAILED)


async def cmd_edit(c: Client, name: str, environ: Mapping[str, str]) -> int:
    original, etag = await _source(c, name)
    argv = editor_argv(environ)
    before, _ = await _plan_lines(c, name)
    # mkstemp: mode 0600, as the text may hold secrets (env); removed whatever happens.
    fd, path = tempfile.mkstemp(prefix=f"lokictl-{name}-", suffix=".toml")
    kept = False   # a refused text stays for the operator, as crontab -e and visudo keep it

    def refused() -> int:
        nonlocal kept
        kept = True
        print(f"lokictl: {name}: nothing written; your text is kept in {path}",
              file=sys.stderr)
        return EXIT_FAILED

    try:
        with open(fd, "w", encoding="utf-8", newline="") as f:
            f.write(original)
        while True:
            await _run_editor(argv, path)
            with open(path, "rb") as edited:
                raw = edited.read()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                print(f"lokictl: {name}: not UTF-8 text (byte {e.start})", file=sys.stderr)
                if _edit_again():
                    continue
                return refused()
            if text == original:
                print(f"{name}: unchanged, nothing written")
                return EXIT_OK
            try:
                (new_etag,) = await c.manager("UpdatePreset", "sss", [name, text, etag])
                break
            except DBusError as e:
                if e.type == errors.INVALID_PRESET:
                    print(f"lokictl: {e.text}", file=sys.stderr)
                    if _edit_again():
                        continue
                    return refused()
                if e.type == errors.BUSY:
                    print(f"lokictl: {e.text}\n  `lokictl edit {name}` starts again from "
                          "the file as it is now", file=sys.stderr)
                    return refused()
                refused()   # any other refusal (PermissionDenied, …): the text stays too
                raise
    finally:
        if not kept:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    print(f"{name}: saved (version {new_etag})")
    after, why = await _plan_lines(c, name)
    if after is None:
        print(f"no command line to compare: {why}")
    elif diff := plan_diff(before or [], after):
        print("\n".join(diff))
    else:
        print("the engine's command line is unchanged")
    await _pending_restart_hint(c, name)
    return EXIT_OK
