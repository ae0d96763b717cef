"""The audit record (issue 46, item 2) written to a real journal: a keyed gateway (the flat
api_keys_file's key: identity ``keys-file:<8 hex>``) in front of the real engine, its
records sent with systemd-python's ``journal.send`` (what the gateway uses when its
stderr is the journal) to a real systemd-journald (tests/support/journald.py), read back
with ``journalctl LOKID_KEY=…``: one entry per request with the fields, the engine's own
counts, and never the key or the prompt's text."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import journald
from support.daemonkit import Running
from support.enginekit import write_config, write_preset
from support.gatewaykit import gateway_on
from test_usage import start

from lokid.core.serve.keys import legacy_identity
from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SECRET = "sk-u1-audit-0123456789abcdefghijklmnop"
PROMPT = "the password is tangerine-u1-9431"


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int]) -> Path:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", f'model = "llama.gguf"\nport = {ports["alpha"]}\n')
    return config


@pytest.fixture
def journal() -> Iterator[journald.Journald]:
    why = journald.unavailable()
    if why:
        pytest.skip(why)
    with journald.private_journald() as j:
        yield j


async def test_audit_entries_in_the_journal(running: Running, bus_address: str,
                                            journal: journald.Journald) -> None:
    from systemd import journal as systemd_journal

    async with gateway_on(bus_address, keys=frozenset({SECRET})) as gw:
        gateway: Gateway = gw
        gateway.usage.audit.send = systemd_journal.send   # as journal_sender() gives it
        await start(running, gateway, "alpha")
        auth = {"Authorization": f"Bearer {SECRET}"}
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:  # type: ignore[attr-defined]
            r = await c.post("/v1/chat/completions", headers=auth, json={
                "model": "alpha", "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 9})
            assert r.status_code == 200, r.text
            whole = r.json()["timings"]
            raw = b""
            async with c.stream("POST", "/v1/chat/completions", headers={"x-api-key": SECRET},
                                json={"model": "alpha", "stream": True, "max_tokens": 7,
                                      "messages": [{"role": "user", "content": PROMPT}]}) as s:
                async for chunk in s.aiter_raw():
                    raw += chunk
            streamed = [json.loads(line[6:])["timings"] for line in raw.decode().splitlines()
                        if line.startswith("data: {") and '"timings"' in line][-1]
            # a wrong key: refused before it is anyone, no record
            r = await c.post("/v1/chat/completions", headers={"Authorization": "Bearer nope"},
                             json={"model": "alpha", "messages": []})
            assert r.status_code == 401
        # counted under key "-", as the daemon keeps it (no record in the journal)
        from dbus_fast import Variant

        from lokid.core.names import BUS_NAME, OBJECT_PATH

        usage = await running.iface(OBJECT_PATH, BUS_NAME + ".Usage")

        async def refused() -> int:
            rows = await usage.call_usage({"key": Variant("s", "-")})
            return sum(r["refused_401"].value for r in rows if "refused_401" in r)

        deadline = time.monotonic() + 15
        while await refused() != 1:
            assert time.monotonic() < deadline, "the 401 not counted at the daemon in 15 s"
            await asyncio.sleep(0.2)
    name = legacy_identity(SECRET).name
    got = journald.entries(journal.directory, f"LOKID_KEY={name}")
    assert len(got) == 2, got
    for entry, t in zip(got, (whole, streamed), strict=True):
        assert entry["LOKID_PRESET"] == "alpha"
        assert entry["LOKID_ROUTE"] == "/v1/chat/completions"
        assert entry["LOKID_STATUS"] == "200" and entry["LOKID_WHERE"] == "local"
        assert entry["LOKID_HOP"] == "0" and entry["SYSLOG_IDENTIFIER"] == "lokid-gateway"
        assert int(entry["LOKID_PROMPT_TOKENS"]) == t["prompt_n"] + t["cache_n"]
        assert int(entry["LOKID_CACHED_TOKENS"]) == t["cache_n"]
        assert int(entry["LOKID_GENERATED_TOKENS"]) == t["predicted_n"]
        for field in ("LOKID_WAIT_MS", "LOKID_TTFB_MS", "LOKID_DURATION_MS"):
            assert int(entry[field]) >= 0, (field, entry)
        assert int(entry["LOKID_TTFB_MS"]) <= int(entry["LOKID_DURATION_MS"])
        assert name in entry["MESSAGE"]
    # never the key, never the prompt: anywhere in the journal
    everything = json.dumps(journald.entries(journal.directory))
    assert SECRET not in everything and "tangerine" not in everything
    assert "nope" not in everything


def test_records_journald_does_not_take_are_lost_and_said_once(
        journal: journald.Journald, caplog: pytest.LogCaptureFixture) -> None:
    """journald gone (its socket still there: connection refused): systemd-python's real
    journal.send raises; the record is lost, said once, never raised to the request's
    path; once journald takes records again, the next failure is said again."""
    from systemd import journal as systemd_journal

    from lokid.gateway.audit import Audit, Record
    from lokid.gateway.figures import UNKNOWN

    audit = Audit(systemd_journal.send)
    record = Record("alice", "alpha", "/v1/chat/completions", 200, UNKNOWN, 0.0, 1.0, 2.0,
                    "local", False)
    audit.write(record)
    assert not audit.failed
    journal.proc.kill()
    journal.proc.wait(10)
    for _ in range(3):
        audit.write(record)
    said = [r for r in caplog.records if "could not be written to the journal" in r.getMessage()]
    assert len(said) == 1 and audit.failed
