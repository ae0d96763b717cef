"""The Hugging Face hub's HTTP API for a model pull (issue 48): the client and the listing.

:func:`make_client` makes the one ``httpx.Client`` a pull uses; :func:`list_entries` reads
a repository's file listing (the tree API, every page) as raw JSON entries, which
:mod:`lokid.core.model.pullref` judges. :func:`status_error` and :func:`transport_error` turn the
hub's refusals into :class:`~lokid.core.errors.HubError` for the downloader too, so a
listing and a download say the same thing for the same answer. Every fault reaches the
caller as a ``HubError`` written for the operator (the URL, what it means, what to do;
``retry`` true only where the same pull later can succeed); no traceback, and never the
token. The rules, each with the failure it prevents:

- Redirects are followed (the hub's ``resolve`` URLs answer 302 to a CDN host), and the
  token goes to the hub's origin only: httpx drops ``Authorization`` on a redirect to
  another origin (0.23.3 and 0.28 alike, tests/host/test_hub.py proves it against a CDN on
  a second port). A token sent to a CDN, or to a mirror's third party, is a token leaked.
- Timeouts: 30 s to connect, 60 s between two reads: a hub that stops answering ends the
  pull with a retryable error, never a worker hung for ever.
- A ``Link: <…>; rel="next"`` page is fetched only on the listing's own origin: the client
  sends the token with every request it makes itself (not only redirects), so a page link to
  another host would hand it the token.
- A listing is bounded (100,000 entries, 64 MiB of JSON in all, 10,000 pages, each read
  as it streams in): a hostile or broken mirror cannot exhaust the worker's memory, nor keep
  it paging for ever.
- 401 and 403 say the repository is gated or private (the hub also answers 401 for a
  repository that does not exist) and where a token goes; 404 says no such repository or
  revision; 429 and 5xx are retryable, as are transport failures (refused, DNS, TLS,
  timeout), which name the host; a body that is not a JSON list is refused.
"""

from __future__ import annotations

import json
import re
import urllib.parse

import httpx

from ..core.errors import HubError, printable

TOKEN_FILE = "/etc/loki/hf-token"
MAX_ENTRIES = 100_000
MAX_JSON_BYTES = 64 << 20
MAX_PAGES = 10_000
TIMEOUT = httpx.Timeout(connect=30.0, read=60.0, write=60.0, pool=30.0)

# one link of a Link header: <url>; params (bounded, so a hostile header costs little)
_LINK = re.compile(r'<([^<>\s]{1,8192})>\s*((?:;\s*[^,;]{0,200})*)')
_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")


def make_client(token: str | None, user_agent: str) -> httpx.Client:
    """The client of one pull: redirects followed, the timeouts above, and the token
    (when given) as ``Authorization: Bearer`` on the hub's origin only."""
    headers = {"User-Agent": user_agent}
    if token:
        if not _TOKEN_CHARS.fullmatch(token):
            # an httpx error here would quote the header, and so the token
            raise HubError(f"the token in {TOKEN_FILE} holds spaces or characters no HTTP "
                           "header may carry: write the token alone on one line")
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(headers=headers, follow_redirects=True, timeout=TIMEOUT)


def list_entries(client: httpx.Client, url: str) -> list[object]:
    """The entries of the hub's tree listing at ``url``, every page's in order."""
    entries: list[object] = []
    budget = MAX_JSON_BYTES
    origin = _origin(url)
    page_url: str | None = url
    pages = 0
    while page_url is not None:
        pages += 1
        if pages > MAX_PAGES:
            raise HubError(f"the listing of {_shown(url)} runs past {MAX_PAGES} pages: "
                           "not a repository lokid pulls from")
        body, link = _page(client, page_url, url, budget)
        budget -= len(body)
        try:
            page = json.loads(body)
        except (ValueError, RecursionError):
            raise HubError(f"the hub's answer to {_shown(page_url)} is not JSON: is "
                           "HF_ENDPOINT a Hugging Face hub (or a mirror of its API)?") from None
        if not isinstance(page, list):
            raise HubError(f"the hub's answer to {_shown(page_url)} is not a file listing "
                           f"(a JSON {type(page).__name__}, not a list)")
        entries.extend(page)
        if len(entries) > MAX_ENTRIES:
            raise HubError(f"the listing of {_shown(url)} holds more than {MAX_ENTRIES} "
                           "files: not a repository lokid pulls from")
        page_url = _next_page(link, page_url, origin, url)
    return entries


def status_error(response: httpx.Response, url: str, what: str = "repository or revision"
                 ) -> HubError | None:
    """The error a non-2xx answer to ``url`` means (``what`` a 404 did not find), or None.

    A refusal by another host than ``url``'s (the CDN a download was redirected to) names
    that host."""
    status = response.status_code
    if 200 <= status < 300:
        return None
    shown = _shown(url)
    host = response.request.url.host
    by = "the hub" if host == urllib.parse.urlsplit(url).hostname else printable(host)
    if status in (401, 403):
        if "authorization" in response.request.headers:
            return HubError(f"{by} refuses {shown} (HTTP {status}) with the token of "
                            f"{TOKEN_FILE}: the token is wrong or expired, or its account "
                            "may not read this repository (a gated model: accept its terms "
                            "on the hub with that account)")
        return HubError(f"{by} refuses {shown} (HTTP {status}): the repository is gated or "
                        "private (the hub answers the same for one that does not exist). "
                        f"Put the token of an account that may read it in {TOKEN_FILE} (the "
                        "daemon passes it to the pull as a systemd credential), then pull "
                        "again")
    if status == 404:
        return HubError(f"{by} has no such {what}: {shown} (HTTP 404); check the reference's "
                        "spelling and revision")
    if status == 429:
        return HubError(f"{by} limits requests now (HTTP 429 for {shown}); the pull is "
                        "retried later", retry=True)
    if status >= 500:
        return HubError(f"{by} fails (HTTP {status} for {shown}); the pull is retried later",
                        retry=True)
    return HubError(f"{by} answers HTTP {status} for {shown}")


def transport_error(error: httpx.HTTPError, url: str) -> HubError:
    """The error a failed exchange for ``url`` means: retryable when the network failed
    (refused, DNS, TLS, timeout, a cut), not for a redirect loop or a scheme no client
    speaks (a hostile redirect)."""
    host = urllib.parse.urlsplit(url).hostname or "?"
    try:
        host = error.request.url.host or host
    except RuntimeError:   # an error raised before its request was made
        pass
    reason = printable(str(error))[:200] or type(error).__name__
    if isinstance(error, httpx.TooManyRedirects):
        return HubError(f"{_shown(url)} redirects without end (a redirect loop at "
                        f"{printable(host)}): is HF_ENDPOINT right?")
    if isinstance(error, httpx.UnsupportedProtocol):
        return HubError(f"{_shown(url)} leads to an address no pull fetches ({reason})")
    if isinstance(error, httpx.TransportError):
        return HubError(f"cannot reach {printable(host)} for {_shown(url)}: "
                        f"{type(error).__name__}: {reason}; the pull is retried later",
                        retry=True)
    return HubError(f"the answer of {printable(host)} to {_shown(url)} cannot be read: "
                    f"{type(error).__name__}: {reason}")


def _page(client: httpx.Client, page_url: str, url: str, budget: int) -> tuple[bytes, str]:
    """One page's body (at most ``budget`` bytes) and its Link header."""
    body = bytearray()
    try:
        with client.stream("GET", page_url, headers={"Accept": "application/json"}) as r:
            fail = status_error(r, page_url)
            if fail is not None:
                raise fail
            for data in r.iter_bytes():
                body += data
                if len(body) > budget:
                    raise HubError(f"the listing of {_shown(url)} runs past "
                                   f"{MAX_JSON_BYTES / (1 << 20):g} MiB of JSON: not a repository "
                                   "lokid pulls from")
            return bytes(body), r.headers.get("link", "")
    except httpx.HTTPError as e:
        raise transport_error(e, page_url) from None


def _next_page(link: str, page_url: str, origin: str, url: str) -> str | None:
    for m in _LINK.finditer(link[:65536]):
        rels = re.findall(r'rel\s*=\s*"?([^";]*)"?', m.group(2))
        if "next" not in " ".join(rels).split():
            continue
        nxt = urllib.parse.urljoin(page_url, str(m.group(1)))
        if _origin(nxt) != origin:
            raise HubError(f"the listing of {_shown(url)} sends its next page to another "
                           f"host ({printable(_origin(nxt))}): refused, the token would "
                           "go there")
        return nxt
    return None


def _origin(url: str) -> str:
    s = urllib.parse.urlsplit(url)
    try:
        port = s.port or {"http": 80, "https": 443}.get(s.scheme)
    except ValueError:   # a port that is no number: no origin of ours
        return "?"
    return f"{s.scheme}://{(s.hostname or '').lower()}:{port}"


def _shown(url: str) -> str:
    return printable(url[:500])
