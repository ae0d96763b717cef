"""The engine's last error line of a start (lokid.core.telemetry.lasterror), on recorded
engine lines (tests/data/engine-logs: the real llama-server b11434's stderr)."""

from __future__ import annotations

from support import DATA

from lokid.core.telemetry.lasterror import MAX_CHARS, LastErrors, is_error_line

LOGS = DATA / "engine-logs"


def test_the_last_error_line_of_a_start_is_quoted_without_its_stamp() -> None:
    errors = LastErrors()
    for line in (LOGS / "b11434-cpu-missingmd.log").read_text().splitlines():
        errors.feed("p", "inv1", line)
    assert errors.of("p") == "srv  llama_server: exiting due to model loading error"
    errors = LastErrors()
    for line in (LOGS / "b11434-cpu-badtype.log").read_text().splitlines():
        errors.feed("p", "inv1", line)  # the usage text after the error is none
    assert errors.of("p") == ('error while handling argument "--spec-type": unknown '
                              'speculative type: draft-mtpx')


def test_progress_and_requests_are_no_errors_and_a_new_start_forgets() -> None:
    errors = LastErrors()
    for line in (LOGS / "b11434-cpu-tiny-llama-ngram.log").read_text().splitlines():
        errors.feed("p", "inv1", line)
    assert errors.of("p") == ""
    errors.feed("p", "inv1", "error: invalid argument: --no-such-flag")
    assert errors.of("p") == "error: invalid argument: --no-such-flag"
    errors.feed("p", "inv2", "main: loading model")   # the next start's lines
    assert errors.of("p") == ""
    errors.feed("p", "inv2", "E " + "x" * 5000)
    assert len(errors.of("p")) == MAX_CHARS
    errors.forget("p")
    assert errors.of("p") == ""
    assert is_error_line("GGML_ASSERT(layer.nextn.eh_proj && \"MTP\") failed")
    assert not is_error_line("srv  log_server_r: request: GET /health 127.0.0.1 200")
