"""The runtime plan: what ``lokid prestart`` decided for one start of a preset, as one value.

``lokid prestart`` (ExecStartPre) writes it to ``$LOKI_RUNTIME_DIR/<preset>.json``
(:mod:`lokid.store.runtimedir`); ``lokid engine`` runs its argv, the journal
watcher attributes a load's verdict to its mark, the daemon shows its
speculation types, and the benchmark measures at its address. They all read
this one frozen type; the JSON form lives here and nowhere else.

The JSON is ``lokid plan --json`` of the start (preset, argv, env, notes,
spec) plus host, port (and ``socket`` where systemd holds them), the attempt
mark, the systemd invocation and ``schema``. A file without ``schema`` was
written before it existed, in the same layout (schema 1 added the key, nothing
else; ``socket``, absent, reads as none; so do ``gpu_choice`` and ``claim``, added
later without a new schema since an older reader ignores them): an engine started by the
previous release is still understood after an upgrade, which restarts the
daemon but leaves engines running. A newer schema is refused, not guessed.

Kept light (records of :mod:`lokid.core.record`, and the attempt mark): ``lokid engine`` reads it
between ``systemctl start`` and the engine's own start.
"""

from __future__ import annotations

from ..config import secrets
from ..config.secrets import Secret
from ..record import field, record
from .attempt import Mark

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from typing import Any

    from .plan import Plan

SCHEMA = 1


@record
class RuntimePlan:
    """The plan of one start: the engine's command line and environment, its address,
    the speculation it runs and the attempt mark its token was set under."""

    preset: str
    argv: tuple[str, ...]
    env: dict[str, str]
    host: str
    port: int
    mark: Mark
    spec_mode: str = "off"
    spec_types: tuple[str, ...] = ()
    auto: bool = False            # automatic speculation: its token must clear on READY
    notes: tuple[str, ...] = ()
    invocation: str = ""          # systemd's INVOCATION_ID of the start ("" outside systemd)
    pid: int = 0                  # the process that planned and supervises it (0: unknown)
    # Where each secret is read at start (lokid.core.config.secrets); never a value. Absent from
    # a file written before secrets existed: none.
    secrets: tuple[Secret, ...] = ()
    # The UNIX socket the engine listens on when systemd holds host:port for it
    # (lokid.core.launch.portunit); "" = host:port. Absent from older files: "".
    socket: str = ""
    # gpus = "auto" (0) / gpu_count (N): the GPUs prestart chose are in env's
    # CUDA_VISIBLE_DEVICES, and ``claim`` holds what it expected the engine to take on
    # each ("GPU1" → bytes): what another start at the same time counts as taken before
    # the engine allocates it (lokid.planning.gpuchoice). Absent from older files.
    gpu_choice: int | None = None
    claim: dict[str, int] = field(default_factory=dict)
    schema: int = field(default=SCHEMA, compare=False)

    @classmethod
    def of(cls, plan: Plan, mark: Mark, invocation: str = "", pid: int = 0) -> RuntimePlan:
        return cls(preset=plan.preset, argv=tuple(plan.argv), env=dict(plan.env),
                   host=plan.host, port=plan.port, mark=mark, spec_mode=plan.spec.mode,
                   spec_types=tuple(plan.spec.types), auto=plan.spec.auto,
                   notes=tuple(plan.notes), invocation=invocation, pid=pid,
                   secrets=tuple(plan.secrets), socket=plan.socket,
                   gpu_choice=plan.gpu_choice)

    def command_line(self) -> str:
        return secrets.command_line(self.env, self.argv)

    def settled_alone(self, verdict: str) -> bool:
        """Whether a start that reuses this plan, planned with the attempt verdict
        ``verdict``, has nothing to ask at start but where it listens: no speculation
        that a verdict could cut nor a token to set (the state DB), no GPUs to choose,
        no RPC worker to find answering. A restart of such a plan is handed over by the
        planning step without the JSON module (:mod:`lokid.unit.keptstart`)."""
        from .flags import has_flag

        return (self.spec_mode == "off" and not self.auto and not verdict
                and self.gpu_choice is None and not has_flag(self.argv, "--rpc"))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "preset": self.preset,
            "argv": list(self.argv),
            "env": dict(self.env),
            "notes": list(self.notes),
            "spec": {"mode": self.spec_mode, "types": list(self.spec_types),
                     "auto": self.auto},
            "host": self.host,
            "port": self.port,
            "mark": {"fingerprint": self.mark.fingerprint, "engine": self.mark.engine,
                     "build": self.mark.build},
            "invocation": self.invocation,
            "pid": self.pid,
            "secrets": [s.to_json() for s in self.secrets],
            **({"socket": self.socket} if self.socket else {}),
            **({"gpu_choice": self.gpu_choice} if self.gpu_choice is not None else {}),
            **({"claim": dict(self.claim)} if self.claim else {}),
        }

    @classmethod
    def from_json(cls, data: object) -> RuntimePlan:
        """The runtime plan of a parsed JSON document; ValueError saying what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        schema = data.get("schema", SCHEMA)
        if type(schema) is not int or schema > SCHEMA:
            raise ValueError(f"schema {schema!r}: this lokid reads schema {SCHEMA} or older")
        spec = _get(data, "spec", dict)
        mark = _get(data, "mark", dict)
        return cls(
            preset=_get(data, "preset", str),
            argv=_strings(data, "argv"),
            env=_string_map(data, "env"),
            host=_get(data, "host", str),
            port=_get(data, "port", int),
            mark=Mark(_get(mark, "fingerprint", str), _get(mark, "engine", str),
                      _get(mark, "build", int)),
            spec_mode=_get(spec, "mode", str),
            spec_types=_strings(spec, "types"),
            auto=_get(spec, "auto", bool),
            notes=_strings(data, "notes"),
            invocation=_get(data, "invocation", str, ""),
            pid=_get(data, "pid", int, 0),  # optional: not written before it existed
            secrets=tuple(Secret.from_json(s) for s in _get(data, "secrets", list, [])),
            socket=_get(data, "socket", str, ""),
            gpu_choice=_get(data, "gpu_choice", int) if "gpu_choice" in data else None,
            claim=_int_map(data, "claim"),
            schema=schema,
        )


_MISSING = object()


def _get(data: dict[str, Any], key: str, kind: type, default: Any = _MISSING) -> Any:
    value = data.get(key, default)
    if value is _MISSING:
        raise ValueError(f"no {key!r}")
    # bool is an int in Python: a port of true is not a port
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{key!r} is not a {kind.__name__}: {value!r}")
    return value


def _strings(data: dict[str, Any], key: str) -> tuple[str, ...]:
    value = _get(data, key, list)
    if not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key!r} holds a non-string")
    return tuple(value)


def _string_map(data: dict[str, Any], key: str) -> dict[str, str]:
    value = _get(data, key, dict)
    if not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"{key!r} holds a non-string value")
    return dict(value)


def _int_map(data: dict[str, Any], key: str) -> dict[str, int]:
    value = _get(data, key, dict, {})
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
        raise ValueError(f"{key!r} holds a non-integer value")
    return dict(value)
