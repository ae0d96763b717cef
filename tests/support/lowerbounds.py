"""The lower bounds of lokid's libraries: the versions Debian 12 ships, the oldest release
the package runs on (tests/packaging/test_lower_bounds.py checks pyproject.toml and
debian/control say them; tests/packaging/test_deb_silent.py checks Debian 12's archive
still ships them, and Debian 13's nothing older)."""

from __future__ import annotations

# PyPI name -> (the Debian package, the upstream version Debian 12 ships)
DEBIAN_12 = {
    "aiohttp": ("python3-aiohttp", "3.8.4"),
    "dbus-fast": ("python3-dbus-fast", "1.84.2"),
    "httpx": ("python3-httpx", "0.23.3"),
    "sdnotify": ("python3-sdnotify", "0.3.1"),
    "systemd-python": ("python3-systemd", "235"),
    "tomlkit": ("python3-tomlkit", "0.11.7"),
}
