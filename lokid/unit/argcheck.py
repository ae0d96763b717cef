"""Whether an engine that failed to start refused its own command line.

llama-server parses its whole command line (and its ``LLAMA_ARG_*``
variables) before it loads anything, and an argument it cannot parse ends it
at once with status 1 and one line on stderr, such as
``error: invalid argument: --no-such-flag`` (b11434: ``common_params_parse``,
``common/arg.cpp``). A crash or an out-of-memory while loading exits 1 as well,
so the status cannot tell them apart, and the engine's stderr goes straight to
the journal, not through lokid. So when an engine exits on its own before it
was ready, the same command line is given to the engine again with
``--help`` first: the engine parses every argument as before and, when all of
them parse, prints its usage and exits 0 without loading a model (the usage is
printed only after the parse). A failure there is the argument error, and its
line is what the operator must fix: trying again cannot help, so the start ends
as a config error does (exit 78, which the unit does not restart).

The engine is not trusted to behave: its output is read up to a bound, within a
timeout, and its process group is killed on the way out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

TIMEOUT = 20.0          # as the engine probe's: --help loads the backends, nothing more
OUTPUT_CAP = 64 << 10   # an argument error is a line; usage goes to stdout (discarded)
LINE_CAP = 300          # characters of the line kept for STATUS= and the journal


def argument_error(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The engine's own line about its command line ``argv`` (environment ``env``), or ""
    when it accepts the command line (or cannot be asked: then it is no argument error)."""
    import selectors

    try:
        proc = subprocess.Popen([argv[0], "--help", *argv[1:]], env=dict(env),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError:
        return ""
    assert proc.stderr is not None
    out = bytearray()
    deadline = time.monotonic() + TIMEOUT
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stderr, selectors.EVENT_READ)
            while len(out) < OUTPUT_CAP and time.monotonic() < deadline:
                if not sel.select(max(deadline - time.monotonic(), 0.0)):
                    continue
                chunk = os.read(proc.stderr.fileno(), 1 << 14)
                if not chunk:
                    break
                out += chunk
        rc = proc.wait(max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        return ""  # it hangs: no answer about its arguments
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        proc.stderr.close()
    if rc <= 0:  # accepted, or killed (a crash is no answer about the arguments)
        return ""
    # Every parse error of b11434 starts its line so ("error: invalid argument: …",
    # "error while handling argument …", then that flag's usage); a failure that says
    # nothing of the kind (a backend that cannot load) is no argument error.
    lines = (x.strip() for x in out.decode("utf-8", "replace").splitlines())
    line = next((x for x in lines if x.startswith("error")), "")
    return line[:LINE_CAP]
