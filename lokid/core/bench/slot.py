"""Which of the engine's slots the benchmark runs in, and what it says about the others.

The seed's side slot: a benchmark sent wherever the engine likes evicts the
cached prompt of whoever chats with it, so with two or more slots every
request of one benchmark goes to one slot (``id_slot``), chosen once here,
and that slot is erased afterwards where the engine allows slot actions.

Measured on llama-server b11434 (``--parallel 2``, the tiny test model):

- An unpinned request on a fresh engine lands in the *last* slot (its LRU
  ties go to the highest id), so "always the last slot" would evict the
  first conversation of a fresh engine. The benchmark takes the last slot
  that holds no prompt (``n_prompt_tokens`` 0 or absent), and only when
  every idle slot holds one, the least recently used of them (the lowest
  ``id_task``), the one the engine would evict itself for a new prompt.
- ``/slots`` lists every slot with ``is_processing``; a slot never used has no
  ``id_task``. ``--no-slots`` answers 501: then ``/props`` ``total_slots`` gives
  the count, and the last slot is taken without knowing what it holds.
- ``POST /slots/<id>?action=erase`` answers 501 "not_supported_error" unless the
  engine was started with ``--slot-save-path``; with it, 200 and ``n_erased``.

The busy check looks at the slot the benchmark uses: a busy one refuses, as
before. Another slot serving a request does not refuse, but shares the engine
with the measurement (continuous batching): the result says so and is not kept.

With one slot there is no side: the benchmark runs in the conversations'
slot and its report says the cached prompt was taken (the engine's RAM prompt
cache, on by default, may give it back: measured, a one-slot engine restored a
1285-token conversation after a bench-sized prompt; ``--cache-ram 0`` lost it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Slot:
    """One entry of ``/slots``: ``cached`` is ``n_prompt_tokens`` (0 when absent: a
    slot never used), ``task`` its last ``id_task`` (-1 when none)."""

    id: int
    processing: bool
    cached: int = 0
    task: int = -1


@dataclass(frozen=True)
class Choice:
    """``slot``: the ``id_slot`` to send, None to let the engine choose (one slot, or
    a count it does not say); ``count``: the slots it has (0 unknown); ``note``: what
    the report says about the conversations' caches; ``shared``: another slot was
    serving a request when the benchmark started ("" when none)."""

    slot: int | None
    count: int
    note: str = ""
    shared: str = ""


def _int(v: Any, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def slots_of(data: Any) -> list[Slot] | None:
    """The slots of a ``/slots`` answer; None when it is no list of slots."""
    if not isinstance(data, list) or not data:
        return None
    out = []
    for i, s in enumerate(data):
        if not isinstance(s, dict):
            return None
        out.append(Slot(_int(s.get("id"), i), s.get("is_processing") is True,
                        max(_int(s.get("n_prompt_tokens"), 0), 0), _int(s.get("id_task"), -1)))
    return out


def _tokens(n: int) -> str:
    return f"{n} token{'s' if n != 1 else ''}"


def choose(slots: list[Slot] | None, total: int) -> Choice | str:
    """The slot of one benchmark, or why it cannot start now (a busy engine).

    ``slots``: what ``/slots`` says (None: disabled or unreadable); ``total``:
    ``/props`` ``total_slots`` (0 unknown)."""
    if slots is None:
        if total >= 2:
            return Choice(total - 1, total, f"ran in slot {total - 1} of {total} (the engine "
                          "hides /slots: which slot was free is unknown)")
        if total == 1:
            return Choice(None, 1, "one slot: the benchmark ran in the conversations' slot "
                          "and took any prompt cached there")
        return Choice(None, 0)
    idle = [s for s in slots if not s.processing]
    if not idle:
        return "the engine is already serving a request: run the benchmark again once it is idle"
    busy = ", ".join(str(s.id) for s in slots if s.processing)
    shared = (f"slot{'s' if ',' in busy else ''} {busy} served a request when the benchmark "
              "started: the figures shared the engine with it") if busy else ""
    if len(slots) == 1:
        s = slots[0]
        took = (f" and took its cached prompt ({_tokens(s.cached)}; the engine's RAM prompt "
                "cache, when on, may restore it)" if s.cached else ", which held no prompt")
        return Choice(None, 1, f"one slot: the benchmark ran in the conversations' slot{took}")
    empty = [s for s in idle if s.cached == 0]
    if empty:
        pick = max(empty, key=lambda s: s.id)
        return Choice(pick.id, len(slots), f"ran in slot {pick.id} of {len(slots)}, which held "
                      "no prompt: the conversations' caches kept", shared)
    pick = min(idle, key=lambda s: (s.task, -s.id))
    return Choice(pick.id, len(slots), f"ran in slot {pick.id} of {len(slots)}, the least "
                  f"recently used: every slot held a prompt, its {_tokens(pick.cached)} "
                  "were taken", shared)


def erase_note(status: int, body: str = "") -> str:
    """What the report adds after erasing the benchmark's slot answered ``status``
    ("" when it was erased)."""
    if status == 200:
        return ""
    if status == 501:
        return ("its prompt stays there: the engine refuses slot actions (start it with "
                "--slot-save-path to let the benchmark erase its slot)")
    snip = " ".join(body.split())[:120]
    return f"its prompt stays there: erasing the slot answered HTTP {status} {snip}".rstrip()
