"""The caller's trace, passed on to the ledger: when ``opentelemetry-api`` is installed and a span
is current, every call carries its ``traceparent`` (and ``tracestate``), so the server's logs and
spans join the agent's tool-call span. Without the package, nothing is sent and nothing is
imported beyond this module."""

from __future__ import annotations

try:  # an optional dependency: pip install 'idempotency-ledger[opentelemetry]'
    from opentelemetry import propagate
except ImportError:  # pragma: no cover (the test environment has it)
    propagate = None

# What the W3C Trace Context propagator writes; anything else a configured propagator adds
# (baggage) stays out of the ledger's requests.
_FIELDS = ("traceparent", "tracestate")


def trace_metadata() -> tuple[tuple[str, str], ...]:
    """The gRPC metadata that carries the current span, or nothing."""
    if propagate is None:
        return ()
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple((name, carrier[name]) for name in _FIELDS if carrier.get(name))
