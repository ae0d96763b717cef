"""Reading llama-server flags out of an argument list (a preset's ``extra_args``).

Both spellings count: ``--flag value`` and ``--flag=value``. Values are not
validated here; the engine does that.
"""

from __future__ import annotations

from collections.abc import Sequence


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
