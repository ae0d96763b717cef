"""Collecting a plan's inputs from the host: config files, model headers, the engine, RAM.

This is the I/O half of ``lokid plan``: it turns a preset name into
:class:`lokid.core.launch.plan.PlanInputs`, then :func:`lokid.core.launch.plan.build_plan` decides.
:func:`decide` is the plan of the next start: the attempt verdict the state DB
holds for it applied, as ``lokid prestart``, the daemon's registry and the
benchmark all need it. Nothing here writes anything.

Files are checked as the engine will open them. A file this process may not
read is "permission denied", with the path component that stops it (never
"does not exist"). Planned as root for the unit (``for_unit``), where the
engine runs as the unit's user (``loki``), each file is checked against that
user's uid and groups, from the mode bits (:mod:`lokid.core.access`).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..core import access
from ..core.config import files as cfg
from ..core.config import secrets
from ..core.config.external import nothing_runs
from ..core.errors import (
    ConfigError,
    EngineError,
    ExternalPresetError,
    ModelError,
    ModelNotPulledError,
)
from ..core.launch import conflicts
from ..core.launch.attempt import Mark, Verdict
from ..core.launch.plan import Plan, PlanInputs, build_plan, config_fingerprint
from ..core.launch.spec import DraftInput
from ..core.model.modelinfo import probe_model
from ..core.record import replace
from ..host.probe import probe_engine

if TYPE_CHECKING:
    from ..store.state import StateDB, StateReader, Token


def host_memory() -> int:
    """Total RAM in bytes from /proc/meminfo, 0 when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


# --- who may read what ------------------------------------------------------------


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except (KeyError, OverflowError):
        return str(gid)


def _node(path: str) -> access.Node:
    """``path`` as stat sees it (OSError when it cannot)."""
    st = os.stat(path)
    try:
        os.getxattr(path, "system.posix_acl_access")
        acl = True
    except OSError:     # ENODATA: no ACL; ENOTSUP: a file system without them
        acl = False
    return access.Node(path, st.st_mode, st.st_uid, st.st_gid, _user_name(st.st_uid),
                       _group_name(st.st_gid), acl)


def _prefixes(path: str) -> list[str]:
    parts = os.path.abspath(path).split("/")[1:]
    return ["/"] + ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _chain(path: str) -> list[access.Node]:
    """Every directory on the way to ``path``, then the file: those of the path as
    written (each stat'ed through its symlinks), then those of its real path not seen
    yet. Stops at the first component this process cannot stat (past the blocker)."""
    given = _prefixes(path)
    real = _prefixes(os.path.realpath(path))
    ordered = given[:-1] + [p for p in real[:-1] if p not in given] + given[-1:]
    chain = []
    for p in ordered:
        try:
            chain.append(_node(p))
        except OSError:
            break
    return chain


def listable_by(user: access.User, directory: str) -> bool:
    """Whether ``user`` may list ``directory`` and stat what it holds: search on every
    directory on the way, read and search on it (mode bits, as :mod:`lokid.core.access`
    reads them; a component this process cannot stat counts as closed)."""
    if not os.path.isdir(directory):
        return False
    chain = _chain(directory)
    return access.blocker(user, chain, access.READ) is None and \
        access.blocker(user, chain, access.EXECUTE) is None


def user_of(uid: int, gids: list[int]) -> access.User:
    """The user ``uid`` with ``gids`` (a bus caller's, :meth:`lokid.dbus.authz.Authority.caller`)
    for the mode-bit checks; the group named in messages is the first of them."""
    return access.User(_user_name(uid), uid, frozenset(gids),
                       _group_name(gids[0]) if gids else "")


def _this_user() -> access.User:
    uid, gid = os.geteuid(), os.getegid()
    return access.User(_user_name(uid), uid, frozenset([gid, *os.getgroups()]),
                       _group_name(gid))


def unit_user(environ: Mapping[str, str]) -> access.User | None:
    """The unit's engine user when this process plans for it as root, else None (not
    root: the process plans as itself, like the unit's own ``lokid prestart``; no such
    user: no unit runs here). Its groups are its own (primary and supplementary, from
    the group database) and the unit's SupplementaryGroups=."""
    if os.geteuid() != 0:
        return None
    name = access.engine_user(environ)
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None
    gids = {pw.pw_gid, *os.getgrouplist(name, pw.pw_gid)}
    for group in access.ENGINE_GROUPS:
        try:
            gids.add(grp.getgrnam(group).gr_gid)
        except KeyError:
            pass
    return access.User(name, pw.pw_uid, frozenset(gids), _group_name(pw.pw_gid))


def _unusable(what: str, path: str, user: access.User | None,
              bit: int = access.READ) -> str | None:
    """Why the engine could not use ``path`` (an existing file), or None when it can.

    ``user``: the unit's user, checked from the mode bits; None: this process, asked
    of the kernel (ACLs included), the mode bits only naming what refused it.
    """
    if user is not None:
        node = access.blocker(user, _chain(path), bit)
        return None if node is None else access.not_permitted(what, path, user, node, bit)
    if os.access(path, os.R_OK if bit == access.READ else os.X_OK):
        return None
    me = _this_user()
    return access.permission_denied(what, path, me, access.blocker(me, _chain(path), bit), bit)


def _denied(value: str, dirs: tuple[str, ...]) -> str | None:
    """Where a setting not found would be, had the search not been refused (EACCES)."""
    if os.path.isabs(value):
        candidates = [value]
    else:
        candidates = [os.path.join(d, c) for d in dirs for c in (value, value + ".gguf")]
    for path in candidates:
        try:
            os.stat(path)
        except PermissionError:
            return path
        except (OSError, ValueError):
            continue
    return None


def _required_file(preset: cfg.Preset, key: str, value: str, dirs: tuple[str, ...],
                   user: access.User | None) -> str:
    """The resolved path of a file the preset cannot start without (``model``,
    ``mmproj``); ConfigError or ModelError when it is missing or the engine's user
    could not read it."""
    path = cfg.resolve_file(value, dirs)
    if path is None:
        raise _missing(preset, key, value, dirs)
    refused = _unusable(key, path, user)
    if refused is not None:
        raise ModelError(refused)
    return path


def _pulled_mmproj(value: str, dirs: tuple[str, ...], user: access.User | None) -> str | None:
    """The projector a hub reference's pull fetched with its model (issue 48), as llama.cpp's
    ``-hf`` loads it: None when it fetched none (or the file has gone since)."""
    from ..core.model.pulled import find

    found = find(value, dirs)
    if found is None or found[1].mmproj is None:
        return None
    path = os.path.join(found[0], found[1].mmproj)
    if not os.path.isfile(path):
        return None
    refused = _unusable("mmproj", path, user)
    if refused is not None:
        raise ModelError(refused)
    return path


def _missing(preset: cfg.Preset, key: str, value: str,
             dirs: tuple[str, ...]) -> ConfigError | ModelError:
    from ..core.model.pulled import canonical

    reference = canonical(value) if key == "model" else None
    if reference is not None:   # a hub reference not pulled yet: a start pulls it (issue 48)
        if not dirs:
            return ConfigError(f"{value!r} is a hub reference, pulled into the first of "
                               "model_dirs, and lokid.toml sets none", preset.path, None, key)
        return ModelNotPulledError(
            f"{reference} is not pulled yet: a start pulls it into {dirs[0]} first "
            f"(`lokictl pull {reference}` does it now)", reference, dirs[0])
    denied = _denied(value, dirs)
    if denied is not None:
        return ModelError(_unusable(key, denied, None) or f"{key} {denied}: permission denied")
    if os.path.isabs(value):
        why = f"{value} does not exist"
    elif dirs:
        why = f"{value!r} is in none of model_dirs ({', '.join(dirs)})"
    else:
        why = f"{value!r} is a bare name but lokid.toml sets no model_dirs"
    return ConfigError(why, preset.path, None, key)


def _draft(preset: cfg.Preset, model_path: str, dirs: tuple[str, ...],
           user: access.User | None) -> DraftInput | None:
    raw = preset.spec.draft
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        return DraftInput(setting=repr(raw), error="it must be a file name or an absolute path")
    path = cfg.resolve_file(raw, dirs)
    if path is None:
        denied = _denied(raw, dirs)
        if denied is not None:
            return DraftInput(setting=raw, error=_unusable("spec.draft", denied, None) or
                              "permission denied")
        where = "" if os.path.isabs(raw) else f"in model_dirs ({', '.join(dirs) or 'none set'})"
        return DraftInput(setting=raw, error=where)
    try:
        same = os.path.samefile(path, model_path)
    except OSError:
        same = False
    refused = None if same else _unusable("spec.draft", path, user)
    if refused is not None:
        return DraftInput(setting=raw, path=path, error=refused)
    try:
        info = probe_model(path)
    except ModelError as e:
        return DraftInput(setting=raw, path=path, error=str(e), is_model=same)
    return DraftInput(setting=raw, path=path, info=info, is_model=same)


def gather(config_dir: str, name: str, environ: Mapping[str, str] | None = None,
           auto_blocked: str = "", for_unit: bool = False,
           probe_wait: float | None = None, preset: cfg.Preset | None = None,
           state_dir: str | None = None) -> PlanInputs:
    """Everything the plan of preset ``name`` depends on.

    ``for_unit``: the plan is for ``loki-engine@.service``, whose engine runs as
    the unit's user (:func:`unit_user`): planned as root, the model, mmproj,
    draft and engine are checked against that user's permissions. False where
    the engine runs as this process's user (``lokid run``, the local runner).
    ``probe_wait``: how long to wait for the engine's probe (None: until it ends
    or times out); the daemon waits a little, then plans again when it ends.
    ``preset``: the preset to plan, already parsed (an edit not yet written,
    :func:`lokid.core.config.files.parse_preset_text`), instead of its file.
    ``state_dir``: lokid's state directory, where a group member's engine saves its
    slots for the gateway's swaps; None where no gateway swaps it (``lokid run``, a
    check of an edit): no ``--slot-save-path`` is planned then.

    Raises ConfigError (preset or lokid.toml invalid, model missing),
    NotFoundError (no such preset), ModelError (the model is not a readable
    GGUF, or not readable by the engine's user) or EngineError (the engine is
    missing, not llama-server, or not executable by the engine's user; its
    subclass ProbePending when ``probe_wait`` ran out).
    """
    env = dict(os.environ if environ is None else environ)
    glob = cfg.load_global(config_dir)
    if preset is None:
        preset = _load_instance(config_dir, name, glob)
    if preset.external is not None:   # no engine to plan: every start and bench says why
        raise ExternalPresetError(nothing_runs(preset.name, preset.external))
    dirs = glob.model_dirs
    user = unit_user(env) if for_unit else None

    # What the file is, before whether the engine's user may read it: a file that is no
    # model (model = "/etc/shadow") is said to be none, not to need a chmod.
    model_path = _required_file(preset, "model", preset.model, dirs, None)
    model = probe_model(model_path)
    if user is not None:
        refused = _unusable("model", model_path, user)
        if refused is not None:
            raise ModelError(refused)
    mmproj_path = None
    if preset.mmproj is not None:
        mmproj_path = _required_file(preset, "mmproj", preset.mmproj, dirs, user)
    elif "/" in preset.model and not os.path.isabs(preset.model):
        mmproj_path = _pulled_mmproj(preset.model, dirs, user)

    caps = probe_engine(glob.engine, glob.path, wait=probe_wait)
    if user is not None:
        refused = _unusable("engine", caps.path, user, access.EXECUTE)
        if refused is not None:
            raise EngineError(refused)

    credentials_dir, loose = _secret_files(preset, env, for_unit)
    return PlanInputs(
        engine_socket=_engine_socket(preset, glob, env, for_unit),
        preset=preset,
        config=glob,
        model_path=model_path,
        model=model,
        caps=caps,
        mmproj_path=mmproj_path,
        draft=_draft(preset, model_path, dirs, user),
        environ=env,
        host_memory=host_memory(),
        auto_blocked=auto_blocked,
        credentials_dir=credentials_dir,
        loose_secrets=loose,
        slot_dir=os.path.join(state_dir, "slots", preset.name) if state_dir else "",
    )


def _load_instance(config_dir: str, name: str, glob: cfg.GlobalConfig) -> cfg.Preset:
    """The preset ``name`` names, or its replica for ``NAME:k`` (lokid.core.serve.replicas: the
    preset's file, the replica's name and port)."""
    from ..core.serve.replicas import replica_preset, split_instance

    found = split_instance(name)
    if found is None or found[1] == 1:
        return cfg.load_preset(config_dir, name)
    preset = cfg.load_preset(config_dir, found[0])
    if preset.external is not None:
        return preset
    return replica_preset(preset, glob, found[1])


def _engine_socket(preset: cfg.Preset, glob: cfg.GlobalConfig, environ: Mapping[str, str],
                   for_unit: bool) -> str:
    """The UNIX socket the engine listens on, when systemd holds the preset's port
    (:mod:`lokid.core.launch.portunit`); "" otherwise. Planned for the unit from outside: by
    the rule. In the unit itself: by the mark of the generator's drop-in, what it
    really wrote (an edit that no ``daemon-reload`` has shown it yet keeps the engine
    on its port, where no socket unit waits for it). Elsewhere (the local runner,
    ``lokid run``) never: the port is the engine's own."""
    from ..core.launch import portunit

    if not for_unit:
        return portunit.marked_socket(preset.name, environ)
    held = portunit.held_by_systemd(preset, *conflicts.listen_address(preset, glob))
    return portunit.engine_socket(preset.name) if held is not None else ""


def _secret_files(preset: cfg.Preset, environ: Mapping[str, str],
                  for_unit: bool) -> tuple[str | None, dict[str, int]]:
    """Where the preset's secrets will be read at start, after checking each is there:
    the unit's credentials directory (in the unit, or planned for it), else None; and
    the mode of each secret file any user may read.

    In the unit the copies must exist: a secret added to a preset after the generator
    last ran has no ``LoadCredential=`` yet. Outside it the files themselves: as root
    for the unit (systemd reads them as root), else as this process will."""
    from ..core.names import engine_unit

    files = ([("api_key_file", secrets.API_KEY_TARGET, preset.api_key_file)]
             if preset.api_key_file is not None else [])
    files += [(f"secrets.{name}", name, source) for name, source in sorted(preset.secrets.items())]
    # Planned for the unit from outside (lokid plan, the daemon): its directory, whatever
    # this process's own credentials are. Planned by the unit itself: the one it was given.
    in_unit = None if for_unit else (environ.get("CREDENTIALS_DIRECTORY")
                                     or environ.get(secrets.CREDENTIALS_DIR_ENV))
    directory = secrets.unit_credentials_dir(engine_unit(preset.name)) if for_unit \
        else in_unit
    loose: dict[str, int] = {}
    for key, target, source in files:
        if in_unit:
            copy = os.path.join(in_unit, secrets.credential_id(target))
            if not os.path.isfile(copy):
                raise ConfigError(
                    f"the unit has no credential {secrets.credential_id(target)} for it "
                    f"(systemd loads it from {source} once lokid's generator has seen the "
                    "preset): run `systemctl daemon-reload`, then start it again",
                    preset.path, None, key)
            continue
        try:
            st = os.stat(source)
        except PermissionError:
            if for_unit and os.geteuid() != 0:
                continue  # systemd reads it as root: a user planning for the unit cannot tell
            raise ConfigError(f"{source}: permission denied", preset.path, None, key) from None
        except OSError as e:
            raise ConfigError(f"{source}: {e.strerror}", preset.path, None, key) from None
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{source} is not a regular file", preset.path, None, key)
        if st.st_size > secrets.MAX_SECRET_BYTES:
            raise ConfigError(f"{source} holds {st.st_size} bytes: a key or a token is "
                              f"at most {secrets.MAX_SECRET_BYTES}", preset.path, None, key)
        if not for_unit and not os.access(source, os.R_OK):
            raise ConfigError(f"{source}: permission denied (the engine is started by "
                              f"uid {os.geteuid()}, who reads it)", preset.path, None, key)
        if st.st_mode & 0o007:
            loose[source] = stat.S_IMODE(st.st_mode)
    return directory, loose


def make_plan(config_dir: str, name: str, environ: Mapping[str, str] | None = None,
              for_unit: bool = False) -> Plan:
    return build_plan(gather(config_dir, name, environ, for_unit=for_unit))


def listeners(config: cfg.GlobalConfig,
              presets: Mapping[str, cfg.Preset]) -> dict[str, conflicts.Endpoint]:
    """Where each preset that could start would listen: the valid ones whose model file
    is found (one stat each; no header read) and that are no example, as
    :func:`lokid.core.launch.conflicts.port_conflicts` wants them; and each of its
    replicas past the first, up to its ``max_replicas`` (``NAME:k`` on port + k - 1,
    :mod:`lokid.core.serve.replicas`): a preset set on a replica's port is refused before
    the gateway ever scales up onto it."""
    from ..core.serve.replicas import instance, replica_port

    out = {}
    for name, preset in presets.items():
        if preset.example:   # never started (example = true): holds no port
            continue
        if preset.external is None and cfg.resolve_file(preset.model,
                                                        config.model_dirs) is not None:
            host, port = conflicts.listen_address(preset, config)
            out[name] = conflicts.Endpoint(host, port, preset.path)
            for k in range(2, preset.serve.max_replicas + 1):
                out[instance(name, k)] = conflicts.Endpoint(host, replica_port(port, k),
                                                            preset.path)
    return out


def last_starts(runtime_dir: str,
                endpoints: Mapping[str, conflicts.Endpoint]) -> dict[str, conflicts.Started]:
    """The last start of each preset that shares its port with another one, from its
    runtime plan in ``runtime_dir`` and when that file was written: who holds a port
    (:func:`lokid.core.launch.conflicts.port_conflicts`). Presets alone on their port are not
    looked at (nothing is read in the usual case); a plan that cannot be read is no
    start ("" for ``runtime_dir``: none known)."""
    from ..core.errors import StalePlanError
    from ..store.runtimedir import read_runtime_plan, runtime_path

    ports = [e.port for e in endpoints.values()]
    out = {}
    for name, e in endpoints.items():
        if not runtime_dir or ports.count(e.port) < 2:
            continue
        try:
            rp = read_runtime_plan(runtime_dir, name)
            at = os.stat(runtime_path(runtime_dir, name)).st_mtime
        except (StalePlanError, OSError):
            continue
        out[name] = conflicts.Started(rp.host, rp.port, at)
    return out


def check_port_conflicts(config_dir: str, plan: Plan, glob: cfg.GlobalConfig | None = None,
                         runtime_dir: str = "") -> None:
    """ConfigError when another preset that could start holds where ``plan`` would
    listen (``glob``: lokid.toml when the caller has read it already; ``runtime_dir``:
    where the runtime plans say who started on a port last, "" for none known)."""
    check_listen_conflicts(config_dir, plan.preset, plan.host, plan.port, glob, runtime_dir)


def check_listen_conflicts(config_dir: str, preset: str, host: str, port: int,
                           glob: cfg.GlobalConfig | None = None, runtime_dir: str = "") -> None:
    """:func:`check_port_conflicts` for a preset that has no plan yet (its model is still
    to be pulled), by where it will listen."""
    glob = cfg.load_global(config_dir) if glob is None else glob
    presets, _ = cfg.load_presets(config_dir)
    found = listeners(glob, presets)
    path = cfg.preset_path(config_dir, preset)
    found[preset] = conflicts.Endpoint(host, port, path)
    clash = conflicts.port_conflicts(found, last_starts(runtime_dir, found)).get(preset)
    if clash is not None:
        raise ConfigError(clash, path)


def check_start(config_dir: str, inputs: PlanInputs, plan: Plan, for_unit: bool = False,
                runtime_dir: str = "") -> None:
    """ConfigError where the start of ``plan`` would refuse it before its engine runs,
    whoever holds the port now: an address the engine's user could not listen on (the
    host is not this machine's, or the port is below the unprivileged ones for the
    unit's user, with ``for_unit``; else for this process) and the port of another
    preset that holds it (:func:`check_port_conflicts`). The rest of what a start
    checks, the files, :func:`gather` has checked already."""
    from .endpoint import check_address

    check_address(plan.host, plan.port, unit_user(inputs.environ) if for_unit else None,
                  conflicts.listen_source(inputs.preset, inputs.config))
    check_port_conflicts(config_dir, plan, inputs.config, runtime_dir)


def decide(inputs: PlanInputs, db: StateDB | StateReader, loading: bool = False,
           cleared: Token | None = None, blocked: str = "") -> tuple[Plan, Mark, Verdict]:
    """The plan of a start, given the attempt verdict for its mark (read-only on ``db``).

    The mark is the plan's as it would be with automatic speculation allowed, so
    that a cut configuration keeps the same mark. ``loading``: the preset's engine
    runs now and has not answered (see :func:`lokid.core.launch.attempt.verdict`).
    ``cleared``: a token the runtime directory notes as cleared
    (:func:`lokid.store.state.read_cleared`). ``blocked``: a reason of the caller's
    to cut automatic speculation when the verdict does not (no token can be set).
    ConfigError for a preset marked ``example = true`` (issue 45, item 14): every start,
    ``lokid plan`` and the daemon's listing refuse it; an edit of it is still checked.
    """
    if inputs.preset.example:   # after gather's checks: a missing model still says so first
        raise ConfigError("example = true: this file is an example and never starts; remove "
                          "that line to serve it", inputs.preset.path)
    allowed = build_plan(inputs)
    mark = Mark(config_fingerprint(allowed, inputs.model), inputs.caps.path, inputs.caps.build)
    found = db.peek(inputs.preset.name, mark, loading, cleared)
    if not allowed.spec.auto and not found.record:
        # no automatic flags to cut: a verdict of the state DB's (it cannot be written)
        # is no concern of this preset's, and said on it misleads (issue 45, item 11)
        found = Verdict()
    elif blocked and not found.why:
        found = Verdict(blocked)
    plan = build_plan(replace(inputs, auto_blocked=found.why)) if found.why else allowed
    if found.pending and plan.spec.auto:
        plan = replace(plan, notes=(*plan.notes, found.pending))
    return plan, mark, found
