"""lokid.core.serve.waiting: the rows a gateway reports of who waits, checked and kept by the
daemon (issue 46, item 4)."""

from __future__ import annotations

import pytest

from lokid.core.errors import InvalidArgsError
from lokid.core.serve.waiting import FRESH, MAX_ROWS, MAX_WHY, Queues, Row, changed, check_rows


def wire(preset: str = "alpha", key: str = "bob", batch: bool = False, n: int = 2,
         oldest: float = 3.0, why: str = "slots busy (1/1)") -> list[object]:
    return [preset, key, batch, n, oldest, why]


def test_rows_are_checked_whole_naming_the_bad_one() -> None:
    assert check_rows([wire(), wire(key="keys-file:0a1b2c3d"), wire(key="-")])[0] == \
        Row("alpha", "bob", False, 2, 3.0, "slots busy (1/1)")
    for bad, said in [(wire(preset="../x"), "row 2: preset"), (wire(key="a b"), "row 2: key"),
                      (wire(n=0), "row 2: 0 waiting"), (wire(oldest=-1.0), "oldest -1.0"),
                      (wire(why="x" * (MAX_WHY + 1)), "at most 200")]:
        with pytest.raises(InvalidArgsError, match=said):
            check_rows([wire(), bad])
    with pytest.raises(InvalidArgsError, match="at most 4096"):
        check_rows([wire()] * (MAX_ROWS + 1))
    assert check_rows([wire(why="busy\x1b[2J")])[0].why != "busy\x1b[2J"   # printable


def test_the_daemon_ages_the_oldest_wait_and_forgets_a_word_not_repeated() -> None:
    q = Queues()
    rows = check_rows([wire(oldest=3.0), wire(key="job", batch=True, n=1, oldest=1.0)])
    assert q.report(rows, 100.0, {"alpha": object()})
    shown = q.shown(105.0)
    assert [(r["key"], r["class"], r["waiting"], r["oldest_s"]) for r in shown] == [
        ("bob", "interactive", 2, 8.0), ("job", "batch", 1, 6.0)]
    assert not q.report(check_rows([wire(oldest=9.0), wire(key="job", batch=True, n=1)]),
                        106.0)   # only the ages moved: no change to announce
    assert q.shown(106.0 + FRESH + 1) == []   # the gateway went quiet
    assert q.report(check_rows([wire(preset="gone")]), 200.0, {"alpha": object()}) is False
    assert q.shown(200.0) == []   # a preset the daemon does not know is left out


def test_a_change_is_a_count_or_a_why_never_an_age() -> None:
    a = [Row("alpha", "bob", False, 2, 1.0, "loading")]
    assert not changed(a, [Row("alpha", "bob", False, 2, 7.0, "loading")])
    assert changed(a, [Row("alpha", "bob", False, 3, 1.0, "loading")])
    assert changed(a, [Row("alpha", "bob", False, 2, 1.0, "slots busy (1/1)")])
    assert changed(a, [])
