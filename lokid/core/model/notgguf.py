"""What a file that is not GGUF most likely is: the usual wrong downloads, named for the
operator (:func:`lokid.core.model.modelinfo.probe_model` refuses such a file with it)."""

from __future__ import annotations

from ..errors import ModelError


def not_gguf(path: str, head: bytes) -> ModelError:
    """Say what a non-GGUF file most likely is: these are the usual wrong downloads.

    Never its bytes: the message reaches ``Notes`` on the bus, which anyone may
    read, and the file may be one its reader could open and they could not
    (``model = "/etc/shadow"`` would show the start of a password hash)."""
    hint = ""
    if head.startswith(b"version https://git-lfs"):
        hint = ": a Git LFS pointer, not the model (fetch it with `git lfs pull`)"
    elif head.lstrip()[:1] == b"<":
        hint = ": looks like an HTML/XML page (a download error page?)"
    elif head.startswith(b"PK\x03\x04"):
        hint = ": a ZIP archive"
    elif head.startswith(b"\x1f\x8b"):
        hint = ": a gzip archive"
    elif head[:4] in (b"lmgg", b"fmgg", b"tjgg", b"algg"):
        hint = ": a pre-GGUF GGML/GGJT file, convert it to GGUF"
    elif len(head) >= 10 and head[8:10] == b"{\"":
        hint = ": looks like a safetensors file, convert it to GGUF"
    elif head.lstrip()[:1] in (b"{", b"["):
        hint = ": looks like a JSON document"
    return ModelError(f"{path}: not a GGUF file (it does not begin with \"GGUF\"){hint}")
