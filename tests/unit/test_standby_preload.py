"""The spare step's preload (lokid.unit.standby.preload): once it has run, what a start
with a kept plan does after the step is told (the plan's reuse key, the /health polls)
imports nothing. Each import found there was on a cold start's path, or took the CPU
while the engine loaded. In a fresh interpreter: the test process has imported most of
the standard library already."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from support import REPO

CHILD = """
import json, os, sys
sys.path.insert(0, {repo!r})
from lokid.unit.standby import preload
preload()
from lokid.planning.endpoint import health_status
from lokid.store import plancache
before = set(sys.modules)
plancache.key("tiny", [{path!r}], dict(os.environ))
health_status("127.0.0.1", {port}, 0.3)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_a_told_step_imports_nothing_for_the_reuse_key_and_the_health_poll(tmp_path: Path) -> None:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF")
    with socket.socket() as listener:   # answers nothing: the poll connects, then times out
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-c", CHILD.format(repo=str(REPO), path=str(model), port=port)],
            capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out) == []
