"""The gateway's peers (issue 30, item 1): what each other lokid gateway of
``[gateway] peers`` serves, and whether it is up; the routing rule itself is
:mod:`lokid.core.fleet.route`.

Rules, each for a failure it prevents:

- each peer's ``GET /v1/models`` is read every :data:`POLL_EVERY` seconds while it is
  up, with the peer's own key (never a client's) and the hop mark (:data:`HOP_HEADER`:
  the peer lists only its own presets, so hosts that list each other never count a
  model twice); the read is bounded in time (:data:`READ_TIMEOUT`) and in bytes: a
  body is read in chunks and cut at :data:`MAX_LISTING`, never whole first; what a
  listing may say (depth, models, ids, facts) is :mod:`lokid.core.fleet.listing`'s;
- a peer that refuses or times out the read, answers other than 200 or sends what is no
  model list, or one refused by those bounds, is **down**: its models are unavailable
  at once (a client is answered 503 naming the peer, rather than kept waiting on a dead
  host), and it is read again after a backoff (:data:`BACKOFF`, from 1 s to 5 s), then
  routed to as soon as a read succeeds. A request that could not reach a peer marks it
  down the same way. Whatever a read meets, the peer is read again: an exception that
  escaped once ended a peer's reads for good, silently, its last listing left "up";
- what a peer's answer did is logged in one line naming the peer and why, when it
  changes, and at most :data:`LINES_PER_MINUTE` lines a minute per peer (the next line
  says how many were held back): a peer flapping between lies cannot fill the journal;
- a listing the same as the last one read (its digest) is not parsed again: a big
  allowed listing costs its parse once, not every :data:`POLL_EVERY` seconds on the
  loop that answers every client; the merged listing of all peers is built when a
  peer's changes, not per ``GET /v1/models``;
- what a peer said last stays known while it is down, so a model only it serves is
  answered "on gpu2, which is down" (503) rather than "no such model" (404);
- the requests this gateway has in flight to a peer count with what the peer last said
  (the larger of the two), so a burst between two reads is spread over the replicas;
- no peer's address reaches a client: replies and listings name the peer only, and a
  reason for a peer being down is ours, never an exception's text (aiohttp's name the
  URL) nor the peer's bytes; a peer's status text is shown as :func:`public` makes it;
- a peer key going over plain http:// beyond loopback is warned about when the peers
  are loaded (:func:`lokid.core.fleet.peers.cleartext_key`); https:// peers are verified
  (aiohttp's default context: the system's CAs, the host name checked);
- ``systemctl reload loki-gateway`` (:meth:`Peers.reconfigure`, issue 48, item 5) keeps
  the state of a peer still listed the same (a new ``Peer`` would read as "down, not
  read yet" and lose what it was sent); a removed peer's reads end, even where their
  cancel was lost, and nothing of it is said or marked after;
- the daemon is told which peers are down (``ReportPeers``: lokictl top, Prometheus's
  ``lokid_peer_up``) when that changes, and again every :data:`REPORT_EVERY` seconds
  (it forgets a word not repeated); a report that fails is logged once, never in the
  way of a request.

Cache-affine routing (issue 47, item 2; :mod:`lokid.core.serve.affinity`): among the ready
replicas, a request goes where its prompt's longest prefix was last sent, within a bound
on load. Rules, each for a failure it prevents:

- a prompt's fingerprints (:mod:`lokid.core.serve.prefixes`) are taken on the routes that read
  a prompt (:data:`AFFINE_ROUTES`), whenever this gateway has peers or the request came
  from one: a peer must know what its own engine holds to say it;
- this gateway records where it sent each prompt, a peer or its own engine
  (:meth:`Peers.sent`, :meth:`Peers.served_here`); it forgets a peer's when the peer goes
  down or lists the model not ready (its engine's cache is gone with its start), and its
  own when its engine was started again since (``ready_at``); a peer's listing is
  parsed again once it is back up, to learn what it holds;
- a peer learns what this host's engine holds from its listing: ``slots`` and the
  ``prefixes`` last served here (:func:`told`, at most :data:`TOLD` in all), only in
  the listing given to a request carrying the hop mark, never to a client's. A
  fingerprint is no prompt, but it confirms a guessed one (a known system prompt hashed
  with the model's name): kept to peers. The hop mark is a header, not a proof: a client
  whose key this gateway accepts could send it, so a gateway shared with untrusted keys
  lets them confirm such guesses; the prompts themselves never leave;
- what a peer lists is kept out of what clients see (:func:`lokid.core.fleet.listing
  .prefixes_of`), and taken as a hint only (:meth:`lokid.core.serve.affinity.Affinity.learn`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from ..core.fleet.listing import (
    MAX_BYTES,
    ListingRefused,
    model_of,
    over_size,
    prefixes_of,
    read_listing,
)
from ..core.fleet.peers import Peer, cleartext_key, peer_key_credential
from ..core.fleet.route import LOCAL, READY, Host, Model, Route, route
from ..core.serve.affinity import Affinity
from ..core.serve.prefixes import Chain, chain_of, hex_of
from .faults import Throttle
from .relay import read_capped
from .replies import GatewayError, public
from .upstream import read_key

log = logging.getLogger("lokid.gateway")

# The mark a forwarded request carries: a gateway answers it from its own presets only,
# never sends it on, and lists only its own presets to it.
HOP_HEADER = "Lokid-Hop"
POLL_EVERY = 2.0            # seconds between two reads of an up peer's models
READ_TIMEOUT = 3.0          # seconds a read may take, connect included
# Seconds before a down peer is read again. Capped at 5 s: a read of a down host costs
# nothing worth saving, and with 30 s a host rebooted in 3 s (the fleet walk) stayed
# "down" for its clients some 6 s after it was back.
BACKOFF = (1.0, 2.0, 4.0, 5.0)
MAX_LISTING = MAX_BYTES         # bytes of a peer's /v1/models, at most
REPORT_EVERY = 10.0             # seconds between two ReportPeers when nothing changed
UNAVAILABLE = "unavailable"     # the state a down peer's models are listed in
LINES_PER_MINUTE = 3            # log lines about one peer, at most
REPORTING = ""                  # the report's task among the peers' (no peer is named "")
TOLD = 1024                     # prefix fingerprints a listing tells a peer, at most
# The routes whose body carries a prompt an engine caches (chat, Anthropic messages,
# completions): the others (embeddings, tokenize…) are routed by load alone.
AFFINE_ROUTES = frozenset({"/v1/chat/completions", "/chat/completions", "/v1/messages",
                           "/v1/completions", "/completions", "/completion"})


@dataclass
class PeerState:
    peer: Peer
    up: bool = False
    read: bool = False                       # a listing was read once at least
    models: dict[str, Model] = field(default_factory=dict)
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)   # its lokid facts
    why_down: str = "not read yet"
    failures: int = 0
    since: float = field(default_factory=time.monotonic)   # up or down since
    sent: Counter[str] = field(default_factory=Counter)    # our requests in flight there
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    tried: asyncio.Event = field(default_factory=asyncio.Event)   # its first read ended
    digest: bytes = b""        # of the last answer parsed
    refused: str = ""          # why that answer was refused ("" = taken)
    left_out: int = 0          # its entries whose ids are no model names


class Peers:
    def __init__(self, peers: Sequence[Peer],
                 client: Callable[[], aiohttp.ClientSession | None],
                 report: Callable[[dict[str, str]], Awaitable[None]] | None = None):
        self.states = {p.name: PeerState(p) for p in peers}
        self.client = client
        self.report = report     # ReportPeers to the daemon
        self.tasks: dict[str, asyncio.Task[None]] = {}   # each peer's reads, the report's
        self.stopped = False
        self.throttle = Throttle(60.0, LINES_PER_MINUTE)
        self.merged: dict[str, dict[str, dict[str, Any]]] | None = None   # listing()'s
        self.affinity = Affinity()   # where each prompt prefix was sent (issue 47)
        self.here_at: dict[str, float | None] = {}   # ready_at of the engine recorded
        for p in peers:
            warning = cleartext_key(p)
            if warning:
                log.warning("%s", warning)

    def __bool__(self) -> bool:
        return bool(self.states)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for s in self.states.values():
            if s.peer.name not in self.tasks:
                self.tasks[s.peer.name] = loop.create_task(self._follow(s))
        if self.states and self.report is not None and REPORTING not in self.tasks:
            self.tasks[REPORTING] = loop.create_task(self._reporting(self.report))

    async def stop(self) -> None:
        self.stopped = True
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.tasks = {}

    def reconfigure(self, peers: Sequence[Peer]) -> tuple[list[str], list[str]]:
        """``[gateway] peers`` read again (a reload, :mod:`lokid.gateway.reload`): a peer
        still listed the same keeps its state (up or down, its listing, what it was sent);
        one removed is read no more; one added, or listed with another url or key file,
        starts as at a start (read at once). A request in flight to a removed peer ends
        as it would have (its count is its own). The names removed and added."""
        wanted = {p.name: p for p in peers}
        removed = [n for n, s in self.states.items() if wanted.get(n) != s.peer]
        added = [n for n, p in wanted.items() if n not in self.states
                 or self.states[n].peer != p]
        for name in removed:
            task = self.tasks.pop(name, None)
            if task is not None:
                task.cancel()
            del self.states[name]
            self.affinity.forget(name)   # what it was sent is no route any more
        for name in added:
            self.states[name] = PeerState(wanted[name])
            warning = cleartext_key(wanted[name])
            if warning:
                log.warning("%s", warning)
        if removed or added:
            self.merged = None
        if added:
            self.start()   # the new ones read now
        return removed, added

    def key(self, peer: Peer) -> str | None:
        """The key presented to ``peer`` (its credential under systemd); GatewayError 503
        when its file cannot be used."""
        if not peer.api_key_file:
            return None
        return read_key(peer.name, peer.api_key_file, credential=peer_key_credential(peer.name),
                        label=f"peer gateway {peer.name!r}")

    async def _reporting(self, report: Callable[[dict[str, str]], Awaitable[None]]) -> None:
        sent: dict[str, str] | None = None
        at, failed = float("-inf"), False
        while True:
            now = self.summary()
            if now != sent or time.monotonic() - at >= REPORT_EVERY:
                at = time.monotonic()
                try:
                    await report(now)
                    sent, failed = now, False
                except Exception as e:   # the daemon away, older, or refusing: logged once
                    if not failed:
                        log.info("peers: the daemon was not told which peers are up: %s",
                                 getattr(e, "text", "") or f"{type(e).__name__}: {e}")
                    failed = True
            await asyncio.sleep(1.0)

    async def _follow(self, s: PeerState) -> None:
        # until stopped or removed, even where a cancel was lost: Python 3.11's wait_for
        # drops one that comes as its read ends (then stop() waited for ever)
        while not self.stopped and self.states.get(s.peer.name) is s:
            try:
                await self.read(s)
            except Exception as e:   # a defect of ours: said, and the peer read again
                if self.states.get(s.peer.name) is not s:
                    return   # removed by a reload while it was read
                self._down(s, f"the gateway failed reading it ({type(e).__name__})")
            pause = POLL_EVERY if s.up else BACKOFF[min(s.failures, len(BACKOFF)) - 1]
            s.wake.clear()
            try:
                await asyncio.wait_for(s.wake.wait(), pause)
            except TimeoutError:
                pass

    async def read(self, s: PeerState) -> None:
        """Read ``s``'s models once: up with them, or down with why."""
        try:
            await self._read(s)
        finally:
            s.tried.set()

    async def first_reads(self, timeout: float = READ_TIMEOUT + 0.5) -> None:
        """Until every peer was read once (or ``timeout``): a gateway just started does
        not answer "down (not read yet)" for a peer it is reading."""
        waiting = [s.tried.wait() for s in self.states.values() if not s.tried.is_set()]
        if waiting:
            try:
                await asyncio.wait_for(asyncio.gather(*waiting), timeout)
            except TimeoutError:
                pass

    async def _read(self, s: PeerState) -> None:
        try:
            data = await asyncio.wait_for(self._get(s.peer), READ_TIMEOUT)
            changed = self._take(s, data)
        except TimeoutError:
            self._down(s, f"its /v1/models did not answer in {READ_TIMEOUT:g} s")
            return
        except GatewayError:
            self._down(s, "its api_key_file cannot be used")
            return
        except (aiohttp.ClientError, OSError, ValueError) as e:
            self._down(s, _reason(e))
            return
        s.read = True
        if not s.up:
            self._say(s, logging.INFO, f"is up: {len(s.models)} model(s)" + (
                f"; {s.left_out} entr{'ies' if s.left_out != 1 else 'y'} left out (an id "
                "that is no model name)" if s.left_out else ""))
            s.up, s.since = True, time.monotonic()
            changed = True
        elif changed and s.left_out:
            self._say(s, logging.WARNING, f"{s.left_out} entr{'ies' if s.left_out != 1 else 'y'}"
                      " of its /v1/models left out (an id that is no model name)")
        s.failures, s.why_down = 0, ""
        if changed:
            self.merged = None

    def _take(self, s: PeerState, data: bytes) -> bool:
        """``data``, a peer's answer, read into ``s`` (whether it changed what is known);
        ListingRefused saying why not. The same bytes as the last answer parsed are not
        parsed again: the same verdict."""
        digest = hashlib.blake2b(data, digest_size=16).digest()
        if digest == s.digest:
            if s.refused:
                raise ListingRefused(s.refused)
            return False
        s.digest, s.refused = digest, ""
        try:
            listing = read_listing(data)
        except ListingRefused as e:
            s.refused = str(e)
            raise
        for facts in listing.models.values():
            if facts.get("status"):
                facts["status"] = public(facts["status"])
        models = {}
        for name, facts in listing.models.items():
            prints, m = prefixes_of(facts), model_of(facts)
            models[name] = m
            if m.state != READY:
                if name in s.models and s.models[name].state == READY:
                    self.affinity.forget(s.peer.name, name)   # its cache went with it
            elif prints:
                self.affinity.learn(name, s.peer.name, prints)
        for name in s.models.keys() - models.keys():
            self.affinity.forget(s.peer.name, name)
        s.models = models
        s.facts, s.left_out = listing.models, listing.left_out
        return True

    async def _get(self, peer: Peer) -> bytes:
        client = self.client()
        if client is None:
            raise ValueError("the gateway is not serving yet")
        headers = {HOP_HEADER: "1"}
        key = self.key(peer)
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        async with client.get(peer.url + "/v1/models", headers=headers,
                              allow_redirects=False) as answer:
            if answer.status != 200:
                raise ListingRefused(f"its /v1/models answered {answer.status}"
                                     + (" (is its key right?)" if answer.status == 401
                                        else ""))
            why = over_size(answer.content_length)
            if why:
                raise ListingRefused(why)
            data = await read_capped(answer, MAX_LISTING)
            if data is None:   # the connection is closed, the rest unread
                raise ListingRefused(f"its /v1/models is over {MAX_LISTING} bytes")
        return data

    def down(self, name: str, why: str) -> None:
        """Mark peer ``name`` down (a read or a request could not reach it); a peer a
        reload removed is nobody's to mark (a request of it in flight ends as it would)."""
        s = self.states.get(name)
        if s is None:
            return
        self._down(s, why)

    def _down(self, s: PeerState, why: str) -> None:
        name = s.peer.name
        if self.states.get(name) is not s:
            return   # removed by a reload as it was read
        s.failures += 1
        if s.up or s.why_down != why:
            self._say(s, logging.WARNING, f"is down: {why}")
            self.merged = None
        if s.up:
            s.since = time.monotonic()
            self.affinity.forget(name)   # what it holds is read again once it is back
            s.digest = b""
        s.up, s.why_down = False, why
        if s.failures == 1:
            s.wake.set()   # read again soon: the first backoff step

    def _say(self, s: PeerState, level: int, what: str) -> None:
        """One line about peer ``s``, as :data:`LINES_PER_MINUTE` allows."""
        ok, held = self.throttle.allow(s.peer.name)
        if ok:
            log.log(level, "peer gateway %s %s%s", s.peer.name, what,
                    f" ({held} more line{'s' if held != 1 else ''} about it not logged)"
                    if held else "")

    def hosts(self, local: Model | None, name: str) -> list[Host]:
        """This host (its view of model ``name``: ``local``, None when it has no such
        preset) and each peer, as the routing rule reads them. A peer's model of another
        kind than the local preset of that name (an engine here, an external API there,
        or the other way) is no replica: the local preset wins (:func:`conflicts`)."""
        out = [Host(LOCAL, True, {name: local} if local is not None else {})]
        for s in self.states.values():
            models: Mapping[str, Model] | None = None
            if s.up:
                models = s.models
                if local is not None and name in models and models[name].kind != local.kind:
                    models = {k: v for k, v in models.items() if k != name}
                sent = s.sent.get(name, 0)
                if sent and name in models and models[name].in_flight < sent:
                    models = {name: replace(models[name], in_flight=sent)}
            out.append(Host(s.peer.name, s.up, models, s.why_down))
        return out

    def route(self, name: str, local: Model | None, hopped: bool = False,
              chain: Chain | None = None) -> Route:
        return route(name, self.hosts(local, name), hopped, chain, self.affinity)

    def chain(self, raw_path: str, body: bytes, name: str) -> Chain | None:
        """The prefix fingerprints of a request for ``name`` on ``raw_path``; None on a
        route that reads no prompt."""
        return chain_of(body, name) if raw_path in AFFINE_ROUTES else None

    def sent(self, chain: Chain | None, peer: str) -> None:
        """A request of ``chain`` goes to ``peer``: its prefixes live there now."""
        if chain:
            self.affinity.record(chain, peer)

    def served_here(self, chain: Chain | None, name: str, ready_at: float | None) -> None:
        """A request of ``chain`` goes to this host's engine of preset ``name``, ready
        since ``ready_at`` (None: not ready yet): what was recorded of an earlier start
        of it is forgotten first."""
        if not chain:
            return
        before = self.here_at.get(name)
        if before is not None and before != ready_at:
            self.affinity.forget(LOCAL, name)   # started again: its cache is new
        self.here_at[name] = ready_at
        self.affinity.record(chain, LOCAL)

    def knows(self, name: str) -> bool:
        """Whether a peer lists ``name``, or listed it when last read, or could (it was
        never read): a request for it is then answered 503 naming the peers, not 404."""
        return any(name in s.models or not s.read for s in self.states.values())

    @contextlib.contextmanager
    def sending(self, peer: str, name: str) -> Iterator[None]:
        """Count a request of ours for ``name`` in flight to ``peer`` while the block runs."""
        sent = self.states[peer].sent
        sent[name] += 1
        try:
            yield
        finally:
            sent[name] -= 1
            if sent[name] <= 0:
                del sent[name]

    def listing(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Every model a peer serves or served: name → peer → its facts (a down peer's
        in the state "unavailable", saying why). Built again only when a peer's listing
        or state changed: the caller must not change it."""
        if self.merged is not None:
            return self.merged
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for s in self.states.values():
            for name, facts in s.facts.items():
                shown = dict(facts) if s.up else {
                    "state": UNAVAILABLE, "status": f"peer gateway {s.peer.name} is down: "
                    f"{s.why_down}"}
                out.setdefault(name, {})[s.peer.name] = shown
        self.merged = out
        return out

    def summary(self) -> dict[str, str]:
        """Peer name → "" when up, else why it is down."""
        return {name: "" if s.up else s.why_down for name, s in self.states.items()}


def told(entries: dict[str, dict[str, Any]], slots: Mapping[str, int],
         affinity: Affinity) -> None:
    """This host's listing ``entries`` as a peer is shown them (the hop mark): each
    engine preset of ``slots`` (name → its engine's slots) with its ``slots`` and the
    prefixes its engine was last sent, newest first, at most :data:`TOLD` in all."""
    left = TOLD
    for name, n in slots.items():
        facts = entries.get(name, {}).get("lokid")
        if facts is None:
            continue
        facts["slots"] = n
        prints = affinity.held(name, LOCAL, min(left, affinity.listed)) if left else []
        left -= len(prints)
        facts["prefixes"] = hex_of(prints)


def _reason(e: BaseException) -> str:
    """Why a read failed, in our words: aiohttp's texts name the peer's URL, and a
    refusal's are ours (:class:`ListingRefused`)."""
    if isinstance(e, ListingRefused):
        return str(e)
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        cert = e.certificate_error
        why = "it is not for that host name" \
            if getattr(cert, "verify_code", None) == _HOSTNAME_MISMATCH \
            else _fixed(getattr(cert, "verify_message", None)) or "not trusted here"
        return f"its TLS certificate was refused: {why}"
    if isinstance(e, aiohttp.ClientSSLError):
        return "the TLS handshake failed (is its url https:// where it speaks http?)"
    if isinstance(e, aiohttp.ClientConnectorError):   # its text names the address: not shown
        number = e.os_error.errno
        return f"cannot connect ({os.strerror(number) if number else type(e.os_error).__name__})"
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "it closed the connection"
    if isinstance(e, aiohttp.ClientResponseError):
        return "its answer is not valid HTTP"
    if isinstance(e, aiohttp.ClientPayloadError):
        return "its answer broke off"
    if isinstance(e, OSError) and e.errno:
        return f"the connection failed ({os.strerror(e.errno)})"
    return f"the read failed ({type(e).__name__})"


_HOSTNAME_MISMATCH = 62   # X509_V_ERR_HOSTNAME_MISMATCH


def _fixed(text: object) -> str:
    """OpenSSL's verify message when it is one of its fixed texts (lower-case words,
    such as "self-signed certificate"), else ""."""
    if isinstance(text, str) and len(text) <= 80 and all(
            c.islower() or c in " -," for c in text):
        return text
    return ""
