"""lokid.core.launch.conflicts: presets on one address, and who holds a busy port (table tests)."""

from __future__ import annotations

import pytest

from lokid.core.config.files import GlobalConfig, Preset
from lokid.core.launch.attempt import Mark
from lokid.core.launch.conflicts import (
    Endpoint,
    ListenSource,
    Setting,
    Started,
    holder,
    listen_address,
    listen_source,
    not_local,
    overlap,
    port_conflicts,
    port_refused,
    unresolvable,
)
from lokid.core.launch.runtimeplan import RuntimePlan


@pytest.mark.parametrize("a,b,clash", [
    ("127.0.0.1", "127.0.0.1", True),
    ("127.0.0.1", "127.0.0.2", False),
    ("0.0.0.0", "127.0.0.1", True),
    ("127.0.0.1", "::", True),
    ("::", "::1", True),
    ("0.0.0.0", "::1", True),      # either wildcard: taken as every address
    ("::0", "10.0.0.1", True),     # written another way, still a wildcard
    ("", "10.0.0.1", True),
    ("::1", "0:0::1", True),       # one address, two spellings
    ("localhost", "127.0.0.1", True),
    ("localhost", "::1", True),
    ("localhost", "10.0.0.1", False),
    ("gpu1.lan", "GPU1.lan", True),
    ("gpu1.lan", "gpu2.lan", False),
])
def test_hosts_that_overlap(a: str, b: str, clash: bool) -> None:
    assert overlap(a, b) is clash and overlap(b, a) is clash


def test_no_conflict_no_entry() -> None:
    assert port_conflicts({"a": ("127.0.0.1", 8080, "/p/a.toml"),
                           "b": ("127.0.0.1", 8081, "/p/b.toml"),
                           "c": ("127.0.0.2", 8080, "/p/c.toml")}) == {}
    assert port_conflicts({}) == {}


A = Endpoint("127.0.0.1", 8080, "/p/a.toml")
B = Endpoint("127.0.0.1", 8080, "/p/b.toml")
OTHER = Endpoint("127.0.0.1", 8081, "/p/c.toml")
FIRST_BY_NAME = "first by name (no preset has started on it since boot)"
LAST = "the last to start on it"


def refused(holder: str, why: str, port: int = 8080, host: str = "127.0.0.1") -> str:
    return (f"port {port} on {host} belongs to preset {holder} (/p/{holder}.toml), {why}: "
            "set another port in this preset")


@pytest.mark.parametrize("started,expected", [
    # none has started since boot: the first by name holds, the other is the newcomer
    ({}, {"b": refused("a", FIRST_BY_NAME)}),
    # b runs (or ran last) on the port: b holds it, although a comes first by name (the
    # issue's dup.toml dropped beside a running glm, glm's restart)
    ({"b": Started("127.0.0.1", 8080, 100.0)}, {"a": refused("b", LAST)}),
    ({"a": Started("127.0.0.1", 8080, 100.0), "b": Started("127.0.0.1", 8080, 200.0)},
     {"a": refused("b", LAST)}),
    ({"a": Started("127.0.0.1", 8080, 300.0), "b": Started("127.0.0.1", 8080, 200.0)},
     {"b": refused("a", LAST)}),
    # a last start on another address holds nothing here: b was moved to a's port
    ({"b": Started("127.0.0.1", 9000, 100.0)}, {"b": refused("a", FIRST_BY_NAME)}),
    ({"b": Started("127.0.0.2", 8080, 100.0)}, {"b": refused("a", FIRST_BY_NAME)}),
    # ... but the same address written another way does
    ({"b": Started("localhost", 8080, 100.0)}, {"a": refused("b", LAST)}),
    # a preset on a port of its own is never in it, whatever ran
    ({"c": Started("127.0.0.1", 8080, 900.0)}, {"b": refused("a", FIRST_BY_NAME)}),
])
def test_the_clash_belongs_to_the_newcomer(started: dict[str, Started],
                                           expected: dict[str, str]) -> None:
    assert port_conflicts({"a": A, "b": B, "c": OTHER}, started) == expected


def test_one_holder_and_every_other_preset_on_its_port_refused() -> None:
    found = port_conflicts({"a": A, "b": B, "z": ("127.0.0.1", 8080, "/p/z.toml")},
                           {"z": Started("127.0.0.1", 8080, 5.0)})
    assert found == {"a": refused("z", LAST), "b": refused("z", LAST)}


def test_a_wildcard_clashes_with_every_host_and_says_where_the_other_listens() -> None:
    endpoints = {"a": ("0.0.0.0", 9000, "/p/a.toml"), "b": ("127.0.0.1", 9000, "/p/b.toml"),
                 "c": ("10.0.0.1", 9000, "/p/c.toml")}
    # a, first by name, takes every address: both others are refused
    found = port_conflicts(endpoints)
    assert found == {"b": refused("a", FIRST_BY_NAME, 9000).replace(
                         "(/p/a.toml)", "(/p/a.toml, on 0.0.0.0)"),
                     "c": refused("a", FIRST_BY_NAME, 9000, "10.0.0.1").replace(
                         "(/p/a.toml)", "(/p/a.toml, on 0.0.0.0)")}
    # b and c do not clash with each other: once b holds, the wildcard is refused on
    # b's account only, and c keeps its host
    found = port_conflicts(endpoints, {"b": Started("127.0.0.1", 9000, 1.0)})
    assert found == {"a": ("port 9000 on 0.0.0.0 belongs to preset b (/p/b.toml, on "
                           f"127.0.0.1), {LAST}: set another port in this preset")}
    both = port_conflicts(endpoints, {"b": Started("127.0.0.1", 9000, 1.0),
                                      "c": Started("10.0.0.1", 9000, 2.0)})
    assert both == {"a": ("port 9000 on 0.0.0.0 belongs to presets c (/p/c.toml, on "
                          "10.0.0.1), b (/p/b.toml, on 127.0.0.1), the last to start on it: "
                          "set another port in this preset")}


def preset(port: int | None = None, extra: tuple[str, ...] = ()) -> Preset:
    return Preset(name="p", path="/p/p.toml", model="m.gguf", port=port, extra_args=extra)


@pytest.mark.parametrize("p,address", [
    (preset(), ("127.0.0.1", 8080)),                                  # lokid.toml's
    (preset(9000), ("127.0.0.1", 9000)),                              # the preset's port
    (preset(9000, ("--port", "9100")), ("127.0.0.1", 9100)),          # extra_args win
    (preset(9000, ("--port=9100", "--host", "0.0.0.0")), ("0.0.0.0", 9100)),
    (preset(9000, ("--port", "nine")), ("127.0.0.1", 9000)),          # not a port: the plan's
])
def test_where_a_preset_listens(p: Preset, address: tuple[str, int]) -> None:
    assert listen_address(p, GlobalConfig()) == address


TOML = GlobalConfig(path="/c/lokid.toml")


@pytest.mark.parametrize("p,config,source", [
    (preset(), TOML, (("/c/lokid.toml", "host"), ("/c/lokid.toml", "port"))),
    (preset(), GlobalConfig(), (("", ""), ("", ""))),                # no lokid.toml: defaults
    (preset(9000), TOML, (("/c/lokid.toml", "host"), ("/p/p.toml", "port"))),
    (preset(9000, ("--port", "9100")), TOML,
     (("/c/lokid.toml", "host"), ("/p/p.toml", "extra_args"))),
    (preset(None, ("--port=9100", "--host", "0.0.0.0")), TOML,
     (("/p/p.toml", "extra_args"), ("/p/p.toml", "extra_args"))),
    (preset(9000, ("--port", "nine")), TOML, (("/c/lokid.toml", "host"), ("/p/p.toml", "port"))),
])
def test_where_the_host_and_the_port_are_set(p: Preset, config: GlobalConfig,
                                             source: tuple[tuple[str, str], ...]) -> None:
    # the same rule as listen_address: the file that wins is the one an error names
    assert listen_source(p, config) == ListenSource(*(Setting(*s) for s in source))


@pytest.mark.parametrize("key,start", [
    ("host", "'gpu.invalid' does not resolve"),              # after "lokid.toml: host: "
    ("extra_args", "--host 'gpu.invalid' does not resolve"),
    ("", "host 'gpu.invalid' does not resolve"),             # no file known
])
def test_a_host_is_named_as_its_file_sets_it(key: str, start: str) -> None:
    message = unresolvable("gpu.invalid", key, "Name or service not known")
    assert message.startswith(start + " to an address (Name or service not known): ")
    assert "127.0.0.1" in message and "0.0.0.0" in message
    assert not_local("192.0.2.1", key).replace("192.0.2.1", "gpu.invalid").startswith(
        start.replace("does not resolve", "is not an address of this host"))


def test_a_privileged_port_says_what_to_do() -> None:
    assert port_refused(80, "port", "loki", 1024) == (
        "80 is below 1024: user loki, which runs the engine, may not listen on it: use a "
        "port of 1024 or above, or set the sysctl net.ipv4.ip_unprivileged_port_start to 80")
    assert port_refused(443, "extra_args", "loki", 1000).startswith("--port 443 is below 1000")
    assert port_refused(80, "", "loki", 1024).startswith("port 80 is below 1024")


def plan(preset: str, port: int, argv: tuple[str, ...], host: str = "127.0.0.1") -> RuntimePlan:
    return RuntimePlan(preset=preset, argv=argv, env={}, host=host, port=port,
                       mark=Mark("f", "/e", 1))


ENGINE = ("/usr/bin/llama-server", "-m", "/m/a.gguf", "--port", "8080")


def test_the_holder_is_the_preset_whose_plan_the_process_runs() -> None:
    plans = [plan("b", 8081, ("/x", "--port", "8081")), plan("a", 8080, ENGINE)]
    assert holder("127.0.0.1", 8080, plans, 42, list(ENGINE), "llama-server", "root") == (
        "preset a (pid 42 (llama-server))")
    # behind a wrapper script: the engine runs the plan's arguments under another argv[0]
    assert holder("127.0.0.1", 8080, plans, 42, ["/opt/llama/bin/llama-server", *ENGINE[1:]],
                  "llama-server", "root").startswith("preset a ")


def test_a_stale_runtime_plan_does_not_name_a_preset_when_the_process_is_known() -> None:
    plans = [plan("a", 8080, ENGINE)]
    assert holder("127.0.0.1", 8080, plans, 42, ["python3", "-m", "http.server"], "python3",
                  "root") == "another process: pid 42 (python3)"
    assert holder("127.0.0.1", 8080, [], 42, None, None, "root") == "another process: pid 42"


def test_an_invisible_process() -> None:
    plans = [plan("a", 8080, ENGINE), plan("z", 8080, ENGINE, host="10.0.0.9")]
    assert holder("127.0.0.1", 8080, plans, None, None, None, "bob") == (
        "preset a (its runtime plan has this port; the process is not visible to user bob)")
    assert holder("127.0.0.1", 8081, plans, None, None, None, "bob") == (
        "another process (not visible to user bob)")
