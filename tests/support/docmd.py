"""The documentation's Markdown read as the doc tests need it: fenced blocks, links,
headings' anchors, and quoted messages, with no Markdown library (none is a dependency,
and the few forms the docs use are plain to read).

A fenced block is ```` ```lang ```` … ```` ``` ```` at the start of a line; its first line
tells what it is (``# /etc/loki/presets/qwen.toml``: that file). An anchor is GitHub's:
the heading lower-cased, punctuation but ``-`` and ``_`` dropped, spaces turned to ``-``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import REPO

FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
FILE_LINE = re.compile(r"^#\s+(/etc/loki/\S+)\s*$")
HEREDOC = re.compile(r"^cat > (/etc/loki/\S+) <<'(\w+)'\n(.*?)^\2$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int     # where the block starts in its page (1-based), for messages

    def file(self) -> str | None:
        """The path under /etc/loki this block is, when its first line names one."""
        first = self.text.split("\n", 1)[0]
        match = FILE_LINE.match(first) if self.lang == "toml" else None
        return match.group(1) if match else None


def blocks(text: str) -> list[Block]:
    return [Block(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


def files(text: str) -> list[tuple[str, str]]:
    """The config files a page writes, in order: (path under /etc/loki, text). TOML
    blocks naming their path, and shell here-documents ``cat > /etc/loki/X <<'TOML'``."""
    found: list[tuple[int, str, str]] = []
    for block in blocks(text):
        path = block.file()
        if path is not None:
            found.append((block.line, path, block.text))
        elif block.lang in ("sh", "bash"):
            found += [(block.line, m.group(1), m.group(3)) for m in HEREDOC.finditer(block.text)]
    return [(path, body) for _, path, body in sorted(found, key=lambda f: f[0])]


def commands(text: str) -> list[tuple[int, str, list[str]]]:
    """Each ``console`` block's commands: (line, command, the output lines shown)."""
    out: list[tuple[int, str, list[str]]] = []
    for block in blocks(text):
        if block.lang != "console":
            continue
        for line in block.text.rstrip("\n").split("\n"):
            if line.startswith("$ "):
                out.append((block.line, line[2:], []))
            elif out and out[-1][0] == block.line:
                out[-1][2].append(line)
            else:
                raise ValueError(f"line {block.line}: a console block starts with output")
    return out


def prose(text: str) -> str:
    """The page without its fenced blocks (what a reader reads as sentences)."""
    return FENCE.sub("", text)


def anchor(heading: str) -> str:
    text = re.sub(r"`|\*|\[|\]\([^)]*\)", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {anchor(h) for h in HEADING.findall(prose(text))}


def pages() -> list[Path]:
    """README.md and every page under docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def links(text: str) -> list[str]:
    """The relative links of a page's prose (web links left out)."""
    return [t for t in LINK.findall(prose(text)) if not re.match(r"[a-z]+:", t)]
