"""Fixtures of the host edges' tests: the pull's client of the hub's stand-in, for the modules
that start one (their ``base`` fixture: tests/host/test_hub.py, test_download.py)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from support.hubstand import set_faults

from lokid.host import hub


@pytest.fixture
def client(base: str) -> Iterator[httpx.Client]:
    """The pull's own client (no token) of the module's stand-in, its faults reset first."""
    set_faults(base)
    with hub.make_client(None, "lokid-test") as c:
        yield c
