"""What the planning step leaves for the engine step (lokid.store.handoff): the ``kept``
record, written without the JSON module, reads back as JSON; an invocation that would
need escaping is refused rather than written wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lokid.store import handoff


def test_a_kept_start_reads_back_for_its_invocation_only(tmp_path: Path) -> None:
    handoff.write_kept(str(tmp_path), "p", "0123abcdef")
    assert json.loads(Path(tmp_path, "p.prestart").read_text()) == {
        "invocation": "0123abcdef", "kept": True}
    left = handoff.read(str(tmp_path), "p", "0123abcdef")
    assert isinstance(left, handoff.Planned) and left.kept and left.paths == []
    assert handoff.read(str(tmp_path), "p", "another") is None


@pytest.mark.parametrize("invocation", ["", 'a"b', "a\\b", "inv-1", "é1", "a\nb"])
def test_an_invocation_that_needs_escaping_is_refused(tmp_path: Path, invocation: str) -> None:
    assert not handoff.plain_invocation(invocation)
    with pytest.raises(ValueError):
        handoff.write_kept(str(tmp_path), "p", invocation)
    assert not Path(tmp_path, "p.prestart").exists()


def test_the_other_records_are_not_kept(tmp_path: Path) -> None:
    handoff.write_planned(str(tmp_path), "p", "i1", handoff.Planned(["/x"], "", 5))
    left = handoff.read(str(tmp_path), "p", "i1")
    assert isinstance(left, handoff.Planned) and not left.kept and left.paths == ["/x"]
