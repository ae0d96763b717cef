"""Real journal files from export-format entries: ``systemd-journal-remote --output=FILE -``
writes what journald would store, and ``systemd.journal.Reader(files=…)`` reads it as it
reads the system journal. (tests/watch/test_journalwatch.py has its own copy, older.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
BOOT = "0123456789abcdef0123456789abcdef"


def export(entries: list[dict[str, str]], start_us: int = 1_700_000_000_000_000,
           step_us: int = 1) -> bytes:
    out = bytearray()
    for i, fields in enumerate(entries):
        fields = {"__REALTIME_TIMESTAMP": str(start_us + i * step_us),
                  "__MONOTONIC_TIMESTAMP": str(1000 + i * step_us), "_BOOT_ID": BOOT,
                  **fields}
        for key, value in fields.items():
            data = value.encode()
            if b"\n" in data:  # the export format's binary-safe form
                out += key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
            else:
                out += key.encode() + b"=" + data + b"\n"
        out += b"\n"
    return bytes(out)


def write_journal(path: Path, entries: list[dict[str, str]], start_us: int =
                  1_700_000_000_000_000, step_us: int = 1) -> Path:
    subprocess.run([JOURNAL_REMOTE, f"--output={path}", "-"],
                   input=export(entries, start_us, step_us), check=True, capture_output=True,
                   timeout=60)
    return path
