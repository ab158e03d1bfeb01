//! Waking the claims that wait for an attempt in flight.
//!
//! Every waiting claim of one (tenant, key) on this server shares one [`KeyWatch`]. A
//! completion on this server wakes it directly, without touching the database; a completion on
//! another server arrives as a PostgreSQL notification ([`crate::storage::Store::subscribe`])
//! and wakes it the same way. Where notifications are unavailable (behind PgBouncer in
//! transaction mode) or as a safety net for ones missed while the listening connection was
//! down, one poller per watched key reads the entry at a fixed interval and wakes every waiter
//! of that key: many waiters cost one read per tick, not one each.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use crate::domain::time::Clock;
use crate::domain::{Key, Status, Tenant};
use crate::storage::Store;

/// What the waiters of one key share.
#[derive(Debug, Default)]
pub struct KeyWatch {
    /// Woken (all waiters at once) whenever the entry may have left ATTEMPTING.
    notify: Notify,
}

impl KeyWatch {
    /// A future that completes at the next wake-up. It receives wake-ups from the moment it is
    /// created, so create it *before* reading the entry: a completion between the read and the
    /// await is not lost.
    pub fn notified(&self) -> Notified<'_> {
        self.notify.notified()
    }
}

/// The keys this server's claims wait on.
pub struct WaitHub {
    /// Live watches; an entry whose last waiter left is swept on the next `watch`.
    watches: Mutex<HashMap<(Tenant, Key), Weak<KeyWatch>>>,
    /// Where the poller reads entries.
    store: Arc<dyn Store>,
    /// Where the poller reads the time (to notice an expired lease).
    clock: Arc<dyn Clock>,
    /// How often a watched key is read from the store; `None` when every change is announced
    /// in-process (a store only this server uses).
    poll_interval: Option<Duration>,
    /// Claims parked now: each read the entry, found the attempt in flight, and sleeps until a
    /// wake-up or its time is up (see [`WaitHub::waiting`]).
    waiting: AtomicUsize,
}

/// One claim waiting, counted in [`WaitHub::waiting_claims`] until dropped.
pub struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl WaitHub {
    /// A hub over `store`. `poll_interval` is how often a watched key is read from the store:
    /// `Some` where other servers share it (their completions are not announced here), `None`
    /// where every change is announced in-process.
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        poll_interval: Option<Duration>,
    ) -> WaitHub {
        WaitHub {
            watches: Mutex::new(HashMap::new()),
            store,
            clock,
            poll_interval,
            waiting: AtomicUsize::new(0),
        }
    }

    /// Counts a claim parked until its next wake-up (its watch's, or its own timer), from
    /// after the read that found the attempt in flight until the guard is dropped.
    pub fn waiting(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(&self.waiting)
    }

    /// How many claims are parked now, on any key: what shows, from outside, that a claim
    /// waits for a change rather than being yet to arrive or to read (for tests and metrics).
    pub fn waiting_claims(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The shared watch of (tenant, key), created (with its poller, if polling) for the first
    /// waiter. Waiters keep it alive; it ends with the last of them.
    pub fn watch(&self, tenant: &Tenant, key: &Key) -> Arc<KeyWatch> {
        let mut watches = self
            .watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = (tenant.clone(), key.clone());
        if let Some(existing) = watches.get(&id).and_then(Weak::upgrade) {
            return existing;
        }
        watches.retain(|_, w| w.strong_count() > 0);
        let watch = Arc::new(KeyWatch::default());
        watches.insert(id.clone(), Arc::downgrade(&watch));
        if let Some(interval) = self.poll_interval {
            tokio::spawn(poll(
                Arc::downgrade(&watch),
                self.store.clone(),
                self.clock.clone(),
                id,
                interval,
            ));
        }
        watch
    }

    /// Wakes every waiter of (tenant, key) on this server; nothing when nobody waits.
    pub fn wake(&self, tenant: &Tenant, key: &Key) {
        let watches = self
            .watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(watch) = watches
            .get(&(tenant.clone(), key.clone()))
            .and_then(Weak::upgrade)
        {
            watch.notify.notify_waiters();
        }
    }

    /// How many keys have waiters now (for tests and metrics).
    pub fn watched_keys(&self) -> usize {
        let watches = self
            .watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        watches.values().filter(|w| w.strong_count() > 0).count()
    }
}

/// Reads one watched entry every `interval` while anyone waits on it, and wakes the waiters
/// once it is no longer an attempt in flight.
async fn poll(
    watch: Weak<KeyWatch>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    (tenant, key): (Tenant, Key),
    interval: Duration,
) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(watch) = watch.upgrade() else {
            return;
        };
        match store.get(&tenant, &key).await {
            Ok(Some(entry)) if entry.effective_status(clock.now()) == Status::Attempting => {}
            Ok(_) => watch.notify.notify_waiters(),
            Err(e) => tracing::debug!(error = %e, "wait poll failed; retrying"),
        }
    }
}
