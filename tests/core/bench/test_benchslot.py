"""The benchmark's slot rule (lokid.core.bench.slot), table-tested on /slots answers shaped as
llama-server b11434 gives them (a slot never used has no id_task nor n_prompt_tokens)."""

from __future__ import annotations

from typing import Any

import pytest

from lokid.core.bench import slot as benchslot
from lokid.core.bench.slot import Choice, Slot


def used(i: int, cached: int, task: int, busy: bool = False) -> dict[str, Any]:
    return {"id": i, "n_ctx": 2048, "is_processing": busy, "id_task": task,
            "n_prompt_tokens": cached}


def fresh(i: int, busy: bool = False) -> dict[str, Any]:
    return {"id": i, "n_ctx": 2048, "speculative": False, "is_processing": busy}


def test_slots_of_reads_the_engine_answer() -> None:
    assert benchslot.slots_of([fresh(0), used(1, 829, 0)]) == [Slot(0, False), Slot(1, False,
                                                                                    829, 0)]
    for bad in ({"error": "disabled"}, [], ["x"], None):
        assert benchslot.slots_of(bad) is None


@pytest.mark.parametrize(("slots", "slot", "kept"), [
    # a fresh engine: the last slot
    ([fresh(0), fresh(1)], 1, True),
    # an unpinned first conversation lands in the LAST slot (the engine's LRU ties): the
    # benchmark takes the one left empty, not the conversation's
    ([fresh(0), used(1, 1289, 0)], 0, True),
    ([used(0, 1289, 0), fresh(1)], 1, True),
    ([used(0, 1289, 0), used(1, 0, 6), fresh(2)], 2, True),  # erased (0 tokens) counts empty
    ([used(0, 10, 5), used(1, 0, 9), used(2, 30, 7)], 1, True),
    # every slot holds a prompt: the least recently used goes (what the engine would evict)
    ([used(0, 1289, 9), used(1, 1350, 4)], 1, False),
    ([used(0, 1289, 3), used(1, 1350, 4)], 0, False),
])
def test_the_side_slot(slots: list[dict[str, Any]], slot: int, kept: bool) -> None:
    c = benchslot.choose(benchslot.slots_of(slots), len(slots))
    assert isinstance(c, Choice) and c.slot == slot and c.count == len(slots)
    assert c.shared == ""
    assert ("caches kept" in c.note) is kept, c.note
    if not kept:
        assert c.note.endswith("were taken") and "least recently used" in c.note


def test_only_the_benchmark_slot_is_checked_busy() -> None:
    c = benchslot.choose(benchslot.slots_of([used(0, 1289, 3, busy=True), fresh(1)]), 2)
    assert isinstance(c, Choice) and c.slot == 1
    assert c.shared == ("slot 0 served a request when the benchmark started: the figures "
                        "shared the engine with it")
    # the last slot busy, another idle: the idle one
    c = benchslot.choose(benchslot.slots_of([fresh(0), used(1, 50, 1, busy=True)]), 2)
    assert isinstance(c, Choice) and c.slot == 0 and c.shared.startswith("slot 1 served")
    busy = "the engine is already serving a request: run the benchmark again once it is idle"
    assert benchslot.choose(benchslot.slots_of([fresh(0, True), fresh(1, True)]), 2) == busy
    assert benchslot.choose(benchslot.slots_of([fresh(0, True)]), 1) == busy


def test_one_slot_says_the_conversation_cache_was_taken() -> None:
    c = benchslot.choose(benchslot.slots_of([used(0, 1289, 4)]), 1)
    assert c == Choice(None, 1, "one slot: the benchmark ran in the conversations' slot and "
                       "took its cached prompt (1289 tokens; the engine's RAM prompt cache, "
                       "when on, may restore it)")
    c = benchslot.choose(benchslot.slots_of([fresh(0)]), 1)
    assert isinstance(c, Choice) and c.slot is None and c.note.endswith("which held no prompt")


def test_without_slots_endpoint_the_count_comes_from_props() -> None:
    c = benchslot.choose(None, 4)
    assert isinstance(c, Choice) and c.slot == 3 and "hides /slots" in c.note
    c = benchslot.choose(None, 1)
    assert isinstance(c, Choice) and c.slot is None and c.note.startswith("one slot")
    assert benchslot.choose(None, 0) == Choice(None, 0)


def test_erase_notes() -> None:
    assert benchslot.erase_note(200) == ""
    assert "--slot-save-path" in benchslot.erase_note(501, '{"error": "not supported"}')
    assert benchslot.erase_note(500, "out\n of memory").endswith("HTTP 500 out of memory")
