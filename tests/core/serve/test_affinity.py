"""lokid.core.serve.prefixes and lokid.core.serve.affinity: a prompt's prefix fingerprints, and the
replica a request goes to (issue 47, item 2). Pure: no engine, no clock."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from typing import Any

import pytest

from lokid.core.serve.affinity import Affinity, Replica
from lokid.core.serve.prefixes import MAX_BODY, MAX_CHAIN, TEXT_STEP, Chain, chain, chain_of

SYSTEM = "You are a careful assistant who answers in one sentence. " * 100


def turns(n: int, system: str = SYSTEM, who: str = "a") -> list[dict[str, Any]]:
    """The messages of turn ``n`` (1-based) of conversation ``who``."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for k in range(1, n + 1):
        out.append({"role": "user", "content": f"{who}: question {k}"})
        if k < n:
            out.append({"role": "assistant", "content": f"{who}: answer {k}"})
    return out


def openai(n: int, **kw: Any) -> Chain:
    return chain("m", {"model": "m", "messages": turns(n, **kw)})


# --- the chain --------------------------------------------------------------------

def test_turn_k_plus_1_holds_every_fingerprint_of_turn_k() -> None:
    for k in range(1, 8):
        a, b = openai(k).prints, openai(k + 1).prints
        assert b[:len(a)] == a and len(b) == len(a) + 2, k
    # the system prompt first; one more per message
    assert len(openai(1).prints) == 2


def test_two_conversations_share_the_system_prompt_only() -> None:
    a, b = openai(3, who="a").prints, openai(3, who="b").prints
    assert a[0] == b[0] and not set(a[1:]) & set(b[1:])
    # no system prompt: nothing shared (the empty one is worth nothing)
    assert not set(openai(2, system="", who="a").prints) & set(
        openai(2, system="", who="b").prints)


def test_the_model_role_and_content_count_and_json_spelling_does_not() -> None:
    body: dict[str, Any] = {"model": "m", "messages": turns(2)}
    assert chain("m", body).prints != chain("n", body).prints
    swapped = json.loads(json.dumps(body))
    swapped["messages"][1]["role"] = "assistant"
    assert chain("m", swapped).prints[1] != chain("m", body).prints[1]
    # the same request written by another client (keys ordered, spaced otherwise)
    other = json.dumps({"messages": [dict(reversed(list(m.items())))
                                     for m in body["messages"]], "model": "m"}, indent=3)
    assert chain_of(other.encode(), "m") == chain_of(json.dumps(body).encode(), "m")
    # parts and tool calls are canonical JSON: key order does not matter there either
    parts = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "what is it?"}]}]}
    mixed = json.loads(json.dumps(parts))
    mixed["messages"][0]["content"][0] = {"image_url": {"url": "data:image/png;base64,AAAA"},
                                          "type": "image_url"}
    assert chain("m", parts) == chain("m", mixed)
    tool = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    other_call = json.loads(json.dumps(tool))
    other_call["tool_calls"][0]["function"]["name"] = "g"
    assert chain("m", {"messages": [tool]}) != chain("m", {"messages": [other_call]})


def test_anthropic_system_and_completions_prompt() -> None:
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"},
            {"role": "user", "content": [{"type": "text", "text": "and?"}]}]
    c2 = chain("m", {"system": SYSTEM, "messages": msgs[:1]}).prints
    c3 = chain("m", {"system": SYSTEM, "messages": msgs}).prints
    assert c3[:2] == c2 and len(c3) == 4
    blocks = chain("m", {"system": [{"type": "text", "text": SYSTEM}], "messages": msgs})
    assert blocks.prints[0] != c3[0] and blocks.prints[1:] != c3[1:]   # another prompt
    # a plain prompt grown by appending shares its earlier steps
    text = "x" * (3 * TEXT_STEP + 10)
    short, long = chain("m", {"prompt": text}).prints, chain("m", {"prompt": text + "y" *
                                                                    TEXT_STEP}).prints
    assert long[:3] == short[:3] and short[3] != long[3]
    assert chain("m", {"prompt": [1, 2, 3]}).prints and not chain("m", {"prompt": ""})


def test_what_has_no_chain_and_the_bounds() -> None:
    for body in (b"", b"not json", b"[1, 2]", b'{"model": "m"}', b'{"messages": []}'):
        assert not chain_of(body, "m"), body
    big = json.dumps({"messages": [{"role": "user", "content": "x" * MAX_BODY}]}).encode()
    assert not chain_of(big, "m")   # over MAX_BODY: routed by load alone
    long = chain("m", {"messages": turns(400)})   # 799 boundaries
    assert len(long.prints) == MAX_CHAIN
    assert long.prints[0] == openai(1).prints[0] and long.prints[-2:] == openai(400).prints[-2:]
    # a surrogate a client's JSON may carry is hashed, not an error
    assert chain_of(b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "m")


# --- the choice -------------------------------------------------------------------

def replicas(*loads: int, slots: int = 0) -> list[Replica]:
    return [Replica(f"r{i}", n, slots) for i, n in enumerate(loads)]


def test_a_conversation_returns_to_its_replica() -> None:
    a = Affinity()
    seen: dict[str, str] = {}
    for who in "abcdefgh":
        first = a.choose(openai(1, who=who), replicas(0, 0, 0))
        assert first.held == 1 or who == "a"   # the system prompt, once seen
        a.record(openai(1, who=who), first.name)
        seen[who] = first.name
    for k in range(2, 6):
        for who in "abcdefgh":
            c = a.choose(openai(k, who=who), replicas(0, 0, 0))
            assert c.name == seen[who] and c.held == 2 * k - 2, (who, k, c)
            a.record(openai(k, who=who), c.name)


def test_a_new_prompt_goes_by_its_hash_the_same_from_any_table() -> None:
    """Two gateways with tables of their own send an unseen system prompt alike."""
    names: Counter[str] = Counter()
    for i in range(64):
        c = openai(1, system=f"system prompt {i}")
        one, two = Affinity().choose(c, replicas(0, 0, 0, 0)), Affinity().choose(
            c, list(reversed(replicas(0, 0, 0, 0))))
        assert one.name == two.name and one.held == 0
        names[one.name] += 1
    assert len(names) == 4 and min(names.values()) >= 6, names   # spread, not one
    # a replica gone moves only the prompts that hashed to it
    moved = sum(Affinity().choose(openai(1, system=f"system prompt {i}"),
                                  replicas(0, 0, 0)).name !=
                Affinity().choose(openai(1, system=f"system prompt {i}"),
                                  replicas(0, 0, 0, 0)).name for i in range(64))
    assert moved == names["r3"]


def test_bounded_load_holds_under_skew() -> None:
    """Every conversation shares one system prompt: without the bound all of them went
    to the one replica holding it. In flight never passes ceil(c × average) + 1 on any
    replica, whatever order requests arrive and leave in."""
    rng = random.Random(7)
    a = Affinity()
    n = 4
    load = [0] * n
    running: list[tuple[int, int]] = []   # (replica, ends at step)
    took: Counter[int] = Counter()
    for step in range(4000):
        running = [(r, end) for r, end in running if end > step or load.__setitem__(
            r, load[r] - 1)]
        who = f"c{rng.randrange(40)}"
        c = openai(rng.randrange(1, 6), who=who)
        reps = replicas(*load)
        cap = math.ceil(a.factor * (sum(load) + 1) / n)
        choice = a.choose(c, reps)
        r = int(choice.name[1:])
        assert load[r] < cap, (load, cap, choice)
        load[r] += 1
        took[r] += 1
        running.append((r, step + rng.randrange(1, 12)))
        a.record(c, choice.name)
    assert min(took.values()) > 4000 / n / 2, took   # skew spread over every replica


def test_spill_when_full_then_the_conversation_follows() -> None:
    a = Affinity()
    c1 = openai(1, who="a")
    a.record(c1, "r0")
    # r0 holds it, but its 2 slots are busy while r1 idles: spilled to the least loaded
    c = a.choose(openai(2, who="a"), [Replica("r0", 2, 2), Replica("r1", 1, 2),
                                       Replica("r2", 0, 2)])
    assert (c.name, c.held, c.spilled) == ("r2", 0, True) and "r0" in c.passed
    a.record(openai(2, who="a"), "r2")
    # the next turn follows the prefix to where it lives now, r0 free again or not
    c = a.choose(openai(3, who="a"), replicas(0, 0, 0, slots=2))
    assert (c.name, c.held) == ("r2", 4)
    # a full holder of the whole history passes to a holder of a shorter prefix
    a.record(openai(1, who="b"), "r1")
    c = a.choose(openai(3, who="a"), [Replica("r0", 0, 2), Replica("r1", 0, 2),
                                       Replica("r2", 2, 2)])
    assert (c.name, c.held) == ("r1", 1)   # the system prompt, recorded there last
    # every replica's slots busy: the bound alone decides, the holder if within it
    c = a.choose(openai(3, who="a"), replicas(2, 2, 2, slots=2))
    assert c.name == "r2" and c.held == 4


def test_forget_a_replica_and_learn_from_a_peer() -> None:
    a = Affinity()
    for k in (1, 2):
        a.record(openai(k, who="a"), "r0")
    a.record(openai(1, who="b", system="other"), "r0")
    a.record(openai(1, who="z"), "r1")   # the system prompt moves to r1
    assert a.held("m", "r0") == [openai(1, who="b", system="other").prints[-1],
                                 openai(1, who="b", system="other").prints[0],
                                 openai(2, who="a").prints[-1], openai(1, who="a").prints[-1]]
    a.forget("r0", "other-model")
    assert a.choose(openai(3, who="a"), replicas(0, 0)).name == "r0"
    a.forget("r0", "m")
    c = a.choose(openai(3, who="a"), replicas(0, 0))
    assert (c.name, c.held) == ("r1", 1) and a.held("m", "r0") == []
    # a peer's word fills only what the table does not know, bounded
    b = Affinity(listed=3)
    b.record(openai(1, who="a"), "here")
    b.learn("m", "peer", list(openai(2, who="a").prints) + [1, 2, 3])
    got = b.choose(openai(3, who="a"), [Replica("here"), Replica("peer")])
    assert (got.name, got.held) == ("peer", 3)   # learned, not overriding "here"'s 2
    assert b.table[openai(1, who="a").prints[0]] == ("m", "here")
    assert 3 not in b.table   # past listed: not taken
    b.forget("peer")
    assert b.choose(openai(3, who="a"), [Replica("here"), Replica("peer")]).name == "here"


def test_the_table_is_bounded_least_recent_first() -> None:
    a = Affinity(size=10, listed=4)
    for i in range(20):
        a.record(openai(1, system=f"s{i}"), f"r{i % 2}")
    assert len(a) == 10
    assert openai(1, system="s19").prints[0] in a.table
    assert openai(1, system="s0").prints[0] not in a.table
    assert len(a.held("m", "r1")) <= 4


def test_no_chain_is_the_least_loaded_and_no_replica_is_none() -> None:
    a = Affinity()
    assert a.choose(Chain("m"), replicas(2, 1, 1)).name == "r1"
    assert a.choose(openai(1), []).name == ""


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_the_least_loaded_always_passes_the_bound(n: int) -> None:
    rng = random.Random(n)
    a = Affinity()
    for _ in range(500):
        loads = [rng.randrange(0, 20) for _ in range(n)]
        assert min(loads) < a.bound(replicas(*loads))
