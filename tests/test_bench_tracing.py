"""The tracing bench's parts that need no services: its sides' environments and span_cost."""

from __future__ import annotations

from pathlib import Path

import pytest

from proving.bench.tracing import _env, span_cost


def test_only_the_on_side_is_sent_otel_variables_and_only_it_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")  # the caller's own, never passed on
    off = _env(Path("/tree"), None, 0.01)
    on = _env(Path("/tree"), "http://127.0.0.1:4318", 0.01)
    every = _env(Path("/tree"), "http://127.0.0.1:4318")
    assert not [k for k in off if k.startswith("OTEL_")]
    assert on["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert on["OTEL_TRACES_SAMPLER_ARG"] == "0.01"
    assert "OTEL_TRACES_SAMPLER" not in every  # the SDK's default: every trace
    assert off["PYTHONPATH"] == on["PYTHONPATH"] == "/tree"


def test_span_cost_measures_a_start_and_an_encoding_of_each_span() -> None:
    made, encoded = span_cost(spans=200)
    assert made > 0 and encoded > 0
