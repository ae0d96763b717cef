"""lokid.runners.pipelines: a real pipe read in batches of lines by the event loop."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from lokid.runners.pipelines import PipeLines


async def read_all(writer: list[str], limit: int = 1 << 20, coalesce: float = 0.02
                   ) -> list[list[bytes]]:
    """Run ``sh -c`` writing to a pipe; the batches PipeLines gave until EOF."""
    r, w = os.pipe2(os.O_CLOEXEC)
    batches: list[list[bytes]] = []
    proc = subprocess.Popen(["sh", "-c", *writer], stdout=w, stderr=w)
    os.close(w)
    reader = PipeLines(r, batches.append, limit, coalesce)
    await asyncio.wait_for(reader.done, 30)
    assert proc.wait(10) == 0
    return batches


async def test_a_burst_is_read_at_most_twice_and_a_pause_starts_another() -> None:
    batches = await read_all(["for i in 1 2 3 4 5 6 7; do echo line $i; done; sleep 0.3; "
                              "echo after; printf 'no newline at the end'"])
    lines = [line for batch in batches for line in batch]
    assert lines == [f"line {i}".encode() for i in range(1, 8)] + [b"after",
                                                                b"no newline at the end"]
    # seven writes: what was there at once, then the rest of the burst together
    first = [b for b in batches if b"line 7" in b or b"line 1" in b]
    assert 1 <= len(first) <= 2 and sum(len(b) for b in first) == 7
    assert len(batches) <= 5


async def test_a_line_after_a_quiet_spell_is_read_at_once() -> None:
    """A request's end is one line after seconds of quiet: read when it comes, not a
    burst's wait later (a GPU group's swap waits for it)."""
    r, w = os.pipe2(os.O_CLOEXEC)
    got: list[list[bytes]] = []
    reader = PipeLines(r, got.append, 1 << 20, coalesce=30)
    try:
        os.write(w, b"released\n")
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.01)
        assert got == [[b"released"]]
        os.write(w, b"within the wait\n")   # a read was just made: this one waits
        await asyncio.sleep(0.2)
        assert got == [[b"released"]]
    finally:
        os.close(w)
        reader.close()


async def test_a_line_over_the_limit_is_dropped_whole_and_reading_goes_on() -> None:
    batches = await read_all(["echo first; head -c 300000 /dev/zero | tr '\\0' x; "
                              "echo; echo last"], limit=100_000)
    lines = [line for batch in batches for line in batch]
    assert lines == [b"first", b"last"]


async def test_a_burst_larger_than_the_pipe_comes_whole_in_order() -> None:
    batches = await read_all(["seq 1 200000"])
    lines = [line for batch in batches for line in batch]
    assert lines == [str(i).encode() for i in range(1, 200_001)]


async def test_close_stops_reading_and_is_idempotent() -> None:
    r, w = os.pipe2(os.O_CLOEXEC)
    got: list[list[bytes]] = []
    reader = PipeLines(r, got.append, 1 << 20)
    os.write(w, b"one\n")
    await asyncio.sleep(0.1)
    reader.close()
    reader.close()
    assert reader.done.done() and got == [[b"one"]]
    try:
        with pytest.raises(BrokenPipeError):  # the read end is closed: nobody reads
            os.write(w, b"two\n")
    finally:
        os.close(w)
    await asyncio.sleep(0.1)
    assert got == [[b"one"]]


async def test_read_now_ends_the_output_at_the_writers_exit_without_the_bursts_wait() -> None:
    """The local runner calls read_now once its child exited: the end of a stop is its
    exit, not the next batch (a burst's wait of 30 s here would hold it that long)."""
    r, w = os.pipe2(os.O_CLOEXEC)
    got: list[list[bytes]] = []
    reader = PipeLines(r, got.append, 1 << 20, coalesce=30)
    os.write(w, b"first\n")   # read at once: what follows waits up to 30 s
    for _ in range(100):
        if got:
            break
        await asyncio.sleep(0.01)
    proc = await asyncio.create_subprocess_exec("sh", "-c", "echo last words; printf bye",
                                                stdout=w, stderr=w)
    os.close(w)
    assert await asyncio.wait_for(proc.wait(), 10) == 0
    await asyncio.sleep(0.05)   # the reader saw it readable: its wait began
    assert not reader.done.done() and got == [[b"first"]]
    reader.read_now()
    await asyncio.wait_for(reader.done, 5)
    assert got == [[b"first"], [b"last words"], [b"bye"]]
    reader.read_now()   # once closed: nothing
