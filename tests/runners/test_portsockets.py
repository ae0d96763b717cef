"""lokid.runners.portsockets: each on-demand preset's port socket after a reload, the
rule as a table (the socket, its relay and the engine each in every state that
matters), and what the generator wants read from real files."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.enginekit import write_config, write_preset

from lokid.runners.portsockets import decide, wanted_ports

A, B = "127.0.0.1:8081", "127.0.0.1:8082"


@pytest.mark.parametrize(("wanted", "bound", "socket", "relay", "engine", "action"), [
    (A, "", "inactive", "inactive", "inactive", "start"),      # made on_demand, reloaded
    (A, "", "failed", "inactive", "inactive", "start"),        # a bind that failed before
    (A, "", "inactive", "inactive", "active", "warn"),         # engine on the port itself
    (A, A, "active", "inactive", "inactive", ""),              # in line
    (A, A, "active", "active", "active", ""),
    (B, A, "active", "inactive", "inactive", "restart"),       # moved, nothing behind it
    (B, A, "active", "active", "active", "warn"),              # moved, relaying
    (B, A, "active", "inactive", "active", "warn"),            # an engine runs behind it
    ("", A, "active", "inactive", "inactive", "stop"),         # on_demand turned off
    ("", A, "active", "active", "active", "warn"),             # ... while it relays
    ("", A, "active", "inactive", "active", "warn"),           # ... its engine behind it
    ("", "", "inactive", "inactive", "active", ""),            # never held: nothing
])
def test_the_rule(wanted: str, bound: str, socket: str, relay: str, engine: str,
                  action: str) -> None:
    got, why = decide(wanted, bound, socket, relay, engine)
    assert got == action
    assert bool(why) == bool(action)


def test_what_is_wanted_is_what_the_generator_writes(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.gguf").write_bytes(b"\0" * 64)
    config = write_config(tmp_path, "/usr/bin/llama-server", [models])
    write_preset(config, "lazy", 'model = "m.gguf"\nport = 18201\n[serve]\non_demand = true\n')
    write_preset(config, "steady", 'model = "m.gguf"\nport = 18202\n')
    write_preset(config, "named", 'model = "m.gguf"\nport = 18203\nextra_args = ["--host", '
                 '"localhost"]\n[serve]\non_demand = true\n')
    write_preset(config, "broken", "model = \n")
    assert wanted_ports(str(config)) == {"lazy": "127.0.0.1:18201"}
    assert wanted_ports(str(tmp_path / "nowhere")) == {}
