"""lokid.runners.background: a failing task is one log line; close() cancels what runs."""

from __future__ import annotations

import asyncio
import logging

import pytest

from lokid.runners.background import Background


def test_a_failing_task_is_one_line_naming_what_it_did(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        bg = Background(logging.getLogger("t.bg"))

        async def boom() -> None:
            raise BrokenPipeError(32, "Broken pipe")

        bg.spawn(boom(), "reading the state of loki-engine@a.service")
        await asyncio.sleep(0.01)
        assert not bg.tasks  # forgotten once ended

    with caplog.at_level(logging.WARNING, "t.bg"):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records] == [
        "reading the state of loki-engine@a.service failed: BrokenPipeError: "
        "[Errno 32] Broken pipe"]
    assert all(r.exc_info is None for r in caplog.records)


def test_close_cancels_and_awaits_what_still_runs(caplog: pytest.LogCaptureFixture) -> None:
    ended: list[str] = []

    async def main() -> None:
        bg = Background(logging.getLogger("t.bg"))

        async def slow() -> None:
            try:
                await asyncio.sleep(60)
            finally:
                ended.append("slow")

        bg.spawn(slow(), "slow")
        await asyncio.sleep(0)
        await bg.close()
        assert ended == ["slow"]          # ended before close() returned
        late = bg.spawn(slow(), "late")   # after close: not started at all
        assert late is None

    with caplog.at_level(logging.WARNING, "t.bg"):
        asyncio.run(main())
    assert ended == ["slow"] and not caplog.records
