"""The journal's cost per request at ``-lv 4`` is bounded (issue 45, item 9).

The plan adds ``-lv 4`` to an automatic launch on a GPU engine for its load lines
(``offloaded N/M layers to GPU``, the buffer sizes). llama-server b11434 then also
prints its per-request trace lines, two of them per prompt in its prompt cache: 33
lines for the first request, 76 after 20 distinct prompts, and more as the cache fills
(up to ``--cache-ram``, 8 GiB by default). journald drops those lines
(``LogFilterPatterns=~…``, systemd >= 253): the patterns live in lokid.core.telemetry.journalfilter,
and the unit generator writes them into a drop-in of ``loki-engine@.service`` where the
running systemd knows the key (tests/unit/test_generator.py; 252 logs "Unknown key" for
each, tests/unit/test_logfilter_bookworm_systemd.py).

The patterns are read from that drop-in as systemd reads it and run here over what the
real engine prints at ``-lv 4`` with MTP speculation, 50 requests over 20 distinct
prompts: what journald keeps of each request is bounded (what the default verbosity
writes, plus the idle line and ``acc per pos``), and lokid's parsers read the same
requests, loads and in-flight state from the kept lines as from all of them. journald
matches with PCRE2, Python with ``re``: the patterns use only what both read alike
(bracket classes, alternations, counted repeats; no backslash, which a unit file's parser
could take as an escape).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from support import REPO
from support.enginekit import engine_binary, free_port, running
from support.models import write_glm4moe_mtp

from lokid.core.telemetry.enginelog import LoadTracker
from lokid.core.telemetry.journalfilter import FIRST_SYSTEMD, filter_dropin
from lokid.core.telemetry.requestlog import EngineLog

UNIT = REPO / "units" / "loki-engine@.service"
REQUESTS = 50
PROMPTS = 20
# What journald keeps of one request: at the default verbosity 7 lines (launch, 4
# print_timing, release, and the slot selection) and, with speculation, the draft
# acceptance line; at -lv 4 also "acc per pos" and "all slots are idle", both read by
# lokid. 2 more are warnings the engine prints for a prompt it has whole in its cache.
BOUND = 12
# Words on which lokid's parsers (requestlog.EngineLog.feed, enginelog.parse_line) act:
# a line holding one is never dropped.
READ = ("print_timing", "release", "processing task", "all slots are idle", "buffer size",
        "layers to GPU", "n_slots = ", "loading model '", "model loaded",
        "failed to initialize", "ggml_vulkan: ", "constructing llama_context",
        "sched_reserve: reserving", "listening on ", "error", "failed", "out of memory",
        "MTP", "draft acceptance", "acc per pos")


def deny_patterns() -> list[re.Pattern[str]]:
    """The patterns of the generated drop-in (the first systemd that knows the key)."""
    patterns = []
    for raw in filter_dropin(FIRST_SYSTEMD).splitlines():
        key, _, value = raw.partition("=")
        if key.strip() != "LogFilterPatterns":
            continue
        value = value.strip()   # as systemd reads a value: surrounding blanks go
        assert value.startswith("~"), f"an allow pattern drops every other line: {raw}"
        assert not set(value) & set("\\\"'%"), f"escape, quote or specifier: {raw}"
        patterns.append(re.compile(value[1:]))
    return patterns


def kept(line: str, patterns: list[re.Pattern[str]]) -> bool:
    return not any(p.search(line) for p in patterns)


@pytest.fixture(scope="module")
def lv4_lines(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str]]:
    """The real engine at -lv 4 with MTP speculation: its start-up lines, and the lines of
    50 chat requests over 20 distinct prompts, one after the other."""
    d = tmp_path_factory.mktemp("lv4")
    model = write_glm4moe_mtp(d / "glm.gguf")
    port = free_port()
    argv = [engine_binary(), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-c", "4096", "--spec-type", "draft-mtp", "-lv", "4"]
    log = d / "engine.log"
    with running(argv, log) as eng:
        start = len(log.read_bytes())
        with httpx.Client(timeout=120) as client:
            for i in range(REQUESTS):
                r = client.post(eng.url + "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": f"Hello number {i % PROMPTS} " * 5}],
                    "max_tokens": 16, "seed": 1, "temperature": 0})
                assert r.status_code == 200, r.text
                idle_said(log, start, i + 1)
    text = log.read_bytes().decode(errors="replace")
    stop_line = text.find("cleaning up before exit", start)
    body = text[start:stop_line if stop_line >= 0 else len(text)]
    body = body[:body.rfind("\n") + 1]
    return text[:start].splitlines(), body.splitlines()


def idle_said(log: Path, start: int, n: int) -> None:
    """Wait until the engine has said ``all slots are idle`` n times since ``start``: it
    says so after the answer has gone, and the next request's lines must not come first."""
    deadline = time.monotonic() + 30
    while log.read_bytes()[start:].count(b"all slots are idle") < n:
        assert time.monotonic() < deadline, f"request {n}: no 'all slots are idle' line"
        time.sleep(0.01)


def per_request(lines: list[str]) -> list[list[str]]:
    """Lines by request: requests ran one at a time, each ends with the engine's
    ``all slots are idle`` (a -lv 4 line)."""
    requests: list[list[str]] = [[]]
    for line in lines:
        requests[-1].append(line)
        if "all slots are idle" in line:
            requests.append([])
    return [r for r in requests if r]


def test_unit_drops_only_trace_lines() -> None:
    patterns = deny_patterns()
    assert patterns, "the generated drop-in filters none of the engine's trace lines"
    # the static unit carries none: systemd 252 would log "Unknown key" for each
    assert "\nLogFilterPatterns=" not in UNIT.read_text()


def test_journal_lines_per_request_bounded_at_lv4(lv4_lines: tuple[list[str], list[str]]) -> None:
    startup, lines = lv4_lines
    patterns = deny_patterns()
    requests = per_request(lines)
    assert len(requests) == REQUESTS, [len(r) for r in requests]
    raw = [len(r) for r in requests]
    # The engine's own growth, which the filter must absorb: the cache listing.
    assert raw[-1] >= raw[0] + 2 * (PROMPTS - 2), raw
    left = [[line for line in r if kept(line, patterns)] for r in requests]
    counts = [len(r) for r in left]
    assert max(counts) <= BOUND, (counts, left[counts.index(max(counts))])
    # Not growing with the cache: the first 20 requests each add a prompt to it, the
    # next 30 find theirs in it (2 warnings more each, the same for all).
    assert counts[PROMPTS - 1] <= counts[0] and max(counts[PROMPTS:]) <= counts[PROMPTS], counts

    # Nothing lokid reads is dropped: no dropped line holds a word its parsers act on …
    dropped = [line for line in startup + lines if not kept(line, patterns)]
    assert dropped
    for line in dropped:
        assert not any(w in line for w in READ), line
        assert not re.match(r"^([0-9.]+ )?[EW] ", line), line
    # … and the parsers read the same from the kept lines as from all of them.
    def read(source: list[str]) -> tuple[list[tuple[object, ...]], tuple[object, ...]]:
        """The requests lokid counts, and what it knows of the load and of the slots."""
        log, load = EngineLog(), LoadTracker()
        got: list[tuple[object, ...]] = []
        for i, line in enumerate(source):
            load.feed(line)
            r = log.feed(line, float(i))
            if r is not None:
                got.append((r.slot, r.task, r.prompt_tokens, r.gen_tokens, r.draft_accepted,
                            r.draft_generated, r.n_tokens, r.acc_per_pos))
        cur = load.current
        return got, (dict(log.load.buffers), log.in_flight_known, sorted(log.in_flight),
                     cur.offload() if cur else None, cur.on_cpu() if cur else None)
    everything = startup + lines
    requests_all, state_all = read(everything)
    assert len(requests_all) == REQUESTS and state_all[0], state_all
    assert read([line for line in everything if kept(line, patterns)]) == (requests_all,
                                                                           state_all)
