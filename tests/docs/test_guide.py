"""The operator's guide (docs/guide/) and the README's ten-minute path, run as a reader
follows them: each TOML block naming a file under /etc/loki is written there, each
``console`` block's command runs, and what it prints is what the page shows.

A reader goes through the guide in the order of docs/guide/README.md: each page starts
from the files of the pages before it (a block naming a file again replaces it, as the
reader's editor does). The package's paths are mapped to this test's directories both
ways (``/etc/loki``, ``/var/lib/loki`` and its ``models``, ``/usr/bin/llama-server``: the
real engine b11434), and each ``.gguf`` a preset names is made as a small real model.
A shown line ``…`` stands for lines left out, ``…`` inside a line for text left out;
every other line must be printed, in order. Only ``lokid check`` and ``lokid plan`` may be
shown with their output (they need no daemon); a page showing another command's output
fails here, so that nothing shown goes unchecked.

Also here: every relative link of README.md and docs/ leads to a file and heading that
exist, and every message docs/troubleshooting.md quotes ("…") is one lokid can print.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from support import REPO, docmd
from support.models import write_llama

GUIDE = REPO / "docs" / "guide"
LOKID = str(Path(sys.executable).with_name("lokid"))
SHOWN = ("lokid check", "lokid plan ")
GGUF = re.compile(r'"([\w.+-]+\.gguf)"')
KEY_FILE = re.compile(r'"(/etc/loki/keys/[\w.-]+)"')


def guide_order() -> list[Path]:
    """The pages in the order docs/guide/README.md lists them (those of the guide)."""
    names = re.findall(r"^\d+\. \[[^\]]+\]\(([\w-]+\.md)\)", (GUIDE / "README.md").read_text(),
                       re.M)
    return [GUIDE / n for n in names]


class Host:
    """The package's paths, here: a config, state and models directory of the test."""

    def __init__(self, root: Path, engine: str) -> None:
        self.config, self.state, self.models = root / "etc", root / "state", root / "models"
        for d in (self.config / "presets", self.state, self.models, root / "run"):
            d.mkdir(parents=True, exist_ok=True)
        self.engine = engine
        self.env = {**os.environ, "LOKI_CONFIG_DIR": str(self.config),
                    "LOKI_STATE_DIR": str(self.state), "LOKI_RUNTIME_DIR": str(root / "run")}
        # longest first: the models' directory lies under the state's on the package
        self.mapping = [("/var/lib/loki/models", str(self.models)),
                        ("/var/lib/loki", str(self.state)), ("/etc/loki", str(self.config)),
                        ("/usr/bin/llama-server", engine)]

    def here(self, text: str) -> str:
        for package, test in self.mapping:
            text = text.replace(package, test)
        return text

    def package(self, text: str) -> str:
        for package, test in sorted(self.mapping, key=lambda m: -len(m[1])):
            text = text.replace(test, package)
        return text

    def write(self, path: str, text: str) -> None:
        target = Path(self.here(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.here(text))
        for name in GGUF.findall(text):
            if not (self.models / name).exists():
                write_llama(self.models / name)
        for key in KEY_FILE.findall(text):      # the files the page tells the reader to make
            key_path = Path(self.here(key))
            key_path.parent.mkdir(parents=True, exist_ok=True)
            key_path.write_text("sk-written-by-the-reader\n")
            key_path.chmod(0o600)

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        argv = shlex.split(command)
        assert argv[0] == "lokid"
        return subprocess.run([LOKID, *argv[1:]], env=self.env, capture_output=True, text=True,
                              timeout=60, check=False)


def shown_lines_match(shown: list[str], printed: list[str]) -> str | None:
    """None when ``printed`` is what ``shown`` shows; else the first line that differs."""
    at, skipping = 0, False
    for want in shown:
        if want.strip() == "…":
            skipping = True
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("…")) + r"\Z")
        found = next((i for i in range(at, len(printed)) if pattern.match(printed[i])), None)
        if found is None or (found != at and not skipping):
            return want
        at, skipping = found + 1, False
    if not skipping and at != len(printed):
        return f"(printed, not shown) {printed[at]}"
    return None


def walk(pages: list[Path], host: Host) -> Iterator[tuple[Path, int, str, list[str]]]:
    """Write each page's files in order, yielding its shown commands as they come."""
    for page in pages:
        text = page.read_text()
        writes = [(docmd.blocks(text), path, body) for path, body in docmd.files(text)]
        for _, path, body in writes:
            host.write(path, body)
        for line, command, shown in docmd.commands(text):
            yield page, line, command, shown


@pytest.mark.parametrize("upto", range(len(guide_order())), ids=lambda i: guide_order()[i].stem)
def test_each_guide_page_runs_as_shown(tmp_path: Path, engine: str, upto: int) -> None:
    pages = guide_order()
    host = Host(tmp_path, engine)
    for page, line, command, shown in walk(pages[:upto + 1], host):
        if page != pages[upto]:
            continue
        where = f"{page.relative_to(REPO)}:{line}: {command}"
        assert command.startswith(SHOWN), f"{where}: only lokid check/plan may show output"
        done = host.run(command)
        printed = host.package(done.stdout + done.stderr).rstrip("\n").split("\n")
        assert done.returncode == 0, f"{where} exited {done.returncode}:\n" + "\n".join(printed)
        differs = shown_lines_match(shown, printed)
        assert differs is None, f"{where}: shown {differs!r}; printed:\n" + "\n".join(printed)
    # whatever the page showed, everything written so far passes lokid check
    done = host.run("lokid check")
    assert done.returncode == 0, host.package(done.stdout + done.stderr)


def test_the_guide_lists_every_page_and_each_writes_or_shows_something() -> None:
    listed = {p.name for p in guide_order()}
    assert listed == {p.name for p in GUIDE.glob("*.md")} - {"README.md"}
    for page in guide_order():
        text = page.read_text()
        assert docmd.files(text) or docmd.commands(text), page.name


def test_the_readme_path_checks_and_plans(tmp_path: Path, engine: str) -> None:
    """The README's ten-minute path: its here-documents written, `lokid check` passes,
    and the plan of its preset says the start pulls the model first."""
    text = (REPO / "README.md").read_text()
    host = Host(tmp_path, engine)
    written = docmd.files(text)
    assert {p for p, _ in written} >= {"/etc/loki/lokid.toml"}
    for path, body in written:
        host.write(path, body)
    done = host.run("lokid check")
    assert done.returncode == 0, host.package(done.stdout + done.stderr)
    presets = [Path(p).stem for p, _ in written if "/presets/" in p]
    assert presets
    for name in presets:
        done = host.run(f"lokid check --preset {name}")
        assert "is not pulled yet: a start pulls it into /var/lib/loki/models first" in \
            host.package(done.stdout), done.stdout


@pytest.mark.parametrize(("shown", "printed", "ok"), [
    (["a", "b"], ["a", "b"], True),
    (["a", "…"], ["a", "b", "c"], True),
    (["a", "c"], ["a", "b", "c"], False),            # a line left out needs its …
    (["a", "…", "c"], ["a", "b", "c"], True),
    (["a"], ["a", "b"], False),                      # printed and not shown
    (["x … y"], ["x 12 MiB y"], True),
    (["x … y"], ["x 12 MiB z"], False),
    (["b", "a"], ["a", "b"], False),                 # in order
])
def test_the_comparison_of_shown_and_printed(shown: list[str], printed: list[str],
                                             ok: bool) -> None:
    assert (shown_lines_match(shown, printed) is None) is ok


# --- links -----------------------------------------------------------------------------

@pytest.mark.parametrize("page", docmd.pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    broken = []
    for link in docmd.links(page.read_text()):
        target, _, fragment = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in docmd.anchors(path.read_text()):
            broken.append(f"{link}: no such heading in {path.name}")
    assert broken == []


# --- troubleshooting's quotes ------------------------------------------------------------

QUOTE = re.compile(r'"([^"\n]{6,})"')
PLACEHOLDER = re.compile(r"\s*(?:…|<[a-z ]+>|\bNAME\b)\s*")   # with the spaces around it
HOLE = "\x00"


@cache
def messages() -> tuple[str, ...]:
    """Every string lokid's code holds, an f-string's values as holes; docstrings left
    out (they say what a message means, and would let a quote match itself)."""
    found: list[str] = []
    for path in (REPO / "lokid").rglob("*.py"):
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if id(node) in docs:
                continue
            if isinstance(node, ast.JoinedStr):
                found.append("".join(str(v.value) if isinstance(v, ast.Constant) else HOLE
                                     for v in node.values))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append(node.value)
    return tuple(found)


def fits(doc: str, code: str) -> bool:
    """Whether the quote ``doc`` can be a part of the message ``code``: a hole of the
    quote (its placeholders, and its ends: a quote may be part of a message) stands for
    any text; a hole of the message (a value) for the quote's example values only (a word
    with a digit or a path's punctuation, such as ``org/repo:Q4_K_M`` or ``35%``), so
    that a value never hides the quote's words."""
    doc = HOLE + doc + HOLE
    value = [False] * len(doc)       # doc[i] is in a word that is a value (digits, a path)
    for word in re.finditer(r"[^\s\x00]+", doc):
        if re.search(r"[\d/:.%@_-]", word.group()):
            value[word.start():word.end()] = [True] * (word.end() - word.start())
    # after[j]: whether doc[i:] fits code[j:], for the row i being filled (bottom-up:
    # docstrings are thousands of characters, too deep for a recursion)
    after = [True] * (len(code) + 1)            # i == len(doc): the rest of code is free
    for i in range(len(doc) - 1, -1, -1):
        row = [False] * (len(code) + 1)
        for j in range(len(code), -1, -1):
            if doc[i] == HOLE:
                row[j] = after[j] or (j < len(code) and row[j + 1])
            elif j < len(code) and code[j] == HOLE:
                row[j] = row[j + 1] or (value[i] and after[j])
            else:
                row[j] = j < len(code) and doc[i] == code[j] and after[j + 1]
        after = row
    return after[0]


def quotes() -> list[str]:
    """The page's quotes in its sentences: not a ``"`` inside inline code (a TOML value)."""
    text = docmd.prose((REPO / "docs" / "troubleshooting.md").read_text())
    text = re.sub(r"`[^`\n]*`", lambda m: m.group().replace('"', "\x01"), text)
    return [q.replace("`", "") for q in QUOTE.findall(text)]


@pytest.mark.parametrize("quote", quotes())
def test_each_quoted_message_is_one_lokid_prints(quote: str) -> None:
    doc = PLACEHOLDER.sub(HOLE, quote)
    words = max(doc.split(HOLE), key=len).strip()
    assert len(words) >= 5, f"{quote!r} quotes too little to be checked"
    candidates = [m.replace("`", "") for m in messages() if words.split()[0] in m]
    assert any(fits(doc, m) for m in candidates), f"no message of lokid says {quote!r}"


@pytest.mark.parametrize(("doc", "code", "ok"), [
    ("gated or private", "the model is gated or private: set a token", True),
    ("the SHA-256 \x00 differs", "x: the SHA-256 of \x00 (\x00) differs from the hub's", True),
    ("pulling org/repo: 35% \x00", "pulling \x00: \x00% \x00", True),
    ("pulling org/repo: 35%", "fetching \x00: \x00%", False),
    ("running on the GPU", "running on the CPU: \x00", False),
    ("the SHA-256 \x00 differs", "the \x00 job ended: \x00", False),   # a value is no word
])
def test_a_quote_fits_a_message_with_holes_on_either_side(doc: str, code: str, ok: bool) -> None:
    assert fits(doc, code) is ok
