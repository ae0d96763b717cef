"""GGUF header probe: what the plan needs to know about a model file.

This is a reader of our own for the GGUF container format, versions 2 and 3,
little-endian, as specified in https://github.com/ggml-org/ggml/blob/master/docs/gguf.md:

    header        magic "GGUF", version u32, tensor_count u64, kv_count u64
    kv pairs      key (string), value type u32, value
    tensor infos  name (string), n_dims u32, dims u64[n_dims], ggml type u32, offset u64
    padding       up to general.alignment (default 32)
    tensor data

(strings are a u64 byte length followed by UTF-8 bytes, not NUL-terminated.)

Why not gguf.GGUFReader: it memory-maps the file and builds numpy views for
every element of every array, so a Qwen-scale header (151k-token vocab plus
151k merges) takes seconds. The plan only needs a dozen values, so this reader
walks the header in large buffered blocks, seeks past fixed-size arrays, skips
string arrays by reading only their length fields, and decodes only the
values it keeps. It never trusts a count or a length before bounding it by
what is left in the file, and it checks that the tensor data the header
describes fits in the file (a partial download usually has a whole header), so
a corrupt or half-downloaded file gives a ModelError naming the file and the
problem, never a MemoryError, a hang or another exception.

What it reports (see ModelInfo):
  - the MTP (NextN) head is detected by its tensor, ``blk.{block_count-1}.nextn.eh_proj``,
    not by ``<arch>.nextn_predict_layers``: llama.cpp b11434 aborts with
    ``GGML_ASSERT(layer.nextn.eh_proj ...)`` when asked for draft-mtp on a file whose key
    says 1 but whose head tensors were stripped.
  - hybrid (attention plus recurrent layers) is true when either
      * the architecture is in llama.cpp's own list, ``llm_arch_is_hybrid()`` in
        ``src/llama-arch.cpp`` of b11434 (copied into HYBRID_ARCHS below), or
      * for an architecture that list does not know yet, the file carries keys of a
        recurrent block (``<arch>.ssm.*``, ``<arch>.wkv.*``, ``<arch>.shortconv.*``,
        ``<arch>.kda.*`` or ``<arch>.full_attention_interval``) together with attention
        heads (``<arch>.attention.head_count`` > 0, scalar or per-layer array).
    The list is what the engine we ship acts on; the key rule keeps a newer hybrid
    arch from being treated as plain attention by an older lokid. Pure recurrent
    models (mamba, rwkv) write ``attention.head_count = 0``, so the key rule leaves
    them out, as llama.cpp does. In b11434 the two rules agree on every converter.
  - the shape the memory estimate needs (lokid.core.place.estimate, issue 29): embedding
    length, heads, key/value head lengths, feed-forward length, the vocabulary (from
    ``token_embd``'s shape, which is cheaper than counting the token list and is what the
    engine sizes its logits by), and the tensor bytes already computed for the
    partial-download check, summed: per block ``blk.N.*`` (indexed by N), token_embd,
    the rest outside blocks (output, output_norm...), and the largest block tensor.
    Per-layer arrays (``head_count_kv = [8, 0, 8, ...]`` in hybrids, OpenELM's varying
    heads) keep both the maximum and the per-layer tuple: the maximum answers "how big
    can one layer be", the tuple makes the KV estimate exact where layers differ.
"""

from __future__ import annotations

import os
import stat
import struct
import threading
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import ModelError
from ..record import replace
from .archs import HYBRID_ARCHS, RECURRENT_KEY_PREFIXES
from .ggmltypes import GGML_BLOCKS
from .notgguf import not_gguf


@dataclass(frozen=True)
class ModelInfo:
    """What lokid knows about one GGUF file, read from its header only."""

    path: str
    file_size: int
    arch: str                      # general.architecture, "" when absent
    name: str                      # general.name, "" when absent
    block_count: int               # <arch>.block_count, 0 when absent
    context_length: int            # <arch>.context_length, 0 when absent
    nextn_predict_layers: int      # <arch>.nextn_predict_layers, 0 when absent
    has_nextn_tensor: bool         # tensor blk.{block_count-1}.nextn.eh_proj(.weight) is present
    hybrid: bool                   # attention + recurrent (SSM/linear-attention) layers
    tensor_count: int
    # The shape, for the memory estimate (0 / () when the file does not say).
    n_embd: int = 0                # <arch>.embedding_length
    n_ff: int = 0                  # <arch>.feed_forward_length, max over layers
    n_vocab: int = 0               # token_embd's second dimension
    head_count: int = 0            # <arch>.attention.head_count, max over layers
    head_count_kv: int = 0         # <arch>.attention.head_count_kv, max over layers
    head_count_kv_per_layer: tuple[int, ...] = ()   # only when the file stores an array
    key_length: int = 0            # <arch>.attention.key_length, else n_embd / head_count
    value_length: int = 0          # <arch>.attention.value_length, else n_embd / head_count
    # Tensor data bytes (types this reader knows; a newer type counts 0).
    weight_bytes: int = 0          # every tensor
    block_bytes: tuple[int, ...] = ()   # blk.N.* summed, index N
    token_embd_bytes: int = 0      # token_embd.weight (llama.cpp keeps it on the host)
    output_bytes: int = 0          # every other tensor outside blocks: output, output_norm...
    output_tied: bool = False      # no output.weight: the engine copies token_embd there
    max_block_tensor_bytes: int = 0   # largest single tensor in a block


_MAGIC = b"GGUF"
_SUPPORTED_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_CHUNK = 1 << 20                   # one read() per MiB keeps syscalls negligible
# Sanity caps: far above any real model, far below what would exhaust memory.
_MAX_TENSORS = 1 << 20
_MAX_KV = 1 << 20
_MAX_STRING = 1 << 30              # GGUF_MAX_STRING_LENGTH in ggml/src/gguf.cpp
_MAX_ARRAY = 1 << 30               # GGUF_MAX_ARRAY_ELEMENTS in ggml/src/gguf.cpp
# A size past the end of the file is a partial download unless it is beyond any real
# model file (1 PiB): then the field holding it is garbage.
_IMPLAUSIBLE_BYTES = 1 << 50
_MAX_KEY = 1 << 16                 # the spec caps keys at 65535 bytes
_MAX_TENSOR_NAME = 63              # GGML_MAX_NAME - 1: llama.cpp refuses longer names
_MAX_DIMS = 4                      # GGML_MAX_DIMS
_MAX_NESTING = 4                   # arrays of arrays: the spec allows them, nobody nests deeper
_MIN_KV_BYTES = 8 + 4 + 1          # empty key, type, one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")
# Tensor info tail per n_dims: dims, ggml type, data offset.
_TENSOR_TAIL = [struct.Struct(f"<{n}QIQ") for n in range(_MAX_DIMS + 1)]

# GGUF value type id -> how a scalar of it is stored; 8 is a string, 9 an array.
_STRING, _ARRAY = 8, 9
_SCALARS: dict[int, struct.Struct] = {
    0: struct.Struct("<B"), 1: struct.Struct("<b"), 2: struct.Struct("<H"),
    3: struct.Struct("<h"), 4: struct.Struct("<I"), 5: struct.Struct("<i"),
    6: struct.Struct("<f"), 7: struct.Struct("<?"), 10: struct.Struct("<Q"),
    11: struct.Struct("<q"), 12: struct.Struct("<d"),
}
_INTEGER_TYPES = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
_UINT32 = 4

# Per-layer integer keys (scalar or array), kept as max and, for arrays, per layer.
_PER_LAYER_SUFFIXES = (".attention.head_count", ".attention.head_count_kv",
                       ".feed_forward_length")
# Keys whose string values we keep; every other string is skipped unread.
_WANTED_STRINGS = frozenset({"general.architecture", "general.name"})


class _Cursor:
    """Sequential reader over one open file, refilled in _CHUNK-sized blocks.

    ``buf`` holds the file bytes [base, base + len(buf)) and ``pos`` indexes into
    it; the file position is always base + len(buf), so a refill is one read().
    """

    __slots__ = ("f", "path", "size", "buf", "base", "pos")

    def __init__(self, f: BinaryIO, path: str, size: int) -> None:
        self.f = f
        self.path = path
        self.size = size
        self.buf = b""
        self.base = 0
        self.pos = 0

    def tell(self) -> int:
        return self.base + self.pos

    def left(self) -> int:
        return self.size - self.base - self.pos

    def corrupt(self, what: str) -> ModelError:
        return ModelError(f"{self.path}: corrupt GGUF file: {what}")

    def past_end(self, what: str, nbytes: int) -> ModelError:
        """The error for an item that does not fit in what is left of the file."""
        at = self.tell()
        if nbytes >= _IMPLAUSIBLE_BYTES:
            return self.corrupt(f"{what} at byte {at} claims {nbytes} bytes, "
                                "an implausible size")
        return ModelError(
            f"{self.path}: truncated at byte {self.size} (file is a partial download?): "
            f"{what} at byte {at} needs {nbytes} bytes, only {self.left()} left"
        )

    def need(self, n: int, what: str) -> None:
        """Make buf[pos:pos+n] available, or fail saying what was being read."""
        if len(self.buf) - self.pos >= n:
            return
        if n > self.left():
            raise self.past_end(what, n)
        tail = self.buf[self.pos:]
        more = self.f.read(max(n - len(tail), _CHUNK))
        self.base += self.pos
        self.pos = 0
        self.buf = tail + more
        if len(self.buf) < n:
            # The file shrank after we measured it (still being written or replaced).
            raise ModelError(f"{self.path}: truncated at byte {self.base + len(self.buf)} "
                             "while reading (file changed during the probe?)")

    def seek(self, offset: int) -> None:
        """Move to absolute ``offset`` (at most the file size), keeping the block if it
        is still inside it."""
        rel = offset - self.base
        if 0 <= rel <= len(self.buf):
            self.pos = rel
            return
        self.f.seek(offset)
        self.buf = b""
        self.base = offset
        self.pos = 0

    def skip(self, n: int, what: str) -> None:
        if n <= len(self.buf) - self.pos:
            self.pos += n
            return
        if n > self.left():
            raise self.past_end(what, n)
        self.seek(self.tell() + n)

    def u32(self, what: str) -> int:
        if len(self.buf) - self.pos < 4:
            self.need(4, what)
        value: int = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return value

    def u64(self, what: str) -> int:
        if len(self.buf) - self.pos < 8:
            self.need(8, what)
        value: int = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return value

    def string_length(self, what: str, limit: int = _MAX_STRING) -> int:
        n = self.u64(f"{what} length")
        if n > limit:
            raise self.corrupt(f"{what} at byte {self.tell() - 8} claims to be {n} bytes long "
                               f"(the limit is {limit})")
        if n > self.left():
            raise self.past_end(what, n)
        return n

    def raw(self, n: int, what: str) -> bytes:
        self.need(n, what)
        data = self.buf[self.pos:self.pos + n]
        self.pos += n
        return data

    def skip_strings(self, count: int, what: str) -> None:
        """Skip ``count`` strings, reading only their length fields.

        This loop is where a big vocabulary costs time, so it runs on locals only
        and does no bounds check per string: a string may end past the block (the
        offset stays right, we seek there) and a length field may straddle the
        block end (unpack_from raises, we refill). Whether anything ran past the
        end of the file is checked once per block.
        """
        unpack = _U64.unpack_from
        left = count
        while left:
            if len(self.buf) - self.pos < 8:
                self.need(8, f"length of {what}")
            buf = self.buf
            start = pos = self.pos
            done = 0
            try:
                for done in range(left):  # noqa: B007 - ``done`` counts the strings skipped
                    pos += unpack(buf, pos)[0] + 8
                else:
                    done = left
            except (struct.error, OverflowError):
                # The length field at ``pos`` is not wholly in this block (or a garbage
                # length sent ``pos`` beyond what an offset can be).
                pass
            if self.base + pos > self.size:
                # One of these ``done`` strings overruns the file: walk them again
                # with full checks, which raises the precise error.
                self.pos = start
                for _ in range(done):
                    self.skip(self.string_length(what), what)
                raise self.corrupt(f"{what} runs past the end of the file")
            left -= done
            self.seek(self.base + pos)


def _shown(text: str, limit: int = 64) -> str:
    """``text`` quoted for a message: escaped, and cut short when garbage made it long."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _read_value(cur: _Cursor, vtype: int, key: str, keep: bool) -> object:
    """Read or skip one value of GGUF type ``vtype``; return it only when ``keep``.

    ``key`` is the key as shown in messages (see _shown).
    """
    scalar = _SCALARS.get(vtype)
    if scalar is not None:
        if not keep:
            cur.skip(scalar.size, f"value of key {key}")
            return None
        cur.need(scalar.size, f"value of key {key}")
        value: object = scalar.unpack_from(cur.buf, cur.pos)[0]
        cur.pos += scalar.size
        return value
    if vtype == _STRING:
        n = cur.string_length(f"string value of key {key}")
        if not keep:
            cur.skip(n, f"string value of key {key}")
            return None
        return cur.raw(n, f"string value of key {key}").decode("utf-8", "replace")
    if vtype == _ARRAY:
        return _read_array(cur, key, keep, 1)
    raise cur.corrupt(f"key {key} has unknown value type {vtype} (at byte {cur.tell() - 4})")


def _read_array(cur: _Cursor, key: str, keep: bool, depth: int) -> object:
    """Skip an array, or (``keep``) return it when it holds integers; else None."""
    what = f"array value of key {key}"
    if depth > _MAX_NESTING:
        raise cur.corrupt(f"{what} nests arrays {depth} deep")
    item_type = cur.u32(f"{what} item type")
    count = cur.u64(f"{what} length")
    if count > _MAX_ARRAY:
        raise cur.corrupt(f"{what} at byte {cur.tell() - 8} claims {count} items "
                          f"(the limit is {_MAX_ARRAY})")
    scalar = _SCALARS.get(item_type)
    if scalar is not None:
        nbytes = count * scalar.size
        if nbytes > cur.left():
            raise cur.past_end(f"{what} ({count} items)", nbytes)
        if keep and item_type in _INTEGER_TYPES and count <= _MAX_KV:
            cur.need(nbytes, what)
            items = struct.unpack_from(f"<{count}{scalar.format[1:]}", cur.buf, cur.pos)
            cur.pos += nbytes
            return list(items)
        cur.skip(nbytes, what)
        return None
    if item_type == _STRING:
        if count * 8 > cur.left():
            raise cur.past_end(f"{what} ({count} strings)", count * 8)
        cur.skip_strings(count, f"string in {what}")
        return None
    if item_type == _ARRAY:
        if count * 12 > cur.left():
            raise cur.past_end(f"{what} ({count} arrays)", count * 12)
        for _ in range(count):
            _read_array(cur, key, False, depth + 1)
        return None
    raise cur.corrupt(f"{what} has unknown item type {item_type} (at byte {cur.tell() - 12})")


def _read_header(f: BinaryIO, path: str, size: int) -> ModelInfo:
    cur = _Cursor(f, path, size)
    if size == 0:
        raise ModelError(f"{path}: empty file (0 bytes), not a GGUF model")
    cur.need(min(size, 64), "file start")
    head = cur.buf[:64]
    if head[:4] != _MAGIC:
        if size < len(_MAGIC) and _MAGIC.startswith(head):
            raise cur.past_end("GGUF magic", len(_MAGIC))
        raise not_gguf(path, head)
    if size < _HEADER.size:
        raise cur.past_end("GGUF header", _HEADER.size)
    _, version, n_tensors, n_kv = _HEADER.unpack_from(cur.buf, 0)
    cur.pos = _HEADER.size
    if version not in _SUPPORTED_VERSIONS:
        swapped = int.from_bytes(head[4:8], "big")
        if version & 0xFFFF == 0 and swapped in _SUPPORTED_VERSIONS:
            raise ModelError(f"{path}: big-endian GGUF (version {swapped}) is not supported, "
                             "lokid and llama.cpp on this host read little-endian files")
        raise ModelError(f"{path}: unsupported GGUF version {version} "
                         f"(lokid reads versions {' and '.join(map(str, _SUPPORTED_VERSIONS))})")
    if n_tensors > _MAX_TENSORS:
        raise cur.corrupt(f"implausible tensor count {n_tensors} (at byte 8)")
    if n_kv > _MAX_KV:
        raise cur.corrupt(f"implausible key/value count {n_kv} (at byte 16)")
    least = n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES
    if least > cur.left():
        raise cur.past_end(f"header of {n_kv} keys and {n_tensors} tensor infos", least)

    # Key/value pairs. Integers are cheap to keep; strings and arrays are decoded only
    # for the few keys the plan reads (the arch is not known until its key is read).
    ints: dict[str, int] = {}
    strs: dict[str, str] = {}
    head_counts: dict[str, int] = {}   # "<arch>.attention.head_count(_kv)" -> max over layers
    per_layer: dict[str, tuple[int, ...]] = {}   # the same keys, when stored as an array
    keys: list[str] = []
    seen: set[str] = set()
    for i in range(n_kv):
        what = f"key #{i}"
        klen = cur.string_length(what, _MAX_KEY)
        key = cur.raw(klen, what).decode("utf-8", "replace")
        shown = _shown(key)
        if key in seen:
            raise cur.corrupt(f"duplicate key {shown}")
        seen.add(key)
        keys.append(key)
        vtype = cur.u32(f"value type of key {shown}")
        is_head_count = key.endswith(_PER_LAYER_SUFFIXES)
        keep = (vtype in _INTEGER_TYPES or key in _WANTED_STRINGS
                or (vtype == _ARRAY and is_head_count))
        value = _read_value(cur, vtype, shown, keep)
        if isinstance(value, str) and vtype == _STRING:
            strs[key] = value
        elif vtype in _INTEGER_TYPES and isinstance(value, int):
            ints[key] = value
            if key == "general.alignment" and vtype != _UINT32:
                raise cur.corrupt(f"general.alignment must be a uint32 (it has type {vtype})")
        if is_head_count:
            if isinstance(value, int):
                head_counts[key] = value
            elif isinstance(value, list):
                head_counts[key] = max((int(v) for v in value), default=0)
                per_layer[key] = tuple(int(v) for v in value)

    arch = strs.get("general.architecture", "")
    block_count = ints.get(f"{arch}.block_count", 0)
    alignment = ints.get("general.alignment", _DEFAULT_ALIGNMENT)
    if alignment <= 0 or alignment & (alignment - 1):
        raise cur.corrupt(f"general.alignment {alignment} is not a power of 2")

    # Tensor infos: names are compared as bytes, never decoded.
    last = block_count - 1
    nextn_names = (
        {f"blk.{last}.nextn.eh_proj.weight".encode(), f"blk.{last}.nextn.eh_proj".encode()}
        if block_count > 0 else set()
    )
    has_nextn = False
    names: set[bytes] = set()
    blocks: dict[int, int] = {}        # N -> bytes of blk.N.*
    token_embd = outside = largest = n_vocab = 0
    extents: list[tuple[int, int, str]] = []   # (offset, end, label), in the data section
    for i in range(n_tensors):
        what = f"tensor info #{i}"
        nlen = cur.string_length(f"{what} name")
        name = cur.raw(nlen, f"{what} name")
        label = _shown(name.decode("utf-8", "replace"))
        if nlen > _MAX_TENSOR_NAME:
            raise cur.corrupt(f"tensor name {label} is {nlen} bytes long "
                              f"(llama.cpp allows {_MAX_TENSOR_NAME})")
        if name in names:
            raise cur.corrupt(f"duplicate tensor {label}")
        names.add(name)
        n_dims = cur.u32(f"dimension count of tensor {label}")
        if n_dims > _MAX_DIMS:
            raise cur.corrupt(f"tensor {label} has {n_dims} dimensions "
                              f"(at most {_MAX_DIMS}), at byte {cur.tell() - 4}")
        tail = _TENSOR_TAIL[n_dims]
        cur.need(tail.size, f"shape of tensor {label}")
        *dims, ggml_type, offset = tail.unpack_from(cur.buf, cur.pos)
        cur.pos += tail.size
        if name in nextn_names:
            has_nextn = True
        block = GGML_BLOCKS.get(ggml_type)
        if block is not None:
            elements = 1
            for d in dims[1:]:
                elements *= d
            ne0 = dims[0] if dims else 1
            nbytes = -(-ne0 // block[0]) * block[1] * elements
            extents.append((offset, offset + nbytes, label))
        else:
            nbytes = 0
            extents.append((offset, offset, label))   # size unknown: only its start counts
        if name.startswith(b"blk."):
            dot = name.find(b".", 4)
            digits = name[4:dot] if dot > 4 else b""
            if digits.isdigit() and len(digits) <= 4:   # no model has 10,000 blocks
                n = int(digits)
                blocks[n] = blocks.get(n, 0) + nbytes
                largest = max(largest, nbytes)
            else:
                outside += nbytes      # "blk.x.y": not a block llama.cpp would place
        elif name == b"token_embd.weight":
            token_embd = nbytes
            n_vocab = dims[1] if len(dims) > 1 else 0
        else:
            outside += nbytes

    # The data section. Tensors may be stored in any order but never overlap: an
    # overlap means a shape or offset field is garbage, which must not pass for a
    # partial download. What extends past the end of the file is then truncation.
    if extents:
        extents.sort()
        for (_, end, label), (start, _, after) in zip(extents, extents[1:], strict=False):
            if end > start:
                raise cur.corrupt(f"tensors {label} and {after} overlap in the data section "
                                  "(a shape or offset field is garbage)")
        data_start = -(-cur.tell() // alignment) * alignment
        _, data_end, label = max(extents, key=lambda e: e[1])
        if data_end >= _IMPLAUSIBLE_BYTES:
            raise cur.corrupt(f"tensor {label} claims data up to byte {data_end} "
                              "of the data section, an implausible size")
        if data_start + data_end > size:
            raise ModelError(
                f"{path}: truncated at byte {size} (file is a partial download?): "
                f"the data of tensor {label} ends at byte {data_start + data_end}"
            )

    prefix = arch + "."
    recurrent_keys = bool(arch) and any(
        k.startswith(prefix) and k[len(prefix):].startswith(RECURRENT_KEY_PREFIXES)
        for k in keys)
    attention = head_counts.get(f"{prefix}attention.head_count", 0) > 0
    n_embd = ints.get(f"{prefix}embedding_length", 0)
    n_head = head_counts.get(f"{prefix}attention.head_count", 0)
    head_len = n_embd // n_head if n_head > 0 else 0
    n_ff = head_counts.get(f"{prefix}feed_forward_length", 0)
    weights = sum(blocks.values()) + token_embd + outside
    return ModelInfo(
        path=path,
        file_size=size,
        arch=arch,
        name=strs.get("general.name", ""),
        block_count=block_count,
        context_length=ints.get(f"{arch}.context_length", 0),
        nextn_predict_layers=ints.get(f"{arch}.nextn_predict_layers", 0),
        has_nextn_tensor=has_nextn,
        hybrid=arch in HYBRID_ARCHS or (recurrent_keys and attention),
        tensor_count=n_tensors,
        n_embd=n_embd,
        n_ff=n_ff,
        n_vocab=n_vocab,
        head_count=n_head,
        head_count_kv=head_counts.get(f"{prefix}attention.head_count_kv", n_head),
        head_count_kv_per_layer=per_layer.get(f"{prefix}attention.head_count_kv", ()),
        key_length=ints.get(f"{prefix}attention.key_length", head_len),
        value_length=ints.get(f"{prefix}attention.value_length", head_len),
        weight_bytes=weights,
        block_bytes=tuple(blocks.get(n, 0) for n in range(max(blocks) + 1)) if blocks else (),
        token_embd_bytes=token_embd,
        output_bytes=outside,
        output_tied=b"output.weight" not in names,
        max_block_tensor_bytes=largest,
    )


def _probe_uncached(path: str) -> tuple[ModelInfo, tuple[str, int, int]]:
    """Read the header of ``path``; also return the cache key of what was read."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except FileNotFoundError:
        raise ModelError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:     # ValueError: a NUL byte in the path
        raise ModelError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    if not stat.S_ISREG(st.st_mode):
        # Opening a FIFO or a device would block or read forever.
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ModelError(f"{path}: {kind}, not a GGUF model file")
    try:
        with open(real, "rb") as f:
            st = os.fstat(f.fileno())
            info = _read_header(f, path, st.st_size)
    except OSError as e:
        raise ModelError(f"{path}: cannot read ({e.strerror or e})") from None
    except ModelError:
        raise
    except Exception as e:
        # Every bound above should make this unreachable; should a bug slip through,
        # it still surfaces as a model error, not as a crash of a caller (the daemon)
        # that handles ModelError. The fuzz tests fail on this message.
        raise ModelError(f"{path}: unreadable GGUF header "
                         f"(internal error {type(e).__name__}: {e})") from None
    return info, (real, st.st_size, st.st_mtime_ns)


_CACHE_MAX = 256
_cache: dict[tuple[str, int, int], ModelInfo] = {}
_cache_lock = threading.Lock()


def probe_model(path: str | os.PathLike[str]) -> ModelInfo:
    """Read the GGUF header of ``path``; raise lokid.core.errors.ModelError on bad input.

    Results are cached by (real path, size, mtime): a file that is replaced or
    still growing is read again, an unchanged one is not.
    """
    spath = os.fspath(path)
    try:
        real = os.path.realpath(spath)
        st = os.stat(real)
        key: tuple[str, int, int] | None = (real, st.st_size, st.st_mtime_ns)
    except (OSError, ValueError):
        key = None                     # _probe_uncached turns this into the right ModelError
    with _cache_lock:
        hit = _cache.get(key) if key is not None else None
    if hit is not None:
        return hit if hit.path == spath else replace(hit, path=spath)
    info, read_key = _probe_uncached(spath)
    with _cache_lock:
        _cache.pop(read_key, None)     # re-insert at the end: eviction is oldest-first
        _cache[read_key] = info
        while len(_cache) > _CACHE_MAX:
            del _cache[next(iter(_cache))]
    return info


def clear_cache() -> None:
    """Forget every cached probe (tests and benchmarks measure the uncached path)."""
    with _cache_lock:
        _cache.clear()
