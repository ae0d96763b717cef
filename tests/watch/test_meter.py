"""lokid.watch.meter: the daemon's per-preset figures, fed recorded real engine lines."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from lokid.watch.meter import BLIND_AFTER, Meters, draft_kind

LOGS = Path(__file__).resolve().parent.parent / "data" / "engine-logs"


def lines(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


def test_draft_kind_names_what_an_acceptance_line_counts_for() -> None:
    assert draft_kind(("draft-mtp",)) == "mtp"
    assert draft_kind(["draft-simple"]) == "draft"
    assert draft_kind(("ngram-mod",)) == "ngram"
    assert draft_kind(("draft-mtp", "ngram-mod")) == "mtp+ngram"
    assert draft_kind(()) == ""


def test_a_recorded_h200_start_is_counted_per_preset(tmp_path: Path) -> None:
    meters = Meters(str(tmp_path))   # no runtime plan here: the draft kind is unknown
    for i, line in enumerate(lines("b11434-cuda-h200-mid_fitt_auto.log")):
        meters.feed("big", "inv-1", line, 1000.0 + i * 0.01)
    for line in lines("b11434-cpu-A_full_mtp.log"):
        meters.feed("small", "inv-2", line, 2000.0)
    assert meters.take_dirty() == {"big", "small"} and meters.take_dirty() == set()
    big = meters.snapshot("big", now=1100.0)
    assert big["invocation"] == "inv-1" and big["started"] == 1000.0
    assert big["uptime_seconds"] == 100.0 and big["requests"] == 1
    # the real partial offload: 4 of 10 layers on the GPU, the rest mapped from RAM
    assert big["offload"] == ["4/10"]
    assert big["memory_mib"]["CPU_Mapped model"] == 3104.42
    assert big["memory_mib"]["CUDA0 model"] == 920.22
    assert big["memory_source"] == "engine log (-lv 4)"
    small = meters.snapshot("small", now=2001.0)
    assert small["requests"] == 1 and small["generated_tokens"] == 64
    assert small["draft"]["accepted"] == 47 and small["draft"]["generated"] == 47
    assert small["memory_source"] is None   # a CPU engine at -lv 3: no buffer lines
    assert meters.snapshot("nothing") == {}


def test_a_new_start_replaces_the_figures_of_the_old_one(tmp_path: Path) -> None:
    meters = Meters(str(tmp_path))
    for line in lines("b11434-cpu-A_full_mtp.log"):
        meters.feed("p", "first", line, 10.0)
    assert meters.snapshot("p", now=11.0)["requests"] == 1
    meters.feed("p", "second", "srv  llama_server: initializing ...", 20.0)
    again = meters.snapshot("p", now=21.0)
    assert again["invocation"] == "second" and again["requests"] == 0


LAUNCH = "slot launch_slot_: id  {} | task {} | processing task, is_child = 0"
RELEASE = "slot      release: id  {} | task {} | stop processing: n_tokens = 122, truncated = 0"


def test_requests_served_and_none_read_flag_the_start_once(tmp_path: Path) -> None:
    meters = Meters(str(tmp_path))
    for i in range(BLIND_AFTER + 2):
        meters.feed("p", "inv", LAUNCH.format(i % 4, i), 1.0)
        meters.feed("p", "inv", f"slot print_timing: id  {i % 4} | task {i} | a format lokid "
                    "never saw", 1.0)
        meters.feed("p", "inv", RELEASE.format(i % 4, i), 1.0)
    assert meters.blind == ["p"]
    # launch lines of a format the parser cannot read (never in flight): ended at once
    other = Meters(str(tmp_path))
    for i in range(BLIND_AFTER):
        other.feed("p", "inv", f"slot launch: slot {i}, task {i}: processing task", 1.0)
    assert other.blind == ["p"]
    # a start whose requests are read is never flagged
    ok = Meters(str(tmp_path))
    for line in lines("b11434-cpu-A_full_mtp.log") * 4:
        ok.feed("q", "inv", line, 1.0)
    assert ok.blind == []


# b11434 with --embeddings (three /v1/embeddings) and with --reranking (one /v1/rerank of
# two documents: a task each), recorded: launch and release lines, no timing line
EMBEDDINGS = [
    "0.04.018.006 I slot launch_slot_: id  3 | task 0 | processing task, is_child = 0",
    "0.04.018.708 I slot      release: id  3 | task 0 | stop processing: n_tokens = 17, "
    "truncated = 0",
    "0.04.027.025 I slot launch_slot_: id  3 | task 2 | processing task, is_child = 0",
    "0.04.027.678 I slot      release: id  3 | task 2 | stop processing: n_tokens = 17, "
    "truncated = 0",
    "0.04.034.415 I slot launch_slot_: id  3 | task 4 | processing task, is_child = 0",
    "0.04.035.096 I slot      release: id  3 | task 4 | stop processing: n_tokens = 17, "
    "truncated = 0",
    "0.04.093.405 I slot launch_slot_: id  3 | task 6 | processing task, is_child = 0",
    "0.04.093.426 I slot launch_slot_: id  2 | task 7 | processing task, is_child = 0",
    "0.04.094.039 I slot      release: id  2 | task 7 | stop processing: n_tokens = 10, "
    "truncated = 0",
    "0.04.094.055 I slot      release: id  3 | task 6 | stop processing: n_tokens = 10, "
    "truncated = 0",
]


def test_embeddings_and_rerank_print_no_timings_and_are_not_blindness(tmp_path: Path) -> None:
    """Five requests that print no timing line are not an unreadable log (issue 48, item
    4: three embeddings logged 'its Stats are blind'); completions whose timing lines
    cannot be read still are, on the same engine."""
    meters = Meters(str(tmp_path))
    for line in EMBEDDINGS:
        meters.feed("e", "inv", line, 1.0)
    start = meters.starts["e"]
    assert start.launched == 5 and start.log.untimed == 5 and start.log.in_flight == set()
    assert meters.blind == []
    for i in range(10, 10 + BLIND_AFTER):
        meters.feed("e", "inv", LAUNCH.format(1, i), 2.0)
        meters.feed("e", "inv", f"slot print_timing: id  1 | task {i} | a format lokid "
                    "never saw", 2.0)
        assert meters.blind == []
        meters.feed("e", "inv", RELEASE.format(1, i), 2.0)
    assert meters.blind == ["e"] and start.log.untimed == 5


def test_a_swap_s_queued_clients_launched_at_once_are_not_blindness(tmp_path: Path) -> None:
    """An engine started by a swap takes its queued clients together, one per slot: four
    launches before the first timing line. They are read at their ends (issue 28, item
    17: 'Stats are blind' logged at 66 to 112 such starts in 3 minutes)."""
    one = [line for line in lines("b11434-cpu-A_full_mtp.log") if "| task 0 |" in line]
    launch, rest = one[0], one[1:]
    assert "processing task" in launch and "release" in rest[-1]
    meters = Meters(str(tmp_path))
    tasks = [(slot, slot + 10) for slot in range(4)]
    for slot, task in tasks:
        meters.feed("p", "inv", launch.replace("id  3 | task 0", f"id  {slot} | task {task}"), 1.0)
    assert meters.blind == []
    for slot, task in tasks:
        for line in rest:
            meters.feed("p", "inv", line.replace("id  3 | task 0", f"id  {slot} | task {task}"),
                        2.0)
    assert meters.blind == []
    assert meters.snapshot("p", now=3.0)["requests"] == 4
    # and an engine stopped with its clients in flight (the swap after): not blind either
    cut = Meters(str(tmp_path))
    for slot, task in tasks:
        cut.feed("p", "inv", launch.replace("id  3 | task 0", f"id  {slot} | task {task}"), 1.0)
    cut.feed("p", "inv", "srv    operator(): operator(): cleaning up before exit...", 2.0)
    assert cut.blind == []


def fifty_requests() -> list[str]:
    """50 whole requests (recorded real lines of one, renumbered as tasks 0-49)."""
    one = [line for line in lines("b11434-cpu-A_full_mtp.log") if "| task 0 |" in line]
    assert len(one) == 7
    return [line.replace("| task 0 |", f"| task {t} |") for t in range(50) for line in one]


# A broken engine's lines (the first once raised in the load parser and lost its batch).
HOSTILE = [
    "load_tensors: offloaded " + "9" * 5000 + "/33 layers to GPU",
    "load_tensors: offloaded 1/" + "9" * 5000 + " layers to GPU",
    "slot print_timing: id  3 | task 7 | prompt eval time = " + "9" * 5000 + ".5 ms / 2 tokens",
    "slot print_timing: id  3 | task 8 |      acc per pos = (" + "9" * 390 + ", 1.000)",
    "CUDA0 model buffer size = " + "9" * 5000 + ".00 MiB",
    "srv    load_model: loading model '" + "x" * 100_000 + "'",
    "E ggml_cuda_error: CUDA error " + "x" * 100_000,
    "slot      release: id  -3 | task -1 | stop processing: n_tokens = -5, truncated = 0",
]


def test_a_hostile_line_costs_no_other_line_of_its_batch(tmp_path: Path) -> None:
    """The daemon's path for one batch of engine lines (the local runner's pipe, or one
    journal entry): the load judge, then telemetry for every line. Hostile lines among 50
    requests: all 50 are counted, the load figures stay those of real lines."""
    from lokid.watch.journalwatch import LoadJudge

    meters = Meters(str(tmp_path))
    logged: list[str] = []
    judge = LoadJudge(str(tmp_path / "state"), str(tmp_path / "run"),
                      log=lambda msg, **kw: logged.append(msg), on_line=meters.feed)
    batch = fifty_requests()
    for i, bad in enumerate(HOSTILE):
        batch.insert(i * 40, bad)
    judge.engine_lines("p", "inv", batch, 1000.0)
    snap = meters.snapshot("p", now=1001.0)
    assert snap["requests"] == 50 and snap["generated_tokens"] == 50 * 64
    assert snap["draft"]["accepted"] == 50 * 47
    assert snap["offload"] is None and snap["memory_mib"] is None   # no real load line
    assert judge.unreadable == 0 and logged == []
    load = judge.invocations["inv"].tracker.before
    assert load.offload() == (0, 0) and load.errors_seen == 1


def test_the_local_runners_batch_keeps_its_requests_without_a_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Where the 50 tracebacks came from: the local runner hands a batch of its child's
    output to the judge; a hostile offload line in it lost every request line."""
    from lokid.runners.local_runner import LocalRunner, _Engine
    from lokid.watch.journalwatch import LoadJudge

    meters = Meters(str(tmp_path))
    judge = LoadJudge(str(tmp_path / "state"), str(tmp_path / "run"),
                      log=lambda msg, **kw: None, on_line=meters.feed)
    runner = LocalRunner(lambda name, state: None, str(tmp_path), str(tmp_path / "state"),
                         str(tmp_path / "run"), judge=judge)
    eng = _Engine("p")
    eng.invocation = "inv"
    batch = [HOSTILE[0], *fifty_requests()]
    with caplog.at_level(logging.DEBUG, logger="lokid.local"):
        runner._lines(eng, [line.encode() for line in batch])
    assert meters.snapshot("p", now=1.0)["requests"] == 50
    assert [r for r in caplog.records if r.name == "lokid.local"] == []


def test_a_parser_defect_on_one_line_costs_that_line_only(tmp_path: Path) -> None:
    """Beyond the bounds: whatever a line makes the load parser raise (a defect of ours,
    simulated by a tracker failing on one line), the batch's other lines still reach the
    load and telemetry; it is counted and logged once."""
    from lokid.core.telemetry.enginelog import LoadTracker
    from lokid.watch.journalwatch import Invocation, LoadJudge

    class Defective(LoadTracker):
        def feed(self, line: str) -> Any:
            if "boom" in line:
                raise ValueError("a defect")
            return super().feed(line)

    meters = Meters(str(tmp_path))
    logged: list[str] = []
    judge = LoadJudge(str(tmp_path / "state"), str(tmp_path / "run"),
                      log=lambda msg, **kw: logged.append(msg), on_line=meters.feed)
    judge.invocations["inv"] = Invocation("p", "inv", Defective())
    batch = fifty_requests()
    batch[3:3] = ["boom"] * 3
    judge.engine_lines("p", "inv", batch, 5.0)
    assert meters.snapshot("p", now=6.0)["requests"] == 50
    assert judge.unreadable == 3 and len(logged) == 1 and "ValueError: a defect" in logged[0]
