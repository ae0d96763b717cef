"""What the gateway may know of an engine's slot files: ``$LOKI_RUNTIME_DIR/<preset>.slots``,
their names and sizes, listed by the engine's step before its engine starts (issue 45,
item 10).

The gateway asks the engine to save a swapped preset's slots before its stop and to
restore them after its next start (:mod:`lokid.gateway.slots`), but under systemd it may
not look into the engine's state directory (the engine's user owns it, mode 0750). A file
the engine cut short (its disk full at the last write, which llama.cpp does not check) is
read past its end at the restore, and llama-server aborts (``GGML_ASSERT(nread <=
state_size)``); restored again at every swap-in, the engine died at each one. So the
engine's step (:mod:`lokid.unit.steps`), which runs as the engine's user, lists the
directory here, and the gateway restores a file only when the size listed is the size the
engine said it wrote at the save.

Rules, each for a failure it prevents:

- written before the engine is spawned, at every start, the listing is what the engine
  will read: no save happens between a start and its restore (the gateway saves before
  a stop);
- written atomically (a temporary name, then a rename): a gateway never reads half a
  listing;
- given to the gateway's group, mode 0640, as the engine's socket is
  (:mod:`lokid.host.sockshare`): the gateway reads it by name from ``/run/loki`` (0751),
  which it cannot list, and nobody else reads anything there; where that group does not
  exist (no package: the gateway runs as the engines' user) the file stays its writer's;
- a listing that cannot be written is removed, and a listing absent is no listing: the
  gateway then restores nothing (a stale one would vouch for files changed since);
- bounded both ways (:data:`MAX_FILES` names written, :data:`MAX_BYTES` read): a
  directory grown without limit, or a file that is no listing, costs the gateway a
  bounded read and a refusal, never its memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from ..core.names import GATEWAY_USER

SUFFIX = ".slots"           # $LOKI_RUNTIME_DIR/<preset>.slots
MAX_FILES = 4096            # names listed; the rest are not restored
MAX_BYTES = 1 << 20         # the most the gateway reads of a listing
MODE = 0o640                # the writer's and the gateway's group's


def _path(runtime_dir: str, preset: str) -> str:
    return os.path.join(runtime_dir, preset + SUFFIX)


def prepare_slot_dir(preset: str, argv: Sequence[str], runtime_dir: str) -> None:
    """In the engine's step, before its engine is spawned: the directory the plan's
    ``--slot-save-path`` names, made (the engine refuses one that does not exist; not
    made, the engine says so and fails as for any bad flag), and its files listed for
    the gateway (:func:`publish`). Never raises: a fault is logged."""
    from ..core.launch.flags import flag_value
    from ..host.journallog import journal_log

    path = flag_value(argv, "--slot-save-path")
    if not path:
        return
    try:
        os.makedirs(path, mode=0o750, exist_ok=True)
    except OSError as e:
        journal_log(preset, f"the slots' directory {path} cannot be made: {e}", priority=4)
    try:
        publish(runtime_dir, preset, path)
    except OSError as e:
        journal_log(preset, f"the slots in {path} cannot be listed for the gateway ({e}): "
                    "none of them is restored after this start", priority=4)


def publish(runtime_dir: str, preset: str, slot_dir: str, group: str = GATEWAY_USER) -> int:
    """List the regular files of ``slot_dir`` with their sizes for the gateway (its
    ``group``); how many.

    OSError when the directory cannot be read or the listing written: the old listing is
    removed first, so that none is left to vouch for files it no longer describes.
    """
    path = _path(runtime_dir, preset)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sizes: dict[str, int] = {}
    with os.scandir(slot_dir) as entries:
        for entry in entries:
            if len(sizes) >= MAX_FILES:
                break
            if entry.is_file(follow_symlinks=False):
                sizes[entry.name] = entry.stat(follow_symlinks=False).st_size
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(sizes, f)
        os.chmod(tmp, MODE)
        _give(tmp, group)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return len(sizes)


def _give(path: str, group: str) -> None:
    import grp

    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return   # no such group here: the gateway runs as the engines' user
    try:
        os.chown(path, -1, gid)   # the engine's user is a member (sysusers.d lokid.conf)
    except PermissionError:
        pass   # a user who is no member (lokid run by hand): the gateway, if it is that
        #        user, still reads it; another one finds no listing and restores nothing


def listed(runtime_dir: str, preset: str) -> dict[str, int] | None:
    """The sizes listed for ``preset``'s slot files; None when there is no usable listing
    (absent, unreadable, larger than :data:`MAX_BYTES`, or not a listing). Never raises."""
    try:
        with open(_path(runtime_dir, preset), "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_BYTES:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return {k: v for k, v in data.items()
            if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)}
