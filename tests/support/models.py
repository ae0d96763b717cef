"""Tiny GGUF models for tests, generated with gguf.GGUFWriter (never committed as binaries).

Every ``write_*`` function takes the output path, writes one file and returns its
Path. Two kinds:

- Loadable models (the real llama-server b11434 runs them on a CPU in well under
  a second): ``write_llama`` (plain llama, byte-level SPM tokenizer, chat template),
  ``write_draft`` (a one-layer llama with the same tokenizer, a draft for it) and
  ``write_glm4moe_mtp`` (GLM-4.5 style with a real NextN/MTP head that
  ``--spec-type draft-mtp`` uses).
- Header fixtures for the probe (metadata plus a few tiny tensors, not meant to
  load): ``write_llama_nextn``, ``write_eagle3``, ``write_hybrid``, ``write_qwen4exp``,
  ``write_qwen_scale`` (151k-token vocab and merges, ~670 tensor infos) and
  ``write_meta`` for any other arch; plus byte-level corruptions of a valid file
  (``write_truncated``, ``write_version``, ``write_bad_string_length``...).

Shapes: numpy shapes are ggml's ``ne`` reversed, so a ggml {n_embd, n_vocab}
matrix is a numpy (n_vocab, n_embd) array.
"""

from __future__ import annotations

import os
import shutil
import struct
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import gguf
import numpy as np

PathLike = str | os.PathLike[str]

# Byte-level SPM vocabulary: 3 specials then one token per byte value.
BYTE_TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
BYTE_TOKEN_TYPES = [2, 3, 3] + [6] * 256        # unknown, control, control, byte
N_VOCAB = len(BYTE_TOKENS)
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

QWEN_VOCAB = 151_643
QWEN_MERGES = 151_387
QWEN_BLOCKS = 28
# 24 per-block tensor names (Qwen-MoE style with biases and extra norms): realistic
# name lengths for the header walk; the shapes are tiny, only the header matters.
QWEN_BLOCK_TENSORS = (
    "attn_norm.weight", "attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias",
    "attn_v.weight", "attn_v.bias", "attn_output.weight", "attn_q_norm.weight",
    "attn_k_norm.weight", "ffn_norm.weight", "ffn_gate_inp.weight", "ffn_gate_exps.weight",
    "ffn_up_exps.weight", "ffn_down_exps.weight", "ffn_gate_inp_shexp.weight",
    "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight",
    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "post_attention_norm.weight",
    "post_ffw_norm.weight",
)


def byte_token(ch: str) -> int:
    """Token id of the byte token for a one-byte character (e.g. "a" -> 100)."""
    (b,) = ch.encode()
    return 3 + b


def _finish(w: gguf.GGUFWriter, path: PathLike) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _byte_tokenizer(w: gguf.GGUFWriter, *, chat_template: bool | str = True) -> None:
    w.add_tokenizer_model("llama")
    w.add_token_list(BYTE_TOKENS)
    w.add_token_scores([0.0] * N_VOCAB)
    w.add_token_types(BYTE_TOKEN_TYPES)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    if chat_template:
        w.add_chat_template(CHAT_TEMPLATE if chat_template is True else chat_template)


class _Weights:
    """Deterministic small random f32 tensors."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def rand(self, *shape: int, scale: float = 0.02) -> np.ndarray[Any, np.dtype[np.float32]]:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    @staticmethod
    def ones(n: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        return np.ones(n, dtype=np.float32)


def _embeddings(wt: _Weights, n_embd: int, predict: str | None
                ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Token embedding and output matrices.

    With ``predict``, every embedding carries a constant dim-0 component and only
    the output row of that byte reads it: the model then always predicts that
    byte, whatever its other random weights, so a target and a draft agree.
    """
    tok_embd = wt.rand(N_VOCAB, n_embd)
    output = wt.rand(N_VOCAB, n_embd)
    if predict is not None:
        tok_embd[:, 0] = 1.0
        output[byte_token(predict), 0] = 1.0
    return tok_embd, output


def _output_tensors(w: gguf.GGUFWriter, wt: _Weights, n_embd: int, predict: str | None
                    ) -> None:
    """token_embd, output_norm and output (see _embeddings for ``predict``)."""
    tok_embd, output = _embeddings(wt, n_embd, predict)
    w.add_tensor("token_embd.weight", tok_embd)
    w.add_tensor("output_norm.weight", wt.ones(n_embd))
    w.add_tensor("output.weight", output)


def _attention_tensors(w: gguf.GGUFWriter, wt: _Weights, i: int, *, n_embd: int, n_head: int,
                       n_head_kv: int, head_dim: int, post_norm: str) -> None:
    """Block ``i``'s attention, then its ``post_norm`` (ffn_norm for llama,
    post_attention_norm for GLM)."""
    w.add_tensor(f"blk.{i}.attn_norm.weight", wt.ones(n_embd))
    w.add_tensor(f"blk.{i}.attn_q.weight", wt.rand(n_head * head_dim, n_embd))
    w.add_tensor(f"blk.{i}.attn_k.weight", wt.rand(n_head_kv * head_dim, n_embd))
    w.add_tensor(f"blk.{i}.attn_v.weight", wt.rand(n_head_kv * head_dim, n_embd))
    w.add_tensor(f"blk.{i}.attn_output.weight", wt.rand(n_embd, n_head * head_dim))
    w.add_tensor(f"blk.{i}.{post_norm}.weight", wt.ones(n_embd))


def _llama_writer(path: PathLike, *, n_layers: int, n_embd: int, n_head: int, n_head_kv: int,
                  n_ff: int, context_length: int, name: str, seed: int,
                  predict: str | None, chat_template: bool | str = True
                  ) -> tuple[gguf.GGUFWriter, _Weights]:
    """A llama writer with every key and tensor llama.cpp's llama arch needs."""
    head_dim = n_embd // n_head
    w = gguf.GGUFWriter(os.fspath(path), "llama")
    w.add_name(name)
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _byte_tokenizer(w, chat_template=chat_template)

    wt = _Weights(seed)
    _output_tensors(w, wt, n_embd, predict)
    for i in range(n_layers):
        _attention_tensors(w, wt, i, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                           head_dim=head_dim, post_norm="ffn_norm")
        w.add_tensor(f"blk.{i}.ffn_gate.weight", wt.rand(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", wt.rand(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", wt.rand(n_embd, n_ff))
    return w, wt


def write_llama(path: PathLike, *, n_layers: int = 2, n_embd: int = 64, n_head: int = 4,
                n_head_kv: int = 4, n_ff: int = 128, context_length: int = 4096,
                name: str = "tiny-random-llama", seed: int = 0,
                predict: str | None = None) -> Path:
    """A plain llama model (~0.5 MB of random f32 weights) that llama-server loads.

    ``predict="a"`` makes it always answer that byte (see _embeddings).
    """
    w, _ = _llama_writer(path, n_layers=n_layers, n_embd=n_embd, n_head=n_head,
                         n_head_kv=n_head_kv, n_ff=n_ff, context_length=context_length,
                         name=name, seed=seed, predict=predict)
    return _finish(w, path)


def write_slow_llama(path: PathLike, *, context_length: int = 8192) -> Path:
    """The plain llama a size up (3 layers of 384, ~5 MB): a stream of a few thousand
    tokens lasts seconds on one thread, so a stop, a reload or a reboot can come while
    one is in flight (the tests that hold a stream across one)."""
    return write_llama(path, n_layers=3, n_embd=384, n_head=6, n_head_kv=6, n_ff=1024,
                       context_length=context_length)


def write_llama_uses(path: PathLike, *, chat_template: bool | str = True, fim: bool = False,
                     pooling: int | None = None, context_length: int = 4096) -> Path:
    """The plain llama with the keys that say what it can do (issue 46, item 5): its chat
    template (False: none; a string: that one), the fill-in-the-middle token ids
    (``fim``), an embedding pooling type (``llama.pooling_type``: 1 mean ... 4 rank)."""
    w, _ = _llama_writer(path, n_layers=2, n_embd=64, n_head=4, n_head_kv=4, n_ff=128,
                         context_length=context_length, name="tiny-random-llama-uses",
                         seed=0, predict=None, chat_template=chat_template)
    if fim:
        w.add_uint32("tokenizer.ggml.fim_pre_token_id", byte_token("<"))
        w.add_uint32("tokenizer.ggml.fim_suf_token_id", byte_token(">"))
        w.add_uint32("tokenizer.ggml.fim_mid_token_id", byte_token("|"))
    if pooling is not None:
        w.add_uint32("llama.pooling_type", pooling)
    return _finish(w, path)


def write_llama_nextn(path: PathLike, *, with_tensor: bool = True, n_layers: int = 2) -> Path:
    """The llama model plus ``llama.nextn_predict_layers = 1`` and, with_tensor, the
    NextN head tensors of the last block. A metadata fixture for the probe only:
    llama has no MTP graph, and llama-server b11434 refuses to load either variant
    (``done_getting_tensors: wrong number of tensors``). Use write_glm4moe_mtp for
    a head the engine runs.
    """
    n_embd = 64
    w, wt = _llama_writer(path, n_layers=n_layers, n_embd=n_embd, n_head=4, n_head_kv=4,
                          n_ff=128, context_length=4096, name="tiny-random-llama-nextn",
                          seed=0, predict=None)
    w.add_nextn_predict_layers(1)
    if with_tensor:
        last = n_layers - 1
        w.add_tensor(f"blk.{last}.nextn.eh_proj.weight", wt.rand(n_embd, 2 * n_embd))
        w.add_tensor(f"blk.{last}.nextn.enorm.weight", wt.ones(n_embd))
        w.add_tensor(f"blk.{last}.nextn.hnorm.weight", wt.ones(n_embd))
    return _finish(w, path)


def write_draft(path: PathLike, *, predict: str | None = None) -> Path:
    """An ordinary one-layer llama draft, tokenizer-compatible with write_llama."""
    return write_llama(path, n_layers=1, name="tiny-random-llama-draft", seed=1,
                       predict=predict)


GlmPart = Literal["full", "trunk", "head", "plain"]


def write_glm4moe_mtp(path: PathLike, *, part: GlmPart = "full", agree: bool = True) -> Path:
    """A GLM-4.5 style (arch glm4moe) model with a real NextN/MTP head.

    Layout: two dense trunk layers (blk.0, blk.1) and, as llama.cpp expects for
    glm4moe, one MoE NextN layer blk.2 (2 experts, 1 used, 1 shared) counted in
    ``block_count``.

    - ``full``:  trunk + head in one file (``-m FILE --spec-type draft-mtp``);
    - ``trunk``: head tensors stripped but ``nextn_predict_layers`` still 1: the
      "key without tensor" file, on which draft-mtp aborts the engine;
    - ``head``:  a separate head file (name it ``mtp-*.gguf``) holding the NextN
      layer, the embeddings and the tokenizer (``-md FILE --spec-type draft-mtp``);
    - ``plain``: no head at all, ``nextn_predict_layers`` 0, block_count 2.

    With ``agree`` the trunk and the head both always predict byte "a", so every
    draft is accepted; without it drafts are mostly rejected.
    """
    if part not in ("full", "trunk", "head", "plain"):
        raise ValueError(f"unknown part {part!r}")
    arch = "glm4moe"
    n_embd, n_head, head_dim = 64, 4, 16
    n_trunk = 2
    n_nextn = 0 if part == "plain" else 1
    n_ff, n_expert, n_ff_exp = 128, 2, 32

    w = gguf.GGUFWriter(os.fspath(path), arch)
    w.add_name(f"tiny-random-glm4moe-mtp-{part}")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_trunk + n_nextn)
    w.add_nextn_predict_layers(n_nextn)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim // 2)       # GLM rotates half of each head
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_leading_dense_block_count(n_trunk)         # layers from here on are MoE
    w.add_expert_count(n_expert)
    w.add_expert_used_count(1)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_expert_shared_count(1)
    w.add_expert_weights_scale(1.0)
    w.add_expert_weights_norm(True)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _byte_tokenizer(w)

    wt = _Weights(0)
    # Every part, the head file included, carries the embeddings and output head.
    _output_tensors(w, wt, n_embd, "a" if agree else None)

    def attention(i: int) -> None:
        _attention_tensors(w, wt, i, n_embd=n_embd, n_head=n_head, n_head_kv=n_head,
                           head_dim=head_dim, post_norm="post_attention_norm")

    if part != "head":
        for i in range(n_trunk):
            attention(i)
            w.add_tensor(f"blk.{i}.ffn_gate.weight", wt.rand(n_ff, n_embd))
            w.add_tensor(f"blk.{i}.ffn_up.weight", wt.rand(n_ff, n_embd))
            w.add_tensor(f"blk.{i}.ffn_down.weight", wt.rand(n_embd, n_ff))
    if part in ("full", "head"):
        i = n_trunk
        attention(i)
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", wt.rand(n_expert, n_embd))
        w.add_tensor(f"blk.{i}.exp_probs_b.bias", np.zeros(n_expert, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", wt.rand(n_expert, n_ff_exp, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", wt.rand(n_expert, n_ff_exp, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", wt.rand(n_expert, n_embd, n_ff_exp))
        w.add_tensor(f"blk.{i}.ffn_gate_shexp.weight", wt.rand(n_ff_exp, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up_shexp.weight", wt.rand(n_ff_exp, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down_shexp.weight", wt.rand(n_embd, n_ff_exp))
        eh_proj = wt.rand(n_embd, 2 * n_embd)
        if agree:
            eh_proj[0, 0] = 1.0      # carry the dim-0 "predict a" signal into the head
        w.add_tensor(f"blk.{i}.nextn.eh_proj.weight", eh_proj)
        w.add_tensor(f"blk.{i}.nextn.enorm.weight", wt.ones(n_embd))
        w.add_tensor(f"blk.{i}.nextn.hnorm.weight", wt.ones(n_embd))
    return _finish(w, path)


def write_meta(path: PathLike, arch: str, keys: Mapping[str, Any] | None = None,
               tensors: Sequence[str] = (), *, name: str = "") -> Path:
    """A header-only style fixture: ``general.architecture = arch``, the given keys
    (python int -> uint32, float -> float32, bool, str, list of int -> int32 array,
    list of str -> string array) and a tiny 4-float tensor per name.
    """
    w = gguf.GGUFWriter(os.fspath(path), arch)
    if name:
        w.add_name(name)
    for key, value in (keys or {}).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        else:
            raise TypeError(f"{key}: unsupported value {value!r}")
    for t in tensors:
        w.add_tensor(t, np.zeros(4, dtype=np.float32))
    return _finish(w, path)


def write_eagle3(path: PathLike) -> Path:
    """An EAGLE-3 draft head header (arch eagle3): a sidecar, not a standalone model."""
    return write_meta(path, "eagle3", {
        "eagle3.context_length": 4096,
        "eagle3.embedding_length": 64,
        "eagle3.block_count": 1,
        "eagle3.feed_forward_length": 128,
        "eagle3.attention.head_count": 4,
        "eagle3.attention.head_count_kv": 4,
        "eagle3.attention.layer_norm_rms_eps": 1e-5,
        "eagle3.target_hidden_size": 64,
        "eagle3.target_layers": [0, 1, 2],
    }, ["fc.weight", "d2t", "blk.0.attn_norm.weight", "output_norm.weight"],
        name="tiny-eagle3-head")


def write_hybrid(path: PathLike) -> Path:
    """A Qwen3-Next style hybrid header (arch qwen3next: llm_arch_is_hybrid in b11434):
    linear-attention (SSM keys) layers with a full-attention layer every 4th block.
    """
    a = "qwen3next"
    return write_meta(path, a, {
        f"{a}.context_length": 262144,
        f"{a}.embedding_length": 64,
        f"{a}.block_count": 4,
        f"{a}.feed_forward_length": 128,
        f"{a}.attention.head_count": 4,
        f"{a}.attention.head_count_kv": 2,
        f"{a}.ssm.conv_kernel": 4,
        f"{a}.ssm.state_size": 16,
        f"{a}.ssm.group_count": 2,
        f"{a}.ssm.time_step_rank": 4,
        f"{a}.ssm.inner_size": 64,
        f"{a}.full_attention_interval": 4,
    }, ["token_embd.weight", "blk.0.ssm_conv1d.weight", "blk.3.attn_q.weight",
        "output.weight"], name="tiny-qwen3next-hybrid")


def write_hybrid_by_keys(path: PathLike) -> Path:
    """An arch llama.cpp b11434 does not list as hybrid, but whose keys say so: SSM keys
    and a per-layer head_count array with attention in one layer out of four."""
    a = "futurehybrid"
    return write_meta(path, a, {
        f"{a}.context_length": 8192,
        f"{a}.block_count": 4,
        f"{a}.attention.head_count": [0, 0, 0, 4],
        f"{a}.ssm.state_size": 16,
        f"{a}.ssm.conv_kernel": 4,
    }, ["token_embd.weight", "blk.0.ssm_in.weight", "blk.3.attn_q.weight"])


def write_mamba(path: PathLike) -> Path:
    """A pure recurrent header (arch mamba, head_count 0): recurrent but not hybrid."""
    a = "mamba"
    return write_meta(path, a, {
        f"{a}.context_length": 1048576,
        f"{a}.block_count": 2,
        f"{a}.attention.head_count": 0,
        f"{a}.ssm.conv_kernel": 4,
        f"{a}.ssm.inner_size": 128,
        f"{a}.ssm.state_size": 16,
        f"{a}.ssm.time_step_rank": 4,
    }, ["token_embd.weight", "blk.0.ssm_in.weight", "blk.1.ssm_in.weight"])


def write_qwen4exp(path: PathLike, *, with_nextn: bool = True) -> Path:
    """A qwen4exp header (a hybrid arch in b11434) with, by default, its MTP head tensor."""
    a = "qwen4exp"
    tensors = ["token_embd.weight", "blk.0.attn_q.weight", "blk.2.attn_q.weight"]
    if with_nextn:
        tensors += ["blk.3.nextn.eh_proj.weight", "blk.3.nextn.enorm.weight",
                    "blk.3.nextn.hnorm.weight"]
    return write_meta(path, a, {
        f"{a}.context_length": 131072,
        f"{a}.embedding_length": 64,
        f"{a}.block_count": 4,
        f"{a}.nextn_predict_layers": 1,
        f"{a}.attention.head_count": 4,
        f"{a}.full_attention_interval": 4,
    }, tensors, name="tiny-qwen4exp")


def _qwen_token(i: int) -> str:
    """A deterministic token of realistic length (1 to ~8 chars, half with the GPT-2 space)."""
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    s = ""
    n = i
    while True:
        s += letters[n % 26]
        n //= 26
        if n == 0:
            break
    return ("\u0120" + s) if i % 2 else s


def write_qwen_scale(path: PathLike) -> Path:
    """A Qwen-scale header: 151,643-token gpt2 vocab, 151,387 merges, 28 blocks x 24
    tensor infos (675 in all), each tensor four floats. A few MB, written in seconds."""
    a = "qwen3"
    w = gguf.GGUFWriter(os.fspath(path), a)
    w.add_name("qwen-scale-header")
    w.add_context_length(40960)
    w.add_embedding_length(2048)
    w.add_block_count(QWEN_BLOCKS)
    w.add_feed_forward_length(6144)
    w.add_head_count(16)
    w.add_head_count_kv(8)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    tokens = [_qwen_token(i) for i in range(QWEN_VOCAB)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * QWEN_VOCAB)
    w.add_token_merges([f"{tokens[i % 4096]} {tokens[(i * 7 + 1) % QWEN_VOCAB]}"
                        for i in range(QWEN_MERGES)])
    w.add_eos_token_id(151_645)
    w.add_chat_template(CHAT_TEMPLATE * 50)    # real templates run to several KB
    tiny = np.zeros(4, dtype=np.float32)
    for name in ("token_embd.weight", "output_norm.weight", "output.weight"):
        w.add_tensor(name, tiny)
    for i in range(QWEN_BLOCKS):
        for t in QWEN_BLOCK_TENSORS:
            w.add_tensor(f"blk.{i}.{t}", tiny)
    return _finish(w, path)


# --- corrupt variants: byte-level edits of a valid file ------------------------------

def write_truncated(src: PathLike, dst: PathLike, nbytes: int) -> Path:
    """The first ``nbytes`` of ``src`` (a partial download)."""
    with open(src, "rb") as f:
        data = f.read(nbytes)
    Path(dst).write_bytes(data)
    return Path(dst)


def write_patched(src: PathLike, dst: PathLike, offset: int, data: bytes) -> Path:
    """A copy of ``src`` with ``data`` written over the bytes at ``offset``."""
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(offset)
        f.write(data)
    return Path(dst)


def write_version(src: PathLike, dst: PathLike, version: int) -> Path:
    """``src`` with its GGUF version field set to ``version`` (2 gives a valid v2 file:
    v3 only added big-endian support, the layout is the same)."""
    return write_patched(src, dst, 4, struct.pack("<I", version))


def write_bad_magic(src: PathLike, dst: PathLike, magic: bytes = b"GGUX") -> Path:
    return write_patched(src, dst, 0, magic)


def write_tensor_count(src: PathLike, dst: PathLike, count: int) -> Path:
    return write_patched(src, dst, 8, struct.pack("<Q", count))


def write_kv_count(src: PathLike, dst: PathLike, count: int) -> Path:
    return write_patched(src, dst, 16, struct.pack("<Q", count))


def write_bad_string_length(src: PathLike, dst: PathLike, length: int = 2**60) -> Path:
    """``src`` with the length of the general.architecture value (GGUFWriter's first
    key) set to ``length``: far past EOF by default."""
    key = b"general.architecture"
    with open(src, "rb") as f:
        head = f.read(64)
    # header (24) + key length (8) + key + value type (4), then the string length
    if head[32:32 + len(key)] != key:
        raise ValueError(f"{src}: general.architecture is not the first key")
    return write_patched(src, dst, 32 + len(key) + 4, struct.pack("<Q", length))


def write_tensor_shape(src: PathLike, dst: PathLike, tensor: str, *,
                       n_dims: int | None = None, dim0: int | None = None) -> Path:
    """``src`` with the dimension count or the first dimension of ``tensor``'s info
    overwritten (a garbage shape field)."""
    raw = tensor.encode()
    data = Path(src).read_bytes()
    at = data.find(struct.pack("<Q", len(raw)) + raw)
    if at < 0:
        raise ValueError(f"{src}: no tensor info for {tensor}")
    n_dims_at = at + 8 + len(raw)
    if n_dims is not None:
        return write_patched(src, dst, n_dims_at, struct.pack("<I", n_dims))
    if dim0 is not None:
        return write_patched(src, dst, n_dims_at + 4, struct.pack("<Q", dim0))
    raise ValueError("nothing to change")


def write_big_endian(path: PathLike) -> Path:
    """A valid but big-endian GGUF (as written for s390x)."""
    w = gguf.GGUFWriter(os.fspath(path), "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_block_count(1)
    w.add_tensor("output_norm.weight", np.ones(4, dtype=np.float32))
    return _finish(w, path)


def write_empty(path: PathLike) -> Path:
    Path(path).write_bytes(b"")
    return Path(path)


def write_zip(path: PathLike) -> Path:
    """A ZIP archive (a model downloaded as an archive and never unpacked)."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("model.gguf", b"GGUF not really")
    return Path(path)


def write_lfs_pointer(path: PathLike) -> Path:
    """A Git LFS pointer: what a clone without git-lfs leaves in place of the model."""
    Path(path).write_text(
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:4d5b0ad2f8e1a1f0b5fa2b8f8a2bd4c5ad5a83cd2e9b7f6c4a1d3e5f7a9b1c3d\n"
        "size 4683073504\n")
    return Path(path)


def write_html(path: PathLike) -> Path:
    """An HTML error page saved under the model's name."""
    Path(path).write_text("<!DOCTYPE html>\n<html><body>404 Not Found</body></html>\n")
    return Path(path)
