"""The generated GGUF models of a test session (the ``models`` fixture of tests/conftest.py):
each a cached property written on first use (tests/support/models.py says what each is).
Here, not in conftest.py, so that a test module can name the type: ``from conftest import``
finds whichever conftest.py was imported last (tests/cockpit/ and tests/gateway/ have
their own)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import models as gen


class Models:
    """Paths (str) of the generated GGUF fixtures, each a cached property written on
    first use; ``dir`` is the directory that holds them all."""

    def __init__(self, root: Path) -> None:
        self.dir = root

    def _new(self, name: str, write: Callable[..., Path], *args: Any, **kw: Any) -> str:
        """Write ``name`` in ``dir`` with ``write(path, *args, **kw)``."""
        return str(write(self.dir / name, *args, **kw))

    def _edit(self, name: str, write: Callable[..., Path], src: str, *args: Any) -> str:
        """Write ``name`` in ``dir`` as an edit of ``src``: ``write(src, path, *args)``."""
        return str(write(src, self.dir / name, *args))

    # loadable by the real llama-server b11434
    @functools.cached_property
    def llama(self) -> str:
        """Plain llama, 2 layers, byte-level SPM tokenizer, chat template (~0.5 MB)."""
        return self._new("llama.gguf", gen.write_llama)

    @functools.cached_property
    def llama_long(self) -> str:
        """The plain llama trained (so its header says) for a 32k context: the engine caps
        a slot's context at the training length, and the bench's depth needs 16k."""
        return self._new("llama-long.gguf", gen.write_llama, context_length=32768)

    @functools.cached_property
    def draft(self) -> str:
        """One-layer llama with the same tokenizer: a draft model for `llama`."""
        return self._new("draft.gguf", gen.write_draft)

    @functools.cached_property
    def mtp_full(self) -> str:
        """glm4moe trunk + NextN head in one file: draft-mtp drafts, all accepted."""
        return self._new("glm4moe-mtp-full.gguf", gen.write_glm4moe_mtp, part="full")

    @functools.cached_property
    def mtp_full_disagree(self) -> str:
        """Like mtp_full, but head and trunk disagree: drafts (nearly) all rejected."""
        return self._new("glm4moe-mtp-disagree.gguf", gen.write_glm4moe_mtp, part="full",
                         agree=False)

    @functools.cached_property
    def mtp_trunk(self) -> str:
        """Key nextn_predict_layers=1 but no head tensors: draft-mtp aborts the engine."""
        return self._new("glm4moe-trunk.gguf", gen.write_glm4moe_mtp, part="trunk")

    @functools.cached_property
    def mtp_head(self) -> str:
        """The NextN head alone, published apart (-md mtp-tiny.gguf)."""
        return self._new("mtp-tiny.gguf", gen.write_glm4moe_mtp, part="head")

    @functools.cached_property
    def mtp_plain(self) -> str:
        """glm4moe without any head, nextn_predict_layers=0."""
        return self._new("glm4moe-plain.gguf", gen.write_glm4moe_mtp, part="plain")

    # header fixtures for the probe (not meant to load)
    @functools.cached_property
    def llama_nextn(self) -> str:
        """llama with llama.nextn_predict_layers=1 and the blk.1.nextn.* tensors
        (header only: llama-server refuses to load it)."""
        return self._new("llama-nextn.gguf", gen.write_llama_nextn)

    @functools.cached_property
    def llama_nextn_keyonly(self) -> str:
        """llama with llama.nextn_predict_layers=1 but no nextn tensor."""
        return self._new("llama-nextn-keyonly.gguf", gen.write_llama_nextn, with_tensor=False)

    @functools.cached_property
    def eagle3(self) -> str:
        """An EAGLE-3 head (arch eagle3): a sidecar, not a model of its own."""
        return self._new("eagle3-head.gguf", gen.write_eagle3)

    @functools.cached_property
    def hybrid(self) -> str:
        """qwen3next: hybrid by llama.cpp's arch list (and by its keys)."""
        return self._new("qwen3next-hybrid.gguf", gen.write_hybrid)

    @functools.cached_property
    def hybrid_by_keys(self) -> str:
        """An arch unknown to b11434 that is hybrid by its SSM + attention keys."""
        return self._new("futurehybrid.gguf", gen.write_hybrid_by_keys)

    @functools.cached_property
    def mamba(self) -> str:
        """Pure recurrent (mamba): not hybrid."""
        return self._new("mamba.gguf", gen.write_mamba)

    @functools.cached_property
    def qwen4exp(self) -> str:
        """qwen4exp (hybrid in b11434) with its MTP head tensor."""
        return self._new("qwen4exp.gguf", gen.write_qwen4exp)

    @functools.cached_property
    def qwen4exp_no_nextn(self) -> str:
        return self._new("qwen4exp-no-nextn.gguf", gen.write_qwen4exp, with_nextn=False)

    @functools.cached_property
    def qwen_scale(self) -> str:
        """151k vocab + 151k merges + 675 tensor infos (~5 MB, ~1 s to write)."""
        return self._new("qwen-scale.gguf", gen.write_qwen_scale)

    @functools.cached_property
    def v2(self) -> str:
        """`llama` with its version field set to 2 (same layout: a valid GGUF v2)."""
        return self._edit("llama-v2.gguf", gen.write_version, self.llama, 2)

    # broken files: each must give a ModelError naming the file
    @functools.cached_property
    def truncated_header(self) -> str:
        """`llama` cut inside its token list."""
        return self._edit("truncated-header.gguf", gen.write_truncated, self.llama, 2000)

    @functools.cached_property
    def truncated_data(self) -> str:
        """`llama` with a whole header but its last tensor cut short (a partial download)."""
        size = os.path.getsize(self.llama)
        return self._edit("truncated-data.gguf", gen.write_truncated, self.llama, size - 1000)

    @functools.cached_property
    def truncated_tiny(self) -> str:
        """The first 10 bytes of `llama`: magic and half a version."""
        return self._edit("truncated-tiny.gguf", gen.write_truncated, self.llama, 10)

    @functools.cached_property
    def bad_magic(self) -> str:
        return self._edit("bad-magic.gguf", gen.write_bad_magic, self.llama)

    @functools.cached_property
    def version7(self) -> str:
        return self._edit("version7.gguf", gen.write_version, self.llama, 7)

    @functools.cached_property
    def version1(self) -> str:
        return self._edit("version1.gguf", gen.write_version, self.llama, 1)

    @functools.cached_property
    def big_endian(self) -> str:
        return self._new("big-endian.gguf", gen.write_big_endian)

    @functools.cached_property
    def bad_string_length(self) -> str:
        """The general.architecture string claims 2**60 bytes."""
        return self._edit("bad-string-length.gguf", gen.write_bad_string_length, self.llama)

    @functools.cached_property
    def string_past_eof(self) -> str:
        """The general.architecture string claims just more bytes than the file has."""
        size = os.path.getsize(self.llama)
        return self._edit("string-past-eof.gguf", gen.write_bad_string_length, self.llama,
                          size)

    @functools.cached_property
    def huge_tensor_count(self) -> str:
        return self._edit("huge-tensor-count.gguf", gen.write_tensor_count, self.llama, 2**40)

    @functools.cached_property
    def huge_kv_count(self) -> str:
        return self._edit("huge-kv-count.gguf", gen.write_kv_count, self.llama, 2**40)

    @functools.cached_property
    def overlapping_tensors(self) -> str:
        """blk.0.attn_q.weight claims 64x longer rows: it runs into the next tensor."""
        return str(gen.write_tensor_shape(self.llama, self.dir / "overlap.gguf",
                                          "blk.0.attn_q.weight", dim0=4096))

    @functools.cached_property
    def implausible_tensor_size(self) -> str:
        """The tensor stored last claims exabytes of data."""
        return str(gen.write_tensor_shape(self.llama, self.dir / "huge-tensor.gguf",
                                          "blk.1.ffn_down.weight", dim0=2**60))

    @functools.cached_property
    def too_many_dims(self) -> str:
        return str(gen.write_tensor_shape(self.llama, self.dir / "too-many-dims.gguf",
                                          "output.weight", n_dims=9))

    @functools.cached_property
    def empty(self) -> str:
        return self._new("empty.gguf", gen.write_empty)

    @functools.cached_property
    def zip(self) -> str:
        """A ZIP archive under a .gguf name."""
        return self._new("zipped.gguf", gen.write_zip)

    @functools.cached_property
    def lfs_pointer(self) -> str:
        """A Git LFS pointer file (a clone without git-lfs)."""
        return self._new("lfs-pointer.gguf", gen.write_lfs_pointer)

    @functools.cached_property
    def html(self) -> str:
        """An HTML error page saved as the model."""
        return self._new("error-page.gguf", gen.write_html)

    @property
    def missing(self) -> str:
        """A path where no file exists."""
        return str(self.dir / "no-such-model.gguf")

    # short names for the usual cases
    @property
    def truncated(self) -> str:
        """A partial download: `truncated_data`."""
        return self.truncated_data

    @property
    def corrupt_magic(self) -> str:
        """Not a GGUF file: `bad_magic`."""
        return self.bad_magic
