"""A preset's aliases: the other names clients may ask for it by (``aliases =
["gpt-4o-mini"]``, as llama.cpp's router and llama-swap allow), and who keeps a name two
presets claim.

The rules, each with the failure it prevents:

- An alias follows the preset name rule (:mod:`lokid.core.config.presetname`), at most
  :data:`MAX_ALIASES` of them, none twice, none the preset's own name: a name the gateway
  could not route, or a list that grows without bound, is an error of the file
  (:func:`parse_aliases`).
- A name routes to one preset only. A preset's *name* always wins over another preset's
  alias (a file dropped beside the others may not take a name clients already use for a
  preset); between two aliases, the first preset by name keeps it (as a port's holder
  is the first by name when none has started: :mod:`lokid.core.launch.conflicts`), so which
  side loses does not change while the files stay as they are (:func:`resolve`).
- A clash costs the alias, never the preset: the preset that loses it keeps serving
  under its name and its other aliases, and its notes name the clash (both presets and
  the alias). Making it broken would take down a preset that clients use by its name
  because of a second name: "a broken preset never takes down the others" holds for
  a clash too.
- An edit that would make a clash is refused before the file is written, naming both
  presets and the alias (:func:`check_unique`): a clash is only ever made by hand.

Pure: names in, names and messages out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import ConfigError
from .presetname import valid_preset_name
from .tomlread import Checker, tname

MAX_ALIASES = 16   # per preset: a model picker's list, not a directory of names


def parse_aliases(c: Checker, name: str) -> tuple[str, ...]:
    """The preset's ``aliases`` key, checked (``()`` when absent)."""
    value = c.data.get("aliases")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise c.error("aliases", f"must be a list of names, such as aliases = "
                      f"[\"gpt-4o-mini\"], not {tname(value)}")
    if len(value) > MAX_ALIASES:
        raise c.error("aliases", f"{len(value)} aliases: at most {MAX_ALIASES}")
    seen: list[str] = []
    for item in value:
        if not isinstance(item, str):
            raise c.error("aliases", f"each alias must be a string, not {tname(item)}")
        shown = item if len(item) <= 64 else item[:64] + "..."
        if not valid_preset_name(item):
            raise c.error("aliases", f"{shown!r} is not a valid name: 1 to 64 characters "
                          "from A-Z a-z 0-9 _ . -, starting with a letter or a digit")
        if item == name:
            raise c.error("aliases", f"{item!r} is the preset's own name")
        if item in seen:
            raise c.error("aliases", f"{item!r} is listed twice")
        seen.append(item)
    return tuple(seen)


def resolve(declared: Mapping[str, Sequence[str]]) -> tuple[dict[str, tuple[str, ...]],
                                                            dict[str, list[str]]]:
    """Each preset's aliases as routed (``declared``: preset → its aliases as written),
    and for each preset that lost one, why (one line per alias lost, naming the alias and
    the preset that keeps the name)."""
    owner: dict[str, str] = {}
    kept: dict[str, tuple[str, ...]] = {}
    lost: dict[str, list[str]] = {}
    for preset in sorted(declared):
        mine = []
        for alias in declared[preset]:
            if alias in declared:
                lost.setdefault(preset, []).append(
                    f"alias {alias!r} is not served: it is the name of preset {alias!r} "
                    f"(a name wins over an alias): remove it from preset {preset!r} or "
                    "rename the other")
            elif alias in owner:
                lost.setdefault(preset, []).append(
                    f"alias {alias!r} is not served by preset {preset!r}: preset "
                    f"{owner[alias]!r} has it too and keeps it (the first by name): "
                    "remove it from one of them")
            else:
                owner[alias] = preset
                mine.append(alias)
        kept[preset] = tuple(mine)
    return kept, lost


def check_unique(name: str, aliases: Sequence[str],
                 others: Mapping[str, Sequence[str]], path: str = "") -> None:
    """An edit of preset ``name`` (its ``aliases`` as the new text has them): a
    ConfigError naming both presets and the name when one of its aliases is another
    preset's name or alias, or its own name is another preset's alias. ``others``: every
    other preset and its aliases."""
    for other, theirs in sorted(others.items()):
        if other == name:
            continue
        if other in aliases:
            raise ConfigError(f"alias {other!r} of preset {name!r} is the name of preset "
                              f"{other!r}: each name routes to one preset", path, None,
                              "aliases")
        both = sorted(set(aliases) & set(theirs))
        if both:
            raise ConfigError(f"alias {both[0]!r} of preset {name!r} is an alias of preset "
                              f"{other!r} already: each name routes to one preset", path,
                              None, "aliases")
        if name in theirs:
            raise ConfigError(f"the name of preset {name!r} is an alias of preset {other!r}: "
                              "remove it there first, or choose another name", path)
