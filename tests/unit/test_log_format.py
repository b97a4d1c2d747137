"""Node log lines (nonstop.node.log_format): one JSON object per event, or plain text."""

from __future__ import annotations

import io
import json
import logging

from nonstop.node.log_events import parse_line
from nonstop.node.log_format import REQUIRED_FIELDS, JsonLineFormatter, formatter


def emit(fmt: logging.Formatter, build: object) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(fmt)
    logger = logging.getLogger("nonstop.test.logformat")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    try:
        build(logger)  # type: ignore[operator]
    finally:
        logger.handlers.clear()
    return stream.getvalue()


def test_a_json_line_has_the_required_fields_and_the_extras() -> None:
    out = emit(
        JsonLineFormatter("A"),
        lambda log: log.warning("peer %s is %s", "B", "Down", extra={"peer": "B", "n": 3}),
    )
    lines = out.splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert list(event)[: len(REQUIRED_FIELDS)] == list(REQUIRED_FIELDS)
    assert event["node"] == "A"
    assert event["level"] == "WARNING"
    assert event["logger"] == "nonstop.test.logformat"
    assert event["message"] == "peer B is Down"
    assert event["peer"] == "B" and event["n"] == 3
    assert event["time"].endswith("Z") and "T" in event["time"]


def test_an_exception_stays_on_one_line_and_odd_values_are_written() -> None:
    def build(log: logging.Logger) -> None:
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            log.exception("failed", extra={"thing": object()})

    lines = emit(JsonLineFormatter("B"), build).splitlines()
    assert len(lines) == 1, "a traceback must not break the one-event-per-line rule"
    event = json.loads(lines[0])
    assert "ValueError: boom" in event["exc"]
    assert event["thing"].startswith("<object object")


def test_text_format_is_still_available_and_read_back() -> None:
    out = emit(formatter("text", "C"), lambda log: log.info("hello %d", 5))
    assert " INFO C nonstop.test.logformat: hello 5" in out
    event = parse_line(out.splitlines()[0])
    assert event is not None
    assert (event.node, event.level, event.message) == ("C", "INFO", "hello 5")


def test_a_json_line_is_read_back_with_its_fields() -> None:
    out = emit(JsonLineFormatter("A"), lambda log: log.error("x", extra={"view": 4}))
    event = parse_line(out.splitlines()[0])
    assert event is not None
    assert (event.node, event.level, event.logger, event.message) == (
        "A",
        "ERROR",
        "nonstop.test.logformat",
        "x",
    )
    assert event.fields == {"view": 4}
