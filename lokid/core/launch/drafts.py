"""What a preset may use as its ``spec.draft``, and which presets lean on another's model
(pure: the caller reads the GGUF headers and resolves the files).

The rules, from the system lokid grew from:

- a model is never offered as its own draft: ``-md`` to the model's own file loads a
  second full copy of it next to the first (a 27B model then asked for 9.6 GB more
  on the GPU and died, or ran at a quarter of its speed); a model whose file holds
  its own MTP head needs no draft file at all, and the list says so first;
- MTP heads (files with the ``nextn`` tensors, as llama.cpp recognises them) come
  before plain draft models, and the heads sitting in the model's own directory
  (published beside it: ``mtp-<model>.gguf``) before the others;
- files that are no draft (a vision projector, an EAGLE-3 or DFlash head that
  needs flags of its own, an unreadable header) are left out;
- a model file chosen as another preset's draft is *used by* that preset: removing
  or renaming the preset whose model it is must say so (:func:`users_of`).

lokid does not compare vocabularies: llama.cpp refuses a draft whose vocabulary
differs from the model's at start, with its own message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..model.modelinfo import ModelInfo
from .spec import SIDECAR_ARCHS

NONE_NEEDED = "none-needed"
MTP_HEAD = "mtp-head"
DRAFT_MODEL = "draft-model"
NOT_DRAFTS = ("clip", *SIDECAR_ARCHS)  # vision projectors, heads with flags of their own


@dataclass(frozen=True)
class ModelFile:
    """A GGUF file found where presets look for models."""

    setting: str          # what a preset writes to name it (a file name, or a path)
    path: str             # resolved
    directory: str
    info: ModelInfo
    is_model: bool        # the preset's own model file (the same inode)


def candidates(model: ModelInfo, model_directory: str,
               files: Sequence[ModelFile]) -> list[dict[str, Any]]:
    """The draft choices for a preset whose model is ``model``, best first: the
    ``none-needed`` entry when its file holds an MTP head, then MTP heads (beside the
    model first), then draft models; each a JSON-able dict (file, kind, beside_model,
    note, size_mib)."""
    out: list[dict[str, Any]] = []
    if model.has_nextn_tensor:
        out.append({"file": "", "kind": NONE_NEEDED, "beside_model": True,
                    "note": "the model holds its own MTP head: spec.mode = \"mtp\" (or auto) "
                            "uses it; no draft file needed"})
    usable = [f for f in files if not f.is_model and f.info.arch.lower() not in NOT_DRAFTS]

    def order(f: ModelFile) -> tuple[int, int, str]:
        head = 0 if f.info.has_nextn_tensor else 1
        beside = 0 if f.directory == model_directory else 1
        return head, beside, f.setting

    for f in sorted(usable, key=order):
        head = f.info.has_nextn_tensor
        beside = f.directory == model_directory
        if head:
            note = "MTP head" + (" beside the model" if beside else "") + \
                f" ({f.info.name or f.info.arch or 'unnamed'}): spec.mode = \"mtp\" or auto"
        else:
            note = (f"draft model ({f.info.name or f.info.arch or 'unnamed'}, "
                    f"{f.info.block_count} layers): spec.mode = \"mtp\" loads it with "
                    "--spec-type draft-simple")
        out.append({"file": f.setting, "kind": MTP_HEAD if head else DRAFT_MODEL,
                    "beside_model": beside, "note": note,
                    "size_mib": round(f.info.file_size / (1024 * 1024), 1)})
    return out


def users_of(model_path: str, drafts: Mapping[str, str | None], owner: str) -> list[str]:
    """The presets other than ``owner`` whose draft (``drafts``: preset → its resolved
    ``spec.draft`` file, None when it has none or it is not found; paths compared as
    the caller resolved them, e.g. to their real path) is ``model_path``."""
    return sorted(name for name, draft in drafts.items()
                  if name != owner and draft is not None and draft == model_path)
