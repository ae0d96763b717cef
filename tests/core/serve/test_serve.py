"""lokid.core.serve.tables: a preset's [serve] table and lokid.toml's [gateway] table, as
lokid.core.config.files reads them: typed values, defaults, and every bad value located (file,
line, key, what is valid); the spans written back as systemd writes them; what
`lokid plan` notes of them; an edit of them round-trips through lokid.core.config.presetedit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lokid.core.config import files as cfg
from lokid.core.config import presetedit as pe
from lokid.core.errors import ConfigError
from lokid.core.fleet.peers import Peer
from lokid.core.serve import tables as serve

EXAMPLE = Path(__file__).parents[3] / "etc" / "presets" / "example.toml"
GLOBAL_EXAMPLE = Path(__file__).parents[3] / "etc" / "lokid.toml"


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def preset(tmp_path: Path, body: str) -> cfg.Preset:
    write(tmp_path, "presets/p.toml", 'model = "m"\n' + body)
    return cfg.load_preset(str(tmp_path), "p")


# --- [serve] ----------------------------------------------------------------------


def test_without_a_serve_table_a_preset_is_served_by_hand(tmp_path: Path) -> None:
    p = preset(tmp_path, "")
    assert p.serve == cfg.Serve() == serve.Serve(on_demand=False, idle_stop=None, group="",
                                                 drain=120.0)
    assert preset(tmp_path, "[serve]\n").serve == serve.Serve()


@pytest.mark.parametrize("body,expected", [
    ('[serve]\non_demand = true\nidle_stop = "15min"\ngroup = "gpu0"\ndrain = "90s"\n',
     serve.Serve(on_demand=True, idle_stop=900.0, group="gpu0", drain=90.0)),
    ('[serve]\nidle_stop = "1h 30min"\n', serve.Serve(idle_stop=5400.0)),
    ('[serve]\nidle_stop = "3s"\ndrain = "0s"\n', serve.Serve(idle_stop=3.0, drain=0.0)),
    ('[serve]\nidle_stop = 600\ndrain = 2.5\n', serve.Serve(idle_stop=600.0, drain=2.5)),
    ('serve.idle_stop = "2 minutes"\nserve.group = ""\n', serve.Serve(idle_stop=120.0)),
    ('serve = { on_demand = false, drain = "1d" }\n', serve.Serve(drain=86400.0)),
    ('[serve]\nkeep = true\n', serve.Serve(keep=True)),
])
def test_the_serve_table_parses_to_typed_values(tmp_path: Path, body: str,
                                                expected: serve.Serve) -> None:
    assert preset(tmp_path, body).serve == expected


SPAN = 'use a systemd time span such as "15min", "90s" or "1h 30min"'


@pytest.mark.parametrize("body,line,fragment", [
    ('[serve]\nidle_stop = "15 mni"\n', 3,
     f"serve.idle_stop: '15 mni': unknown time unit 'mni': {SPAN}"),
    ('[serve]\nidle_stop = "soon"\n', 3, f"serve.idle_stop: 'soon' is not a time span: {SPAN}"),
    ('[serve]\nidle_stop = ""\n', 3, "serve.idle_stop: an empty time span: use"),
    ('[serve]\nidle_stop = "0s"\n', 3, "serve.idle_stop: '0s' is out of range (at least 1s; "
     "remove the key to never stop the preset when idle)"),
    ('[serve]\nidle_stop = -5\n', 3, "serve.idle_stop: -5 is out of range (at least 1s"),
    ('[serve]\nidle_stop = true\n', 3, "serve.idle_stop: must be a systemd time span such as "
     '"15min", "90s" or "1h 30min" (a number alone is seconds), not a boolean'),
    ('[serve]\nidle_stop = ["15min"]\n', 3, "serve.idle_stop: must be a systemd time span"),
    ('[serve]\ndrain = "2d"\n', 3, "serve.drain: '2d' is out of range (0s to 1d)"),
    ('[serve]\ndrain = "2 mins"\n', 3, "serve.drain: '2 mins': unknown time unit 'mins'"),
    ('[serve]\non_demand = "yes"\n', 3, "serve.on_demand: must be true or false, not a string"),
    ('[serve]\non_demand = 1\n', 3, "serve.on_demand: must be true or false, not an integer"),
    ('[serve]\ngroup = "gpu 0"\n', 3, "serve.group: 'gpu 0' is not a group name: 1 to 64 "
     "characters from A-Z a-z 0-9 _ . -"),
    ('[serve]\ngroup = 0\n', 3, "serve.group: must be a string, not an integer"),
    ('[serve]\npriority = "15min"\n', 3, "serve.priority: unknown key; valid keys: on_demand, "
     "idle_stop, group, drain, keep"),
    ('[serve]\nkeep = "yes"\n', 3, "serve.keep: must be true or false, not a string"),
    ('[serve]\nidlestop = "15min"\n', 3, "serve.idlestop: unknown key (did you mean "
     "'idle_stop'?)"),
    ('serve.ttl = "5m"\n', 2, "serve.ttl: unknown key"),
    ('serve = "15min"\n', 2, "serve: must be a table ([serve]), not a string"),
    ('srve = { idle_stop = "15min" }\n', 2, "srve: unknown key (did you mean 'serve'?)"),
])
def test_every_bad_serve_value_names_file_line_key_and_what_is_valid(
        tmp_path: Path, body: str, line: int, fragment: str) -> None:
    path = tmp_path / "presets" / "p.toml"
    with pytest.raises(ConfigError) as exc:
        preset(tmp_path, body)
    assert f"{path}:{line}: {fragment}" in str(exc.value), str(exc.value)


def test_a_broken_serve_table_breaks_its_preset_only(tmp_path: Path) -> None:
    write(tmp_path, "presets/good.toml", 'model = "m"\n[serve]\nidle_stop = "15min"\n')
    write(tmp_path, "presets/bad.toml", 'model = "m"\n[serve]\nidle_stop = "forever"\n')
    good, bad = cfg.load_presets(str(tmp_path))
    assert set(good) == {"good"} and good["good"].serve.idle_stop == 900.0
    assert set(bad) == {"bad"} and "serve.idle_stop" in str(bad["bad"])


@pytest.mark.parametrize("seconds,text", [
    (900, "15min"), (5400, "1h 30min"), (3, "3s"), (90, "1min 30s"), (86400, "1d"),
    (0.5, "500ms"), (0, "0ms"), (120.4, "2min"),
])
def test_a_span_is_written_back_as_systemd_writes_it(seconds: float, text: str) -> None:
    assert serve.span_text(seconds) == text
    if seconds >= 1:
        from lokid.core.timespec import span_seconds
        assert span_seconds(text) == round(seconds)


def test_the_plan_notes_what_the_serve_settings_do() -> None:
    assert serve.serve_notes(serve.Serve()) == []
    notes = serve.serve_notes(serve.Serve(on_demand=True, idle_stop=900, group="gpu0",
                                          drain=90))
    assert notes[0] == "on_demand = true: started by the gateway's first request for it"
    assert notes[1].startswith("idle_stop = 15min: stopped after 15min without a request in "
                               "flight")
    assert notes[2].startswith("group = gpu0: at most one preset of group gpu0 runs at a time")
    assert "1min 30s (drain)" in notes[2]


def test_the_annotated_example_documents_every_serve_key() -> None:
    text = EXAMPLE.read_text()
    for key in serve.SERVE_KEYS:
        assert re.search(rf"^#{key} = ", text, re.M), key
    # uncommented, the examples are valid settings
    lines = [re.sub(rf"^#({'|'.join(serve.SERVE_KEYS)}) = ", r"\1 = ", line)
             for line in text.splitlines()]
    p = cfg.parse_preset_text("example", str(EXAMPLE), "\n".join(lines) + "\n")
    assert p.serve == serve.Serve(on_demand=True, idle_stop=900.0, group="gpu0", drain=120.0,
                                  keep=True, replicas=2, max_replicas=4)
    assert cfg.parse_preset_text("example", str(EXAMPLE), text).serve == serve.Serve()


# --- editing ----------------------------------------------------------------------


def test_setting_a_serve_key_in_the_example_lands_below_its_commented_line() -> None:
    old = EXAMPLE.read_text()
    new = pe.set_keys(old, {"serve.idle_stop": "15min", "serve.on_demand": True})
    assert '#idle_stop = "15min"\nidle_stop = "15min"\n' in new
    assert "#on_demand = true\non_demand = true\n" in new
    p = cfg.parse_preset_text("example", str(EXAMPLE), new)
    assert (p.serve.idle_stop, p.serve.on_demand) == (900.0, True)
    back = pe.unset_keys(new, ["serve.idle_stop", "serve.on_demand"])
    assert back == old


def test_setting_serve_keys_in_a_file_without_the_table_adds_it() -> None:
    new = pe.set_keys('model = "m"\nctx = 4096\n', {"serve.idle_stop": "15min",
                                                   "serve.group": "gpu0"})
    p = cfg.parse_preset_text("p", "/etc/loki/presets/p.toml", new)
    assert (p.serve.idle_stop, p.serve.group) == (900.0, "gpu0")
    back = pe.unset_keys(new, ["serve.idle_stop", "serve.group"])
    assert "serve" not in back and back.strip() == 'model = "m"\nctx = 4096'


# --- [gateway] --------------------------------------------------------------------


def test_without_a_gateway_table_the_gateway_is_off(tmp_path: Path) -> None:
    assert cfg.load_global(str(tmp_path)).gateway == serve.GatewayConfig(
        listen=(), api_keys_file="", max_body=64 * 1024 * 1024, default_model="")
    write(tmp_path, "lokid.toml", 'port = 8081\n')
    assert cfg.load_global(str(tmp_path)).gateway == cfg.GatewayConfig()


def test_the_gateway_table_parses_to_typed_values(tmp_path: Path) -> None:
    write(tmp_path, "lokid.toml", '[gateway]\nlisten = ["127.0.0.1:8000", "[::1]:8000", '
          '" 0.0.0.0:8443 "]\napi_keys_file = "/etc/loki/keys/gateway.keys"\n'
          'max_body = 1024\ndefault_model = "qwen"\n')
    g = cfg.load_global(str(tmp_path)).gateway
    assert g == serve.GatewayConfig(listen=("127.0.0.1:8000", "[::1]:8000", "0.0.0.0:8443"),
                                    api_keys_file="/etc/loki/keys/gateway.keys",
                                    max_body=1024, default_model="qwen")
    assert [serve.split_listen(a) for a in g.listen] == [
        ("127.0.0.1", 8000), ("::1", 8000), ("0.0.0.0", 8443)]
    write(tmp_path, "lokid.toml", '[gateway]\nlisten = ["127.0.0.2:8000"]\n')
    assert cfg.load_global(str(tmp_path)).gateway.listen == ("127.0.0.2:8000",)
    write(tmp_path, "lokid.toml", '[gateway]\nmax_queue = 9\nmax_queue_per_key = 3\n')
    g = cfg.load_global(str(tmp_path)).gateway
    assert (g.max_queue, g.max_queue_per_key) == (9, 3)


@pytest.mark.parametrize("body,line,fragment", [
    # without keys_file = "" the named keys file may hold keys: counted when the gateway
    # starts (tests/gateway/test_command.py), not here
    ('listen = ["0.0.0.0:8000"]\nkeys_file = ""\n', 2, "gateway.listen: '0.0.0.0:8000' is "
     "beyond loopback and gateway.api_keys_file is not set: set api_keys_file"),
    ('listen = ["127.0.0.1:8000", "[::]:8000"]\nkeys_file = ""\n', 2, "gateway.listen: "
     "'[::]:8000' is beyond loopback and gateway.api_keys_file is not set"),
    ('listen = ["192.168.1.5:8000"]\napi_keys_file = ""\nkeys_file = ""\n', 2,
     "gateway.listen: '192.168.1.5:8000' is beyond loopback"),
    ('keys_file = "keys.toml"\n', 2, "gateway.keys_file: 'keys.toml' is not an absolute "
     "path"),
    ('listen = ["localhost:8000"]\n', 2, "gateway.listen: 'localhost:8000' is not an IP address "
     "and a port, such as 127.0.0.1:8000 or [::1]:8000"),
    ('listen = ["127.0.0.1"]\n', 2, "gateway.listen: '127.0.0.1' is not an IP address and a "
     "port"),
    ('listen = ["127.0.0.1:0"]\n', 2, "gateway.listen: '127.0.0.1:0': the port must be 1 to "
     "65535"),
    ('listen = ["127.0.0.1:http"]\n', 2, "gateway.listen: '127.0.0.1:http': the port must "
     "be 1 to 65535"),
    ('listen = ["::1:8000"]\n', 2, "gateway.listen: '::1:8000': write an IPv6 address in "
     "brackets, such as [::1]:8000"),
    ('listen = "127.0.0.1:8000"\n', 2, "gateway.listen: must be a list of strings, not a string"),
    ('listen = [8000]\n', 2, "gateway.listen: item 0 must be a string, not an integer"),
    ('api_keys_file = "keys"\n', 2, "gateway.api_keys_file: 'keys' is not an absolute path"),
    ('api_keys_file = "/etc/loki/my keys"\n', 2, "gateway.api_keys_file: '/etc/loki/my keys': "
     "a file's absolute path without spaces"),
    ('max_body = 1023\n', 2, "gateway.max_body: 1023 is out of range (bytes, 1024 (1 KiB) to "
     "1073741824 (1 GiB))"),
    ('max_body = 1073741825\n', 2, "gateway.max_body: 1073741825 is out of range"),
    ('max_body = "64M"\n', 2, "gateway.max_body: must be an integer (bytes, 1024 (1 KiB) to "
     "1073741824 (1 GiB)), not a string"),
    ('default_model = "two words"\n', 2, "gateway.default_model: 'two words' is not a model "
     "name"),
    ('default_model = 3\n', 2, "gateway.default_model: must be a string, not an integer"),
    ('max_queue = 0\n', 2, "gateway.max_queue: 0 is out of range (requests, 1 to 1000000)"),
    ('max_queue_per_key = "10"\n', 2, "gateway.max_queue_per_key: must be an integer "
     "(requests, 1 to 1000000), not a string"),
    ('listn = []\n', 2, "gateway.listn: unknown key (did you mean 'listen'?); valid keys: "
     "listen, api_keys_file, max_body, default_model"),
])
def test_every_bad_gateway_value_names_file_line_key_and_what_is_valid(
        tmp_path: Path, body: str, line: int, fragment: str) -> None:
    path = write(tmp_path, "lokid.toml", "[gateway]\n" + body)
    with pytest.raises(ConfigError) as exc:
        cfg.load_global(str(tmp_path))
    assert f"{path}:{line}: {fragment}" in str(exc.value), str(exc.value)


def test_a_gateway_that_is_not_a_table_is_located(tmp_path: Path) -> None:
    path = write(tmp_path, "lokid.toml", 'port = 8081\ngateway = "127.0.0.1:8000"\n')
    with pytest.raises(ConfigError) as exc:
        cfg.load_global(str(tmp_path))
    assert f"{path}:2: gateway: must be a table ([gateway]), not a string" in str(exc.value)


def test_the_annotated_lokid_toml_documents_every_gateway_key() -> None:
    text = GLOBAL_EXAMPLE.read_text()
    for key in serve.GATEWAY_KEYS:
        assert re.search(rf"^#{key} = ", text, re.M), key
    lines = [re.sub(rf"^#({'|'.join(serve.GATEWAY_KEYS)}) = ", r"\1 = ", line)
             for line in text.splitlines()]
    from lokid.core.config.tomlread import Checker, parse_toml

    data = parse_toml("\n".join(lines) + "\n", str(GLOBAL_EXAMPLE))
    t = Checker(str(GLOBAL_EXAMPLE), text, data["gateway"], "gateway")
    assert serve.parse_gateway(t) == serve.GatewayConfig(
        listen=("127.0.0.1:8000",), api_keys_file="/etc/loki/keys/gateway.keys",
        max_body=64 * 1024 * 1024, default_model="qwen",
        cors_origins=("https://chat.example.org",), first_byte_timeout=600.0,
        stream_idle_timeout=300.0,
        peers=(Peer("gpu2", "http://gpu2:8000", "/etc/loki/keys/gpu2"),),
        allowed_hosts=("llm.example.org",))
