"""lokid.host.notify over sdnotify, against a real AF_UNIX datagram socket."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.enginekit import NotifyListener

from lokid.host.notify import Notifier


def test_a_status_beyond_latin_1_arrives_whole(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """sdnotify encodes as Latin-1 and drops, silently, what does not fit: a STATUS= naming
    a preset file such as /etc/loki/presets/modèle-日本.toml would never show."""
    listener = NotifyListener(tmp_path / "notify")
    monkeypatch.setenv("NOTIFY_SOCKET", listener.path)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    try:
        n = Notifier()
        assert n.enabled and n.watchdog_interval is None
        status = "STATUS=/etc/loki/presets/modèle-日本.toml:2: ctx: must be an integer"
        n.send(status, "WATCHDOG=1")
        assert listener.wait_for("STATUS=", timeout=5) == status
        listener.wait_for("WATCHDOG=1", timeout=5)
        n.close()
    finally:
        listener.close()


def test_without_systemd_it_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "3000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    n = Notifier()
    assert not n.enabled and n.watchdog_interval == 3.0
    n.send("READY=1")  # nothing to send it to, and no error
