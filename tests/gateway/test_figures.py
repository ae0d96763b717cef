"""lokid.gateway.figures and the counters of lokid.gateway.usage, table-tested: the engine's
figures read from an answer (timings first, usage else), never from a string inside it;
bad values refused; a stream's tail bounded whatever its length; the pending rows bounded,
sent in batches, and what came during a report kept. The real engine's answers through
the real gateway are test_usage.py's."""

from __future__ import annotations

import json

import pytest

from lokid.gateway import usage as usage_module
from lokid.gateway.figures import TAIL, UNKNOWN, WINDOW, Figures, Tail, figures_of
from lokid.gateway.usage import BATCH, MAX_COUNTERS, Usage

TIMINGS = {"cache_n": 4, "prompt_n": 13, "prompt_ms": 0.5, "predicted_n": 300,
           "predicted_ms": 1497.5, "predicted_per_second": 199.7}


def answer(**fields: object) -> bytes:
    return json.dumps({"choices": [{"message": {"content": "hi"}}], **fields}).encode()


@pytest.mark.parametrize("body, expected", [
    (answer(timings=TIMINGS), Figures(17, 4, 300, 1498.0, True)),
    # timings win over usage (an engine's own; usage is its copy)
    (answer(usage={"prompt_tokens": 1, "completion_tokens": 1}, timings=TIMINGS),
     Figures(17, 4, 300, 1498.0, True)),
    (answer(usage={"prompt_tokens": 17, "completion_tokens": 5,
                   "prompt_tokens_details": {"cached_tokens": 4}}), Figures(17, 4, 5, 0, True)),
    (answer(usage={"prompt_tokens": 8, "total_tokens": 8}), Figures(8, 0, 0, 0, True)),
    # Anthropic's shape: the prompt is input + cache reads + cache writes
    (answer(usage={"input_tokens": 10, "cache_read_input_tokens": 30,
                   "cache_creation_input_tokens": 2, "output_tokens": 7}),
     Figures(42, 30, 7, 0, True)),
    (answer(), UNKNOWN),
    (b"", UNKNOWN),
    (b"not json at all \"timings\": {", UNKNOWN),
    # bad counts: no figure rather than a poisoned total
    (answer(timings={**TIMINGS, "predicted_n": -1}), UNKNOWN),
    (answer(timings={**TIMINGS, "prompt_n": 1.5}), UNKNOWN),
    (answer(timings={**TIMINGS, "prompt_n": True}), UNKNOWN),
    (answer(timings={**TIMINGS, "prompt_n": 10 ** 13}), UNKNOWN),
    (answer(usage={"prompt_tokens": 3, "completion_tokens": "9"}), UNKNOWN),
    (answer(usage={"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 9}}),
     UNKNOWN),
])
def test_figures_of(body: bytes, expected: Figures) -> None:
    assert figures_of(body) == expected


def test_a_string_that_says_timings_is_not_read() -> None:
    """A prompt or an answer quoting ``"timings": {…}`` is inside a JSON string, its
    quotes escaped: never taken for the engine's own (here: after the real one, so a
    search from the end meets it first)."""
    fake = json.dumps({"timings": {"prompt_n": 999999, "predicted_n": 999999}})
    body = answer(timings=TIMINGS, tail=fake, usage=None)
    assert fake.encode() not in body and b'\\"timings\\"' in body
    assert figures_of(body) == Figures(17, 4, 300, 1498.0, True)
    # only the quoted text: no figures at all
    assert figures_of(answer(content=fake)) == UNKNOWN


def test_a_value_past_the_window_is_no_figure() -> None:
    padded = {"prompt_n": 1, "predicted_n": 2, "pad": "x" * WINDOW}
    assert figures_of(answer(timings=padded)) == UNKNOWN


def sse(event: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def test_a_stream_tail_is_bounded_and_reads_the_last_event() -> None:
    """10 MiB of events fed in parts of every size: the tail never holds much more than
    TAIL bytes, and the figures are the last event's (cumulative timings per token, as
    llama-server's ``timings_per_token`` sends them: the last one is the whole)."""
    tail = Tail()
    fed = 0
    i = 0
    while fed < 10 * 1024 * 1024:
        event = sse({"choices": [{"delta": {"content": "x" * (i % 300)}}],
                     "timings": {**TIMINGS, "predicted_n": i}})
        for cut in range(0, len(event), 1 + i % 97):   # split anywhere, the key too
            tail.feed(event[cut:cut + 1 + i % 97])
            assert tail.size <= 2 * TAIL + 97
        fed += len(event)
        i += 1
    tail.feed(sse({"choices": [], "usage": {"prompt_tokens": 17, "completion_tokens": i}}))
    tail.feed(b"data: [DONE]\n\n")
    assert tail.figures() == Figures(17, 4, i - 1, 1498.0, True)


def test_a_stream_cut_before_its_figures_has_none() -> None:
    tail = Tail()
    for _ in range(100):
        tail.feed(sse({"choices": [{"delta": {"content": "tok"}}]}))
    assert tail.figures() == UNKNOWN


def test_rows_bounded_batched_and_kept_during_a_report(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    monkeypatch.setattr(usage_module, "MAX_ROWS", 5000)
    u = Usage()
    f = Figures(10, 2, 5, 7.4, True)
    for i in range(6000):
        u.count(("2026-12-07", f"k{i}", "p"), 200, f, 1.0, "local")
    assert len(u.pending) == 5000 and u.dropped == 1000
    sent = u.batch()
    assert len(sent) == BATCH
    rows = u.rows(sent)
    assert rows[0][3] == {"requests": 1, "prompt_tokens": 10, "cached_tokens": 2,
                          "generated_tokens": 5, "wait_ms": 1, "engine_ms": 7}
    # a request of a sent row ends while the report is on its way: kept for the next
    u.count(("2026-12-07", rows[0][1], "p"), 429, UNKNOWN, 0.0, "peer:b")
    u.taken(sent)
    assert len(u.pending) == 5000 - BATCH + 1
    left = u.pending[("2026-12-07", rows[0][1], "p")]
    assert {k: v for k, v in left.items() if v} == {"requests": 1, "refused_429": 1,
                                                    "peer_requests": 1}


def test_refusal_counters_per_row_are_bounded() -> None:
    u = Usage()
    for code in range(400, 600):
        u.count(("2026-12-07", "k", "p"), code, UNKNOWN, 0.0, "local")
    counters = u.pending[("2026-12-07", "k", "p")]
    assert len(counters) == MAX_COUNTERS and counters["requests"] == 200


@pytest.mark.parametrize("parts", [1, 3000])
def test_an_anthropic_stream_takes_its_prompt_from_its_first_event(parts: int) -> None:
    """/v1/messages streamed, as llama-server b11434 writes it: the prompt in
    message_start, the output in message_delta; short (both in the kept head) or long
    (message_start long gone from the tail)."""
    def event(name: str, data: dict[str, object]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
    tail = Tail()
    tail.feed(event("message_start", {"type": "message_start", "message": {
        "usage": {"cache_read_input_tokens": 27, "input_tokens": 1, "output_tokens": 0}}}))
    for _ in range(parts):
        tail.feed(event("content_block_delta", {"type": "content_block_delta", "delta": {
            "type": "text_delta", "text": "word " * 10}}))
    tail.feed(event("message_delta", {"type": "message_delta", "usage": {
        "output_tokens": parts}}))
    tail.feed(event("message_stop", {"type": "message_stop"}))
    assert tail.figures() == Figures(28, 27, parts, 0.0, True)

