"""Engine lines that journald dropped (issue 45, item 9): said, counted, never idleness.

The engine is the real llama-server (2 slots, the tiny model); its lines, as it printed
them, go into a real journal file (systemd-journal-remote) as journald stores a unit's
stdout, with the lines of two requests left out and journald's own entry in their place,
as journald writes it when a unit's rate limit ends (``journald-server.c``: MESSAGE_ID
SD_MESSAGE_JOURNAL_DROPPED, ``N_DROPPED``, ``OBJECT_SYSTEMD_UNIT``/``_INVOCATION_ID``,
``_TRANSPORT=driver``, under systemd-journald's own unit). Before this item the watcher
never read that entry: the Stats counted the requests it saw as all of them, and an
engine whose launch lines were lost looked idle.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, running
from support.journalfiles import write_journal
from systemd import journal

from lokid.core.names import ENGINE_SLICE, MESSAGE_LINES_LOST
from lokid.core.telemetry.journalgap import JOURNAL_DROPPED, dropped
from lokid.dbus.idle import IdleStops
from lokid.runners.runner import READY, EngineState
from lokid.watch.journalwatch import JournalWatcher
from lokid.watch.meter import Meters

INV = "0123456789abcdef0123456789abcdef"
UNIT = "loki-engine@p.service"


def ask(url: str, i: int, slot: int = -1) -> None:
    r = httpx.post(url + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": f"hello {i}"}],
                         "max_tokens": 8, "id_slot": slot})
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def printed(tmp_path_factory: pytest.TempPathFactory, engine: str, models: Any
            ) -> dict[str, list[str]]:
    """The real engine's lines: its load, 3 requests, 2 requests (to be lost), then 2
    requests, one on each slot."""
    root = tmp_path_factory.mktemp("gap")
    port = free_port()
    log = root / "engine.log"
    argv = [engine, "-m", models.llama, "--host", "127.0.0.1", "--port", str(port),
            "-c", "1024", "-np", "2", "-t", "1"]
    out: dict[str, list[str]] = {}
    with running(argv, log) as eng:
        def mark(name: str) -> None:
            time.sleep(0.3)   # the engine's last lines of the step written
            out[name] = log.read_text(errors="replace").splitlines()
        mark("load")
        for i in range(3):
            ask(eng.url, i)
        mark("kept")
        for i in range(3, 5):
            ask(eng.url, i)
        mark("lost")
        for slot in (0, 1):   # one request on each slot (the request names it)
            ask(eng.url, 5 + slot, slot)
        mark("both")
    return {"load": out["load"], "kept": out["kept"][len(out["load"]):],
            "lost": out["lost"][len(out["kept"]):], "both": out["both"][len(out["lost"]):]}


def engine_entries(lines: list[str]) -> list[dict[str, str]]:
    return [{"MESSAGE": line, "_SYSTEMD_UNIT": UNIT, "_SYSTEMD_SLICE": ENGINE_SLICE,
             "_SYSTEMD_INVOCATION_ID": INV, "SYSLOG_IDENTIFIER": "llama-server",
             "_TRANSPORT": "stdout"} for line in lines]


def suppressed(count: int, **fields: str) -> dict[str, str]:
    """journald's entry about a unit whose lines it dropped, as journald writes it."""
    return {"MESSAGE": f"Suppressed {count} messages from {UNIT}",
            "MESSAGE_ID": JOURNAL_DROPPED, "N_DROPPED": str(count), "PRIORITY": "6",
            "_TRANSPORT": "driver", "SYSLOG_IDENTIFIER": "systemd-journald",
            "_SYSTEMD_UNIT": "systemd-journald.service", "_SYSTEMD_SLICE": "system.slice",
            "OBJECT_SYSTEMD_UNIT": UNIT, "OBJECT_SYSTEMD_INVOCATION_ID": INV, **fields}


def host(tmp_path: Path) -> Any:
    view = SimpleNamespace(serve=SimpleNamespace(idle_stop=1.0))
    return SimpleNamespace(runtime_dir=str(tmp_path / "run"), exported={},
                           registry=SimpleNamespace(presets={"p": view}),
                           engine_state=lambda name: EngineState(READY))


def test_lost_lines_are_said_counted_as_a_lower_bound_and_never_taken_for_idleness(
        tmp_path: Path, printed: dict[str, list[str]]) -> None:
    requests = sum(1 for line in printed["lost"] if "stop processing" in line)
    assert requests == 2 and any("n_slots = 2" in line for line in printed["load"])
    lost = len(printed["lost"])
    entries = (engine_entries(printed["load"] + printed["kept"]) + [suppressed(lost)]
               + engine_entries(printed["both"]))
    path = write_journal(tmp_path / "j.journal", entries, step_us=1000)
    meters = Meters(str(tmp_path / "run"))
    logged: list[tuple[str, dict[str, Any]]] = []
    watcher = JournalWatcher(journal.Reader(files=[str(path)]), str(tmp_path / "state"),
                             str(tmp_path / "run"), on_line=meters.feed, on_gap=meters.gap,
                             log=lambda msg, **kw: logged.append((msg, kw)))
    idle = IdleStops(host(tmp_path), meters)
    idle.on_state("p", EngineState(READY))
    later = time.time() + 3600   # long past any idle deadline
    deadlines = []
    for entry in watcher.reader:   # the entries one by one: the state at the gap matters
        watcher.handle(entry)
        if dropped(entry) is not None:
            snap = meters.snapshot("p")
            # what was read: 3 requests, none in flight; but 2 more ran unseen
            assert snap["requests"] == 3 and snap["missed_lines"] == lost
            assert snap["requests_lower_bound"] is True and snap["in_flight_known"] is False
            deadlines.append(idle.deadline("p"))
    assert deadlines == [None]   # no idle stop while requests in flight are unknown
    said = [(m, kw) for m, kw in logged if kw.get("MESSAGE_ID") == MESSAGE_LINES_LOST]
    assert len(said) == 1 and said[0][1]["LOKI_LINES_LOST"] == str(lost)
    assert "lower bound" in said[0][0] and "preset p" in said[0][0]
    # Both slots said what they do again (a request on each): the count is known, the
    # idle clock runs again; the totals stay a lower bound for this start.
    snap = meters.snapshot("p")
    assert snap["requests"] == 5 and snap["requests_lower_bound"] is True
    assert "in_flight_known" not in snap and snap["in_flight"] == 0
    at = idle.deadline("p")
    assert at is not None and at < later


def test_only_journald_may_say_lines_were_dropped(tmp_path: Path,
                                                   printed: dict[str, list[str]]) -> None:
    """The same entry from any other transport (a process writing the fields itself) is
    nobody's word: counted as nothing, and the engine's own lines go on as lines."""
    forged = suppressed(999, _TRANSPORT="journal", _SYSTEMD_UNIT=UNIT,
                        _SYSTEMD_SLICE=ENGINE_SLICE, _SYSTEMD_INVOCATION_ID=INV)
    entries = engine_entries(printed["load"]) + [forged] + engine_entries(printed["kept"])
    path = write_journal(tmp_path / "j.journal", entries, step_us=1000)
    meters = Meters(str(tmp_path / "run"))
    watcher = JournalWatcher(journal.Reader(files=[str(path)]), str(tmp_path / "state"),
                             str(tmp_path / "run"), on_line=meters.feed, on_gap=meters.gap,
                             log=lambda msg, **kw: None)
    watcher.drain()
    snap = meters.snapshot("p")
    assert snap["requests"] == 3 and "missed_lines" not in snap
    assert "requests_lower_bound" not in snap


@pytest.mark.parametrize("fields, expected", [
    # the fields journald writes
    ({}, ("p", INV, 7)),
    # no invocation field (an older journald): the preset's current start
    ({"OBJECT_SYSTEMD_INVOCATION_ID": ""}, ("p", "", 7)),
    # no N_DROPPED: the message's own count
    ({"N_DROPPED": ""}, ("p", INV, 7)),
    # a count past any real one is bounded, garbage is "some"
    ({"N_DROPPED": "9" * 40, "MESSAGE": "Suppressed lots"}, ("p", INV, 1)),
    # another unit's lines: not an engine's
    ({"OBJECT_SYSTEMD_UNIT": "cron.service", "MESSAGE": "Suppressed 7 messages from "
      "cron.service"}, None),
])
def test_journalds_entry_read_field_by_field(fields: dict[str, str], expected: Any) -> None:
    entry: dict[str, Any] = {**suppressed(7), **fields}
    assert dropped(entry) == expected


def test_a_gap_without_the_slot_count_stays_unknown_until_the_engine_says_idle() -> None:
    """The rule, on recorded lines (the engine's, above): with no ``n_slots`` line read
    (lost with the rest), no number of slots seen again makes the count known; the
    engine's own "all slots are idle" does, and so does its stop."""
    from lokid.core.telemetry.requestlog import EngineLog

    log = EngineLog()
    log.gap()
    for slot in range(8):
        log.feed(f"0.01.436.745 I slot launch_slot_: id  {slot} | task {slot} | processing "
                 "task, is_child = 0", 1.0)
        log.feed(f"0.01.438.299 I slot      release: id  {slot} | task {slot} | stop "
                 "processing: n_tokens = 42, truncated = 0", 1.0)
    assert not log.in_flight_known and not log.in_flight
    log.feed("0.07.773.095 I srv  update_slots: all slots are idle", 2.0)
    assert log.in_flight_known
    log.gap()
    log.flush(3.0)
    assert log.in_flight_known


def test_a_loss_said_while_a_replay_ran_survives_its_adoption(tmp_path: Path) -> None:
    """After a restart of the daemon the replayed figures replace the live ones
    (Meters.adopt); journald's word that arrived meanwhile is not forgotten with them."""
    live, replayed = Meters(str(tmp_path)), Meters(str(tmp_path))
    replayed.feed("p", INV, "0.00.014.295 I srv    load_model: initializing, n_slots = 1, "
                  "n_ctx_slot = 512", 1.0)
    live.gap("p", INV, 40, 2.0)
    assert live.adopt("p", replayed, None)
    snap = live.snapshot("p", now=3.0)
    assert snap["missed_lines"] == 40 and snap["in_flight_known"] is False
