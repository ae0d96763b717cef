"""The hub client (lokid.host.hub) against the hub's stand-in (tests/support/hubstand.py) in
a process of its own: the listing over pages and its bounds, the hub's refusals as
HubError (gated, missing, 5xx/429 retryable, unreachable), and the token, which reaches
the hub's origin and never the CDN a download is redirected to (two stand-ins, two ports).
The token test holds on whichever httpx runs it (the venv's, Debian 12's 0.23.3 and
Debian 13's 0.28 put the same rule in their redirect code)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.hubstand import hub_running, requests_log, set_faults, start_hub, stop_hub

from lokid.core.errors import HubError
from lokid.host import download, hub

TOKEN = "hf_standin0123456789secret"
PAGE = 7
FILES = [f"part{i:02d}.txt" for i in range(12)] + ["sub/a-Q4_K_M.gguf", "sub/b-Q8_0.gguf"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    rng = random.Random(48)
    for name in FILES:
        path = root / "org" / "model" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(200_000 if name.endswith(".gguf") else 100))
    return root


@pytest.fixture(scope="module")
def base(root: Path) -> Iterator[str]:
    with hub_running(root, page=PAGE) as url:
        yield url


def tree(base: str, repo: str = "org/model", revision: str = "main") -> str:
    return f"{base}/api/models/{repo}/tree/{revision}?recursive=true"


def test_the_listing_is_every_page_in_order(client: httpx.Client, base: str) -> None:
    before = len(requests_log(base))
    entries = hub.list_entries(client, tree(base))
    files = [e for e in entries if isinstance(e, dict) and e["type"] == "file"]
    assert sorted(e["path"] for e in files) == sorted(FILES)
    assert len(entries) == len(FILES) + 1   # and the directory "sub"
    gguf = next(e for e in files if e["path"] == "sub/a-Q4_K_M.gguf")
    assert gguf["lfs"]["size"] == 200_000 and len(gguf["lfs"]["oid"]) == 64
    pages = [r for r in requests_log(base)[before:] if "/tree/" in r["path"]]
    assert len(pages) == 3   # 15 entries at 7 a page
    assert "cursor=14" in pages[-1]["path"]


def test_the_listing_is_bounded(client: httpx.Client, base: str,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "MAX_ENTRIES", 10)
    with pytest.raises(HubError, match="more than 10 files") as e:
        hub.list_entries(client, tree(base))
    assert not e.value.retry
    monkeypatch.setattr(hub, "MAX_ENTRIES", 100_000)
    monkeypatch.setattr(hub, "MAX_JSON_BYTES", 1500)   # two pages are ~1,000 bytes each
    with pytest.raises(HubError, match="MiB of JSON"):
        hub.list_entries(client, tree(base))


def test_a_next_page_on_another_origin_is_refused(base: str) -> None:
    # the stand-in writes its next link from the Host it was asked for: another origin
    with hub.make_client(TOKEN, "lokid-test") as c:
        c.headers["Host"] = "mirror.invalid:8080"
        with pytest.raises(HubError, match=r"another host \(http://mirror.invalid:8080\)"):
            hub.list_entries(c, tree(base))


def test_missing_repository_or_revision_is_a_404(client: httpx.Client, base: str) -> None:
    for url in (tree(base, "org/nothing"), tree(base, revision="v2")):
        with pytest.raises(HubError, match="no such repository or revision") as e:
            hub.list_entries(client, url)
        assert not e.value.retry


@pytest.mark.parametrize("status", [503, 500, 429])
def test_server_errors_and_rate_limits_are_retried(client: httpx.Client, base: str,
                                                   status: int) -> None:
    set_faults(base, status=status)
    with pytest.raises(HubError, match=f"HTTP {status}") as e:
        hub.list_entries(client, tree(base))
    assert e.value.retry


def test_an_unreachable_hub_is_retried_and_named(client: httpx.Client) -> None:
    with pytest.raises(HubError, match="cannot reach 127.0.0.1") as e:
        hub.list_entries(client, "http://127.0.0.1:9/api/models/org/model/tree/main")
    assert e.value.retry


def test_a_body_that_is_not_json_is_refused(client: httpx.Client, base: str) -> None:
    with pytest.raises(HubError, match="is not JSON") as e:
        hub.list_entries(client, f"{base}/_cdn/org/model/sub/a-Q4_K_M.gguf")
    assert not e.value.retry


@pytest.fixture(scope="module")
def gated(root: Path) -> Iterator[tuple[str, str]]:
    """A hub that asks for TOKEN whose resolve URLs redirect to a CDN on another port."""
    cdn, cdn_url = start_hub(root)
    proc, url = start_hub(root, token=TOKEN, cdn_base=cdn_url)
    yield url, cdn_url
    stop_hub(proc)
    stop_hub(cdn)


def test_a_gated_repository_needs_the_token(gated: tuple[str, str]) -> None:
    base, _ = gated
    with hub.make_client(None, "lokid-test") as c, pytest.raises(HubError) as e:
        hub.list_entries(c, tree(base))
    assert "gated or private" in str(e.value) and "/etc/loki/hf-token" in str(e.value)
    assert not e.value.retry
    with hub.make_client("hf_wrong", "lokid-test") as c, pytest.raises(HubError) as e:
        hub.list_entries(c, tree(base))
    assert "token" in str(e.value) and "wrong or expired" in str(e.value)
    assert "hf_wrong" not in str(e.value)
    with hub.make_client(TOKEN, "lokid-test") as c:
        assert len(hub.list_entries(c, tree(base))) == len(FILES) + 1


def test_the_token_never_reaches_the_cdn(gated: tuple[str, str], tmp_path: Path) -> None:
    base, cdn = gated
    with hub.make_client(TOKEN, "lokid-test") as c:
        got = download.download(c, f"{base}/org/model/resolve/main/sub/a-Q4_K_M.gguf",
                                str(tmp_path / "a-Q4_K_M.gguf"), size=200_000, sha256=None)
    assert got.size == 200_000 and not got.already
    asked = [r for r in requests_log(base) if "/resolve/" in r["path"]]
    assert asked and all(r["auth"] for r in asked)   # the hub's origin had it
    served = [r for r in requests_log(cdn) if r["path"].startswith("/_cdn/")]
    assert served and not any(r["auth"] for r in served)   # the CDN's never did


def test_a_token_no_header_can_carry_is_refused_unquoted() -> None:
    with pytest.raises(HubError, match="hf-token") as e:
        hub.make_client("hf_abc\nX-Evil: 1", "lokid-test")
    assert "hf_abc" not in str(e.value)
