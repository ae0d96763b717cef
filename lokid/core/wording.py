"""How lokid's messages count things: "1 preset", "2 presets", "no request".

One home for it, because each message that wrote its own ``f"{n} presets"`` said
"serving 1 presets" and "1 requests" to the operator sooner or later.
"""

from __future__ import annotations


def counted(n: int, singular: str, plural: str = "") -> str:
    """``n`` and the noun that agrees with it: ``counted(1, "preset")`` is "1 preset",
    ``counted(3, "preset")`` "3 presets"; ``plural`` for a noun not made with -s."""
    return f"{n} {singular if n == 1 else plural or singular + 's'}"
