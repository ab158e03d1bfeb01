//! Admission control: which calls the ledger takes on now. A bounded number of calls run at
//! once, holding at most a budget of request bytes between them, and the rest are shed at once
//! with RESOURCE_EXHAUSTED and a retry hint, rather than queued without bound; an optional
//! token bucket per tenant keeps one tenant from taking the whole server.
//!
//! The byte budget ([`AdmitBytes`]) is checked before a request is read: gRPC prefixes each
//! message with its length, so the layer reads only the first frame of the body, holds that
//! many bytes of the budget, and lets tonic read and decode the rest. A call refused then costs
//! the server at most what HTTP/2 flow control let the client send ahead, never its decoded
//! message. The bytes are held until both the call's work and its answer are done, since the
//! decoded request, the canonical arguments, the statement's binds and the answer are all
//! copies of about that size.

use crate::reason::Reason;
use std::collections::HashMap;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as _, Frame};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tonic::Status;
use tonic::body::Body;

use super::error::CallError;
use crate::domain::Tenant;

/// When a shed call is worth retrying: long enough for some in-flight calls to finish.
const OVERLOAD_RETRY_AFTER: Duration = Duration::from_millis(100);

/// The limits on calls, shared by every call of the ledger service.
#[derive(Debug)]
pub struct Admission {
    /// One permit per call allowed to run at once.
    running: Arc<Semaphore>,
    /// The permits in all, for the message.
    max_running: usize,
    /// The per-tenant rate, when configured.
    rate: Option<TenantRate>,
}

/// A token bucket per tenant.
#[derive(Debug)]
struct TenantRate {
    /// Tokens added per second.
    per_second: f64,
    /// The bucket's size: the burst a tenant may send at once.
    burst: f64,
    /// Each tenant's bucket: tokens left and when they were counted.
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl Admission {
    /// At most `max_running` calls at once; with `per_second` > 0, each tenant may make that
    /// many calls a second on average and `burst` at once.
    pub fn new(max_running: usize, per_second: f64, burst: f64) -> Admission {
        let max_running = max_running.max(1);
        Admission {
            running: Arc::new(Semaphore::new(max_running)),
            max_running,
            rate: (per_second > 0.0).then(|| TenantRate {
                per_second,
                burst: burst.max(1.0),
                buckets: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Lets a call of `tenant` in, returning the permit it holds while it runs.
    ///
    /// # Errors
    /// `ResourceExhausted` (reason `RATE_LIMITED` or `OVERLOADED`) with a retry hint; nothing
    /// was done for the call.
    pub fn admit(&self, tenant: &Tenant) -> Result<OwnedSemaphorePermit, CallError> {
        if let Some(rate) = &self.rate {
            rate.take(tenant.as_str())?;
        }
        self.running
            .clone()
            .try_acquire_owned()
            .map_err(|_| CallError::ResourceExhausted {
                reason: Reason::Overloaded,
                message: format!(
                    "the server is running its maximum of {} calls; retry shortly",
                    self.max_running
                ),
                retry_after: OVERLOAD_RETRY_AFTER,
            })
    }
}

/// What an admitted call holds while its work runs: its place among the calls running, and
/// the request bytes it was admitted with.
#[derive(Debug)]
pub struct Admitted {
    /// Released when the work ends.
    _running: OwnedSemaphorePermit,
    /// A share of the bytes held for the call (the layer's answer holds the other); the
    /// bytes return to the budget when both are dropped.
    _bytes: Option<HeldBytes>,
}

impl Admitted {
    /// `running`, with the bytes [`AdmitBytes`] held for the call (in its request's
    /// extensions), if any.
    pub fn new(running: OwnedSemaphorePermit, bytes: Option<HeldBytes>) -> Admitted {
        Admitted {
            _running: running,
            _bytes: bytes,
        }
    }
}

/// The request bytes of the calls in flight, against `--max-inflight-bytes`.
#[derive(Debug)]
pub struct BytesInFlight {
    /// The bytes held now.
    used: AtomicUsize,
    /// The most bytes held at once, except by a call larger than the whole budget, which is
    /// let in alone.
    budget: usize,
}

impl BytesInFlight {
    /// A budget of `budget` bytes (at least one).
    pub fn new(budget: usize) -> Arc<BytesInFlight> {
        Arc::new(BytesInFlight {
            used: AtomicUsize::new(0),
            budget: budget.max(1),
        })
    }

    /// The bytes held now.
    pub fn held(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Holds `n` bytes until the returned value (and all its clones) are dropped, or `None`
    /// when that would take the bytes held over the budget. A call larger than the whole
    /// budget is let in when nothing else is held, so that it is slow under load rather than
    /// never served (`--max-message-bytes` bounds it).
    pub fn try_hold(self: &Arc<Self>, n: usize) -> Option<HeldBytes> {
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            if used != 0 && used.saturating_add(n) > self.budget {
                return None;
            }
            match self.used.compare_exchange_weak(
                used,
                used.saturating_add(n),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(HeldBytes(Arc::new(Hold {
                        budget: self.clone(),
                        n,
                    })));
                }
                Err(now) => used = now,
            }
        }
    }
}

/// Bytes held of a [`BytesInFlight`]; they return to it when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct HeldBytes(Arc<Hold>);

impl HeldBytes {
    /// How many bytes are held.
    pub fn bytes(&self) -> usize {
        self.0.n
    }
}

#[derive(Debug)]
struct Hold {
    budget: Arc<BytesInFlight>,
    n: usize,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.n, Ordering::AcqRel);
    }
}

/// The service around the ledger service (inside authentication, so that a caller without a
/// credential learns nothing of the load) that admits each call against the byte budget
/// before its request is read; see the module's documentation.
#[derive(Clone, Debug)]
pub struct AdmitBytes<S> {
    /// The ledger service.
    inner: S,
    /// The budget the calls share.
    budget: Arc<BytesInFlight>,
}

impl<S> AdmitBytes<S> {
    /// Wraps `inner`, admitting its calls against `budget`.
    pub fn new(inner: S, budget: Arc<BytesInFlight>) -> AdmitBytes<S> {
        AdmitBytes { inner, budget }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for AdmitBytes<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower::Service<http::Request<Body>> for AdmitBytes<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The clone that was made ready serves this call (tower's rule for moving a service
        // into a future).
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let budget = self.budget.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let (declared, body) = declared_length(body).await;
            let held = match declared {
                Some(n) => match budget.try_hold(n) {
                    Some(held) => Some(held),
                    None => return Ok(overloaded(&budget)),
                },
                // No complete prefix: tonic answers the malformed request by itself.
                None => None,
            };
            if let Some(held) = &held {
                parts.extensions.insert(held.clone());
            }
            let response = inner.call(http::Request::from_parts(parts, body)).await?;
            Ok(response.map(|answer| {
                Body::new(Holding {
                    answer,
                    _held: held,
                })
            }))
        })
    }
}

/// The answer to a call the byte budget cannot take now.
fn overloaded(budget: &BytesInFlight) -> http::Response<Body> {
    Status::from(CallError::ResourceExhausted {
        reason: Reason::Overloaded,
        message: format!(
            "the server holds its maximum of {} bytes of requests in flight \
             (--max-inflight-bytes); retry shortly",
            budget.budget
        ),
        retry_after: OVERLOAD_RETRY_AFTER,
    })
    .into_http()
}

/// The message length a gRPC request body declares in its 5-byte prefix (a flag byte, then
/// the length, big-endian), read from its first frames, and a body that yields those frames
/// again followed by the rest. `None` when the body ends before the prefix does.
async fn declared_length(mut body: Body) -> (Option<usize>, Body) {
    let mut prefix = [0_u8; 5];
    let mut have = 0;
    let mut head = VecDeque::new();
    let mut failed = None;
    while have < prefix.len() {
        match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let take = (prefix.len() - have).min(data.len());
                    prefix[have..have + take].copy_from_slice(&data[..take]);
                    have += take;
                }
                head.push_back(frame);
            }
            Some(Err(status)) => {
                failed = Some(status);
                break;
            }
            None => break,
        }
    }
    let declared = (have == prefix.len())
        .then(|| u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]))
        .and_then(|n| usize::try_from(n).ok());
    let replayed = Replayed {
        head,
        failed,
        rest: body,
    };
    (declared, Body::new(replayed))
}

/// A request body whose first frames were read already: those first, then the rest.
struct Replayed {
    /// The frames read to find the prefix.
    head: VecDeque<Frame<Bytes>>,
    /// The error reading them ended with, passed on in its place.
    failed: Option<Status>,
    /// The body after them.
    rest: Body,
}

impl http_body::Body for Replayed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(frame) = self.head.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(status) = self.failed.take() {
            return Poll::Ready(Some(Err(status)));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_empty() && self.failed.is_none() && self.rest.is_end_stream()
    }
}

/// An answer's body, holding the call's bytes until it is sent (or dropped): encoding the
/// answer is the call's last copy.
struct Holding {
    answer: Body,
    _held: Option<HeldBytes>,
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Pin::new(&mut self.answer).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.answer.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.answer.size_hint()
    }
}

impl TenantRate {
    fn take(&self, tenant: &str) -> Result<(), CallError> {
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        let (tokens, counted) = buckets
            .entry(tenant.to_string())
            .or_insert((self.burst, now));
        let refilled = (*tokens + now.duration_since(*counted).as_secs_f64() * self.per_second)
            .min(self.burst);
        *counted = now;
        if refilled >= 1.0 {
            *tokens = refilled - 1.0;
            Ok(())
        } else {
            *tokens = refilled;
            let wait = Duration::from_secs_f64((1.0 - refilled) / self.per_second);
            Err(CallError::ResourceExhausted {
                reason: Reason::RateLimited,
                message: format!(
                    "this tenant's rate limit of {} calls a second is reached; retry in {} ms",
                    self.per_second,
                    wait.as_millis().max(1)
                ),
                retry_after: wait,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> Tenant {
        Tenant::from_stored(name.to_string())
    }

    #[test]
    fn calls_beyond_the_maximum_are_shed_with_a_retry_hint() {
        let a = Admission::new(2, 0.0, 0.0);
        let first = a.admit(&tenant("t"));
        let second = a.admit(&tenant("t"));
        assert!(first.is_ok() && second.is_ok());
        match a.admit(&tenant("t")) {
            Err(CallError::ResourceExhausted {
                reason,
                retry_after,
                ..
            }) => {
                assert_eq!(reason, "OVERLOADED");
                assert!(retry_after > Duration::ZERO);
            }
            other => panic!("the third call should be shed: {other:?}"),
        }
        drop(first);
        assert!(
            a.admit(&tenant("t")).is_ok(),
            "a finished call frees its place"
        );
    }

    #[test]
    fn bytes_beyond_the_budget_are_refused_until_held_ones_return() {
        let budget = BytesInFlight::new(100);
        let first = budget.try_hold(60).expect("within the budget");
        let second = budget.try_hold(40).expect("up to the budget exactly");
        assert!(budget.try_hold(1).is_none(), "over the budget");
        // A clone (the answer's share) keeps the bytes held after the work's share is gone.
        let answer = first.clone();
        drop(first);
        assert!(budget.try_hold(60).is_none());
        drop(answer);
        assert_eq!(budget.held(), 40);
        assert_eq!(budget.try_hold(60).map(|h| h.bytes()), Some(60));
        drop(second);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_call_larger_than_the_whole_budget_runs_alone() {
        let budget = BytesInFlight::new(100);
        let small = budget.try_hold(1).expect("small");
        assert!(budget.try_hold(500).is_none(), "not beside another call");
        drop(small);
        let large = budget.try_hold(500).expect("alone");
        assert!(budget.try_hold(1).is_none(), "and nothing beside it");
        drop(large);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn each_tenant_has_its_own_bucket() {
        let a = Admission::new(100, 1.0, 3.0);
        for _ in 0..3 {
            assert!(a.admit(&tenant("busy")).is_ok());
        }
        match a.admit(&tenant("busy")) {
            Err(CallError::ResourceExhausted {
                reason,
                retry_after,
                ..
            }) => {
                assert_eq!(reason, "RATE_LIMITED");
                assert!(retry_after > Duration::from_millis(500), "{retry_after:?}");
            }
            other => panic!("the burst is spent: {other:?}"),
        }
        assert!(
            a.admit(&tenant("quiet")).is_ok(),
            "another tenant is unaffected"
        );
    }
}
