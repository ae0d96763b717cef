"""A GPU group's swap keeps the users' caches: the slots of the preset swapped out are
saved before its stop and restored at its next start (issue 22, item 7).

llama-server started with ``--slot-save-path DIR`` (planned for every preset of a
``serve.group``, :mod:`lokid.core.launch.plan`) writes a slot's KV cache and its tokens to a
file in DIR on ``POST /slots/<id>?action=save`` and reads it back on ``?action=restore``,
both with ``{"filename": …}``. The gateway only calls these; it never reads the files
(its user cannot: they belong to the engine's). A restored slot answers a prompt that
starts with its tokens from its cache, so a long conversation does not pay its prefill
again after its model was swapped out and back.

Rules, each for a failure it prevents:

- only idle slots holding tokens are saved (``GET /slots``: not ``is_processing``, its
  ``n_prompt_tokens``, ``n_past`` in older builds, above 0): a busy slot's save waits in
  the engine's queue until its request ends, which would hold the swap;
- a file's name carries a digest of the model's path, the engine's build and the slot's
  context (``GET /props``, ``GET /slots``): a preset edited to another model, or an
  engine upgraded, is never handed the cache of the one before (the engine checks only
  the shapes);
- the restore runs once per start, before the requests that waited for the start are
  sent, and the requests wait for it: restored behind their backs it would land in a slot
  already serving one of them;
- every failure (no ``--slot-save-path``: 501, an engine gone, a file that does not fit
  the new context) is logged and ends that step alone; both steps are bounded in time
  (:data:`SAVE_TIMEOUT`, :data:`RESTORE_TIMEOUT`): neither ever blocks or fails a swap;
- what was saved is remembered in this process only: a gateway restarted loses the
  record (its next start is a cold cache, never a wrong one).

A full disk (issue 45, item 10): llama-server opens the file of a save for writing, which
cuts the good file of the previous save to nothing, then fails (HTTP 500); and it does
not check the last write of one that it says it saved. Restoring a file cut short, it
reads past its end and aborts (``GGML_ASSERT(nread <= state_size)``, exit 134): once
at every swap-in, after the disk was freed too. So:

- each save of a slot goes to the other of two names (``…a.bin``, ``…b.bin``) than the
  file on record, which it replaces on record only when the engine said it saved: a
  save that fails leaves the file before it whole and on record (a file the gateway
  cannot rename, it never overwrites);
- a file is restored only when the size the engine's step listed before the engine
  started (:mod:`lokid.store.slotsizes`) is the size the engine said it wrote: one
  cut short, or not listed, is never handed to the engine, and is forgotten (logged);
  the file of the save before it, on the other name and whole, is restored instead (so
  a good file is given up only for one found whole);
- a file whose restore the engine refused, or during which the engine went away, is
  forgotten (logged): it is never tried again;
- at most two files are kept per slot and configuration, the older one overwritten by
  the next save (the gateway may not remove the engine's files).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from ..core.paths import runtime_dir
from ..store.slotsizes import listed
from .replies import GatewayError

log = logging.getLogger("lokid.gateway")

SAVE_TIMEOUT = 20.0      # seconds for all the slots of one engine; then the stop goes on
RESTORE_TIMEOUT = 30.0   # seconds; then the waiting requests go on with a cold cache
BUSY_TIMEOUT = 2.0       # seconds for an engine's /slots asked whether it serves a request
FAILURES = (aiohttp.ClientError, OSError, ValueError, KeyError, TypeError, GatewayError)


def _tokens(slot: dict[str, Any]) -> int:
    value = slot.get("n_prompt_tokens", slot.get("n_past", 0))
    return value if isinstance(value, int) else 0


def slot_file(slot_id: int, model_path: str, build: str, n_ctx: int, side: str = "a") -> str:
    """The slot's file name, on ``side`` "a" or "b" (the engine refuses any with a path
    separator)."""
    digest = hashlib.sha256(f"{model_path}\0{build}\0{n_ctx}".encode()).hexdigest()[:16]
    return f"slot{slot_id}-{digest}{side}.bin"


def _other_side(saved: tuple[str, int] | None) -> str:
    return "b" if saved is not None and saved[0].endswith("a.bin") else "a"


class SlotCache:
    """Save a preset's slots before its swap's stop; restore them at its next start."""

    def __init__(self, client: Callable[[], aiohttp.ClientSession | None],
                 key: Callable[[str], str | None] = lambda _preset: None,
                 runtime: str | None = None):
        self.client = client
        self.key = key   # the preset's own API key for its engine (its api_key_file), if any
        self.runtime = runtime or runtime_dir()   # where the engines' steps list slot files
        # preset → slot id → (file name, the bytes the engine said it wrote there)
        self.saved: dict[str, dict[int, tuple[str, int]]] = {}
        self.older: dict[str, dict[int, tuple[str, int]]] = {}   # the save before, aside
        self.pending: set[str] = set()               # presets whose next start restores
        self.restoring: dict[str, asyncio.Task[None]] = {}

    async def save(self, preset: str, url: str) -> None:
        """The idle slots of ``preset``'s engine at ``url`` saved; never raises."""
        try:
            await asyncio.wait_for(self._save(preset, url), SAVE_TIMEOUT)
        except TimeoutError:
            log.warning("%s: its slots were not saved in %.0f s: swapped out without them",
                        preset, SAVE_TIMEOUT)
        except FAILURES as e:
            log.warning("%s: its slots were not saved: %s", preset, e or type(e).__name__)

    async def busy(self, preset: str, url: str) -> bool | None:
        """Whether ``preset``'s engine at ``url`` serves a request now (a slot of its
        ``/slots`` processing); None when it does not say (no answer, another shape)."""
        try:
            slots = await asyncio.wait_for(self._get(preset, url, "/slots"), BUSY_TIMEOUT)
        except (TimeoutError, *FAILURES):
            return None
        if not isinstance(slots, list):
            return None
        return any(isinstance(s, dict) and bool(s.get("is_processing")) for s in slots)

    def forget(self, preset: str) -> None:
        """Its stop did not happen: the engine keeps its slots, nothing to restore."""
        self.pending.discard(preset)

    async def restored(self, preset: str, url: str) -> None:
        """Once after a start of ``preset``, its saved slots restored; every request for
        it waits here for that (at no cost when there is nothing to restore)."""
        task = self.restoring.get(preset)
        if task is None:
            if preset not in self.pending:
                return
            self.pending.discard(preset)
            task = asyncio.get_running_loop().create_task(self._restore_bounded(preset, url))
            self.restoring[preset] = task
            task.add_done_callback(lambda _t: self.restoring.pop(preset, None))
        await asyncio.shield(task)   # a request cancelled does not cancel the restore

    # --- the engine's side -------------------------------------------------------------

    def _headers(self, preset: str) -> dict[str, str]:
        key = self.key(preset)   # GatewayError: the key file unusable (logged where read)
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _get(self, preset: str, url: str, path: str) -> Any:
        client = self.client()
        if client is None:
            raise ValueError("the gateway is shutting down")
        async with client.get(url + path, headers=self._headers(preset)) as r:
            if r.status != 200:
                raise ValueError(f"GET {path} answered {r.status}")
            return await r.json(content_type=None)

    async def _action(self, preset: str, url: str, slot_id: int, action: str,
                      name: str) -> dict[str, Any]:
        client = self.client()
        if client is None:
            raise ValueError("the gateway is shutting down")
        async with client.post(f"{url}/slots/{slot_id}?action={action}",
                               json={"filename": name}, headers=self._headers(preset)) as r:
            data = await r.json(content_type=None)
            if r.status != 200:
                error = data.get("error", {}) if isinstance(data, dict) else {}
                raise _Refused(r.status, str(error.get("message") or data))
            return data if isinstance(data, dict) else {}

    async def _files(self, preset: str, url: str
                     ) -> tuple[list[dict[str, Any]], Callable[[int, int, str], str]]:
        slots = await self._get(preset, url, "/slots")
        props = await self._get(preset, url, "/props")
        model, build = str(props.get("model_path", "")), str(props.get("build_info", ""))
        if not isinstance(slots, list):
            raise ValueError("GET /slots did not answer a list")
        return slots, lambda slot_id, n_ctx, side: slot_file(slot_id, model, build, n_ctx, side)

    async def _save(self, preset: str, url: str) -> None:
        started = time.monotonic()
        slots, name_of = await self._files(preset, url)
        saved = self.saved.setdefault(preset, {})
        count = tokens = 0
        for slot in slots:
            slot_id = slot["id"]
            if slot.get("is_processing") or _tokens(slot) <= 0:
                continue   # busy (its save would wait for its request), or empty
            before = saved.get(slot_id)
            name = name_of(slot_id, int(slot.get("n_ctx", 0)), _other_side(before))
            try:
                done = await self._action(preset, url, slot_id, "save", name)
            except _Refused as e:
                kept = f"; its save before ({before[0]}) is kept" if before else ""
                log.warning("%s: slot %d not saved: %s%s", preset, slot_id, e, kept)
                if e.status == 501:   # no --slot-save-path: no other slot will do better
                    break
                continue
            n_saved, n_written = _count(done, "n_saved"), _count(done, "n_written")
            if n_saved > 0 and n_written > 0:
                if before is not None:   # kept until this one is found whole at a restore
                    self.older.setdefault(preset, {})[slot_id] = before
                saved[slot_id] = (name, n_written)
                count += 1
                tokens += n_saved
        if saved:
            self.pending.add(preset)
        if count:
            log.info("%s: %d slots saved (%d tokens) in %.0f ms before its stop", preset,
                     count, tokens, (time.monotonic() - started) * 1000)

    async def _restore_bounded(self, preset: str, url: str) -> None:
        try:
            await asyncio.wait_for(self._restore(preset, url), RESTORE_TIMEOUT)
        except TimeoutError:
            log.warning("%s: its slots were not restored in %.0f s: it answers with a cold "
                        "cache", preset, RESTORE_TIMEOUT)
        except FAILURES as e:
            log.warning("%s: its slots were not restored: %s", preset, e or type(e).__name__)

    async def _restore(self, preset: str, url: str) -> None:
        started = time.monotonic()
        slots, name_of = await self._files(preset, url)
        fits = {slot["id"]: {name_of(slot["id"], int(slot.get("n_ctx", 0)), side)
                             for side in "ab"} for slot in slots}
        saved = self.saved.get(preset, {})
        sizes = listed(self.runtime, preset) if saved else {}
        if sizes is None:
            log.warning("%s: its slots were not restored: its engine's step listed none of "
                        "their sizes (%s) to check them by", preset, self.runtime)
            return
        older = self.older.pop(preset, {})
        count = tokens = 0
        for slot_id, (name, size) in sorted(saved.items()):
            if name not in fits.get(slot_id, ()):
                continue   # another model, build or context now: that cache is not its own
            if sizes.get(name) != size:
                found = "is not there" if name not in sizes else f"holds {sizes[name]} bytes"
                log.warning("%s: slot %d: its file %s %s where the engine wrote %d (cut "
                            "short by a full disk?): forgotten", preset, slot_id, name, found,
                            size)
                aside = older.get(slot_id)
                if aside is None or aside[0] not in fits[slot_id] or sizes.get(aside[0]) != \
                        aside[1]:
                    del saved[slot_id]
                    continue
                name, size = saved[slot_id] = aside   # the save before it, whole
                log.info("%s: slot %d: its save before, %s, is restored instead", preset,
                         slot_id, name)
            try:
                done = await self._action(preset, url, slot_id, "restore", name)
            except _Refused as e:
                del saved[slot_id]   # the engine will not do better with it next time
                log.warning("%s: slot %d not restored: %s; %s forgotten", preset, slot_id, e,
                            name)
                continue
            except (aiohttp.ClientError, OSError) as e:
                del saved[slot_id]   # it may be what took the engine down: never again
                log.warning("%s: slot %d: its engine went away restoring %s (%s): that file "
                            "is never restored again", preset, slot_id, name,
                            e or type(e).__name__)
                raise
            count += 1
            tokens += _count(done, "n_restored")
        if count:
            log.info("%s: %d slots restored (%d tokens) in %.0f ms after its start", preset,
                     count, tokens, (time.monotonic() - started) * 1000)


def _count(answer: dict[str, Any], field: str) -> int:
    value = answer.get(field, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class _Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"{message} (HTTP {status})")
        self.status = status
