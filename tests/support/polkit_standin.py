"""A stand-in for polkitd's Authority interface, for the daemon's authorisation tests.

polkitd itself needs the system bus and a user of its own, which the tests' private
buses do not have; this speaks the interface polkit documents
(org.freedesktop.PolicyKit1.Authority.CheckAuthorization) on the test's bus. Like
lokid/dbus/interfaces.py, no postponed annotations: dbus-fast reads the signature strings.
"""

from typing import Any

from dbus_fast.service import ServiceInterface, method


class PolkitStandIn(ServiceInterface):
    """polkitd's Authority interface, as documented (polkitd itself needs the system bus
    and its own user: not available here). Answers per action; records each call."""

    def __init__(self, allowed: set[str]):
        super().__init__("org.freedesktop.PolicyKit1.Authority")
        self.allowed = allowed
        self.calls: list[tuple[Any, str, int]] = []

    @method()
    def CheckAuthorization(self, subject: "(sa{sv})", action_id: "s",
                           details: "a{ss}", flags: "u",
                           cancellation_id: "s") -> "(bba{ss})":
        self.calls.append((subject, action_id, flags))
        return [action_id in self.allowed, False, {}]
