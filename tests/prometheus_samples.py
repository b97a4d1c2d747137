"""Reading Prometheus scrapes in tests: parse with the client library, pick one sample."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def families(text: str) -> dict[str, Any]:
    """Family name (without ``_total``) → the parsed family."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(parsed: dict[str, Any], family: str, sample: str = "", **labels: str) -> float:
    """The sample ``sample`` (default: the family's own, or its ``_total``) with ``labels``."""
    names = {sample} if sample else {family, family + "_total"}
    for s in parsed[family].samples:
        if s.name in names and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError(f"no sample {names} {labels} in {family}")
