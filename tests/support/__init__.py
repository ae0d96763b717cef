"""Helpers shared by the tests and the benchmarks: generated models, the real engine,
the daemon on a private bus, a real systemd in a container, the Debian package.

Tests live in the folders that mirror the package (``tests/core`` ↔ ``lokid/core`` …);
nothing here is collected as a test.
"""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
DATA = TESTS / "data"
