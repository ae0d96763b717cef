"""lokid.watch.journalwatch on real journal files: systemd-journal-remote turns export-format
entries (recorded engine lines, as journald would store them) into a journal that
systemd.journal.Reader reads, exactly as it reads the system journal."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from support import DATA
from support.enginekit import free_port, write_config, write_preset
from support.journalfiles import write_journal
from systemd import journal

from lokid.store.state import StateDB
from lokid.unit.steps import prestart
from lokid.watch.journalwatch import (
    ENGINE_SLICE,
    MESSAGE_AUTO_CUT,
    MESSAGE_FORMAT_UNKNOWN,
    JournalWatcher,
)

LOGS = DATA / "engine-logs"


def engine_entries(preset: str, invocation: str, lines: list[str]) -> list[dict[str, str]]:
    return [{"MESSAGE": line, "_SYSTEMD_UNIT": f"loki-engine@{preset}.service",
             "_SYSTEMD_SLICE": ENGINE_SLICE, "_SYSTEMD_INVOCATION_ID": invocation,
             "SYSLOG_IDENTIFIER": "llama-server", "_TRANSPORT": "stdout"} for line in lines]


def ready_entry(preset: str, invocation: str) -> dict[str, str]:
    return {"MESSAGE": "ready at http://127.0.0.1:8080", "_SYSTEMD_UNIT":
            f"loki-engine@{preset}.service", "_SYSTEMD_SLICE": ENGINE_SLICE,
            "_SYSTEMD_INVOCATION_ID": invocation, "SYSLOG_IDENTIFIER": "lokid",
            "LOKI_PRESET": preset, "_TRANSPORT": "journal"}


class Setup:
    def __init__(self, root: Path, engine: str, models: Any):
        self.root = root
        self.config = write_config(root, engine, [models.dir])
        self.state = str(root / "state")
        self.runtime = str(root / "run")
        self.logged: list[tuple[str, dict[str, Any]]] = []
        write_preset(self.config, "p", f'model = "{models.mtp_full}"\nctx = 2048\n'
                     f'port = {free_port()}\n[spec]\nmode = "auto"\n')

    def start(self, invocation: str) -> Any:
        return prestart(str(self.config), self.state, self.runtime, "p",
                        environ={"INVOCATION_ID": invocation})

    def watcher(self, journal_file: Path) -> JournalWatcher:
        reader = journal.Reader(files=[str(journal_file)])
        return JournalWatcher(reader, self.state, self.runtime,
                              log=lambda msg, **kw: self.logged.append((msg, kw)))

    def load(self, invocation: str, lines: list[str]) -> JournalWatcher:
        """A watcher on a journal holding one start's engine lines, then its "ready at"."""
        entries = engine_entries("p", invocation, lines) + [ready_entry("p", invocation)]
        return self.watcher(write_journal(self.root / "j.journal", entries))


@pytest.fixture
def setup(tmp_path: Path, engine: str, models: Any) -> Setup:
    return Setup(tmp_path, engine, models)


def fit_log() -> list[str]:
    return (LOGS / "vulkan-lavapipe-fit-target-lv4.log").read_text().splitlines()


def test_layers_pushed_to_ram_on_an_auto_launch_cut_auto_next_time(setup: Setup) -> None:
    plan = setup.start("inv1")
    assert plan.spec.auto
    with StateDB(setup.state) as db:  # the engine answered: the supervisor cleared it
        db.clear("p", db_mark(setup))
    w = setup.load("inv1", fit_log())
    assert w.drain() > 100
    assert [v.reason for v in w.verdicts] == [
        "only 0/3 layers on GPU with the draft: --fit moved layers to RAM"]
    msg, fields = setup.logged[-1]
    assert fields["MESSAGE_ID"] == MESSAGE_AUTO_CUT and fields["LOKI_PRESET"] == "p"
    assert "cut for the next start" in msg
    nxt = setup.start("inv2")
    assert not nxt.spec.auto
    assert any("only 0/3 layers on GPU" in n for n in nxt.notes)


def db_mark(setup: Setup) -> Any:
    from lokid.store.runtimedir import read_runtime_plan

    return read_runtime_plan(setup.runtime, "p").mark


def test_an_offload_line_landing_after_ready_is_still_judged_once(setup: Setup) -> None:
    setup.start("inv1")
    lines = fit_log()
    at = next(i for i, line in enumerate(lines) if "offloaded 0/3" in line)
    late = lines[at]
    entries = (engine_entries("p", "inv1", lines[:at] + lines[at + 1:])
               + [ready_entry("p", "inv1")] + engine_entries("p", "inv1", [late, late]))
    w = setup.watcher(write_journal(setup.root / "j.journal", entries))
    w.drain()
    assert [v.reason for v in w.verdicts] == [
        "only 0/3 layers on GPU with the draft: --fit moved layers to RAM"]


def test_a_fully_offloaded_launch_keeps_auto(setup: Setup) -> None:
    setup.start("inv1")
    lines = [line.replace("offloaded 0/3", "offloaded 3/3") for line in fit_log()]
    w = setup.load("inv1", lines)
    w.drain()
    assert w.verdicts == [] and setup.logged == []


def test_a_verdict_needs_the_plan_of_that_very_start(setup: Setup) -> None:
    setup.start("inv-current")
    w = setup.load("inv-old", fit_log())
    w.drain()
    assert w.verdicts == []


def test_forced_speculation_is_never_cut(setup: Setup, models: Any) -> None:
    write_preset(setup.config, "p", f'model = "{models.mtp_full}"\nctx = 2048\n'
                 f'port = {free_port()}\n[spec]\nmode = "mtp"\n')
    setup.start("inv1")
    w = setup.load("inv1", fit_log())
    w.drain()
    assert w.verdicts == []


def test_a_load_with_no_known_line_warns_that_the_format_changed(setup: Setup) -> None:
    setup.start("inv1")
    lines = ["starting something", "weights: 3 of 3 on accelerator", "serving"]
    w = setup.load("inv1", lines)
    w.drain()
    assert [kw["MESSAGE_ID"] for _, kw in setup.logged] == [MESSAGE_FORMAT_UNKNOWN]


def test_other_units_are_ignored(setup: Setup) -> None:
    setup.start("inv1")
    other = [{**e, "_SYSTEMD_UNIT": "nginx.service", "_SYSTEMD_SLICE": "system.slice"}
             for e in engine_entries("p", "inv1", fit_log())]
    path = write_journal(setup.root / "j.journal", other)
    w = setup.watcher(path)
    assert w.drain() == 0


def test_attach_follows_the_journal_fd_from_asyncio(setup: Setup) -> None:
    setup.start("inv1")
    w = setup.load("inv1", fit_log())

    async def main() -> None:
        loop = asyncio.get_running_loop()
        w.attach(loop)
        try:
            deadline = time.monotonic() + 5
            while not w.verdicts and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            w.detach(loop)

    asyncio.run(main())
    assert len(w.verdicts) == 1


def test_a_replay_reads_the_load_then_the_last_minutes_of_one_start(tmp_path: Path) -> None:
    """After a restart of the daemon: one start's lines read again from the journal, its
    first entries (the load) and those of the window before `until`; not another start's,
    not lokid's own, not what comes after `until` (the watcher's)."""
    from lokid.watch.journalwatch import invocation_lines

    def at(seconds: float) -> dict[str, str]:
        return {"__REALTIME_TIMESTAMP": str(int(seconds * 1e6))}

    entries = [{**e, **at(1000 + i)} for i, e in
               enumerate(engine_entries("p", "inv-a", [f"load line {i}" for i in range(8)]))]
    entries += [{**e, **at(2000 + i)} for i, e in
                enumerate(engine_entries("p", "inv-a", [f"middle {i}" for i in range(4)]))]
    entries += [{**e, **at(4900 + i)} for i, e in
                enumerate(engine_entries("p", "inv-a", [f"recent {i}" for i in range(3)]))]
    entries += [{**ready_entry("p", "inv-a"), **at(4950)}]
    entries += [{**e, **at(4960)} for e in engine_entries("q", "inv-b", ["another start"])]
    entries += [{**e, **at(5200)} for e in engine_entries("p", "inv-a", ["after until"])]
    journal_file = write_journal(tmp_path / "j.journal", entries)

    reader = journal.Reader(files=[str(journal_file)])
    lines, resumed = invocation_lines(reader, "inv-a", until=5100, head=5, window=300)
    assert [line for line, _ in lines] == [f"load line {i}" for i in range(5)] + \
        [f"recent {i}" for i in range(3)]
    assert lines[0][1] == 1000 and lines[-1][1] == 4902 and resumed == 4800

    whole, none = invocation_lines(journal.Reader(files=[str(journal_file)]), "inv-a",
                                   until=5100, head=100, window=300)
    assert len(whole) == 15 and none is None   # nothing left out: no gap said
