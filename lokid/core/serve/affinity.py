"""Which replica of a model gets a request: the one most likely to hold the longest
prefix of its prompt, within a bound on its load (issue 47, item 2). Pure and
deterministic; the gateway (peers, :mod:`lokid.core.fleet.route`) and the local replicas
call it.

API (small on purpose; one :class:`Affinity` serves every model of a gateway, since a
fingerprint includes its model's name):

- ``chain = lokid.core.serve.prefixes.chain_of(body, model)``: the request's prefix
  fingerprints (empty: no prompt known, routed by load alone);
- ``choice = affinity.choose(chain, [Replica(name, in_flight, slots), ...])``: the
  replica to send it to among the *ready* ones given, with why (nothing recorded);
- ``affinity.record(chain, choice.name)`` once it is sent: its prefixes live there now;
- ``affinity.forget(name, model)`` when a replica's engine stops or restarts (its cache
  is gone); ``forget(name)`` for all of a host's models;
- ``affinity.held(model, name)``: the fingerprints last recorded there, newest first, at
  most :data:`LISTED` (what a gateway tells its peers), and
  ``affinity.learn(model, name, prints)``: what a peer says it holds.

The rules, each for the failure it prevents:

1. **Longest known prefix first.** The chain is walked from its longest prefix down;
   the first fingerprint whose replica is among those given, and can take the request
   (rule 2), wins. A conversation returns to the replica that served its last turn
   (there, the engine re-reads only the new message: round-robin made it re-read the
   whole history on another engine each turn); a new conversation with a known system
   prompt goes where that system prompt was last sent. (Not following a system prompt
   alone, so that new conversations spread by a hash of their first message, was
   tried: ``benchmarks/affinity_peers.py`` at 8 clients, 32 conversations, two 4-slot
   replicas, evaluated 10 % more prompt tokens in 3 paired runs of 3 (63,786, 57,583,
   54,077 against 55,784, 52,375, 49,526), at 4 clients more in 2 of 3.)
2. **Bounded load** (consistent hashing with bounded loads, Mirrokni et al. 2017): a
   replica takes a request only while it has fewer than ``ceil(c × (in flight + 1) / n)``
   requests in flight (c = :data:`LOAD_FACTOR`, n replicas): one popular system prompt
   would otherwise send every conversation to one engine while the others idle. The
   least loaded replica always passes the bound, so some replica always can.
   A replica whose slots are known and all busy is **full**: the request would queue
   there behind the others while another engine idles, so it is passed over while any
   replica has a free slot.
3. **Spill to the least loaded** (ties by rule 4's order) when every replica known to
   hold a prefix is full or past its bound; the prefix is then recorded where it went,
   so the conversation's next turn follows it there (the affine one's cache has moved on).
4. **A prompt never seen** goes by rendezvous hashing (highest random weight) of its
   first fingerprint (the system prompt) over the replicas' names, the first that can
   take it: identical system prompts from different conversations, and from gateways
   that do not share a table, land on the same replica within the bound; a replica
   added or gone moves only the prompts that hashed to it.
5. **Bounded memory**: at most :data:`TABLE_SIZE` fingerprints, least recently routed
   forgotten first (an int key and a shared (model, replica) pair each: 77 bytes a
   fingerprint, 4.8 MiB full, by tracemalloc), and :data:`LISTED` per model and replica
   for :meth:`held`. :meth:`forget` walks the table (11 ms when full, on the loaded
   2-core development machine): it is called when a replica goes away or starts again,
   not per request; :meth:`choose` costs some 6 µs among 3 replicas, :meth:`record`
   under 1 µs.
6. **A peer's word is a hint**: :meth:`learn` adds what a peer lists only where this
   table knows nothing of a fingerprint (what this gateway routed itself, it saw), at
   most :data:`LISTED` a call. A peer that lists prefixes it does not hold attracts those
   conversations only, and only within its load bound (rule 2, with the requests this
   gateway has in flight there counted).
7. **No request, no replica**: an empty chain (no prompt known) is rule 4 without a key:
   the least loaded, ties by the order given (what routing did before affinity).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .prefixes import Chain

TABLE_SIZE = 65_536     # fingerprints remembered, at most
LOAD_FACTOR = 1.25      # c: a replica takes at most ceil(c × average load)
LISTED = 256            # fingerprints kept per model and replica for held()


@dataclass(frozen=True)
class Replica:
    """One ready replica of a model, as the rule reads it."""

    name: str
    in_flight: int = 0
    slots: int = 0    # requests it runs at once; 0: not known (only the bound holds it)


@dataclass(frozen=True)
class Choice:
    """Where a request goes: ``name`` ("" when no replica was given); ``held``: how many
    of the chain's fingerprints it is known to hold (0: none, a spill or a new prompt);
    ``spilled``: a replica holding a prefix could not take it; ``why``: one line."""

    name: str
    held: int = 0
    spilled: bool = False
    why: str = ""
    passed: frozenset[str] = frozenset()   # replicas full or past the bound


_Where = tuple[str, str]   # (model, replica name)


class Affinity:
    """Where each prompt prefix was last routed (see the module docstring)."""

    def __init__(self, size: int = TABLE_SIZE, factor: float = LOAD_FACTOR,
                 listed: int = LISTED):
        self.size, self.factor, self.listed = size, factor, listed
        self.table: dict[int, _Where] = {}   # insertion order = least recent first
        self.recent: dict[_Where, dict[int, None]] = {}
        self.wheres: dict[_Where, _Where] = {}   # one tuple per (model, name)

    def __len__(self) -> int:
        return len(self.table)

    def bound(self, replicas: Sequence[Replica]) -> int:
        """The most requests in flight a replica may have before it takes one more."""
        total = sum(r.in_flight for r in replicas) + 1
        return math.ceil(self.factor * total / len(replicas))

    def choose(self, chain: Chain, replicas: Sequence[Replica]) -> Choice:
        """The replica among ``replicas`` (the ready ones) that gets a request of
        ``chain``; nothing is recorded."""
        if not replicas:
            return Choice("", why="no replica is ready")
        cap = self.bound(replicas)
        within = [r for r in replicas if r.in_flight < cap]
        free = [r for r in within if r.slots <= 0 or r.in_flight < r.slots]
        ok = {r.name: r for r in (free or within)}
        passed = frozenset(r.name for r in replicas if r.name not in ok)
        seen = False
        model = chain.model
        for depth in range(len(chain.prints), 0, -1):
            where = self.table.get(chain.prints[depth - 1])
            if where is None or where[0] != model:
                continue
            if where[1] in ok:
                return Choice(where[1], depth, False, f"{_label(where[1])} holds "
                              f"{depth} of the prompt's {len(chain.prints)} prefixes",
                              passed)
            if any(r.name == where[1] for r in replicas):
                seen = True
        order = _rendezvous(chain.prints[0], ok) if chain.prints else list(ok)
        if seen:
            best = min(ok.values(), key=lambda r: (r.in_flight, order.index(r.name)))
            return Choice(best.name, 0, True, f"{_label(best.name)}: the least loaded "
                          f"({best.in_flight} in flight); the replicas holding the "
                          "prompt's prefixes are full", passed)
        if not chain.prints:
            best = min(ok.values(), key=lambda r: (r.in_flight, order.index(r.name)))
            return Choice(best.name, 0, False, f"{_label(best.name)}: the least loaded "
                          f"({best.in_flight} in flight)", passed)
        return Choice(order[0], 0, False, f"{_label(order[0])}: a prompt not seen, by "
                      "its hash", passed)

    def record(self, chain: Chain, name: str) -> None:
        """``chain``'s prefixes now live on replica ``name`` (a request was sent there)."""
        if not chain.prints:
            return
        where = self._where(chain.model, name)
        table = self.table
        for p in chain.prints:
            old = table.pop(p, None)
            if old is not None and old is not where:
                self.recent.get(old, {}).pop(p, None)
            table[p] = where
        recent = self.recent.setdefault(where, {})
        for p in (chain.prints[0], chain.prints[-1]):   # the system prompt, the whole
            recent.pop(p, None)
            recent[p] = None
        while len(recent) > self.listed:
            del recent[next(iter(recent))]
        self._trim()

    def learn(self, model: str, name: str, prints: Iterable[int]) -> None:
        """Replica ``name`` (a peer) says it holds ``prints`` of ``model``: each one this
        table does not know is taken, at most :data:`LISTED` (rule 6)."""
        where = self._where(model, name)
        for n, p in enumerate(prints):
            if n >= self.listed:
                break
            if p not in self.table:
                self.table[p] = where
        self._trim()

    def forget(self, name: str, model: str | None = None) -> None:
        """Replica ``name`` (of ``model``; of every model when None) holds nothing now."""
        gone = {w for w in self.wheres if w[1] == name and (model is None or w[0] == model)}
        if not gone:
            return
        self.table = {p: w for p, w in self.table.items() if w not in gone}
        for w in gone:
            self.recent.pop(w, None)
            del self.wheres[w]

    def held(self, model: str, name: str, n: int | None = None) -> list[int]:
        """The fingerprints of ``model`` last recorded on ``name``, newest first."""
        recent = self.recent.get((model, name))
        if not recent:
            return []
        out = list(reversed(recent))
        return out[:n] if n is not None else out

    def _where(self, model: str, name: str) -> _Where:
        key = (model, name)
        return self.wheres.setdefault(key, key)

    def _trim(self) -> None:
        table = self.table
        while len(table) > self.size:
            p = next(iter(table))
            where = table.pop(p)
            self.recent.get(where, {}).pop(p, None)


def _rendezvous(key: int, names: Iterable[str]) -> list[str]:
    """``names`` by their highest-random-weight score for ``key``, best first."""
    k = key.to_bytes(8, "big")

    def score(name: str) -> bytes:
        return hashlib.blake2b(k + name.encode("utf-8", "surrogatepass"),
                               digest_size=8).digest()
    return sorted(names, key=lambda n: (score(n), n), reverse=True)


def _label(name: str) -> str:
    return "this host" if name == "" else name
