"""Every command-line option of ``lokid`` and ``lokictl`` is in its man page, where that
command is described, and every option a SYNOPSIS line shows is one the command takes
(issue 49, item 3: the man pages from the same sources as the parsers).

The parsers are the real ones (``lokid.cli._parser``, ``lokid.ctl.main._parser``), walked
down to nested commands (``lokictl keys add``). The rules, each with the failure it
prevents:

- **An option is in its command's part of the page.** A command's part is its SYNOPSIS
  lines (``| **lokictl** ... **keys** **add**\\|\\ **change** *NAME* ...``) and its
  entries (a line at column 0 whose bold words name it, ``**keys add** *NAME*``, and the
  indented lines below). Each option string must be there in bold (``**--json**``): its
  long forms, and a short form where it has no long one. An option found only in another
  command's paragraph or in prose of a distant section does not count (an option added
  to ``pull`` whose only mention is in ``bench``'s text would otherwise pass). Help-
  suppressed options count too: ``lokictl keys change --no-rpm`` works and is documented.
- **Every leaf command has a part.** A new sub-command without a SYNOPSIS line or entry
  fails, even with no option of its own.
- **Global options** (before the command: ``--bus``, ``-H``, ``--config-dir`` ...) are in
  the first SYNOPSIS line or the OPTIONS section.
- **A SYNOPSIS line names real commands and their real options** (and so does an entry's
  first line): a removed option or command leaves no stale page. The options before the
  command are checked against the top parser, those after it against each command the
  line names (``**start**\\|\\ **stop**\\|\\ **restart**``: all three).
- **SYNOPSIS is one line block**: each line starts ``| **PROG**``. A paragraph pasted into
  it (lokid.8 had ``pull-worker``'s description there) renders as one run-on line that
  swallows every command after it.

argparse's own ``-h``/``--help`` is exempt (:data:`EXEMPT`). :func:`problems` is the
checker; the tests below also run it on planted pages and parsers to show it fails.
"""
from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from support import REPO

MAN = REPO / "packaging" / "man"
# argparse adds -h/--help to every parser; documenting it on each command is noise.
EXEMPT = frozenset({"-h", "--help"})
Command = tuple[str, ...]

SECTION = re.compile(r"^(\S[^\n]*)\n=+\n", re.M)
OPTION = re.compile(r"\*\*(--?[A-Za-z][\w-]*)\*\*")
WORDS = re.compile(r"\*\*([a-z][a-z0-9-]*(?: [a-z][a-z0-9-]*)*)\*\*")
# Between two alternatives at one level: "**a**\|\ **b**" or "**a**, **b**".
ALTERNATIVE = re.compile(r"\\\|\\ |, ")


@dataclass
class Page:
    prog: str
    synopsis: list[str] = field(default_factory=list)   # each line, "| **prog**" removed
    entries: list[str] = field(default_factory=list)    # head line and its indented body
    options: str = ""                                    # the OPTIONS section
    broken: list[str] = field(default_factory=list)      # lines outside the line block


def read_page(text: str, prog: str) -> Page:
    page = Page(prog)
    parts = SECTION.split(text)
    sections = dict(zip(parts[1::2], parts[2::2], strict=True))
    lead = f"| **{prog}**"
    for line in sections.get("SYNOPSIS", "").splitlines():
        if line.startswith(lead):
            page.synopsis.append(line[len(lead):].strip())
        elif line.strip():
            page.broken.append(line.strip())
    page.options = sections.get("OPTIONS", "")
    for title, body in sections.items():
        if title in ("SYNOPSIS", "OPTIONS"):
            continue
        for m in re.finditer(r"^\*\*.*\n(?:(?:[ \t]+\S.*)?\n)*", body + "\n", re.M):
            page.entries.append(m.group(0))
    return page


def command_words(text: str) -> tuple[set[Command], str]:
    """The commands a line starts with, and the rest of it: ``**keys** **add**\\|\\
    **change** *NAME*`` gives {("keys", "add"), ("keys", "change")} and `` *NAME*``."""
    paths: set[Command] = {()}
    pos = 0
    while m := WORDS.match(text, pos):
        alternatives = [tuple(m.group(1).split())]
        pos = m.end()
        while (sep := ALTERNATIVE.match(text, pos)) and (n := WORDS.match(text, sep.end())):
            alternatives.append(tuple(n.group(1).split()))
            pos = n.end()
        paths = {p + a for p in paths for a in alternatives}
        if not text.startswith(" ", pos):
            break
        pos += 1
    return paths - {()}, text[pos:]


def leading_groups(text: str) -> tuple[str, str]:
    """The ``...`` and ``[...]`` groups before a SYNOPSIS line's command, and the rest."""
    groups, rest = "", text.lstrip()
    while rest.startswith(("...", "[")):
        if rest.startswith("..."):
            rest = rest[3:].lstrip()
            continue
        end = closing(rest)
        groups, rest = groups + rest[:end], rest[end:].lstrip()
    return groups, rest


def closing(text: str) -> int:
    """Where the bracket ``text`` opens with is closed (just after it); the end of
    ``text`` if it never is."""
    depth = 0
    for end, c in enumerate(text, 1):
        depth += {"[": 1, "]": -1}.get(c, 0)
        if depth == 0:
            return end
    return len(text)


def commands(parser: argparse.ArgumentParser, path: Command = ()
             ) -> Iterator[tuple[Command, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from commands(sub, (*path, name))


def accepted(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def required(parser: argparse.ArgumentParser) -> list[str]:
    """The option strings the page must show: the long forms, else the short one."""
    out: list[str] = []
    for action in parser._actions:
        strings = [s for s in action.option_strings if s not in EXEMPT]
        out += [s for s in strings if s.startswith("--")] or strings
    return out


def stale(shown: list[str], parser: argparse.ArgumentParser) -> list[str]:
    return [o for o in shown if o not in accepted(parser)]


def problems(text: str, prog: str, parser: argparse.ArgumentParser) -> list[str]:
    """What the man page ``text`` of ``prog`` gets wrong about ``parser``, one line each
    (empty: the page and the parser agree)."""
    page = read_page(text, prog)
    out = [f"SYNOPSIS: {line!r} is not a line of its line block (| **{prog}** ...)"
           for line in page.broken]
    table = dict(commands(parser))
    parts: dict[Command, str] = {p: "" for p in table}

    def claim(paths: set[Command], text: str) -> None:
        for path in table:
            if any(p[:len(path)] == path for p in paths):
                parts[path] += text + "\n"

    for line in page.synopsis:
        groups, rest = leading_groups(line)
        paths, after = command_words(rest)
        out += [f"SYNOPSIS of {prog}: {o} is not a global option of {prog}"
                for o in stale(OPTION.findall(groups if paths else line), parser)]
        for path in sorted(paths):
            if path not in table:
                out.append(f"SYNOPSIS: {prog} {' '.join(path)} is not a command")
                continue
            out += [f"SYNOPSIS: {prog} {' '.join(path)} takes no {o}"
                    for o in stale(OPTION.findall(after), table[path])]
        claim(paths, line)
    for entry in page.entries:
        head = entry.split("\n", 1)[0]
        paths, after = command_words(head)
        if paths and paths <= set(table):
            for path in sorted(paths):
                out += [f"entry {head!r}: {prog} {' '.join(path)} takes no {o}"
                        for o in stale(OPTION.findall(after), table[path])]
            claim(paths, entry)
    first = page.synopsis[0] if page.synopsis else ""
    out += [f"{prog}: the global option {o} is in neither the first SYNOPSIS line nor "
            "OPTIONS" for o in required(parser) if f"**{o}**" not in first + page.options]
    for path, sub in table.items():
        name = f"{prog} {' '.join(path)}"
        leaf = not any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
        if leaf and not parts[path]:
            out.append(f"{name}: no SYNOPSIS line and no entry")
        out += [f"{name}: {o} is in neither its SYNOPSIS line nor its entry"
                for o in required(sub) if f"**{o}**" not in parts[path]]
    return out


def lokid_parser() -> argparse.ArgumentParser:
    from lokid.cli import _parser
    return _parser()


def lokictl_parser() -> argparse.ArgumentParser:
    from lokid.ctl.main import _parser
    return _parser()


PAGES: dict[str, tuple[str, Callable[[], argparse.ArgumentParser]]] = {
    "lokid": ("lokid.8.rst", lokid_parser),
    "lokictl": ("lokictl.1.rst", lokictl_parser),
}


def page_text(prog: str) -> str:
    return (MAN / PAGES[prog][0]).read_text()


def subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    return dict(commands(parser))[path]


@pytest.mark.parametrize("prog", PAGES)
def test_the_page_and_the_parser_agree(prog: str) -> None:
    found = problems(page_text(prog), prog, PAGES[prog][1]())
    assert not found, "\n".join(found)


def test_the_walk_reaches_nested_commands_and_their_options() -> None:
    """The comparison above sees what it must (a walk that found nothing would pass)."""
    table = dict(commands(lokictl_parser()))
    assert "--tokens-per-month" in required(table[("keys", "add")])
    assert "--no-rpm" in required(table[("keys", "change")])   # help-suppressed, still there
    assert required(table[("replica", "list")]) == ["--json"]
    assert required(table[("logs",)]) == ["--lines", "--follow"]
    assert {"--bus", "--address", "--host", "--hosts"} <= set(required(lokictl_parser()))
    groups, rest = leading_groups(read_page(page_text("lokictl"), "lokictl").synopsis[0])
    assert OPTION.findall(groups) == ["--bus", "--address", "-H"]
    assert command_words(rest) == ({("status",)}, "[**--json**]")
    assert command_words(r"**keys** **add**\|\ **change** *NAME*") == (
        {("keys", "add"), ("keys", "change")}, "*NAME*")
    assert command_words("**start**, **stop**, **restart** *PRESET*")[0] == {
        ("start",), ("stop",), ("restart",)}


@pytest.mark.parametrize("prog, option, command", [
    ("lokictl", "--grace", "keys rotate"),       # its SYNOPSIS line, entry head and body
    ("lokictl", "--lines", "logs"),
    ("lokictl", "--no-tokens-per-month", "keys change"),
    ("lokictl", "--no-wait", "pull"),
    ("lokid", "--status-file", "pull-worker"),
    ("lokid", "--listen", "gateway"),
])
def test_an_option_missing_from_the_page_is_reported(prog: str, option: str,
                                                    command: str) -> None:
    text = page_text(prog).replace(f"**{option}**", option)
    found = problems(text, prog, PAGES[prog][1]())
    assert f"{prog} {command}: {option} is in neither its SYNOPSIS line nor its entry" in found


def test_an_option_only_in_another_commands_part_is_reported() -> None:
    """``--once`` is ``top``'s; shown for ``devices`` only in ``top``'s text, it is missing."""
    parser = lokictl_parser()
    subparser(parser, "devices").add_argument("--once", action="store_true")
    found = problems(page_text("lokictl"), "lokictl", parser)
    assert found == ["lokictl devices: --once is in neither its SYNOPSIS line nor its entry"]


def test_an_option_added_to_a_parser_is_reported() -> None:
    parser = lokictl_parser()
    subparser(parser, "replica", "list").add_argument("--planted", action="store_true")
    parser.add_argument("--planted-global")
    found = problems(page_text("lokictl"), "lokictl", parser)
    assert sorted(found) == sorted([
        "lokictl replica list: --planted is in neither its SYNOPSIS line nor its entry",
        "lokictl: the global option --planted-global is in neither the first SYNOPSIS "
        "line nor OPTIONS"])


def test_a_command_without_a_part_is_reported() -> None:
    parser = lokid_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub.add_parser("planted")
    assert problems(page_text("lokid"), "lokid", parser) == [
        "lokid planted: no SYNOPSIS line and no entry"]


def test_a_stale_synopsis_is_reported() -> None:
    text = page_text("lokictl")
    old = "| **lokictl** ... **reload**\n"
    assert old in text
    text = text.replace(old, "| **lokictl** ... **reload** [**--json**]\n"
                        "| **lokictl** [**--planted**] ... **gone** [**--x**]\n")
    assert sorted(problems(text, "lokictl", lokictl_parser())) == sorted([
        "SYNOPSIS: lokictl reload takes no --json",
        "SYNOPSIS of lokictl: --planted is not a global option of lokictl",
        "SYNOPSIS: lokictl gone is not a command"])


def test_a_stale_option_in_a_combined_line_or_an_entry_head_is_reported() -> None:
    text = page_text("lokictl")
    old = r"**start**\|\ **stop**\|\ **restart** *PRESET* [**--wait**"
    assert old in text
    text = text.replace(old, old.replace("[**--wait**", "[**--once**] [**--wait**"))
    text = text.replace("**keys revoke** *NAME*\n", "**keys revoke** *NAME* [**--grace**]\n")
    found = problems(text, "lokictl", lokictl_parser())
    assert sorted(found) == sorted(
        [f"SYNOPSIS: lokictl {c} takes no --once" for c in ("restart", "start", "stop")]
        + ["entry '**keys revoke** *NAME* [**--grace**]': lokictl keys revoke takes no "
           "--grace"])


def test_a_paragraph_inside_synopsis_is_reported() -> None:
    """The shape lokid.8 had: a description pasted under a SYNOPSIS line."""
    text = page_text("lokid")
    old = "| **lokid** **rpc-worker** *NAME*\n"
    assert old in text
    text = text.replace(old, old + "    ExecStart of loki-rpc@.service.\n\n")
    found = problems(text, "lokid", lokid_parser())
    assert found == ["SYNOPSIS: 'ExecStart of loki-rpc@.service.' is not a line of its "
                     "line block (| **lokid** ...)"]
