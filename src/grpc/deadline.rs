//! The call's deadline: how much of it a waiting claim may spend, and running a use case to
//! completion while answering DEADLINE_EXCEEDED just before the deadline.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::error::LedgerError;
use crate::observe::Metrics;

/// How much earlier than the caller's deadline the server answers DEADLINE_EXCEEDED (or a
/// waiting claim answers IN_PROGRESS), so the answer arrives before the caller gives up.
const DEADLINE_MARGIN_MAX: Duration = Duration::from_millis(50);

fn margin(deadline: Instant) -> Duration {
    (deadline.saturating_duration_since(Instant::now()) / 10).min(DEADLINE_MARGIN_MAX)
}

/// Runs `work` in its own task, holding the call's admission `permit` until the work ends, so
/// that a cancelled or timed-out call never drops a write halfway; answers DEADLINE_EXCEEDED
/// shortly before the deadline if it is still running. The work's store errors are counted
/// in the task, once, also when the caller is no longer waiting.
pub(super) async fn run<T, F>(
    metrics: &Arc<Metrics>,
    deadline: Instant,
    permit: OwnedSemaphorePermit,
    work: F,
) -> Result<T, LedgerError>
where
    T: Send + 'static,
    F: Future<Output = Result<T, LedgerError>> + Send + 'static,
{
    let counted = metrics.clone();
    // In the call's span, so what the ledger and the store log is the call's.
    let task = tokio::spawn(
        async move {
            let done = work.await;
            if let Err(e) = &done {
                counted.call_failed(e);
            }
            drop(permit);
            done
        }
        .instrument(tracing::Span::current()),
    );
    match tokio::time::timeout_at(deadline - margin(deadline), task).await {
        Ok(joined) => joined.map_err(|e| {
            let e = LedgerError::Internal(format!("request task failed: {e}"));
            metrics.call_failed(&e);
            e
        })?,
        Err(_) => Err(LedgerError::DeadlineExceeded),
    }
}

/// Parses a `grpc-timeout` header value: up to 8 digits and a unit (H, M, S, m, u, n).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_in_every_unit() {
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("100u"), Some(Duration::from_micros(100)));
        assert_eq!(parse_grpc_timeout("100n"), Some(Duration::from_nanos(100)));
        assert_eq!(parse_grpc_timeout("S"), None);
        assert_eq!(parse_grpc_timeout("123456789S"), None);
        assert_eq!(parse_grpc_timeout("5x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
    }
}
