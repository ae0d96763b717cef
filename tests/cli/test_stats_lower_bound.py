"""lokictl stats says when the figures are a lower bound (issue 45, item 9): journald
dropped lines of the engine, so the counts are "at least", and while the requests in
flight are unknown the idle stop waits; figures read whole say nothing of the kind."""

from __future__ import annotations

from lokid.ctl.stats import stats_text

FIGURES = {"requests": 12695, "prompt_tokens": 100, "generated_tokens": 50,
           "invocation": "a" * 32}


def test_a_lower_bound_is_said_with_the_lines_missed() -> None:
    text = stats_text("gamma", {**FIGURES, "missed_lines": 18582,
                                "requests_lower_bound": True, "in_flight_known": False})
    assert text.startswith("gamma: at least 12695 requests"), text
    assert "journald dropped 18582 engine lines: the counts are a lower bound" in text
    assert "requests in flight unknown, no idle stop" in text


def test_whole_figures_say_nothing_of_it() -> None:
    text = stats_text("gamma", FIGURES)
    assert "at least" not in text and "journald" not in text
