"""Usage counted once where a request entered (issue 46, item 2): the three-host fleet of
test_peers.py (each host its own bus, daemon, real engines and gateway). A client asks A
for ``beta``, which only B serves: A counts it under ``beta`` (its client's key,
``peer_requests``, the engine's own figures read from the answer it relayed, whole or
streamed); B, which got it with the hop mark, counts nothing and writes only its audit
record (``LOKID_HOP=1``)."""

from __future__ import annotations

import json
import time

import pytest
from support.gatewaykit import until
from test_peers import Host, all_up, chat, client, fleet  # noqa: F401 (fleet: a fixture)

from lokid.core.serve.keys import legacy_identity
from lokid.gateway.usage import utc_day

pytestmark = [pytest.mark.engine, pytest.mark.slow]


async def test_a_peer_served_request_is_counted_where_it_entered(
        fleet: dict[str, Host]) -> None:  # noqa: F811
    a, b = fleet["a"], fleet["b"]
    assert a.gateway is not None and b.gateway is not None
    await until(lambda: all_up(a), 20, "A's peers read")
    for host in (a, b):
        host.gateway.report.usage = None   # type: ignore[union-attr]  # rows kept to be read
    records: list[dict[str, str]] = []
    b.gateway.usage.audit.send = lambda message, **fields: records.append(fields)
    seen = []
    async with client() as c:
        r = await c.post(a.url + "/v1/chat/completions", json=chat("beta", max_tokens=6))
        assert r.status_code == 200, r.text
        seen.append(r.json()["timings"])
        raw = b""
        async with c.stream("POST", a.url + "/v1/chat/completions",
                            json=chat("beta", stream=True, max_tokens=9)) as s:
            async for chunk in s.aiter_raw():
                raw += chunk
        seen.append([json.loads(line[6:])["timings"] for line in raw.decode().splitlines()
                     if line.startswith("data: {") and '"timings"' in line][-1])
    day = utc_day(time.time())
    row = a.gateway.usage.pending[(day, legacy_identity("client-key-a").name, "beta")]
    assert row["requests"] == 2 and row["peer_requests"] == 2
    assert row["prompt_tokens"] == sum(t["prompt_n"] + t["cache_n"] for t in seen)
    assert row["generated_tokens"] == sum(t["predicted_n"] for t in seen) == 15
    assert not b.gateway.usage.pending   # counted once: at A
    assert len(records) == 2, records
    for record, t in zip(records, seen, strict=True):
        assert record["LOKID_HOP"] == "1" and record["LOKID_PRESET"] == "beta"
        assert record["LOKID_GENERATED_TOKENS"] == str(t["predicted_n"])
