"""A real small file system for state DB faults: a 1 MiB tmpfs, filled (its disk is
really full) or remounted read-only (really read-only: chmod does not stop root, which
these tests run as). Mounting needs root; where it cannot mount, the test says why."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(where: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of ``size`` (1 MiB) mounted on ``where`` (created), until the block ends."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                        str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(fs: Path) -> Path:
    """Fill ``fs`` to its last block; the file that does it."""
    path = fs / "fill"
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return path


def remount(fs: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(fs)], check=True)
