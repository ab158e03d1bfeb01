//! The W3C trace context of a call: the caller's `traceparent` read by OpenTelemetry's
//! propagator, the call's ids (trace, parent span, own span) and their hex for the log.

use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{SpanId, TraceContextExt as _, TraceId};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::LOG_TARGET;

/// A fresh span id for a call whose span is not exported: 64 bits of the thread's generator
/// (`rand::rng()`, seeded by the operating system, no system call per draw), as
/// OpenTelemetry's own SDK draws them; an id must not be zero.
pub(super) fn new_span_id() -> SpanId {
    use rand::Rng as _;
    SpanId::from(rand::rng().next_u64().max(1))
}

/// A request's headers as the propagator reads them. A header sent more than once is absent:
/// the recommendation makes several `traceparent`s invalid.
struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let mut values = self.0.get_all(key).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        value.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// The caller's trace context, from a valid `traceparent` (and its `tracestate`), or none. An
/// invalid one (or several) is ignored, as the recommendation says, and never fails the call.
/// Nothing is read, and nothing allocated, for a call that sends none.
pub(super) fn remote_parent(headers: &http::HeaderMap) -> Option<opentelemetry::Context> {
    let mut values = headers.get_all("traceparent").iter();
    let value = values.next()?;
    if values.next().is_some() {
        tracing::debug!(target: LOG_TARGET, "ignoring traceparent: sent more than once");
        return None;
    }
    let Ok(text) = value.to_str() else {
        tracing::debug!(target: LOG_TARGET, "ignoring traceparent: not visible ASCII");
        return None;
    };
    let cx = TraceContextPropagator::new()
        .extract_with_context(&opentelemetry::Context::new(), &Headers(headers));
    if cx.span().span_context().is_valid() {
        return Some(cx);
    }
    // The value is a header, not a payload; shortened so a junk header cannot bloat the log.
    let shown = text.get(..64).unwrap_or(text);
    tracing::debug!(
        target: LOG_TARGET,
        traceparent = shown,
        "ignoring an invalid traceparent"
    );
    None
}

/// The ids of a call, as the log shows them and the exported span carries them.
#[derive(Clone, Copy, Debug)]
pub(super) struct CallIds {
    /// The caller's trace, or (with traces exported) the one the call's span started.
    trace_id: Option<TraceId>,
    /// The caller's span, from its `traceparent`.
    parent_id: Option<SpanId>,
    /// The call's own span.
    span_id: SpanId,
}

impl CallIds {
    /// The ids of a call with the trace context `parent`, whose exported span is `server` (a
    /// disabled span when traces are not exported). With a span, it is made the child of
    /// `parent` here, before anything starts under it.
    pub(super) fn new(server: &tracing::Span, parent: Option<opentelemetry::Context>) -> CallIds {
        let caller = parent.as_ref().map(|cx| {
            let sc = cx.span().span_context().clone();
            (sc.trace_id(), sc.span_id())
        });
        if server.is_disabled() {
            return CallIds {
                trace_id: caller.map(|(trace, _)| trace),
                parent_id: caller.map(|(_, span)| span),
                span_id: new_span_id(),
            };
        }
        if let Some(cx) = parent {
            // Only fails without the OpenTelemetry layer, which is what enabled the span.
            let _ = server.set_parent(cx);
        }
        let own = server.context().span().span_context().clone();
        CallIds {
            trace_id: Some(own.trace_id()),
            parent_id: caller.map(|(_, span)| span),
            span_id: own.span_id(),
        }
    }

    pub(super) fn trace_hex(&self) -> Option<Hex<32>> {
        self.trace_id.map(|id| Hex::of(&id.to_bytes()))
    }

    pub(super) fn parent_hex(&self) -> Option<Hex<16>> {
        self.parent_id.map(|id| Hex::of(&id.to_bytes()))
    }

    pub(super) fn span_hex(&self) -> Hex<16> {
        Hex::of(&self.span_id.to_bytes())
    }
}

/// An id in lowercase hex, on the stack: the log's fields are strings, and a call allocates
/// none for them.
pub(super) struct Hex<const N: usize>([u8; N]);

impl<const N: usize> Hex<N> {
    /// The hex of `bytes`, which are `N / 2` long.
    fn of(bytes: &[u8]) -> Hex<N> {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [b'0'; N];
        for (i, b) in bytes.iter().take(N / 2).enumerate() {
            out[2 * i] = DIGITS[usize::from(b >> 4)];
            out[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
        }
        Hex(out)
    }

    pub(super) fn as_str(&self) -> &str {
        // Hex digits only, so always UTF-8.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(values: &[&str]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for v in values {
            map.append(
                "traceparent",
                http::HeaderValue::from_str(v).expect("header"),
            );
        }
        map
    }

    fn parent_of(values: &[&str]) -> Option<(String, String, bool)> {
        remote_parent(&headers(values)).map(|cx| {
            let sc = cx.span().span_context().clone();
            (
                sc.trace_id().to_string(),
                sc.span_id().to_string(),
                sc.is_sampled(),
            )
        })
    }

    #[test]
    fn a_valid_traceparent_gives_the_callers_ids_and_sampled_flag() {
        assert_eq!(
            parent_of(&[VALID]),
            Some((
                "4bf92f3577b34da6a3ce929d0e0e4736".into(),
                "00f067aa0ba902b7".into(),
                true
            ))
        );
        let unsampled = VALID.replace("-01", "-00");
        assert_eq!(parent_of(&[&unsampled]).map(|p| p.2), Some(false));
        // A later version is read the same way, and may have more after the flags.
        let later = VALID.replacen("00", "01", 1);
        assert!(parent_of(&[&format!("{later}-what-comes-next")]).is_some());
    }

    #[test]
    fn invalid_repeated_or_absent_traceparents_are_ignored() {
        assert_eq!(parent_of(&[]), None);
        assert_eq!(parent_of(&[VALID, VALID]), None, "sent twice");
        for bad in [
            VALID.to_uppercase(),
            VALID.replacen("00", "ff", 1),
            format!("{VALID}-extra"),
            format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32)),
            format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01", "0".repeat(16)),
            VALID.replace("00f0", "00z0"),
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01".into(),
            String::new(),
        ] {
            assert_eq!(parent_of(&[&bad]), None, "{bad:?}");
        }
    }

    #[test]
    fn ids_are_lowercase_hex_of_their_full_width() {
        let trace = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex");
        let small = SpanId::from(0xab);
        let ids = CallIds {
            trace_id: Some(trace),
            parent_id: Some(small),
            span_id: small,
        };
        assert_eq!(
            ids.trace_hex().as_ref().map(Hex::as_str),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(ids.span_hex().as_str(), "00000000000000ab");
    }
}
