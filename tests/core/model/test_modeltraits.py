"""What a model can do and its context (lokid.core.model.modeltraits), read from generated GGUF
files (with and without a chat template, fill-in-the-middle tokens, an embedding pooling)
and the engine's command line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import models as gen

from lokid.core.model.modeltraits import (
    MAX_TEMPLATE,
    UNKNOWN,
    Traits,
    capabilities,
    context_length,
    read_traits,
)

TOOLS_TEMPLATE = (gen.CHAT_TEMPLATE + "{% if tools %}{{ tools | tojson }}{% endif %}")


def test_the_keys_of_generated_models(tmp_path: Path) -> None:
    plain = read_traits(str(gen.write_llama(tmp_path / "plain.gguf")))
    assert plain == Traits(chat_template=True, template_tools=False, fim=False, pooling=-1,
                           context_length=4096)
    bare = read_traits(str(gen.write_llama_uses(tmp_path / "bare.gguf", chat_template=False,
                                                context_length=2048)))
    assert bare == Traits(context_length=2048)
    coder = read_traits(str(gen.write_llama_uses(tmp_path / "fim.gguf", fim=True,
                                                 chat_template=TOOLS_TEMPLATE)))
    assert coder.fim and coder.chat_template and coder.template_tools
    embed = read_traits(str(gen.write_llama_uses(tmp_path / "embed.gguf", pooling=1,
                                                 chat_template=False)))
    assert embed.pooling == 1 and not embed.chat_template


def test_a_file_that_cannot_be_read_is_unknown(tmp_path: Path) -> None:
    assert read_traits(str(tmp_path / "missing.gguf")) == UNKNOWN
    (tmp_path / "html.gguf").write_text("<html>not a model</html>")
    assert read_traits(str(tmp_path / "html.gguf")) == UNKNOWN
    whole = str(gen.write_llama(tmp_path / "whole.gguf"))
    gen.write_truncated(whole, tmp_path / "cut.gguf", 300)
    assert read_traits(str(tmp_path / "cut.gguf")) == UNKNOWN


def test_a_huge_template_counts_as_present_and_is_not_decoded(tmp_path: Path) -> None:
    path = gen.write_llama_uses(tmp_path / "huge.gguf",
                                chat_template="{# tools #}" + "x" * MAX_TEMPLATE)
    traits = read_traits(str(path))
    assert traits.chat_template and not traits.template_tools
    assert traits.context_length == 4096   # the keys after it were still read


def test_a_changed_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    gen.write_llama_uses(path, fim=False)
    assert not read_traits(str(path)).fim
    gen.write_llama_uses(path, fim=True)
    os.utime(path, ns=(1, 1))   # another mtime, whatever the clock's resolution
    assert read_traits(str(path)).fim


CHAT = Traits(chat_template=True, context_length=4096)
TOOLS = Traits(chat_template=True, template_tools=True, context_length=4096)


@pytest.mark.parametrize(("argv", "traits", "expected"), [
    ([], CHAT, ["chat", "completion"]),
    ([], Traits(), ["completion"]),
    (["--chat-template", "chatml"], Traits(), ["chat", "completion"]),
    ([], TOOLS, ["chat", "completion", "tools"]),
    (["--jinja"], TOOLS, ["chat", "completion", "tools"]),
    (["--no-jinja"], TOOLS, ["chat", "completion"]),
    (["--chat-template-file", "/t.jinja"], TOOLS, ["chat", "completion"]),
    (["--chat-template", "{{ tools }}"], Traits(), ["chat", "completion", "tools"]),
    ([], Traits(chat_template=True, fim=True), ["chat", "completion", "infill"]),
    (["--embedding"], CHAT, ["embeddings"]),
    (["--embeddings"], Traits(fim=True), ["embeddings"]),
    ([], Traits(pooling=1), ["embeddings"]),
    (["--rerank"], CHAT, ["embeddings", "rerank"]),
    (["--embedding", "--pooling", "rank"], Traits(), ["embeddings", "rerank"]),
    (["--embedding"], Traits(pooling=4), ["embeddings", "rerank"]),
    (["--mmproj", "/p.gguf"], CHAT, ["chat", "completion", "vision"]),
    (["-mm", "/p.gguf"], Traits(), ["completion", "vision"]),
])
def test_capabilities(argv: list[str], traits: Traits, expected: list[str]) -> None:
    assert capabilities(["llama-server", "-m", "/m.gguf", *argv], traits) == expected


def test_the_context_is_the_plans_else_the_models() -> None:
    assert context_length(["llama-server", "-c", "8192"], CHAT) == 8192
    assert context_length(["llama-server", "--ctx-size=2048"], CHAT) == 2048
    assert context_length(["llama-server", "-c", "0"], CHAT) == 4096
    assert context_length(["llama-server"], CHAT) == 4096
    assert context_length(["llama-server"], UNKNOWN) == 0
