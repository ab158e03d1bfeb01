//! A sqlx pool, and the connections the store keeps out of it between its calls.
//!
//! sqlx returns a connection to its pool in a task of its own, and before it lends it again it
//! asks the database whether the session is still good: a Sync and its ReadyForQuery, one more
//! round trip, on both ends, for every statement the server runs (PostgreSQL; on SQLite a trip
//! to the connection's worker thread). A store call that succeeded instead puts its connection
//! on a stack of its own, and the next call takes it from there, in the same task. A
//! connection goes back to sqlx (and through its checks: the session, the connection's
//! lifetime, the stale mark and the idle ping of a PostgreSQL store) when
//!
//! - it was idle on the stack for [`super::CONNECTIONS_PROVEN_FOR`] or longer, or held out of
//!   the pool for [`HOLD_AT_MOST`] or longer,
//! - a call failed within the last [`super::CONNECTIONS_PROVEN_FOR`], no call succeeded
//!   within it, or connections were marked stale ([`super::StoreMarks::connections_proven`]):
//!   then the whole stack goes back, and calls take their connections through sqlx's checks,
//! - someone waits in sqlx's pool for a connection: the stack never keeps one from a waiter,
//! - or its call failed: such a connection is never put on the stack.
//!
//! Why sqlx's own options cannot do this (read in sqlx-core 0.9.0, `pool/connection.rs`,
//! `return_to_pool`): the check on release is a `ping` that runs for every connection given
//! back, unconditionally. `test_before_acquire(false)` and `before_acquire` act on the way
//! out of the pool, not on the way back; `after_release` runs before the ping and can only
//! add to it or close the connection; `idle_timeout` and `max_lifetime` retire connections
//! and do not skip checks. So the only way to save the round trip per call is not to give the
//! connection back, which is what this stack does, and why it gives it back (to those checks)
//! whenever the connections are not proven.
//!
//! Measured when this stack came (commit 6efe9ff), against the same sqlx pool with
//! `test_before_acquire(false)` and no stack: fewer system calls, less CPU per operation in the
//! server and in the database, more operations a second (the figures: bench/HISTORY.md, "The
//! claim path, profiled").
//!
//! It also counts the connections lent to calls, so that a call that waited in the pool
//! until its timeout can tell a busy pool (every connection in use by other calls: the
//! database answers, slowly for this many calls) from a database it cannot open a connection
//! to (the pool had room, and opening one failed or hung): sqlx's pool says `PoolTimedOut`
//! for both.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;

use super::{CONNECTIONS_PROVEN_FOR, StoreMarks};

/// How long a connection stays out of sqlx's pool at most, from when it was taken from it: then
/// it goes back once, so that sqlx's own rules (the session check, the lifetime) apply to it
/// within this long.
pub(crate) const HOLD_AT_MOST: Duration = Duration::from_secs(10);

/// A sqlx pool and the connections held out of it for the next store call; a clone shares
/// both.
pub(crate) struct Connections<DB: sqlx::Database> {
    /// The pool: it opens, checks and limits the connections.
    pool: sqlx::Pool<DB>,
    /// Connections taken from `pool` and kept between calls, the last given back on top.
    held: Arc<Mutex<Vec<Held<DB>>>>,
    /// Calls waiting in `pool` for a connection: while there are any, none is held.
    waiting: Arc<AtomicUsize>,
    /// Connections lent to calls now (not those held idle on the stack).
    in_use: Arc<AtomicUsize>,
}

impl<DB: sqlx::Database> Clone for Connections<DB> {
    fn clone(&self) -> Self {
        Connections {
            pool: self.pool.clone(),
            held: self.held.clone(),
            waiting: self.waiting.clone(),
            in_use: self.in_use.clone(),
        }
    }
}

impl<DB: sqlx::Database> std::fmt::Debug for Connections<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("pool", &self.pool)
            .field("held", &self.held())
            .finish()
    }
}

/// A connection held out of the pool.
struct Held<DB: sqlx::Database> {
    conn: PoolConnection<DB>,
    /// When it was taken from the pool.
    taken_at: Instant,
    /// When it was given back to the stack.
    idle_since: Instant,
}

impl<DB: sqlx::Database> Held<DB> {
    fn fresh(&self, now: Instant) -> bool {
        now.duration_since(self.idle_since) < CONNECTIONS_PROVEN_FOR
            && now.duration_since(self.taken_at) < HOLD_AT_MOST
    }
}

/// A connection lent for one store call, and when it was taken from the pool.
pub(crate) struct Lent<DB: sqlx::Database> {
    pub(crate) conn: PoolConnection<DB>,
    pub(crate) taken_at: Instant,
    /// Counts the connection as in use until the call gives it back.
    pub(crate) in_use: InUse,
}

/// Counts one connection as lent to a call while it lives.
pub(crate) struct InUse(Arc<AtomicUsize>);

impl InUse {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        InUse(count.clone())
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why [`Connections::acquire`] lent no connection.
#[derive(Debug)]
pub(crate) enum AcquireError {
    /// The pool timed out while every connection it may open was in use by other calls
    /// (when this call began to wait, or when it gave up): the store is busy, not
    /// unreachable.
    Busy {
        /// How long this call waited.
        waited: Duration,
        /// The most connections the pool opens.
        max: u32,
    },
    /// Opening (or checking) a connection failed, at whichever step, or the pool timed out
    /// while it had room to open one: sqlx's own error.
    Open(sqlx::Error),
}

/// Counts a call waiting in the pool while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<DB: sqlx::Database> Connections<DB> {
    pub(crate) fn new(pool: sqlx::Pool<DB>) -> Self {
        Connections {
            pool,
            held: Arc::default(),
            waiting: Arc::default(),
            in_use: Arc::default(),
        }
    }

    /// The pool itself (for migrations at start-up and for its counts).
    pub(crate) fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// Connections held out of the pool now, idle.
    pub(crate) fn stats(&self) -> super::PoolStats {
        // Connections the store holds between its calls are idle too.
        let size = self.pool.size();
        let idle = u32::try_from(self.pool.num_idle() + self.held())
            .unwrap_or(u32::MAX)
            .min(size);
        super::PoolStats {
            in_use: size - idle,
            idle,
            max: self.pool.options().get_max_connections(),
        }
    }

    /// How many connections are held idle out of the pool now.
    pub(crate) fn held(&self) -> usize {
        self.lock().len()
    }

    /// A connection for one store call: a held one, while `marks` says the connections are
    /// proven; else an idle one of the pool's, taken at once while proven; else through the
    /// pool's `acquire`, which runs its checks and waits for one.
    ///
    /// sqlx's acquire future holds its whole connect path (TLS included), which is large:
    /// inline, it made every store call's future as large, and each call copied that into
    /// `async_trait`'s box. It is boxed here, when used (its size and the gain: bench/HISTORY.md, "Figures once
    /// written in code comments").
    ///
    /// # Errors
    /// [`AcquireError::Busy`] when the pool timed out while every connection was in use by
    /// other calls; [`AcquireError::Open`] with sqlx's error otherwise.
    pub(crate) async fn acquire(&self, marks: &StoreMarks) -> Result<Lent<DB>, AcquireError> {
        let proven = marks.connections_proven();
        if proven {
            if let Some(lent) = self.pop_fresh() {
                return Ok(lent);
            }
            if let Some(conn) = self.pool.try_acquire() {
                return Ok(self.lend(conn, Instant::now()));
            }
        } else {
            self.give_all_back();
        }
        let _waiting = Waiting::new(&self.waiting);
        // Given back before this call counted as waiting, and so kept: taken here.
        if proven && let Some(lent) = self.pop_fresh() {
            return Ok(lent);
        }
        let max = self.pool.options().get_max_connections();
        let all_in_use =
            || u32::try_from(self.in_use.load(Ordering::SeqCst)).unwrap_or(u32::MAX) >= max;
        let busy_when_it_began = all_in_use();
        let began = Instant::now();
        match Box::pin(self.pool.acquire()).await {
            Ok(conn) => Ok(self.lend(conn, Instant::now())),
            // Checked again at the end: a call that began to wait while a connection was
            // being given back still waited behind the others.
            Err(sqlx::Error::PoolTimedOut) if busy_when_it_began || all_in_use() => {
                Err(AcquireError::Busy {
                    waited: began.elapsed(),
                    max,
                })
            }
            Err(e) => Err(AcquireError::Open(e)),
        }
    }

    /// Lends `conn`, taken from the pool at `taken_at`, to a call.
    fn lend(&self, conn: PoolConnection<DB>, taken_at: Instant) -> Lent<DB> {
        Lent {
            conn,
            taken_at,
            in_use: InUse::new(&self.in_use),
        }
    }

    /// Keeps the connection of a call that succeeded for the next call, unless it was held
    /// long enough or someone waits in the pool (then it goes back to the pool).
    pub(crate) fn keep(&self, lent: Lent<DB>) {
        let Lent {
            conn,
            taken_at,
            in_use,
        } = lent;
        // Not in use from here, whether it is held or goes back to the pool.
        drop(in_use);
        let now = Instant::now();
        if now.duration_since(taken_at) >= HOLD_AT_MOST {
            return;
        }
        let mut held = self.lock();
        // Read under the lock: a waiter counts itself before it looks at the stack.
        if self.waiting.load(Ordering::SeqCst) > 0 {
            return;
        }
        held.push(Held {
            conn,
            taken_at,
            idle_since: now,
        });
    }

    /// The connection given back last, if it is fresh; the ones found stale on the way (and
    /// the bottom one, if stale) go back to the pool.
    fn pop_fresh(&self) -> Option<Lent<DB>> {
        let now = Instant::now();
        let mut stale = Vec::new();
        let found = {
            let mut held = self.lock();
            if held.first().is_some_and(|h| !h.fresh(now)) {
                stale.push(held.remove(0));
            }
            loop {
                match held.pop() {
                    Some(h) if h.fresh(now) => break Some(h),
                    Some(h) => stale.push(h),
                    None => break None,
                }
            }
        };
        // Dropped outside the lock: each goes back to the pool in a task of sqlx's.
        drop(stale);
        found.map(|h| self.lend(h.conn, h.taken_at))
    }

    /// Gives every held connection back to the pool.
    fn give_all_back(&self) {
        let all = std::mem::take(&mut *self.lock());
        drop(all);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Held<DB>>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use sqlx::sqlite::SqlitePoolOptions;

    use super::*;

    async fn pool(max: u32) -> sqlx::SqlitePool {
        SqlitePoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(3))
            .connect("sqlite::memory:")
            .await
            .expect("in-memory SQLite")
    }

    /// The connection of a call that succeeded is held and lent to the next call, without
    /// going back to the pool in between.
    #[tokio::test]
    async fn a_succeeded_calls_connection_serves_the_next_call() {
        let conns = Connections::new(pool(4).await);
        let marks = StoreMarks::default();
        let first = conns.acquire(&marks).await.expect("first");
        marks.call_succeeded();
        conns.keep(first);
        assert_eq!(conns.held(), 1);
        let second = conns.acquire(&marks).await.expect("second");
        assert_eq!(conns.held(), 0, "taken from the stack");
        assert_eq!(conns.pool().size(), 1, "no second connection was opened");
        conns.keep(second);
        assert_eq!(conns.held(), 1);
    }

    /// A call waiting in the pool gets the connection the other call gives back, which is not
    /// held: with one connection in all, the waiter is answered long before the pool's 3 s
    /// acquire timeout.
    #[tokio::test]
    async fn a_connection_goes_to_a_waiter_rather_than_onto_the_stack() {
        let conns = Connections::new(pool(1).await);
        let marks = StoreMarks::default();
        marks.call_succeeded();
        let first = conns.acquire(&marks).await.expect("first");
        let waiter = {
            let conns = conns.clone();
            tokio::spawn(async move {
                let marks = StoreMarks::default();
                marks.call_succeeded();
                let started = Instant::now();
                let lent = conns.acquire(&marks).await.map(|_| ());
                (lent, started.elapsed())
            })
        };
        while conns.waiting.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        conns.keep(first);
        assert_eq!(conns.held(), 0, "not held while someone waits");
        let (lent, took) = waiter.await.expect("the waiter's task");
        lent.expect("the waiter got the connection");
        assert!(took < Duration::from_secs(2), "took {took:?}");
    }

    /// Once a call failed, the held connections go back to the pool and calls take theirs
    /// through the pool's checks; so they do before any call succeeded.
    #[tokio::test]
    async fn after_a_failure_held_connections_go_back_to_the_pool() {
        let conns = Connections::new(pool(4).await);
        let marks = StoreMarks::default();
        assert!(
            !marks.connections_proven(),
            "nothing proven before a success"
        );
        let (a, b) = (
            conns.acquire(&marks).await.expect("a"),
            conns.acquire(&marks).await.expect("b"),
        );
        marks.call_succeeded();
        assert!(marks.connections_proven());
        conns.keep(a);
        conns.keep(b);
        assert_eq!(conns.held(), 2);
        marks.call_failed();
        assert!(!marks.connections_proven());
        let c = conns.acquire(&marks).await.expect("c");
        assert_eq!(conns.held(), 0, "all went back");
        drop(c);
    }

    /// A call that waits out the acquire timeout while every connection is lent to other
    /// calls is told the pool was busy; one that finds room but cannot open a connection is
    /// told sqlx's own error.
    #[tokio::test]
    async fn a_timeout_with_every_connection_in_use_is_busy_and_one_with_room_is_not() {
        let conns = Connections::new(
            SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_millis(100))
                .connect("sqlite::memory:")
                .await
                .expect("in-memory SQLite"),
        );
        let marks = StoreMarks::default();
        let held = conns.acquire(&marks).await.expect("the one connection");
        match conns.acquire(&marks).await {
            Err(AcquireError::Busy { max: 1, .. }) => {}
            other => panic!("busy expected: {:?}", other.map(|_| ())),
        }
        drop(held);
        conns.acquire(&marks).await.expect("free again");

        // Nothing listens on port 1: sqlx retries the refused connect until its timeout.
        let refused = Connections::new(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_millis(300))
                .connect_lazy("postgres://nobody@127.0.0.1:1/nothing")
                .expect("a lazy pool"),
        );
        match refused.acquire(&marks).await {
            Err(AcquireError::Open(sqlx::Error::PoolTimedOut)) => {}
            other => panic!("sqlx's timeout expected: {:?}", other.map(|_| ())),
        }
    }

    /// A connection held longer than HOLD_AT_MOST goes back to the pool instead of onto the
    /// stack.
    #[tokio::test]
    async fn a_connection_held_long_enough_goes_back() {
        let conns = Connections::new(pool(2).await);
        let marks = StoreMarks::default();
        marks.call_succeeded();
        let mut lent = conns.acquire(&marks).await.expect("lent");
        lent.taken_at = Instant::now()
            .checked_sub(HOLD_AT_MOST)
            .expect("the clock has run that long");
        conns.keep(lent);
        assert_eq!(conns.held(), 0);
    }
}
