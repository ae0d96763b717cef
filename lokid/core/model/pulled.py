"""A preset whose model is a hub reference (issue 48): ``model = "org/repo:Q4_K_M"``.

A pull that ends writes a manifest beside the files it fetched,
``<dir>/.lokid-pulled/<digest of the reference>.json``: the reference, the model's file
name (the first shard) and the projector's. A preset naming that reference is then planned
with those files, whatever their names, as llama.cpp's ``-hf`` cache does with its own
manifests. Rules, each for the failure it prevents:

- **a setting is a reference only when it cannot be a file**: a relative path with a
  ``/`` was always refused for ``model``, and a bare name or an absolute path keeps its
  meaning, so no preset that worked changes what it loads;
- **the manifest names files in its own directory only** (a base name, never a path):
  a manifest written by someone else than the pull must not point a preset at
  ``/etc/shadow``;
- **a manifest is believed only when its model file is there**: a file deleted by hand
  makes the preset "not pulled yet" again, so the next start pulls it again rather than
  failing on a missing file;
- **the digest is of the reference as :func:`lokid.core.model.pullref.parse_reference` writes
  it back**, so ``org/repo:Q4_K_M`` written twice the same way finds one manifest.

Pure but for reading one small file (:func:`read_manifest`), as :mod:`lokid.core.config.files`
reads presets.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

MANIFEST_DIR = ".lokid-pulled"
MAX_MANIFEST = 64 << 10


@dataclass(frozen=True)
class Pulled:
    """What a finished pull left for a preset: file names in the manifest's directory."""

    reference: str
    model: str
    mmproj: str | None = None


def canonical(value: str) -> str | None:
    """``value`` as the pull names it when it is a hub reference or URL, else None (a bare
    file name, an absolute path, or nothing a pull could read)."""
    if not value or os.path.isabs(value) or "/" not in value:
        return None
    if value.count("/") == 1 and value.lower().endswith(".gguf"):
        return None   # sub/m.gguf: a relative path, still refused as one, never a repo
    from ..errors import PullReferenceError
    from .pullref import parse_reference

    try:
        return str(parse_reference(value))
    except PullReferenceError:
        return None


def manifest_path(directory: str, reference: str) -> str:
    digest = hashlib.sha256(reference.encode()).hexdigest()[:16]
    return os.path.join(directory, MANIFEST_DIR, f"{digest}.json")


def manifest_text(pulled: Pulled) -> str:
    return json.dumps({"reference": pulled.reference, "model": pulled.model,
                       "mmproj": pulled.mmproj}) + "\n"


def _safe(name: object) -> bool:
    return (isinstance(name, str) and bool(name) and "/" not in name and "\0" not in name
            and not name.startswith("."))


def read_manifest(directory: str, reference: str) -> Pulled | None:
    """The manifest of ``reference`` in ``directory`` when it is there, well formed, names
    safe base names and its model file exists; else None (never raises)."""
    try:
        with open(manifest_path(directory, reference), "rb") as f:
            data = json.loads(f.read(MAX_MANIFEST))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("reference") != reference:
        return None
    model, mmproj = data.get("model"), data.get("mmproj")
    if not _safe(model) or (mmproj is not None and not _safe(mmproj)):
        return None
    if not os.path.isfile(os.path.join(directory, str(model))):
        return None
    return Pulled(reference, str(model), None if mmproj is None else str(mmproj))


def find(value: str, model_dirs: tuple[str, ...]) -> tuple[str, Pulled] | None:
    """The first of ``model_dirs`` holding a finished pull of ``value``, with its manifest."""
    reference = canonical(value)
    if reference is None:
        return None
    for directory in model_dirs:
        pulled = read_manifest(directory, reference)
        if pulled is not None:
            return directory, pulled
    return None
