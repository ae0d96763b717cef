"""What the gateway adds to a request for a preset: the preset's own key, and for an
external preset (:mod:`lokid.core.config.external`) where its API is and which model to ask.

Rules, each for a failure it prevents:

- the key sent is the preset's (its ``api_key_file``: an external API's key, or a keyed
  engine's own), never the client's: a client's key for the gateway is not a key for an
  engine, and must never reach another host;
- under loki-gateway.service (``LOKI_CREDENTIALS_DIR`` set) the key is systemd's private
  copy, credential ``preset-key.<preset>`` (the generator's ``LoadCredential=``): the
  gateway's user never reads the operator's file; elsewhere (``lokid gateway --bus
  session``, the local runner) the file itself, as the client keys
  (:func:`lokid.gateway.settings.keys_path`);
- a key that cannot be read answers 503 naming the preset and saying to look at the
  gateway's log, which names the file: a client is not told the server's paths, and
  the request is not sent without its key (the API would answer 401 and hide why);
- the key is read at each request (a few microseconds: a small file), so a key file
  fixed is used at once; it appears in no log line and no reply;
- an external preset takes OpenAI's inference routes only, matched whole
  (:mod:`lokid.gateway.routes`: no client path reaches another path of its host), with
  ``model`` rewritten to its ``upstream_model`` in the bytes
  (:func:`lokid.gateway.bodyscan.with_model`): llama.cpp's own routes (``/completion``,
  ``/tokenize``) mean nothing to another API.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from ..core.config.external import key_credential
from ..core.config.secrets import CREDENTIALS_DIR_ENV, MAX_SECRET_BYTES
from .replies import UNAVAILABLE, GatewayError

log = logging.getLogger("lokid.gateway")

def key_path(preset: str, configured: str, env: Mapping[str, str] = os.environ,
             credential: str = "") -> str:
    """Where ``preset``'s key is read: systemd's copy under loki-gateway.service, else
    the file ``configured`` (its KeyFile). ``credential``: its id when it is not the
    preset key's (a peer's, :func:`lokid.core.fleet.peers.peer_key_credential`)."""
    directory = env.get(CREDENTIALS_DIR_ENV)
    credential = credential or key_credential(preset)
    return f"{directory.rstrip('/')}/{credential}" if directory else configured


def read_key(preset: str, configured: str, env: Mapping[str, str] = os.environ,
             credential: str = "", label: str = "") -> str:
    """The first key of ``preset``'s key file (one a line, ``#`` comments skipped, as
    llama-server's --api-key-file); GatewayError (503) when there is none. ``credential``
    and ``label`` (how errors name its owner): for a key that is not a preset's."""
    credential = credential or key_credential(preset)
    logged, label = label or f"preset {preset}", label or f"preset {preset!r}"
    path = key_path(preset, configured, env, credential)
    why = ""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SECRET_BYTES + 1)
    except OSError as e:
        why = e.strerror or type(e).__name__
        if path != configured:
            why += (f" (systemd's copy of {configured}, credential {credential}: "
                    "run `systemctl daemon-reload`, then restart loki-gateway.service)")
        data = b""
    if not why and len(data) > MAX_SECRET_BYTES:
        why = f"over {MAX_SECRET_BYTES} bytes: not a key file"
    lines = [] if why else [line.strip() for line in data.decode("utf-8", "replace").splitlines()]
    key = next((line for line in lines if line and not line.startswith("#")), "")
    if not why and not key:
        why = "it holds no key"
    if why or any(not ch.isprintable() for ch in key):
        log.warning("%s: cannot use its api_key_file %s: %s", logged, path,
                    why or "the key holds control characters")
        raise GatewayError(503, f"{label}: its api_key_file cannot be used (the "
                           "gateway's log says why)", UNAVAILABLE, "model_key_missing")
    return key
