//! The call's deadline: how much of it a waiting claim may spend, and running a use case to
//! completion while answering DEADLINE_EXCEEDED just before the deadline.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument as _;

use super::admission::Admitted;
use super::error::CallError;
use crate::error::LedgerError;
use crate::observe::Metrics;

/// How much earlier than the caller's deadline the server answers DEADLINE_EXCEEDED (or a
/// waiting claim answers IN_PROGRESS), so the answer arrives before the caller gives up.
const DEADLINE_MARGIN_MAX: Duration = Duration::from_millis(50);

fn margin(deadline: Instant) -> Duration {
    (deadline.saturating_duration_since(Instant::now()) / 10).min(DEADLINE_MARGIN_MAX)
}

/// Runs `work` to its end, holding the call's admission `permit` until it ends, so that a
/// cancelled or timed-out call never drops a write halfway; answers DEADLINE_EXCEEDED shortly
/// before the deadline if it is still running. The work's store errors are counted with it,
/// once, also when the caller is no longer waiting.
///
/// The work runs on the call's own task while the call waits for it (no task hand-off per
/// call); only a call abandoned before its work ended (the deadline passed, or the caller went
/// away) hands the rest to a task of its own, which finishes it ([`RunToEnd`]).
pub(super) async fn run<T, F>(
    metrics: &Arc<Metrics>,
    deadline: Instant,
    permit: Admitted,
    work: F,
) -> Result<T, CallError>
where
    T: Send + 'static,
    F: Future<Output = Result<T, LedgerError>> + Send + 'static,
{
    let counted = metrics.clone();
    // In the call's span, so what the ledger and the store log is the call's, also when the
    // work is finished on a task of its own.
    let work = RunToEnd::new(
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
    match tokio::time::timeout_at(deadline - margin(deadline), work).await {
        // A panic's error is counted here; the work's own errors were counted with it.
        Ok(ran) => Ok(ran.inspect_err(|e| metrics.call_failed(e))??),
        Err(_) => Err(CallError::DeadlineExceeded),
    }
}

/// A future that is finished even if it is dropped first: polled in place while its owner
/// waits, and handed to a task of its own (on the runtime it was dropped on) if dropped
/// before it ended. A panic in it is answered as an internal error.
struct RunToEnd<F: Future<Output: Send + 'static> + Send + 'static> {
    /// `None` once it ended.
    work: Option<std::pin::Pin<Box<F>>>,
}

impl<F: Future<Output: Send + 'static> + Send + 'static> RunToEnd<F> {
    fn new(work: F) -> Self {
        RunToEnd {
            work: Some(Box::pin(work)),
        }
    }
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Future for RunToEnd<F> {
    type Output = Result<F::Output, LedgerError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::panic::{AssertUnwindSafe, catch_unwind};
        use std::task::Poll;
        let Some(work) = self.work.as_mut() else {
            return Poll::Ready(Err(LedgerError::Internal(
                "a call's work was polled after it ended".into(),
            )));
        };
        let polled = catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => {
                self.work = None;
                Poll::Ready(Ok(out))
            }
            Err(panic) => {
                self.work = None;
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Poll::Ready(Err(LedgerError::Internal(format!(
                    "the call's work panicked: {what}"
                ))))
            }
        }
    }
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Drop for RunToEnd<F> {
    fn drop(&mut self) {
        if let Some(work) = self.work.take() {
            // Outside a runtime (it is shutting down) nothing can run it any more.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(work);
            }
        }
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
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::sync::{Semaphore, oneshot};

    use super::*;
    use crate::domain::time::SystemClock;
    use crate::grpc::admission::BytesInFlight;
    use crate::observe::MetricsOptions;

    fn metrics() -> Arc<Metrics> {
        Metrics::new(Arc::new(SystemClock), &MetricsOptions::default())
    }

    /// The work of a call whose deadline passes first, and of a call dropped by its caller,
    /// still runs to its end, and holds the call's admission permit and request bytes until
    /// then.
    #[tokio::test]
    async fn an_abandoned_call_finishes_its_work_and_keeps_its_permit_until_then() {
        let admission = Arc::new(Semaphore::new(2));
        let bytes = BytesInFlight::new(1000);
        for abandon_by_drop in [false, true] {
            let (go, wait) = oneshot::channel::<()>();
            let (finished, seen) = oneshot::channel::<()>();
            let permit = Admitted::new(
                admission.clone().acquire_owned().await.expect("permit"),
                bytes.try_hold(600),
            );
            let work = async move {
                let _ = wait.await;
                let _ = finished.send(());
                Ok(())
            };
            let m = metrics();
            let call = run(
                &m,
                Instant::now() + Duration::from_millis(100),
                permit,
                work,
            );
            if abandon_by_drop {
                let polled = tokio::time::timeout(Duration::from_millis(20), call).await;
                assert!(polled.is_err(), "the work waits for `go`");
            } else {
                let answer = call.await;
                assert!(
                    matches!(answer, Err(CallError::DeadlineExceeded)),
                    "{answer:?}"
                );
            }
            assert_eq!(admission.available_permits(), 1, "held by the running work");
            assert_eq!(bytes.held(), 600, "the bytes too");
            go.send(()).expect("the work is still there to be told");
            tokio::time::timeout(Duration::from_secs(5), seen)
                .await
                .expect("the abandoned work ran to its end")
                .expect("it reported");
            tokio::time::timeout(Duration::from_secs(5), async {
                while admission.available_permits() < 2 {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .expect("the permit is released when the work ends");
            assert_eq!(bytes.held(), 0, "and the bytes with it");
        }
    }

    #[tokio::test]
    async fn a_call_whose_work_panics_is_answered_internal() {
        let admission = Arc::new(Semaphore::new(1));
        let permit = Admitted::new(
            admission.clone().acquire_owned().await.expect("permit"),
            None,
        );
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let work = async move {
            flag.store(true, Ordering::SeqCst);
            if flag.load(Ordering::SeqCst) {
                panic!("a bug");
            }
            Ok::<(), LedgerError>(())
        };
        let answer = run(
            &metrics(),
            Instant::now() + Duration::from_secs(5),
            permit,
            work,
        )
        .await;
        assert!(ran.load(Ordering::SeqCst));
        match answer {
            Err(CallError::Ledger(LedgerError::Internal(message))) => {
                assert!(message.contains("a bug"), "{message}")
            }
            other => panic!("expected INTERNAL, got {other:?}"),
        }
        assert_eq!(
            admission.available_permits(),
            1,
            "the permit went with the work"
        );
    }

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
