"""External presets: a preset that is another OpenAI-compatible API, not an engine here.

A preset with ``kind = "external"`` names an API somewhere else (another host's
gateway, a hosted model) that lokid's gateway routes to by the preset's name, as it
routes to its own engines::

    kind = "external"
    url = "http://10.0.0.7:8000/v1"            # the API's base URL, /v1 included
    upstream_model = "qwen3-32b"               # the model asked for there (default: the name)
    api_key_file = "/etc/loki/keys/upstream"   # optional: its key, first line of the file

Rules, each for a failure it prevents:

- ``url`` is the base URL as OpenAI clients write it (``OPENAI_BASE_URL``, /v1 included):
  the gateway sends ``/v1/chat/completions`` to ``<url>/chat/completions``. Only http and
  https, a host, no query, no fragment, and no user or password in it: the URL is shown
  to anyone (D-Bus, ``lokid plan``), and a password there would be shown with it;
- the key is a file, never a value, as every secret of a preset
  (:mod:`lokid.core.config.secrets`): under systemd it reaches the gateway as its credential
  :func:`key_credential` (``LoadCredential=``, written by the generator), and nothing
  of it travels over D-Bus, into a log or an argv;
- nothing runs here: a key that only means something to an engine (``model``, ``ctx``,
  ``gpus``, ``spec``, ``[serve]`` …) is an error naming the file, the line and the key,
  not a setting silently ignored (an operator who wrote ``gpus`` expects it to act);
  and ``url`` or ``upstream_model`` in an engine preset is an error the same way;
- starting, stopping or benchmarking it is refused with the reason
  (:func:`nothing_runs`, :data:`BENCH_REFUSAL`): a benchmark of an external API would
  measure a network and be recorded as this preset's engine.

Part of the pure core: values in, values out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import secrets
from .tomlread import Checker, tname

ENGINE, EXTERNAL = "engine", "external"
KINDS = (ENGINE, EXTERNAL)
# What an external preset may hold; every other preset key is an engine's.
EXTERNAL_KEYS = ("kind", "url", "upstream_model", "api_key_file", "aliases")
ONLY_EXTERNAL = ("url", "upstream_model")
BENCH_REFUSAL = "the preset is an external API: a benchmark measures a local engine"
# The systemd credential a preset's key travels to loki-gateway.service as: the external
# API's key, or the engine's own key the gateway sends it (a keyed engine behind it).
KEY_CREDENTIAL_PREFIX = "preset-key."
MAX_MODEL_NAME = 256


@dataclass(frozen=True)
class External:
    """Where an external preset's API is, and what to ask it for."""

    url: str                       # the base URL, /v1 included, without a trailing /
    upstream_model: str            # the "model" of every request sent there
    api_key_file: str | None = None


def key_credential(preset: str) -> str:
    """The credential id of ``preset``'s key in loki-gateway.service."""
    return KEY_CREDENTIAL_PREFIX + preset


def kind_of(c: Checker) -> str:
    """The preset's ``kind`` (default ``engine``), checked."""
    kind = c.string("kind", ENGINE) or ENGINE
    if kind not in KINDS:
        raise c.error("kind", f"{kind!r} is not a kind: \"engine\" (llama-server run here, "
                      "the default) or \"external\" (an OpenAI-compatible API elsewhere)")
    return kind


def reject_external_keys(c: Checker) -> None:
    """An engine preset holding a key of an external one: an error naming it."""
    for key in ONLY_EXTERNAL:
        if key in c.data:
            raise c.error(key, "only for kind = \"external\" (an API elsewhere); this "
                          "preset runs an engine here: remove the key, or set kind")


# scheme, authority (before the first /, ? or #), the rest; the core parses no URL with
# urllib (no network module here), and a base URL needs no more than this
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#]*)(?P<rest>.*)",
                  re.S)
_HOST_PORT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>[0-9]+))?")


def _host(url: str) -> tuple[str, int | None] | None:
    """The URL's host (IPv6 without brackets) and port, None when it has no valid one."""
    m = _URL.fullmatch(url)
    found = _HOST_PORT.fullmatch(m.group("authority")) if m else None
    if found is None:
        return None
    port = found.group("port")
    return found.group("host").strip("[]"), None if port is None else int(port)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an external preset's base URL, or None."""
    if any(not ch.isprintable() or ch.isspace() for ch in url):
        return f"{url!r}: no spaces or control characters"
    m = _URL.fullmatch(url)
    if m is None or m.group("scheme").lower() not in ("http", "https"):
        return (f"{url!r}: an http:// or https:// URL with a host, such as "
                "\"http://127.0.0.1:9100/v1\"")
    if "@" in m.group("authority"):
        return ("holds a user or a password: the URL is shown to anyone; put the key in "
                "api_key_file instead")
    host = _host(url)
    if host is None:
        return (f"{url!r}: an http:// or https:// URL with a host (a name, an address, "
                "[an IPv6 address]) and an optional port, such as \"http://127.0.0.1:9100/v1\"")
    if host[1] is not None and not 1 <= host[1] <= 65535:
        return f"{url!r}: the port must be 1 to 65535"
    if "?" in m.group("rest") or "#" in m.group("rest"):
        return f"{url!r}: a base URL without ?query or #fragment"
    return None


def parse_external(c: Checker, name: str) -> External:
    """An external preset's keys (``kind`` already read as external): every other key an
    error naming it, each value checked."""
    for key, value in c.data.items():
        if key not in EXTERNAL_KEYS:
            where = c
            if isinstance(value, dict) and value:   # a table: its first key has a line
                where, key = Checker(c.path, c.text, value, key), next(iter(value))
            raise where.error(key, "an engine's setting, in a kind = \"external\" preset: "
                              "nothing runs here; an external preset holds "
                              f"{', '.join(EXTERNAL_KEYS)}")
    url = c.string("url")
    if url is None:
        raise c.error("url", "missing: the base URL of the OpenAI-compatible API, /v1 "
                      "included, such as \"http://127.0.0.1:9100/v1\"")
    problem = url_problem(url)
    if problem:
        raise c.error("url", problem)
    value = c.data.get("upstream_model", name)
    if not isinstance(value, str):
        raise c.error("upstream_model", f"must be a string, not {tname(value)}")
    if not value or len(value) > MAX_MODEL_NAME or not value.isprintable():
        raise c.error("upstream_model", f"{value!r}: the model name the API knows, 1 to "
                      f"{MAX_MODEL_NAME} printable characters (default: the preset's name)")
    key_file = c.string("api_key_file")
    if key_file is not None:
        problem = secrets.source_problem(key_file)
        if problem:
            raise c.error("api_key_file", problem)
    return External(url=url.rstrip("/"), upstream_model=value, api_key_file=key_file)


def nothing_runs(name: str, ext: External) -> str:
    """Why ``name`` has no engine to start, stop or plan (and what it is instead)."""
    return (f"preset {name!r} is an external API at {ext.url}: nothing runs here (the "
            "gateway relays its requests there)")


def external_notes(name: str, ext: External) -> list[str]:
    """What ``lokid plan`` says of an external preset, one line each; never the key."""
    notes = [f"external API at {ext.url}: nothing runs here; the gateway relays requests "
             f"for {name!r} there",
             f"upstream_model = {ext.upstream_model}: the model asked for there"]
    if ext.api_key_file:
        notes.append(f"its key: read from {ext.api_key_file} (under systemd, loaded as "
                     f"loki-gateway.service's credential {key_credential(name)}), sent as "
                     "Authorization: Bearer")
    else:
        notes.append("no api_key_file: requests go there without a key")
    return notes


def ip_host(url: str) -> str | None:
    """The URL's host when it is an IP address (the daemon's sandbox allows addresses, not
    names), else None."""
    import ipaddress

    found = _host(url)
    try:
        return str(ipaddress.ip_address(found[0] if found else ""))
    except ValueError:
        return None


def models_url(url: str) -> str:
    """Where reachability is checked: the API's model list (no key needed to be told
    401, which still says it answers)."""
    return url.rstrip("/") + "/models"
