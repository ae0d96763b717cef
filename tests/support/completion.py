"""What the shipped bash completion (packaging/completion/lokid.bash) offers, for the tests."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from . import REPO

COMPLETION = REPO / "packaging" / "completion" / "lokid.bash"


def comp_words(line: str, split_at_equals: bool = True) -> list[str]:
    """COMP_WORDS as bash makes them of ``line``: split at spaces and, as bash's default
    COMP_WORDBREAKS has "=", around each run of "=" ("a=b" is "a", "=", "b")."""
    words = []
    for word in line.split(" "):
        parts = [p for p in re.split(r"(=+)", word) if p] if split_at_equals else [word]
        words += parts or [""]
    return words


def complete(line: str, presets: Path, split_at_equals: bool = True) -> list[str]:
    """What bash completes for ``line`` (the cursor at its end), with ``presets`` as the
    config directory (LOKI_CONFIG_DIR); ``split_at_equals=False`` as if COMP_WORDBREAKS
    had no "="."""
    words = comp_words(line, split_at_equals)
    script = (f"source {COMPLETION}\n"
              f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
              f"{'_lokictl' if words[0] == 'lokictl' else '_lokid'}\n"
              'printf "%s\\n" "${COMPREPLY[@]}"')
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                       env={"LOKI_CONFIG_DIR": str(presets), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return sorted(w for w in r.stdout.split("\n") if w)
