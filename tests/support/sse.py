"""A streamed answer's ``data:`` payloads, read as SSE means them: lines cut at ``\\n``.

httpx's ``aiter_lines()`` cuts at every line break Python knows (U+2028, U+0085, …, as
``str.splitlines``). The tests' random models generate any text, and the engine writes it
in its JSON unescaped: a U+2028 in a token cut an event in two, and its ``json.loads``
failed one run in many (seen in tests/gateway/test_shutdown.py and test_reload.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any


async def data_lines(response: Any) -> AsyncIterator[str]:
    """Each ``data: `` payload of ``response`` (an httpx streamed response), in order."""
    rest = b""
    async for chunk in response.aiter_bytes():
        *lines, rest = (rest + chunk).split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if line.startswith(b"data: "):
                yield line[len(b"data: "):].decode()
