"""What the daemon's interfaces send that is more than a plain value: a JSON object as
a{sv} (Stats, Memory, Devices, a bench's reply), a plan as ``lokid plan --json`` shows
it, a command line as the caller may see it (secrets masked unless revealed:
:mod:`lokid.dbus.reveal`)."""

from __future__ import annotations

from typing import Any

from dbus_fast import Variant

from ..core.config.secrets import mask_argv, mask_env
from ..core.launch.plan import Plan
from .reveal import revealed


def json_variant(data: dict[str, Any]) -> dict[str, Variant]:
    """A JSON object as a{sv}: objects a{sv}, lists of objects aa{sv}, strings as, and a
    None (an unknown figure) left out: over the bus an absent key means "n/a"."""
    def one(value: Any) -> Variant | None:
        if value is None:
            return None
        if isinstance(value, bool):
            return Variant("b", value)
        if isinstance(value, int):
            return Variant("x", value)
        if isinstance(value, float):
            return Variant("d", value)
        if isinstance(value, str):
            return Variant("s", value)
        if isinstance(value, dict):
            return Variant("a{sv}", json_variant(value))
        if isinstance(value, list) and all(isinstance(v, dict) for v in value):
            return Variant("aa{sv}", [json_variant(v) for v in value])
        if isinstance(value, list):
            return Variant("as", [str(v) for v in value])
        return Variant("s", str(value))

    out = {}
    for key, value in data.items():
        v = one(value)
        if v is not None:
            out[key] = v
    return out


def shown_argv(argv: list[str]) -> list[str]:
    """A command line as this property read may show it (:mod:`lokid.dbus.reveal`)."""
    return list(argv) if revealed() else mask_argv(argv)


def plan_variant(plan: Plan, reveal: bool = False) -> dict[str, Variant]:
    """``lokid plan --json`` as a{sv}: argv (as), env (a{ss}), notes (as), spec (a{sv}),
    secrets (aa{sv}: where each comes from, never a value). Without ``reveal``, the
    values of secret flags and of every variable are masked."""
    return {
        "preset": Variant("s", plan.preset),
        "argv": Variant("as", list(plan.argv) if reveal else mask_argv(plan.argv)),
        "env": Variant("a{ss}", dict(plan.env) if reveal else mask_env(plan.env)),
        "secrets": Variant("aa{sv}", [json_variant(s.to_json()) for s in plan.secrets]),
        "notes": Variant("as", list(plan.notes)),
        "spec": Variant("a{sv}", {"mode": Variant("s", plan.spec.mode),
                                  "types": Variant("as", list(plan.spec.types)),
                                  "auto": Variant("b", plan.spec.auto)}),
    }
