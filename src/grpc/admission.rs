//! Admission control: which calls the ledger takes on now. A bounded number of calls run at
//! once and the rest are shed at once with RESOURCE_EXHAUSTED and a retry hint, rather than
//! queued without bound; an optional token bucket per tenant keeps one tenant from taking
//! the whole server.

use crate::reason::Reason;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::domain::Tenant;
use crate::error::LedgerError;

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
    pub fn admit(&self, tenant: &Tenant) -> Result<OwnedSemaphorePermit, LedgerError> {
        if let Some(rate) = &self.rate {
            rate.take(&tenant.0)?;
        }
        self.running
            .clone()
            .try_acquire_owned()
            .map_err(|_| LedgerError::ResourceExhausted {
                reason: Reason::Overloaded,
                message: format!(
                    "the server is running its maximum of {} calls; retry shortly",
                    self.max_running
                ),
                retry_after: OVERLOAD_RETRY_AFTER,
            })
    }
}

impl TenantRate {
    fn take(&self, tenant: &str) -> Result<(), LedgerError> {
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
            Err(LedgerError::ResourceExhausted {
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
        Tenant(name.to_string())
    }

    #[test]
    fn calls_beyond_the_maximum_are_shed_with_a_retry_hint() {
        let a = Admission::new(2, 0.0, 0.0);
        let first = a.admit(&tenant("t"));
        let second = a.admit(&tenant("t"));
        assert!(first.is_ok() && second.is_ok());
        match a.admit(&tenant("t")) {
            Err(LedgerError::ResourceExhausted {
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
    fn each_tenant_has_its_own_bucket() {
        let a = Admission::new(100, 1.0, 3.0);
        for _ in 0..3 {
            assert!(a.admit(&tenant("busy")).is_ok());
        }
        match a.admit(&tenant("busy")) {
            Err(LedgerError::ResourceExhausted {
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
