"""lokid.core.model.modelinfo: the GGUF header probe, checked against gguf.GGUFReader.

Every generated fixture is probed and compared field by field with what the
gguf package's own (slow, complete) reader says about the same file; broken
files must give a ModelError naming the file and the problem, and nothing else.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import models as gen
from support.modelset import Models

from lokid.core.errors import ModelError
from lokid.core.model import modelinfo
from lokid.core.model.modelinfo import ModelInfo, probe_model


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    modelinfo.clear_cache()


def _field(reader: gguf.GGUFReader, key: str, default: Any) -> Any:
    field = reader.get_field(key)
    return default if field is None else field.contents()


def reader_view(path: str | Path) -> dict[str, Any]:
    """The ModelInfo fields, computed from gguf.GGUFReader's complete parse."""
    r = gguf.GGUFReader(path)
    arch = _field(r, "general.architecture", "")
    blocks = _field(r, f"{arch}.block_count", 0)
    names = {t.name for t in r.tensors}
    last = blocks - 1
    per_block: dict[int, int] = {}
    for t in r.tensors:
        part = t.name.split(".")
        if part[0] == "blk" and part[1].isdigit():
            per_block[int(part[1])] = per_block.get(int(part[1]), 0) + int(t.n_bytes)
    embd = [t for t in r.tensors if t.name == "token_embd.weight"]
    kv_heads = r.get_field(f"{arch}.attention.head_count_kv")
    per_layer = (tuple(int(v) for v in kv_heads.contents())
                 if kv_heads is not None and kv_heads.types[0] == gguf.GGUFValueType.ARRAY
                 else ())
    return {
        "n_embd": _field(r, f"{arch}.embedding_length", 0),
        "n_vocab": int(embd[0].shape[1]) if embd and len(embd[0].shape) > 1 else 0,
        "head_count_kv_per_layer": per_layer,
        "weight_bytes": sum(int(t.n_bytes) for t in r.tensors),
        "block_bytes": tuple(per_block.get(n, 0) for n in range(max(per_block, default=-1) + 1)),
        "token_embd_bytes": int(embd[0].n_bytes) if embd else 0,
        "output_tied": "output.weight" not in names,
        "file_size": os.path.getsize(path),
        "arch": arch,
        "name": _field(r, "general.name", ""),
        "block_count": blocks,
        "context_length": _field(r, f"{arch}.context_length", 0),
        "nextn_predict_layers": _field(r, f"{arch}.nextn_predict_layers", 0),
        "has_nextn_tensor": blocks > 0 and bool(
            {f"blk.{last}.nextn.eh_proj.weight", f"blk.{last}.nextn.eh_proj"} & names),
        "tensor_count": len(r.tensors),
    }


def probe_view(info: ModelInfo) -> dict[str, Any]:
    return {k: getattr(info, k) for k in (
        "file_size", "arch", "name", "block_count", "context_length",
        "nextn_predict_layers", "has_nextn_tensor", "tensor_count", "n_embd", "n_vocab",
        "head_count_kv_per_layer", "weight_bytes", "block_bytes", "token_embd_bytes",
        "output_tied")}


VALID = [
    "llama", "draft", "mtp_full", "mtp_full_disagree", "mtp_trunk", "mtp_head",
    "mtp_plain", "llama_nextn", "llama_nextn_keyonly", "eagle3", "hybrid",
    "hybrid_by_keys", "mamba", "qwen4exp", "qwen4exp_no_nextn", "v2",
    pytest.param("qwen_scale", marks=pytest.mark.slow),   # GGUFReader needs seconds on it
]


@pytest.mark.parametrize("fixture", VALID)
def test_probe_agrees_with_ggufreader(models: Models, fixture: str) -> None:
    path = getattr(models, fixture)
    info = probe_model(path)
    assert info.path == path
    assert probe_view(info) == reader_view(path)


# What each fixture is, independently of any reader: (arch, block_count,
# nextn_predict_layers, has_nextn_tensor, hybrid).
EXPECTED = {
    "llama": ("llama", 2, 0, False, False),
    "draft": ("llama", 1, 0, False, False),
    "mtp_full": ("glm4moe", 3, 1, True, False),
    "mtp_trunk": ("glm4moe", 3, 1, False, False),     # the key alone is no head
    "mtp_head": ("glm4moe", 3, 1, True, False),
    "mtp_plain": ("glm4moe", 2, 0, False, False),
    "llama_nextn": ("llama", 2, 1, True, False),
    "llama_nextn_keyonly": ("llama", 2, 1, False, False),
    "eagle3": ("eagle3", 1, 0, False, False),
    "hybrid": ("qwen3next", 4, 0, False, True),
    "hybrid_by_keys": ("futurehybrid", 4, 0, False, True),
    "mamba": ("mamba", 2, 0, False, False),            # recurrent, but no attention
    "qwen4exp": ("qwen4exp", 4, 1, True, True),
    "qwen4exp_no_nextn": ("qwen4exp", 4, 1, False, True),
    "v2": ("llama", 2, 0, False, False),
}


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_probe_reports_what_the_fixture_is(models: Models, fixture: str) -> None:
    info = probe_model(getattr(models, fixture))
    got = (info.arch, info.block_count, info.nextn_predict_layers, info.has_nextn_tensor,
           info.hybrid)
    assert got == EXPECTED[fixture]


@pytest.mark.slow
def test_qwen_scale_header(models: Models) -> None:
    info = probe_model(models.qwen_scale)
    assert (info.arch, info.block_count, info.tensor_count) == ("qwen3", 28, 675)
    assert info.file_size > 4_000_000          # the vocab really is in there


@pytest.mark.parametrize("chunk", [1, 7, 8, 64, 1000])
@pytest.mark.parametrize("fixture", ["llama", "mtp_full", "hybrid_by_keys", "eagle3"])
def test_block_size_does_not_change_the_result(models: Models, monkeypatch: pytest.MonkeyPatch,
                                               fixture: str, chunk: int) -> None:
    # Tiny blocks put every string, length field and tensor info across a block
    # boundary somewhere: the refill and seek paths must give the same answer.
    path = getattr(models, fixture)
    expected = modelinfo._probe_uncached(path)[0]
    monkeypatch.setattr(modelinfo, "_CHUNK", chunk)
    assert modelinfo._probe_uncached(path)[0] == expected


def test_strings_longer_than_a_block(tmp_path: Path) -> None:
    # Strings of several MiB: skipped by seeking, not read.
    path = gen.write_meta(tmp_path / "long.gguf", "llama", {
        "llama.block_count": 3,
        "tokenizer.chat_template": "x" * (3 << 20),
        "tokenizer.ggml.tokens": ["y" * 700_000] * 4 + ["z"] * 10,
        "llama.context_length": 777,
    }, ["output.weight"])
    info = probe_model(path)
    assert (info.block_count, info.context_length, info.tensor_count) == (3, 777, 1)
    assert probe_view(info) == reader_view(path)


# (fixture, fragments the message must contain besides the file name)
BROKEN = [
    ("missing", ["no such file"]),
    ("empty", ["empty file"]),
    ("zip", ["not a GGUF file (it does not begin", "ZIP archive"]),
    ("lfs_pointer", ["not a GGUF file", "Git LFS pointer"]),
    ("html", ["not a GGUF file", "HTML"]),
    ("bad_magic", ["not a GGUF file (it does not begin with \"GGUF\")"]),
    ("version7", ["unsupported GGUF version 7"]),
    ("version1", ["unsupported GGUF version 1"]),
    ("big_endian", ["big-endian GGUF (version 3) is not supported"]),
    ("huge_tensor_count", [f"implausible tensor count {2**40}"]),
    ("huge_kv_count", [f"implausible key/value count {2**40}"]),
    ("bad_string_length", ["corrupt GGUF file", "general.architecture",
                           f"claims to be {2**60} bytes long"]),
    ("string_past_eof", ["truncated at byte", "partial download", "general.architecture"]),
    ("overlapping_tensors", ["corrupt GGUF file", "'blk.0.attn_q.weight' and", "overlap"]),
    ("implausible_tensor_size", ["corrupt GGUF file", "'blk.1.ffn_down.weight'",
                                 "an implausible size"]),
    ("too_many_dims", ["corrupt GGUF file", "'output.weight' has 9 dimensions (at most 4)"]),
    ("truncated_header", ["truncated at byte 2000 (file is a partial download?)"]),
    ("truncated_data", ["truncated at byte", "(file is a partial download?)",
                        "the data of tensor"]),
    ("truncated_tiny", ["truncated at byte 10 (file is a partial download?)"]),
]


@pytest.mark.parametrize(("fixture", "fragments"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_files_give_a_clear_model_error(models: Models, fixture: str,
                                               fragments: list[str]) -> None:
    path = getattr(models, fixture)
    with pytest.raises(ModelError) as exc:
        probe_model(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: ")
    for fragment in fragments:
        assert fragment in message


def test_a_directory_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="a directory"):
        probe_model(tmp_path)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ModelError, match="not a regular file"):
        probe_model(fifo)


def test_unreadable_file(models: Models, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    path = Path(shutil.copy(models.llama, tmp_path / "locked.gguf"))
    path.chmod(0)
    with pytest.raises(ModelError, match="cannot read"):
        probe_model(path)


def test_a_nul_byte_in_the_path_is_a_model_error() -> None:
    with pytest.raises(ModelError, match="cannot read"):
        probe_model("/tmp/a\0b.gguf")


# --- properties: any damage gives a ModelError, never another exception ------------

def _data_end(path: str) -> int:
    r = gguf.GGUFReader(path)
    return max(int(t.data_offset) + int(t.n_bytes) for t in r.tensors)


@pytest.fixture(scope="module")
def llama_bytes(models: Models) -> tuple[bytes, int, int]:
    """The bytes of `llama`, where its header ends and where its tensor data ends."""
    data = Path(models.llama).read_bytes()
    r = gguf.GGUFReader(models.llama)
    return data, int(r.data_offset), _data_end(models.llama)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.data())
def test_any_truncation_is_reported_as_truncation(
        llama_bytes: tuple[bytes, int, int], tmp_path: Path, cut: st.DataObject) -> None:
    data, header_end, data_end = llama_bytes
    # Half the cuts inside the header, where the parsing happens.
    n = cut.draw(st.one_of(st.integers(1, header_end), st.integers(1, data_end - 1)))
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:n])
    with pytest.raises(ModelError) as exc:
        modelinfo._probe_uncached(str(path))
    assert f"truncated at byte {n} (file is a partial download?)" in str(exc.value)


def test_cutting_only_the_trailing_padding_is_harmless(
        llama_bytes: tuple[bytes, int, int], tmp_path: Path) -> None:
    data, _, data_end = llama_bytes
    path = tmp_path / "exact.gguf"
    path.write_bytes(data[:data_end])
    assert modelinfo._probe_uncached(str(path))[0].tensor_count == 21


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.data())
def test_byte_flips_never_raise_anything_but_model_error(
        llama_bytes: tuple[bytes, int, int], tmp_path: Path, flips: st.DataObject) -> None:
    data, header_end, _ = llama_bytes
    damaged = bytearray(data)
    for _ in range(flips.draw(st.integers(1, 4))):
        at = flips.draw(st.integers(0, header_end - 1))
        damaged[at] = flips.draw(st.integers(0, 255))
    path = tmp_path / "flipped.gguf"
    path.write_bytes(damaged)
    try:
        modelinfo._probe_uncached(str(path))
    except ModelError as e:
        assert str(e).startswith(f"{path}: ")
        assert "internal error" not in str(e)    # a guard missed, caught only by the net


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]),
       at=st.integers(0, 4000))
def test_garbage_length_fields_never_raise_anything_but_model_error(
        llama_bytes: tuple[bytes, int, int], tmp_path: Path, value: int, at: int) -> None:
    # Extreme u64 values written anywhere in the header: counts, lengths, dims, offsets.
    data, header_end, _ = llama_bytes
    at = min(at, header_end - 8)
    damaged = bytearray(data)
    damaged[at:at + 8] = value.to_bytes(8, "little")
    path = tmp_path / "garbage.gguf"
    path.write_bytes(damaged)
    try:
        modelinfo._probe_uncached(str(path))
    except ModelError as e:
        assert "internal error" not in str(e)


# --- the cache ----------------------------------------------------------------------

def test_a_second_probe_is_served_from_the_cache(models: Models,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    first = probe_model(models.llama)

    def no_reading(*args: object) -> ModelInfo:
        raise AssertionError("the header was read again")

    monkeypatch.setattr(modelinfo, "_read_header", no_reading)
    assert probe_model(models.llama) is first
    assert probe_model(Path(models.llama)) is first     # a PathLike names the same file


def test_another_path_to_the_same_file_keeps_its_own_name(models: Models,
                                                          tmp_path: Path) -> None:
    link = tmp_path / "alias.gguf"
    link.symlink_to(models.llama)
    first = probe_model(models.llama)
    via_link = probe_model(link)
    assert via_link.path == str(link)
    assert probe_view(via_link) == probe_view(first)


def test_a_changed_mtime_or_size_is_read_again(models: Models, tmp_path: Path) -> None:
    path = Path(shutil.copy(models.llama, tmp_path / "m.gguf"))
    first = probe_model(path)
    st_ = path.stat()
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))
    second = probe_model(path)
    assert second is not first and second == first

    # Replaced by another model with the same name: the new header is what counts.
    gen.write_glm4moe_mtp(path, part="full")
    third = probe_model(path)
    assert (third.arch, third.has_nextn_tensor) == ("glm4moe", True)

    # A partial download that keeps growing is probed again each time.
    gen.write_truncated(models.llama, path, 3000)
    with pytest.raises(ModelError, match="truncated at byte 3000"):
        probe_model(path)
    gen.write_truncated(models.llama, path, 4000)
    with pytest.raises(ModelError, match="truncated at byte 4000"):
        probe_model(path)


def test_errors_are_not_cached(models: Models, tmp_path: Path) -> None:
    path = tmp_path / "later.gguf"
    with pytest.raises(ModelError, match="no such file"):
        probe_model(path)
    shutil.copy(models.llama, path)
    assert probe_model(path).arch == "llama"


def test_the_cache_is_bounded(models: Models, monkeypatch: pytest.MonkeyPatch,
                              tmp_path: Path) -> None:
    monkeypatch.setattr(modelinfo, "_CACHE_MAX", 3)
    paths = [Path(shutil.copy(models.eagle3, tmp_path / f"e{i}.gguf")) for i in range(5)]
    for p in paths:
        probe_model(p)
    assert len(modelinfo._cache) == 3
    cached = {key[0] for key in modelinfo._cache}
    assert cached == {os.path.realpath(p) for p in paths[2:]}   # oldest evicted first


@pytest.mark.parametrize("content", [b"root:$y$j9T$s3cr3t:19000:0:99999:7:::\n", b"ro",
                                     b"\x00\x01se", b"PK\x03\x04secret"])
def test_a_file_that_is_not_gguf_never_shows_its_bytes(tmp_path: Path, content: bytes) -> None:
    """``model = "/etc/shadow"``: the error reaches Notes on the bus, which anyone reads;
    it must say what the file is not, never what it holds."""
    path = tmp_path / "shadow"
    path.write_bytes(content)
    with pytest.raises(ModelError) as exc:
        probe_model(str(path))
    message = str(exc.value)[len(str(path)):]
    for leak in ("root", "s3cr3t", "secret", "ro'", "se'", "\\x00", "\\x01"):
        assert leak not in message, message


def test_shape_for_the_memory_estimate(tmp_path: Path) -> None:
    # Per-layer head_count_kv keeps the max and the tuple; explicit key/value lengths
    # win over n_embd / head_count; blocks are summed by N, the rest outside them.
    path = gen.write_meta(tmp_path / "m.gguf", "llama", {
        "llama.block_count": 3, "llama.embedding_length": 64,
        "llama.attention.head_count": 4, "llama.attention.head_count_kv": [2, 0, 4],
        "llama.attention.key_length": 24, "llama.attention.value_length": 8,
        "llama.feed_forward_length": [96, 128, 64],
    }, ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
        "blk.2.ffn_up.weight", "output_norm.weight"])
    info = probe_model(path)
    assert (info.head_count, info.head_count_kv, info.head_count_kv_per_layer) == (4, 4, (2, 0, 4))
    assert (info.key_length, info.value_length, info.n_ff) == (24, 8, 128)
    assert info.block_bytes == (32, 0, 16)      # 4 f32 per tensor
    assert (info.token_embd_bytes, info.output_bytes, info.weight_bytes) == (16, 16, 80)
    assert info.output_tied and info.max_block_tensor_bytes == 16


def test_head_lengths_default_to_embd_over_heads(tmp_path: Path) -> None:
    path = gen.write_meta(tmp_path / "m.gguf", "llama", {
        "llama.block_count": 1, "llama.embedding_length": 4096,
        "llama.attention.head_count": 32}, ["blk.7000.x.weight", "blk.x.y", "output.weight"])
    info = probe_model(path)
    assert (info.head_count_kv, info.key_length, info.value_length) == (32, 128, 128)
    assert info.head_count_kv_per_layer == ()
    # blk.7000 is a block (by N), "blk.x.y" is not one llama.cpp would place.
    assert len(info.block_bytes) == 7001 and info.output_bytes == 32
    assert not info.output_tied
