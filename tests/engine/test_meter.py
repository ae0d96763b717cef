"""lokid.engine.meter: the daemon's per-preset figures, fed recorded real engine lines."""

from __future__ import annotations

from pathlib import Path

from lokid.engine.meter import BLIND_AFTER, Meters, draft_kind

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


def test_requests_served_and_none_read_flag_the_start_once(tmp_path: Path) -> None:
    meters = Meters(str(tmp_path))
    launch = "slot launch_slot_: id  {} | task {} | processing task, is_child = 0"
    for i in range(BLIND_AFTER + 2):
        meters.feed("p", "inv", launch.format(i % 4, i), 1.0)
        meters.feed("p", "inv", "slot print_timing: id  0 | task 0 | a format lokid never saw", 1.0)
    assert meters.blind == ["p"]
    # a start whose requests are read is never flagged
    ok = Meters(str(tmp_path))
    for line in lines("b11434-cpu-A_full_mtp.log") * 4:
        ok.feed("q", "inv", line, 1.0)
    assert ok.blind == []
