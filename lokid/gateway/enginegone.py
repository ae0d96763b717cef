"""Whether an engine whose connection closed before its answer's head is gone (issue 47):
what lets a request to one of several replicas go to another after its bytes were sent.

Only a connect that failed used to count as "nothing reached it" (the relay's
:class:`~lokid.gateway.relay.Unreached`). A replica killed (``systemctl kill``, the OOM
killer) is seen first on its streams' connections, and its listening socket is closed a
moment later: measured here, a request sent in that moment was taken into the socket's
queue, never read, and reset (``ECONNRESET`` before any byte of an answer), and its client
got 502 though another replica was ready (tests/gateway/test_replicas_gateway.py, 4 runs
in 7 under load). An engine alive that closed a connection (a request that made it
crash is the case that matters: sent to every replica in turn, it would take them all
down) must not have its request sent elsewhere on that ground alone.

So the engine is asked once more, on a connection of its own: refused, or taken and then
reset or closed unread within :data:`PROBE` seconds, it is gone; held open (an HTTP
server waiting for a request), it lives. The gateway sends such a request elsewhere at
most once (:mod:`lokid.gateway.server`): a request that kills engines kills two at most.
"""

from __future__ import annotations

import asyncio
import contextlib

PROBE = 0.5   # s: a connect, then a read that a live engine leaves waiting


async def engine_gone(host: str | None, port: int | None, path: str = "") -> bool:
    """Whether the engine at ``host``:``port`` (or its UNIX socket ``path``) is gone."""
    try:
        if path:
            connect = asyncio.open_unix_connection(path)
        elif host and port:
            connect = asyncio.open_connection(host, port)
        else:
            return False
        reader, writer = await asyncio.wait_for(connect, PROBE)
    except TimeoutError:
        return False   # slow to take it: not known gone
    except OSError:
        return True    # refused: nothing listens there any more
    try:
        return await asyncio.wait_for(reader.read(1), PROBE) == b""   # closed unread
    except TimeoutError:
        return False   # held open: it lives
    except OSError:
        return True    # reset from the queue of a socket being closed
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
