"""What the daemon does with loki-gateway.socket after a systemd reload (the pure part;
the container test in tests/gateway/test_units_systemd.py does it under real systemd)."""

from __future__ import annotations

import pytest

from lokid.runners.gatewaysocket import addresses, decide


def test_addresses_are_written_as_systemd_shows_them() -> None:
    assert addresses(("127.0.0.1:8000", "[::1]:8001")) == {"127.0.0.1:8000", "[::1]:8001"}


@pytest.mark.parametrize("state", ["inactive", "failed"])
def test_listen_set_and_the_socket_down_starts_it(state: str) -> None:
    action, why = decide({"127.0.0.1:8000"}, state, set(), "inactive")
    assert action == "start" and "127.0.0.1:8000" in why


def test_listen_unset_stops_a_running_socket_and_leaves_a_stopped_one() -> None:
    assert decide(set(), "active", {"127.0.0.1:8000"}, "active")[0] == "stop"
    assert decide(set(), "inactive", set(), "inactive") == ("", "")


def test_the_same_addresses_need_nothing() -> None:
    assert decide({"127.0.0.1:8000"}, "active", {"127.0.0.1:8000"}, "active") == ("", "")


def test_changed_addresses_restart_an_idle_gateway_and_only_warn_while_it_serves() -> None:
    action, why = decide({"127.0.0.1:8001"}, "active", {"127.0.0.1:8000"}, "inactive")
    assert action == "restart"
    assert "127.0.0.1:8000" in why and "127.0.0.1:8001" in why
    assert decide({"127.0.0.1:8001"}, "active", {"127.0.0.1:8000"}, "active")[0] == "warn"
