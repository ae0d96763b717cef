"""lokid.gateway.slots: a restore that takes its engine down is never tried again (issue
45, item 10), and nothing is restored that the engine's step did not list whole.

The engine here is a stand-in over a real socket, because the real one could not be made
to die on a file of the right size (llama-server refuses a file whose header or cell
count lies, HTTP 400; it aborts only on one cut short, which the size check keeps from
it: tests/gateway/test_slots_fulldisk.py). It writes its saves to a real directory, which
the real listing of the engine's step (:mod:`lokid.store.slotsizes`) describes, and it
drops the connection at a restore, as an engine that aborts does. Reproduced before:
the record of that file stayed, the next stop of the restarted engine (an empty slot:
nothing saved) marked it for restore again, and it was restored at every start.
"""

from __future__ import annotations

import grp
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from support.gatewaykit import app_on_loopback

from lokid.gateway.slots import SlotCache
from lokid.store.runtimefiles import remove_preset_files
from lokid.store.slotsizes import publish


class Engine:
    """What llama-server answers for the slots, with a slot that holds ``tokens``."""

    def __init__(self, where: Path):
        self.where = where
        self.tokens = 10
        self.restores: list[str] = []
        self.die = True

    def app(self) -> web.Application:
        async def slots(_r: web.Request) -> web.Response:
            return web.json_response([{"id": 0, "n_ctx": 4096, "is_processing": False,
                                       "n_prompt_tokens": self.tokens}])

        async def props(_r: web.Request) -> web.Response:
            return web.json_response({"model_path": "/m/tiny.gguf", "build_info": "b11434"})

        async def action(r: web.Request) -> web.StreamResponse:
            name = (await r.json())["filename"]
            if r.query["action"] == "save":
                (self.where / name).write_bytes(b"s" * 1000)
                return web.json_response({"id_slot": 0, "filename": name,
                                          "n_saved": self.tokens, "n_written": 1000})
            self.restores.append(name)
            if self.die:
                assert r.transport is not None
                r.transport.close()   # the engine aborted reading it
                return web.Response()
            return web.json_response({"id_slot": 0, "filename": name, "n_restored": 10,
                                      "n_read": 1000})

        app = web.Application()
        app.router.add_get("/slots", slots)
        app.router.add_get("/props", props)
        app.router.add_post("/slots/{id}", action)
        return app


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[tuple[Engine, str]]:
    engine = Engine(tmp_path / "slots")
    engine.where.mkdir()
    async with app_on_loopback(engine.app()) as url:
        yield engine, url


@pytest.fixture
async def cache(tmp_path: Path) -> AsyncIterator[SlotCache]:
    async with aiohttp.ClientSession() as client:
        yield SlotCache(lambda: client, runtime=str(tmp_path / "run"))


def start(engine: Engine, tmp_path: Path) -> None:
    """What the engine's step does before its engine starts."""
    (tmp_path / "run").mkdir(exist_ok=True)
    publish(str(tmp_path / "run"), "alpha", str(engine.where))


async def test_a_file_the_engine_died_restoring_is_never_restored_again(
        engine: tuple[Engine, str], cache: SlotCache, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    fake, url = engine
    await cache.save("alpha", url)
    start(fake, tmp_path)
    await cache.restored("alpha", url)
    assert len(fake.restores) == 1

    fake.tokens = 0                    # the engine restarted: its slot holds nothing
    await cache.save("alpha", url)     # nothing saved at its next stop
    start(fake, tmp_path)
    await cache.restored("alpha", url)
    assert len(fake.restores) == 1, fake.restores   # that file not tried again
    assert "never restored again" in caplog.text, caplog.text


async def test_nothing_is_restored_without_a_listing_or_against_it(
        engine: tuple[Engine, str], cache: SlotCache, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    fake, url = engine
    fake.die = False
    await cache.save("alpha", url)
    await cache.restored("alpha", url)   # the engine's step listed nothing
    assert fake.restores == [] and "listed none" in caplog.text, caplog.text

    name, = (n for n, _ in cache.saved["alpha"].values())   # still on record
    (fake.where / name).write_bytes(b"s" * 999)   # its last write lost, no save before it
    fake.tokens = 0
    await cache.save("alpha", url)       # the next stop: nothing to save, that one pending
    fake.tokens = 10
    start(fake, tmp_path)
    await cache.restored("alpha", url)
    assert fake.restores == [] and "holds 999 bytes where the engine wrote 1000" in caplog.text
    assert cache.saved["alpha"] == {}   # forgotten

    for _ in range(3):
        await cache.save("alpha", url)
        start(fake, tmp_path)
        await cache.restored("alpha", url)
    assert len(fake.restores) == 3
    assert len(list(fake.where.iterdir())) == 2   # two sides, never more


async def test_a_save_found_cut_short_gives_way_to_the_one_before(
        engine: tuple[Engine, str], cache: SlotCache, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """The engine said 200 and the new file is short (its last write lost): the file of
    the save before, on the other name and whole, is the one restored."""
    fake, url = engine
    fake.die = False
    await cache.save("alpha", url)
    first, _ = cache.saved["alpha"][0]
    await cache.save("alpha", url)
    second, _ = cache.saved["alpha"][0]
    assert second != first
    (fake.where / second).write_bytes(b"s" * 10)
    start(fake, tmp_path)
    await cache.restored("alpha", url)
    assert fake.restores == [first], (fake.restores, caplog.text)
    assert "holds 10 bytes where the engine wrote 1000" in caplog.text
    assert cache.saved["alpha"][0][0] == first
    await cache.save("alpha", url)            # the next save goes over the short one
    assert cache.saved["alpha"][0][0] == second


def test_a_listing_is_bounded_and_a_bad_one_is_none(tmp_path: Path) -> None:
    from lokid.store import slotsizes

    run = tmp_path / "run"
    run.mkdir()
    (run / "alpha.slots").write_text('{"a.bin": 10, "b.bin": "x", "c.bin": true}')
    assert slotsizes.listed(str(run), "alpha") == {"a.bin": 10}
    (run / "alpha.slots").write_text("[1, 2]")
    assert slotsizes.listed(str(run), "alpha") is None
    (run / "alpha.slots").write_bytes(b"{" + b" " * slotsizes.MAX_BYTES + b"}")
    assert slotsizes.listed(str(run), "alpha") is None
    assert slotsizes.listed(str(run), "beta") is None
    where = tmp_path / "slots"
    where.mkdir()
    for i in range(slotsizes.MAX_FILES + 5):
        (where / f"s{i}.bin").write_bytes(b"")
    group = grp.getgrgid(os.getgid()).gr_name if os.geteuid() else "daemon"
    assert publish(str(run), "alpha", str(where), group=group) == slotsizes.MAX_FILES
    st = (run / "alpha.slots").stat()   # the gateway's group's alone (nobody reads it)
    assert st.st_mode & 0o777 == 0o640 and st.st_gid == grp.getgrnam(group).gr_gid
    assert len(slotsizes.listed(str(run), "alpha") or {}) == slotsizes.MAX_FILES
    # a preset removed or renamed leaves no listing behind for a later one of its name
    assert "alpha.slots" in remove_preset_files(str(run), "alpha")
