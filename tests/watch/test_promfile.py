"""lokid.watch.promfile: the node_exporter textfile, read back by a strict parser of the
Prometheus text format 0.0.4 (and by the real ``promtool check metrics`` where it is
installed; tests/dbus/test_metrics_systemd.py always runs it, and node_exporter, in the
container)."""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import REPO

from lokid.watch import promfile
from lokid.watch.meter import Meters
from lokid.watch.promfile import FAMILIES, MIB, Record, Textfile, render

LOGS = Path(__file__).resolve().parent.parent / "data" / "engine-logs"

# --- a strict reader of the text format ---------------------------------------------
# https://prometheus.io/docs/instrumenting/exposition_formats/ (text format 0.0.4)

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
VALUE = r"[+-]?(?:Inf|NaN|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)"
SAMPLE = re.compile(rf"({NAME})(?:\{{(.*)\}})? ({VALUE})")
PAIR = re.compile(rf'({LABEL})="((?:[^"\\\n]|\\[\\"n])*)"')
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


@dataclass
class Family:
    name: str
    help: str = ""
    type: str = ""
    samples: dict[tuple[tuple[str, str], ...], float] = field(default_factory=dict)


def unescape(value: str, chars: str) -> str:
    out, it = [], iter(value)
    for c in it:
        if c != "\\":
            out.append(c)
            continue
        nxt = next(it)
        assert nxt in chars, f"bad escape \\{nxt}"
        out.append("\n" if nxt == "n" else nxt)
    return "".join(out)


def parse(text: str) -> dict[str, Family]:
    """The families of ``text``; fails on anything the format does not allow: a line
    that is neither a comment nor a sample, a second HELP or TYPE, a TYPE after the
    family's samples, a family in two places, a repeated series, a bad escape."""
    assert text.endswith("\n"), "the last line must end with a newline"
    families: dict[str, Family] = {}
    current = ""
    for line in text[:-1].split("\n"):
        assert line, "no empty lines"
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                assert re.fullmatch(NAME, name), line
                fam = families.setdefault(name, Family(name))
                assert name == current or not fam.samples, f"{name} split in two: {line}"
                current = name
                if parts[1] == "HELP":
                    assert not fam.help, f"second HELP: {line}"
                    fam.help = unescape(parts[3] if len(parts) > 3 else "", "\\n")
                else:
                    assert not fam.type and not fam.samples, f"late or second TYPE: {line}"
                    assert len(parts) == 4 and parts[3] in TYPES, line
                    fam.type = parts[3]
            continue
        m = SAMPLE.fullmatch(line)
        assert m, f"not a sample: {line!r}"
        name, labels, value = m.groups()
        family = current if families.get(current) is None or families[current].type != \
            "summary" else name.removesuffix("_sum").removesuffix("_count")
        assert family == current, f"{name} outside its family: {line}"
        pairs = []
        rest = labels or ""
        while rest:
            p = PAIR.match(rest)
            assert p, f"bad labels: {line!r}"
            pairs.append((p[1], unescape(p[2], '\\"n')))
            rest = rest[p.end():]
            assert rest == "" or rest.startswith(","), f"bad labels: {line!r}"
            rest = rest[1:]
        assert len({k for k, _ in pairs}) == len(pairs), f"a label twice: {line}"
        # a summary's _sum and _count are two series of its family (__name__ tells them apart)
        key = tuple(sorted(pairs + ([("__name__", name)] if name != family else [])))
        fam = families[family]
        assert key not in fam.samples, f"a series twice: {line}"
        fam.samples[key] = float(value.replace("Inf", "inf"))
    return families


def series(families: dict[str, Family], name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    found = [v for k, v in families[name].samples.items() if set(labels.items()) <= set(k)]
    assert len(found) == 1, (name, labels, families[name].samples)
    return found[0]


# --- records from real recorded engine output ---------------------------------------


def snapshot(log: str, kind: str = "", invocation: str = "inv-1") -> dict[str, Any]:
    meters = Meters("/nonexistent")
    for i, line in enumerate((LOGS / log).read_text().splitlines()):
        meters.feed("p", invocation, line, 1000.0 + i * 0.01)
    stats = meters.snapshot("p", now=1010.0)
    if kind and stats.get("draft"):
        stats["draft"]["kind"] = kind
    return stats


def records() -> list[Record]:
    return [
        Record("big", "glm-3b.gguf", "ready", snapshot("b11434-cuda-h200-mid_fitt_auto.log",
                                                        "mtp"), "", 1,
               memory={"needs": {"GPU0": 674 * MIB, "host": 3200 * MIB},
                       "sources": {"GPU0": "nvml", "host": "estimate"}}),
        Record("drafted", "/srv/models/q.gguf", "ready",
               snapshot("b11434-cuda-h200-draft_auto.log", "draft"), "", 2),
        Record("small", "tiny.gguf", "inactive", snapshot("b11434-cpu-A_full_mtp.log"),
               "the last automatic launch never became healthy", 1, idle_stops=3,
               sight={"cold_starts": 2, "cold_start_waits": 1, "cold_start_wait_seconds": 1.5,
                      "gateway_requests": {"200": 4, "499": 1},
                      "evictions": {"room": 3, "cut": 1}}),
        Record("never", "other.gguf", "inactive"),
    ]


# the manager's Devices on the recorded H200 (143155 MiB, 142629 MiB free before any
# engine) with the engine above at 674 MiB (nvidia-smi)
DEVICES = [{"device": "GPU0", "name": "NVIDIA H200", "total": 143155 * MIB,
            "free": (142629 - 674) * MIB, "reserve": 2048 * MIB, "others": 526 * MIB,
            "lokid": 674 * MIB, "source": "the NVIDIA driver (NVML)"},
           {"device": "host", "total": 24 * 1024 * MIB, "free": 20 * 1024 * MIB, "reserve": 0,
            "others": 800 * MIB, "lokid": 3200 * MIB, "source": "/proc/meminfo"}]


def test_every_family_follows_the_naming_conventions() -> None:
    """https://prometheus.io/docs/practices/naming/ and promtool's lint rules."""
    abbreviations = {"s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m",
                     "h", "d"}
    assert len({name for name, _, _ in FAMILIES}) == len(FAMILIES)
    for name, kind, help_text in FAMILIES:
        assert re.fullmatch(r"lokid_[a-z0-9_]+", name), name
        assert kind in ("counter", "gauge", "summary"), name
        assert name.endswith("_total") == (kind == "counter"), name
        assert not set(name.split("_")) & abbreviations, name
        assert not set(name.split("_")) & {"milliseconds", "mebibytes", "minutes", "counter",
                                           "gauge", "summary", "histogram"}, name
        assert help_text and "\n" not in help_text, name
        if name.endswith("_timestamp_seconds"):
            assert kind == "gauge", name


def test_a_rendered_file_parses_strictly_with_help_and_type_for_every_family() -> None:
    text = render(records(), now=1764547200.25, swaps={"gpu0": 2}, devices=DEVICES,
                  waits=["big"], peers={"gpu2": "", "gpu3": "cannot connect"})
    fams = parse(text)
    declared = {name: (kind, help_text) for name, kind, help_text in FAMILIES}
    assert set(fams) <= set(declared)
    for fam in fams.values():
        assert (fam.type, fam.help) == declared[fam.name], fam.name
        assert fam.samples, fam.name
    # everything the records hold is there
    assert set(fams) == set(declared)
    assert series(fams, "lokid_textfile_timestamp_seconds") == 1764547200.25
    # every engine series carries preset and model (a broken preset's, preset only)
    for fam in fams.values():
        for labels in fam.samples:
            if fam.name not in ("lokid_textfile_timestamp_seconds", "lokid_preset_broken",
                                "lokid_group_swaps_total", "lokid_device_memory_bytes",
                                "lokid_peer_up"):
                assert {"preset", "model"} <= dict(labels).keys(), (fam.name, labels)


def test_memory_waits_and_peers_are_series_of_their_own() -> None:
    fams = parse(render(records(), now=0.0, waits=["big", "gone"],
                        peers={"gpu2": "", "gpu3": "cannot connect (Connection refused)"}))
    assert series(fams, "lokid_memory_waiting", preset="big", model="glm-3b.gguf") == 1
    others = [dict(labels)["preset"] for labels, value in fams["lokid_memory_waiting"].samples
              .items() if value == 0]
    assert others and "big" not in others
    assert series(fams, "lokid_peer_up", peer="gpu2") == 1
    assert series(fams, "lokid_peer_up", peer="gpu3") == 0
    assert "lokid_peer_up" not in parse(render(records(), now=0.0))   # no peers: no series


def test_the_figures_are_the_snapshots_in_base_units() -> None:
    fams = parse(render(records(), now=0.0))
    big = {"preset": "big", "model": "glm-3b.gguf"}
    assert series(fams, "lokid_engine_up", **big) == 1
    assert series(fams, "lokid_requests_total", **big) == 1
    assert series(fams, "lokid_prompt_tokens_total", **big) == 61
    assert series(fams, "lokid_generated_tokens_total", **big) == 64
    assert series(fams, "lokid_requests_in_flight", **big) == 0
    assert series(fams, "lokid_engine_starts_total", **big) == 1
    assert series(fams, "lokid_engine_start_time_seconds", **big) == 1000.0
    assert math.isclose(series(fams, "lokid_engine_load_seconds", **big), 2.49)
    assert math.isclose(series(fams, "lokid_decode_tokens_per_second", **big), 140.8884779641615)
    assert math.isclose(series(fams, "lokid_prefill_tokens_per_second", **big), 147.9003006497915)
    assert series(fams, "lokid_draft_tokens_accepted_total", kind="mtp", **big) == 47
    assert series(fams, "lokid_draft_tokens_generated_total", kind="mtp", **big) == 47
    # the real H200 partial offload: MiB from the load lines, as bytes, by device and buffer
    assert series(fams, "lokid_engine_memory_bytes", device="CUDA0", buffer="model",
                  **big) == round(920.22 * MIB)
    assert series(fams, "lokid_engine_memory_bytes", device="CPU_Mapped", buffer="model",
                  **big) == round(3104.42 * MIB)
    assert series(fams, "lokid_engine_memory_bytes", device="CUDA_Host", buffer="compute",
                  **big) == round(64.03 * MIB)
    assert series(fams, "lokid_engine_offloaded_layers", part="model", **big) == 4
    assert series(fams, "lokid_engine_layers", part="model", **big) == 10
    # a draft model: its own offload line
    drafted = {"preset": "drafted", "model": "/srv/models/q.gguf"}
    assert series(fams, "lokid_engine_offloaded_layers", part="draft", **drafted) == 2
    assert series(fams, "lokid_engine_starts_total", **drafted) == 2
    assert series(fams, "lokid_draft_tokens_accepted_total", kind="draft", **drafted) == 47
    # a CPU engine at the default verbosity: no memory, no offload series
    small = {"preset": "small", "model": "tiny.gguf"}
    assert not [k for k in fams["lokid_engine_memory_bytes"].samples if ("preset", "small") in k]
    assert series(fams, "lokid_engine_up", **small) == 0
    assert series(fams, "lokid_draft_tokens_generated_total", kind="unknown", **small) == 47


def test_the_state_is_one_hot_and_the_verdict_has_its_reason() -> None:
    fams = parse(render(records(), now=0.0))
    states = {dict(k)["state"]: v for k, v in fams["lokid_engine_state"].samples.items()
              if ("preset", "big") in k}
    assert states == {"inactive": 0, "loading": 0, "ready": 1, "failed": 0, "stopping": 0}
    assert series(fams, "lokid_auto_spec_blocked", preset="small",
                  reason="the last automatic launch never became healthy") == 1
    assert series(fams, "lokid_auto_spec_blocked", preset="big", reason="") == 0
    # a state lokid does not know yet still has its series
    odd = parse(render([Record("x", "m", "reloading")], now=0.0))
    assert series(odd, "lokid_engine_state", state="reloading") == 1
    assert sum(odd["lokid_engine_state"].samples.values()) == 1


def test_idle_stops_are_counted_for_a_preset_with_idle_stop_only() -> None:
    fams = parse(render(records(), now=0.0))
    assert series(fams, "lokid_idle_stops_total", preset="small", model="tiny.gguf") == 3
    assert {dict(k)["preset"] for k in fams["lokid_idle_stops_total"].samples} == {"small"}
    zero = parse(render([Record("p", "m", "ready", idle_stops=0)], now=0.0))
    assert series(zero, "lokid_idle_stops_total", preset="p", model="m") == 0


def test_a_preset_that_served_nothing_has_state_but_no_counters() -> None:
    fams = parse(render([Record("never", "other.gguf", "inactive")], now=0.0))
    assert set(fams) == {"lokid_textfile_timestamp_seconds", "lokid_preset_broken",
                         "lokid_engine_up", "lokid_engine_state", "lokid_auto_spec_blocked",
                         "lokid_memory_waiting"}


def test_a_broken_preset_has_a_series_to_alert_on() -> None:
    # "never" parses but cannot start (its object stays: a record); "unparsed" has none
    fams = parse(render(records(), now=0.0, broken=["never", "unparsed"]))
    assert fams["lokid_preset_broken"].type == "gauge"
    assert fams["lokid_preset_broken"].help.startswith("1 when the preset cannot start")
    assert {dict(k)["preset"]: v for k, v in fams["lokid_preset_broken"].samples.items()} == {
        "big": 0, "drafted": 0, "small": 0, "never": 1, "unparsed": 1}
    assert [dict(k) for k in fams["lokid_preset_broken"].samples] == [
        {"preset": n} for n in ("big", "drafted", "never", "small", "unparsed")]
    # a file that does not parse has no engine series of its own
    assert not [k for f in fams.values() for k in f.samples
                if ("preset", "unparsed") in k and f.name != "lokid_preset_broken"]


def test_label_values_are_escaped_and_read_back_unchanged() -> None:
    model = 'C:\\models\\"odd"\nname ü.gguf'
    reason = 'said "no"\\\n'
    fams = parse(render([Record("p", model, "failed", {}, reason)], now=0.0))
    assert series(fams, "lokid_engine_up", preset="p", model=model) == 0
    assert series(fams, "lokid_auto_spec_blocked", model=model, reason=reason) == 1
    text = render([Record("p", model, "failed", {}, reason)], now=0.0)
    assert 'model="C:\\\\models\\\\\\"odd\\"\\nname ü.gguf"' in text


def test_missing_or_odd_figures_are_left_out_never_written_wrong() -> None:
    stats: dict[str, Any] = {"requests": 3, "prompt_tokens": None, "generated_tokens": "7",
                             "prefill_tps": {"1m": None}, "decode_tps": None, "draft": None,
                             "in_flight": True, "load_seconds": None,
                             "memory_mib": {"nospace": 1.0, "CUDA0 KV": None},
                             "offload": ["x/y", "3/4", "1/1"]}
    fams = parse(render([Record("p", "m", "ready", stats, "", None)], now=0.0))
    assert series(fams, "lokid_requests_total", preset="p") == 3
    for absent in ("lokid_prompt_tokens_total", "lokid_generated_tokens_total",
                   "lokid_prefill_tokens_per_second", "lokid_decode_tokens_per_second",
                   "lokid_requests_in_flight", "lokid_engine_memory_bytes",
                   "lokid_engine_starts_total", "lokid_engine_load_seconds"):
        assert absent not in fams, absent
    # offload figures pair with the parts in order: a bad one is skipped, not shifted
    assert list(fams["lokid_engine_layers"].samples.values()) == [4]
    assert series(fams, "lokid_engine_layers", part="draft") == 4


@pytest.mark.parametrize("value,text", [
    (3, "3"), (True, "1"), (0.0, "0"), (2.5, "2.5"), (1e20, "1e+20"), (1.5e-7, "1.5e-07"),
    (math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN"), (964689920.0, "964689920"),
])
def test_values_are_written_as_the_format_reads_them(value: float, text: str) -> None:
    assert promfile.format_value(value) == text
    assert re.fullmatch(VALUE, text)


def test_a_new_start_resets_the_counters_and_counts_one_more_start() -> None:
    """Prometheus reads a counter that goes down as a reset: rate() and increase() stay
    right across a restart of the engine."""
    tf = Textfile("/nonexistent/x.prom")
    first = snapshot("b11434-cpu-A_full_mtp.log", invocation="a")
    assert tf.starts("p", first["invocation"]) == 1
    assert tf.starts("p", first["invocation"]) == 1
    meters = Meters("/nonexistent")
    meters.feed("p", "b", "srv  llama_server: initializing ...", 20.0)
    second = meters.snapshot("p", now=21.0)
    assert tf.starts("p", second["invocation"]) == 2
    assert tf.starts("q", None) is None
    fams = parse(render([Record("p", "m", "loading", second, "", 2)], now=0.0))
    assert series(fams, "lokid_requests_total", preset="p") == 0
    assert series(fams, "lokid_engine_starts_total", preset="p") == 2


def test_a_write_is_due_on_a_change_and_at_least_every_refresh() -> None:
    tf = Textfile("/x/y.prom", refresh=15.0)
    assert tf.due(False, ["a"], 100.0)            # the first time
    assert not tf.due(False, ["a"], 101.0)        # nothing moved
    assert tf.due(True, ["a"], 102.0)             # figures changed
    assert tf.due(False, ["a", "ready"], 103.0)   # a state changed
    assert not tf.due(False, ["a", "ready"], 117.9)
    assert tf.due(False, ["a", "ready"], 118.0)   # the heartbeat


# --- the writer ---------------------------------------------------------------------


@pytest.fixture
def strict_umask() -> Iterator[None]:
    old = os.umask(0o077)   # the daemon runs with UMask=0027: the file must still be 0644
    try:
        yield
    finally:
        os.umask(old)


def test_the_file_is_replaced_whole_world_readable_and_no_temp_file_stays(
        tmp_path: Path, strict_umask: None) -> None:
    path = tmp_path / "lokid.prom"
    tf = Textfile(str(path))
    assert tf.write(render(records(), now=1.0))
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    inode = path.stat().st_ino
    assert tf.write(render(records(), now=2.0))
    assert path.stat().st_ino != inode   # a new file renamed over the old: never half-written
    assert series(parse(path.read_text()), "lokid_textfile_timestamp_seconds") == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lokid.prom"]


def test_no_directory_means_no_file_and_no_error(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    tf = Textfile(str(tmp_path / "node-exporter" / "lokid.prom"))
    with caplog.at_level(logging.INFO):
        assert not tf.write("x\n")
    assert not (tmp_path / "node-exporter").exists() and not caplog.records


def test_a_failing_write_is_one_log_line_and_its_recovery_another(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "lokid.prom"
    path.mkdir()   # a directory where the file should be: the rename fails
    tf = Textfile(str(path))
    with caplog.at_level(logging.INFO, logger="lokid.daemon"):
        assert not tf.write("a 1\n")
        assert not tf.write("a 2\n")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["lokid.prom"]  # no temp left
        path.rmdir()
        assert tf.write("a 3\n")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "cannot write" in messages[0] and str(path) in messages[0]
    assert "written again" in messages[1]


def test_close_removes_the_file_it_wrote_and_stops_writing(tmp_path: Path) -> None:
    path = tmp_path / "lokid.prom"
    tf = Textfile(str(path))
    assert tf.write("a 1\n") and path.exists()
    tf.close()
    assert not path.exists()
    assert not tf.write("a 2\n") and not path.exists()   # a write still on its way
    # a file this daemon never wrote (another's, a leftover) is not removed
    path.write_text("a 1\n")
    Textfile(str(path)).close()
    assert path.exists()


def test_where_says_where_the_metrics_go(tmp_path: Path) -> None:
    assert "writing " + str(tmp_path / "l.prom") in promfile.where(str(tmp_path / "l.prom"))
    missing = promfile.where(str(tmp_path / "no" / "l.prom"))
    assert "does not exist" in missing and str(tmp_path / "no" / "l.prom") in missing
    assert "no textfile" in promfile.where("")


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool (Debian: prometheus) not installed here; the container "
                           "test runs it")
def test_promtool_accepts_the_file_without_a_lint_warning() -> None:
    r = subprocess.run(["promtool", "check", "metrics"],
                       input=render(records(), now=1.0, broken=["never", "unparsed"],
                                    devices=DEVICES),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r


def test_the_on_demand_counters_are_counters_a_summary_and_the_groups_swaps() -> None:
    fams = parse(render(records(), now=1.0, swaps={"gpu0": 2}))
    assert series(fams, "lokid_cold_starts_total", preset="small") == 2
    wait = "lokid_cold_start_wait_seconds"
    assert series(fams, wait, preset="small", **{"__name__": wait + "_sum"}) == 1.5
    assert series(fams, wait, preset="small", **{"__name__": wait + "_count"}) == 1
    assert series(fams, "lokid_gateway_requests_total", preset="small", code="200") == 4
    assert series(fams, "lokid_gateway_requests_total", preset="small", code="499") == 1
    assert series(fams, "lokid_evictions_total", preset="small", reason="room") == 3
    assert series(fams, "lokid_evictions_total", preset="small", reason="cut") == 1
    assert fams["lokid_group_swaps_total"].samples == {(("group", "gpu0"),): 2}
    # a preset the gateway never asked anything of has none of them
    assert not [k for k in fams["lokid_cold_starts_total"].samples if ("preset", "big") in k]
    # no cold start became ready yet: no summary (a _sum of 0 over 0 says nothing)
    bare = Record("lazy", "m.gguf", "loading", sight={"cold_starts": 1})
    fams = parse(render([bare], now=1.0))
    assert series(fams, "lokid_cold_starts_total", preset="lazy") == 1
    assert wait not in fams


def test_each_device_by_kind_and_each_presets_footprint_by_source() -> None:
    """Issue 29's lokid_device_memory_bytes{device,kind} and
    lokid_preset_footprint_bytes{preset,device,source}."""
    fams = parse(render(records(), now=1.0, devices=DEVICES))
    dev = "lokid_device_memory_bytes"
    assert series(fams, dev, device="GPU0", kind="total") == 143155 * MIB
    assert series(fams, dev, device="GPU0", kind="free") == (142629 - 674) * MIB
    assert series(fams, dev, device="GPU0", kind="reserved") == 2048 * MIB
    assert series(fams, dev, device="GPU0", kind="others") == 526 * MIB
    assert series(fams, dev, device="host", kind="lokid") == 3200 * MIB
    assert len(fams[dev].samples) == 10
    need = "lokid_preset_footprint_bytes"
    assert series(fams, need, preset="big", device="GPU0", source="nvml") == 674 * MIB
    assert series(fams, need, preset="big", device="host", source="estimate") == 3200 * MIB
    assert len(fams[need].samples) == 2   # the others have no Memory in these records
    # a device row with a figure missing or not a number leaves that series out
    fams = parse(render([], now=1.0, devices=[{"device": "GPU1", "total": 8, "free": "x"}]))
    assert fams[dev].samples == {(("device", "GPU1"), ("kind", "total")): 8}


def test_the_shipped_alert_rules_use_only_series_lokid_writes() -> None:
    """data/prometheus/lokid.rules.yml (promtool runs it in the container test): every
    lokid_ name its expressions and tests use is a family the daemon writes, with the
    labels it writes (a renamed family would leave an alert that never fires)."""
    import re as re_

    rules = (REPO / "data" / "prometheus" / "lokid.rules.yml").read_text()
    tests = (REPO / "data" / "prometheus" / "lokid.rules.test.yml").read_text()
    declared = {name for name, _, _ in FAMILIES}
    used = set(re_.findall(r"\b(lokid_[a-z_]+)", rules + tests))
    assert used and used <= declared, used - declared
    for name in ("lokid_peer_up", "lokid_memory_waiting", "lokid_preset_broken",
                 "lokid_engine_state", "lokid_engine_starts_total"):
        assert name in rules, name
    # the test series carry the labels render() writes
    text = render(records(), now=0.0, waits=["big"], peers={"gpu2": ""})
    for series_text in re_.findall(r"series: '([a-z_]+)\{([^}]*)\}'", tests):
        name, labels = series_text
        keys = {pair.split("=")[0] for pair in labels.split(",")} - {"instance"}
        written = [line for line in text.splitlines()
                   if line.startswith(name + ("{" if keys else " "))]
        assert written, name
        assert any(keys == set(re_.findall(r'(\w+)="', line)) for line in written), \
            (name, keys, written[:2])


def test_lines_journald_dropped_are_a_series_to_alert_on() -> None:
    """Issue 45, item 9: a start whose lines journald dropped says how many (its
    lokid_requests_total is a lower bound); one read whole says 0."""
    lossy = {"requests": 12695, "missed_lines": 18582, "requests_lower_bound": True}
    fams = parse(render([Record("gamma", "m", "ready", lossy, ""),
                         Record("whole", "m", "ready", {"requests": 3}, "")], now=0.0))
    assert series(fams, "lokid_engine_lines_missed_total", preset="gamma") == 18582
    assert series(fams, "lokid_engine_lines_missed_total", preset="whole") == 0
    assert series(fams, "lokid_requests_total", preset="gamma") == 12695


def test_a_replica_is_an_engine_of_its_own_with_a_replica_label() -> None:
    """Issue 47: the preset's own engine keeps its series as before (no replica label), each
    replica past the first adds replica="k" to its own; the preset is listed once."""
    fams = parse(render([Record("r", "m.gguf", "ready", {"requests": 4, "in_flight": 1}),
                         Record("r", "m.gguf", "loading", {"requests": 2}, replica=2)],
                        now=0.0))
    up = {dict(labels).get("replica", ""): v
          for labels, v in fams["lokid_engine_up"].samples.items()}
    assert up == {"": 1, "2": 0}
    assert series(fams, "lokid_requests_total", preset="r", replica="2") == 2
    assert sum(fams["lokid_requests_total"].samples.values()) == 6   # sum by (preset)
    assert len(fams["lokid_preset_broken"].samples) == 1
    assert len(fams["lokid_memory_waiting"].samples) == 1
