"""What a preset's model can do for a client, and how much context it has: the
``capabilities`` and ``context_length`` that ``/v1/models`` gives (issue 46, item 5).

Read from the plan's command line and the GGUF's keys, as llama-server b11434 decides
them, so that a model picker never offers what the engine would refuse:

- ``completion``: any generative model. An engine started with ``--embedding(s)`` or
  ``--rerank(ing)`` is "restricted to the embedding use case" (its own help), and a
  model whose GGUF sets ``<arch>.pooling_type`` (mean, cls, last, rank) is an embedding
  or reranking model: neither completes text.
- ``chat``: completion, and a chat template (the GGUF's ``tokenizer.chat_template`` or
  ``--chat-template(-file)``): without one a chat request gets a template guessed for it.
- ``tools``: chat, the jinja engine on (the server's default; ``--no-jinja`` turns it off)
  and a template that mentions ``tools``: function calls are parsed only then.
- ``infill``: completion, and the GGUF's fill-in-the-middle tokens (``fim_pre/suf/mid``,
  or the older ``prefix/suffix/middle`` ids): /infill refuses a model without all three.
- ``embeddings``: ``--embedding(s)`` (the server answers /embeddings only with it), or an
  embedding model (pooling set in the GGUF).
- ``rerank``: ``--rerank(ing)``, ``--pooling rank``, or a GGUF whose pooling is rank.
- ``vision``: a projector given (``--mmproj``/``-mm``).

``context_length``: the plan's ``-c``/``--ctx-size`` when it fixes one (above 0), else
the model's training context (``<arch>.context_length``), 0 when neither says.

The GGUF's keys are read once per file version (:func:`read_traits`, cached by path, size
and mtime like :func:`lokid.core.model.modelinfo.probe_model`), within the same bounds as its
reader, whose cursor it uses: the key/value section only, a chat template decoded only up
to :data:`MAX_TEMPLATE` bytes (a larger one counts as present, tools not known), every
other string and array skipped by its length. A file that cannot be read gives
:data:`UNKNOWN` (the command line alone decides); the plan already said what is wrong
with it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from ..launch.flags import flag_value, flag_values
from .modelinfo import _STRING, _Cursor, _read_value

MAX_TEMPLATE = 1 << 20   # bytes of a chat template decoded (real ones: a few KiB)
_CACHE_MAX = 256
_FIM = (("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id",
         "tokenizer.ggml.fim_mid_token_id"),
        ("tokenizer.ggml.prefix_token_id", "tokenizer.ggml.suffix_token_id",
         "tokenizer.ggml.middle_token_id"))
_RANK = 4   # LLAMA_POOLING_TYPE_RANK; 1-3 are mean, cls, last; 0 none, -1 unspecified
CAPABILITIES = ("chat", "completion", "tools", "embeddings", "rerank", "infill", "vision")


@dataclass(frozen=True)
class Traits:
    """What the GGUF's keys say of a model's uses."""

    chat_template: bool = False
    template_tools: bool = False   # the template mentions "tools"
    fim: bool = False              # all three fill-in-the-middle token ids
    pooling: int = -1              # <arch>.pooling_type, -1 when absent
    context_length: int = 0        # <arch>.context_length, 0 when absent


UNKNOWN = Traits()
_cache: dict[tuple[str, int, int], Traits] = {}
_lock = threading.Lock()


def read_traits(path: str) -> Traits:
    """The traits of the GGUF at ``path`` (:data:`UNKNOWN` when it cannot be read)."""
    try:
        real = os.path.realpath(path)
        with open(real, "rb") as f:
            st = os.fstat(f.fileno())
            key = (real, st.st_size, st.st_mtime_ns)
            with _lock:
                hit = _cache.get(key)
            if hit is not None:
                return hit
            traits = _read(_Cursor(f, path, st.st_size))
    except Exception:   # OSError, ModelError, a bug: the command line alone decides
        return UNKNOWN
    with _lock:
        _cache[key] = traits
        while len(_cache) > _CACHE_MAX:
            del _cache[next(iter(_cache))]
    return traits


def _read(cur: _Cursor) -> Traits:
    cur.need(24, "GGUF header")
    if cur.buf[:4] != b"GGUF":
        return UNKNOWN
    n_kv = int.from_bytes(cur.buf[16:24], "little")
    cur.pos = 24
    ints: dict[str, int] = {}
    template: str | None = None
    arch = ""
    for i in range(n_kv):
        key = cur.raw(cur.string_length(f"key #{i}", 1 << 16), "key").decode("utf-8", "replace")
        vtype = cur.u32("value type")
        if key == "tokenizer.chat_template" and vtype == _STRING:
            n = cur.string_length("chat template")
            if n <= MAX_TEMPLATE:
                template = cur.raw(n, "chat template").decode("utf-8", "replace")
            else:
                cur.skip(n, "chat template")
                template = ""
            continue
        keep = key == "general.architecture" or vtype != _STRING
        value = _read_value(cur, vtype, key[:64], keep and vtype != 9)
        if key == "general.architecture" and isinstance(value, str):
            arch = value
        elif isinstance(value, int) and not isinstance(value, bool):
            ints[key] = value
    return Traits(chat_template=template is not None,
                  template_tools=template is not None and "tools" in template,
                  fim=any(all(k in ints for k in keys) for keys in _FIM),
                  pooling=ints.get(f"{arch}.pooling_type", -1),
                  context_length=max(0, ints.get(f"{arch}.context_length", 0)))


def capabilities(argv: Sequence[str], traits: Traits) -> list[str]:
    """What the engine run with ``argv`` on a model of ``traits`` can do, in the order of
    :data:`CAPABILITIES`."""
    args = list(argv)
    embedding_flag = any(a in ("--embedding", "--embeddings") for a in args)
    rerank_flag = any(a in ("--rerank", "--reranking") for a in args)
    pooling = flag_value(args, "--pooling")
    rerank = rerank_flag or pooling == "rank" or traits.pooling == _RANK
    embedding_model = traits.pooling > 0
    completion = not (embedding_flag or rerank_flag or embedding_model)
    template = traits.chat_template or bool(flag_values(args, "--chat-template",
                                                        "--chat-template-file"))
    given = flag_value(args, "--chat-template")
    if given is not None:
        tools_in_template = "tools" in given
    else:   # a template file is not read here: its tools are not claimed
        tools_in_template = traits.template_tools and not flag_values(
            args, "--chat-template-file")
    chat = completion and template
    have = {
        "chat": chat,
        "completion": completion,
        "tools": chat and "--no-jinja" not in args and tools_in_template,
        "embeddings": embedding_flag or rerank_flag or embedding_model,
        "rerank": rerank,
        "infill": completion and traits.fim,
        "vision": bool(flag_values(args, "--mmproj", "-mm")),
    }
    return [c for c in CAPABILITIES if have[c]]


def context_length(argv: Sequence[str], traits: Traits) -> int:
    """The context the engine run with ``argv`` has: its ``-c`` when above 0, else the
    model's training context (0: not known)."""
    value = flag_value(list(argv), "-c", "--ctx-size")
    if value is not None and value.isdigit() and int(value) > 0:
        return int(value)
    return traits.context_length
