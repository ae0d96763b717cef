"""What the shipped bash completion (packaging/completion/lokid.bash) offers, for the tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

from . import REPO

COMPLETION = REPO / "packaging" / "completion" / "lokid.bash"


def complete(line: str, presets: Path) -> list[str]:
    """What bash completes for ``line`` (the cursor at its end), with ``presets`` as the
    config directory (LOKI_CONFIG_DIR)."""
    words = line.split(" ")
    script = (f"source {COMPLETION}\n"
              f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
              f"{'_lokictl' if words[0] == 'lokictl' else '_lokid'}\n"
              'printf "%s\\n" "${COMPREPLY[@]}"')
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                       env={"LOKI_CONFIG_DIR": str(presets), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return sorted(w for w in r.stdout.split("\n") if w)
