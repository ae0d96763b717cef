"""A preset's replicas (issue 47): several engines of one preset on one host, each its
own unit, port, attempt token, journal and state.

Rules, each for the failure it prevents:

- Replica 1 is the preset itself: ``loki-engine@NAME.service`` on the preset's port,
  unchanged. A preset without ``replicas`` runs exactly as before, and an operator's
  scripts, drop-ins and dashboards that name its unit keep working.
- Replica k >= 2 is the instance ``NAME:k`` (:func:`instance`): ``loki-engine@NAME:k``.
  ``:`` can never be part of a preset's name (:mod:`lokid.core.config.presetname`), so an
  instance name is never mistaken for another preset, and systemd takes it in a unit's
  instance and passes it unchanged as ``%i``. Every file keyed by a start (runtime
  plan, handoff, failures, attempt token, plan cache) is then keyed by the instance:
  one replica's crash loop or verdict is its own, never its siblings'.
- Replica k listens on the preset's port + k - 1 (:func:`replica_port`), and every
  replica up to ``max_replicas`` counts in the port conflicts
  (:func:`replica_names`): a preset placed on a replica's port is refused before it
  starts, not when the gateway scales up under load.
- A replica's own port is its own (:func:`replica_preset`): an on-demand preset's
  systemd-held socket belongs to replica 1, the one the gateway wakes; a ``--port`` in
  extra_args, which would put every replica on one port, is moved by k - 1 as well.
- Replica indices are small (at most :data:`MAX_REPLICAS`): a typo (``replicas = 80``)
  on a one-GPU host must not become 80 units and 80 ports.

Pure: presets in, presets and names out.
"""

from __future__ import annotations

from ..config.presetname import MAX_REPLICAS, valid_preset_name
from ..errors import ConfigError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a unit step's path)
if TYPE_CHECKING:
    from ..config.files import GlobalConfig, Preset
    from .tables import Serve

SEPARATOR = ":"
__all__ = ["MAX_REPLICAS"]


def instance(preset: str, index: int) -> str:
    """The instance name of replica ``index`` of ``preset`` (the preset itself for 1)."""
    return preset if index == 1 else f"{preset}{SEPARATOR}{index}"


def split_instance(name: str) -> tuple[str, int] | None:
    """``(preset, index)`` of an instance name (``"m"`` → ``("m", 1)``, ``"m:2"`` →
    ``("m", 2)``), None for a name that is neither a preset's nor a replica's
    (``"m:1"`` too: replica 1 has one name, the preset's)."""
    preset, sep, index = name.partition(SEPARATOR)
    if not valid_preset_name(preset):
        return None
    if not sep:
        return preset, 1
    if not index.isascii() or not index.isdigit() or index[0] == "0":
        return None
    k = int(index)
    return (preset, k) if 2 <= k <= MAX_REPLICAS else None


def preset_of(name: str) -> str:
    """The preset an instance name belongs to (the name itself when it is no replica's)."""
    return name.partition(SEPARATOR)[0]


def is_replica(name: str) -> bool:
    """Whether ``name`` is replica k >= 2 of a preset."""
    found = split_instance(name)
    return found is not None and found[1] > 1


def check_instance_name(name: str) -> None:
    """ConfigError for a name that is neither a preset's nor one of its replicas'."""
    if split_instance(name) is None:
        raise ConfigError(
            f"invalid preset name {name!r}: use 1 to 64 characters from A-Z a-z 0-9 _ . -, "
            "starting with a letter or a digit, followed for a replica by :2 to "
            f":{MAX_REPLICAS}")


def replica_port(port: int, index: int) -> int:
    """Where replica ``index`` of a preset on ``port`` listens."""
    return port + index - 1


def replica_names(preset: str, count: int) -> list[str]:
    """The instance names of replicas 2 to ``count`` (none for 1)."""
    return [instance(preset, k) for k in range(2, count + 1)]


def _moved_port(args: tuple[str, ...], by: int) -> tuple[str, ...]:
    """``args`` with each ``--port N``/``--port=N`` moved by ``by``."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == "--port" and i + 1 < len(out) and out[i + 1].isdigit():
            out[i + 1] = str(int(out[i + 1]) + by)
        elif arg.startswith("--port=") and arg[7:].isdigit():
            out[i] = f"--port={int(arg[7:]) + by}"
    return tuple(out)


def replica_preset(preset: Preset, config: GlobalConfig, index: int) -> Preset:
    """Replica ``index`` of ``preset`` as a preset of its own: the instance's name, its
    port, the preset's file (errors still name it) and every other setting the same.
    ConfigError when the index is past the preset's ``max_replicas`` or the port past
    65535."""
    if index == 1:
        return preset
    bound = preset.serve.max_replicas
    if not 2 <= index <= bound:
        raise ConfigError(f"replica {index} of preset {preset.name}: its [serve] "
                          f"max_replicas is {bound} (replicas 1 to {bound})", preset.path)
    from dataclasses import replace as dc_replace  # here: a unit step's start skips it

    # as lokid.core.launch.conflicts.listen_address reads it (not imported: conflicts reads
    # runtime plans, which read plans, which say what the replicas are)
    port = preset.port if preset.port is not None else config.port
    args = preset.extra_args
    for i, arg in enumerate(args):
        value = arg[7:] if arg.startswith("--port=") else \
            args[i + 1] if arg == "--port" and i + 1 < len(args) else ""
        if value.isdigit() and 0 < int(value) < 65536:
            port = int(value)
    moved = replica_port(port, index)
    if moved > 65535:
        raise ConfigError(f"replica {index} would listen on port {moved}, past 65535 (port "
                          f"{port} + {index - 1}): lower the port or max_replicas",
                          preset.path, None, "serve")
    # its stops are its preset's (idle_stop included), StopReplica's and the gateway's
    # scaling rule's: its plan named an idle stop of its own, which no one runs
    return dc_replace(preset, name=instance(preset.name, index), port=moved,
                      extra_args=_moved_port(preset.extra_args, index - 1),
                      serve=dc_replace(preset.serve, on_demand=False, idle_stop=None))


def replica_note(name: str, serve: Serve) -> str:
    """What ``lokid plan NAME:k`` says of replica k: who starts and stops it."""
    preset, index = split_instance(name) or (name, 1)
    return (f"replica {index} of preset {preset}: its own loki-engine@ unit, started with "
            f"the preset when {index} <= replicas ({serve.replicas}), else by StartReplica "
            "(lokictl replica start, or the gateway's scaling rule when requests wait); "
            "stopped with the preset (its idle_stop too), by StopReplica, or by the "
            "gateway's rule after a quarter of the preset's idle_stop without a request "
            "when the rule started it")


def replica_notes(preset: Preset, port: int) -> list[str]:
    """What ``lokid plan`` says of a preset's replicas (none for a single engine)."""
    serve = preset.serve
    if serve.max_replicas <= 1:
        return []
    started = ", ".join(f"{instance(preset.name, k)} on port {replica_port(port, k)}"
                        for k in range(1, serve.replicas + 1))
    line = (f"replicas = {serve.replicas}: a start runs {started}, each its own "
            f"loki-engine@ unit")
    if serve.max_replicas > serve.replicas:
        line += (f"; up to {serve.max_replicas} (max_replicas, up to port "
                 f"{replica_port(port, serve.max_replicas)}) by StartReplica")
    return [line]
