"""lokid.toml's ``[gateway] peers`` (issue 30, item 1): each peer typed, every mistake
an error naming the file, the line and what would be valid; and the peers' keys
reaching loki-gateway.service as systemd credentials."""

from __future__ import annotations

from pathlib import Path

import pytest

from lokid.core.config import files as cfg
from lokid.core.errors import ConfigError
from lokid.core.fleet.peers import Peer, peer_key_credential
from lokid.core.serve.tables import GatewayConfig
from lokid.unit.generator import gateway_dropins


def load(tmp_path: Path, peers: str) -> GatewayConfig:
    (tmp_path / "lokid.toml").write_text('[gateway]\nlisten = ["127.0.0.1:8000"]\n'
                                         f"peers = {peers}\n")
    return cfg.load_global(str(tmp_path)).gateway


def test_peers_parse_to_typed_values_named_by_their_host(tmp_path: Path) -> None:
    g = load(tmp_path, '[{ url = "http://gpu2:8000/", api_key_file = "/etc/loki/keys/gpu2" },'
             ' { name = "gpu3", url = "HTTPS://10.0.0.3:8443" },'
             ' { name = "v6", url = "http://[fd00::3]:8000" }]')
    assert g.peers == (Peer("gpu2", "http://gpu2:8000", "/etc/loki/keys/gpu2"),
                       Peer("gpu3", "https://10.0.0.3:8443"),
                       Peer("v6", "http://[fd00::3]:8000"))
    assert load(tmp_path, "[]").peers == ()


@pytest.mark.parametrize("peers,fragment", [
    ('"http://gpu2:8000"', "gateway.peers: must be a list of tables"),
    ('["http://gpu2:8000"]', "gateway.peers: item 0 must be a table"),
    ('[{ name = "x" }]', "gateway.peers: item 0: url is missing"),
    ('[{ url = "gpu2:8000" }]', "gateway.peers: item 0: 'gpu2:8000': an http:// or https://"),
    ('[{ url = "http://gpu2:8000/v1" }]', "gateway.peers: item 0: url 'http://gpu2:8000/v1': "
     "the peer gateway's base, scheme, host and port only"),
    ('[{ url = "http://me:pw@gpu2:8000" }]', "holds a user or a password"),
    ('[{ url = "http://gpu2:99999" }]', "the port must be 1 to 65535"),
    ('[{ url = "http://[::1]:8000" }]', "gateway.peers: item 0: name '::1': 1 to 64 letters"
     ", digits, '.', '_' or '-', starting with a letter or digit (it names the peer in logs "
     "and a systemd credential); give the peer a name"),
    ('[{ url = "http://a:1", name = "a/b" }]', "name 'a/b': 1 to 64 letters"),
    ('[{ url = "http://a:1", api_key_file = "keys" }]', "gateway.peers: item 0: "
     "api_key_file 'keys' is not an absolute path"),
    ('[{ url = "http://a:1", key = "sk-1" }]', "gateway.peers: item 0: unknown key 'key'; a "
     "peer holds name, url, api_key_file"),
    ('[{ url = "http://a:1", name = 3 }]', "item 0: name must be a string, not an integer"),
    ('[{ url = "http://a:1" }, { url = "http://a:2" }]', "gateway.peers: item 1: the name "
     "'a' is taken by another peer"),
    ('[{ url = "http://a:1" }, { name = "b", url = "http://a:1/" }]', "gateway.peers: item "
     "1: http://a:1 is listed twice"),
])
def test_every_bad_peer_names_file_line_and_what_is_valid(tmp_path: Path, peers: str,
                                                          fragment: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, peers)
    assert f"{tmp_path / 'lokid.toml'}:3: " in str(exc.value), str(exc.value)
    assert fragment in str(exc.value), str(exc.value)


def test_each_peer_key_is_a_credential_of_the_gateway_and_a_missing_one_is_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "gpu2.key"
    key.write_text("sk-peer\n")
    g = load(tmp_path, f'[{{ url = "http://gpu2:8000", api_key_file = "{key}" }},'
             f' {{ url = "http://gpu3:8000", api_key_file = "{tmp_path / "none"}" }},'
             ' { url = "http://gpu4:8000" }]')
    _, service = gateway_dropins(g)
    assert f"LoadCredential={peer_key_credential('gpu2')}:{key}\n" in service
    assert "gpu3" not in service and "gpu4" not in service and "sk-peer" not in service
    assert f"peer gpu3: api_key_file {tmp_path / 'none'} does not exist" in \
        capsys.readouterr().err


def test_the_generator_writes_each_rpc_workers_dropin_and_skips_a_broken_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lokid.unit.generator import rpc_units

    rpc = tmp_path / "rpc"
    rpc.mkdir()
    (rpc / "gpu.toml").write_text('listen = "10.0.0.2:50052"\nheads = ["10.0.0.1"]\n')
    (rpc / "open.toml").write_text('listen = "0.0.0.0:50052"\n')
    out = tmp_path / "out"
    assert rpc_units(str(tmp_path), str(out)) == ["loki-rpc@gpu.service"]
    text = (out / "loki-rpc@gpu.service.d" / "50-lokid-preset.conf").read_text()
    assert "IPAddressAllow=10.0.0.1\n" in text
    assert "skipping RPC worker open" in capsys.readouterr().err
    assert not (out / "loki-rpc@open.service.d").exists()
