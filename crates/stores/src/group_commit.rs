//! Group commit: claims' inserts and claimants' completions that arrive while the store is busy
//! are written together, one multi-row statement and one commit per batch.
//!
//! [`GroupCommit`] is a [`Store`] around another: its `insert` and `finish` are batched (written
//! with the inner store's `insert_many` and `finish_many`, or, alone, its `insert` and
//! `finish`), and every other call passes straight to the inner store (`unbatched`). Each kind
//! of write has a
//! queue and a dispatcher that runs at most `writers` batches at once. When a writer is free, a
//! request is written at once, alone: no timer ever delays it. While every writer is busy,
//! requests wait in the queue, and the next free writer takes all of them (up to a cap) as one
//! batch. Each request is answered only after its batch committed; a batch that fails fails
//! exactly its own requests, with the store's error, and answers none of them wrongly.
//!
//! Duplicates inside a batch resolve as if they had come one by one: the store's multi-row
//! insert lets the first entry of a key win and the others see the conflict; a completion
//! whose key is already in the batch waits for the next round.
//!
//! With traces exported, each write is a `ledger.batch_commit` span in its call's trace, from
//! its submission to its batch's commit, with the batch's size; without, the span is disabled
//! and costs a branch.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::Instrument as _;

mod unbatched;

use super::{Finish, Finished, Store, StoreError, StoreResult};
use crate::domain::{Entry, Tenant};

/// The most requests one statement carries.
const MAX_BATCH: usize = 256;

/// The span of one write's group commit, in its call's trace. Its target is
/// the core's `TRACE_TARGET`, which the server's observe layer exports: only the trace exporter sees
/// it, and without one it is disabled.
fn commit_span(kind: &'static str) -> tracing::Span {
    tracing::info_span!(
        target: ledger_core::TRACE_TARGET,
        "ledger.batch_commit",
        ledger.batch.kind = kind,
        ledger.batch.size = tracing::field::Empty,
    )
}

/// One queued write and where its answer goes.
struct Job<T, R> {
    tenant: Tenant,
    write: T,
    reply: oneshot::Sender<StoreResult<R>>,
    /// Its [`commit_span`], told the size of the batch that carries it.
    span: tracing::Span,
}

type InsertJob = Job<Entry, bool>;
type FinishJob = Job<Finish, Option<Finished>>;

/// A store whose inserts and completions are group-committed, around the store that runs the
/// statements ([`GroupCommit::wrap`]).
pub struct GroupCommit {
    /// The store that runs the statements, and every call but `insert` and `finish`.
    inner: Arc<dyn Store>,
    /// Claims' inserts waiting for a writer.
    inserts: Queue<InsertJob>,
    /// Completions waiting for a writer.
    finishes: Queue<FinishJob>,
    /// How batching went, for tests and metrics.
    stats: Arc<Stats>,
}

/// Counts of the batches written so far.
#[derive(Debug, Default)]
pub struct Stats {
    /// Batches written (both kinds).
    pub batches: AtomicU64,
    /// Requests written in them.
    pub requests: AtomicU64,
    /// The most requests one batch carried.
    pub largest: AtomicUsize,
}

impl Stats {
    fn record(&self, size: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(size as u64, Ordering::Relaxed);
        self.largest.fetch_max(size, Ordering::Relaxed);
    }
}

/// One kind of write: its free writers and the requests waiting for one.
struct Queue<J> {
    /// Free writers of this kind.
    free: Arc<Semaphore>,
    /// Requests that found no free writer, for the dispatcher.
    waiting: mpsc::UnboundedSender<J>,
    /// How many requests are queued and not yet taken (a lone request goes ahead of nobody).
    queued: Arc<AtomicUsize>,
}

impl GroupCommit {
    /// Wraps `inner`, running at most `writers` batches of each kind at once (at least 1).
    /// Call inside a tokio runtime: it spawns the two dispatchers, which end when this store
    /// is dropped.
    pub fn wrap(inner: Arc<dyn Store>, writers: usize) -> GroupCommit {
        let writers = writers.max(1);
        let stats = Arc::new(Stats::default());
        let inserts = Queue::start(writers, stats.clone(), {
            let store = inner.clone();
            move |batch: Vec<InsertJob>| {
                let store = store.clone();
                async move { write_inserts(&*store, batch).await }
            }
        });
        let finishes = Queue::start(writers, stats.clone(), {
            let store = inner.clone();
            move |batch: Vec<FinishJob>| {
                let store = store.clone();
                async move { write_finishes(&*store, batch).await }
            }
        });
        GroupCommit {
            inner,
            inserts,
            finishes,
            stats,
        }
    }

    /// How batching went so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The counts, shared.
    pub fn stats_handle(&self) -> Arc<Stats> {
        self.stats.clone()
    }
}

impl<T: Send + 'static, R: Send + 'static> Queue<Job<T, R>> {
    /// A queue with `writers` writers and its dispatcher, which ends when the queue is dropped.
    fn start<F, Fut>(writers: usize, stats: Arc<Stats>, write: F) -> Self
    where
        F: Fn(Vec<Job<T, R>>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (waiting, rx) = mpsc::unbounded_channel();
        let free = Arc::new(Semaphore::new(writers));
        let queued = Arc::new(AtomicUsize::new(0));
        tokio::spawn(dispatch(rx, free.clone(), queued.clone(), stats, write));
        Queue {
            free,
            waiting,
            queued,
        }
    }

    /// Writes `write` and waits for its answer. With a writer free and nobody queued, the
    /// request is written at once by the caller's own task, alone (`lone`); otherwise it
    /// queues for the dispatcher's next batch.
    async fn submit<L>(
        &self,
        tenant: &Tenant,
        write: &T,
        span: &tracing::Span,
        lone: L,
    ) -> StoreResult<R>
    where
        T: Clone,
        L: AsyncFnOnce(&Tenant, &T) -> StoreResult<R>,
    {
        if self.queued.load(Ordering::Acquire) == 0
            && let Ok(_writer) = self.free.try_acquire()
        {
            span.record("ledger.batch.size", 1);
            return lone(tenant, write).await;
        }
        let (reply, answer) = oneshot::channel();
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self
            .waiting
            .send(Job {
                tenant: tenant.clone(),
                write: write.clone(),
                reply,
                span: span.clone(),
            })
            .is_err()
        {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(StoreError::Unavailable("the store is shutting down".into()));
        }
        answer
            .await
            .map_err(|_| StoreError::Internal("a write batch was dropped unanswered".into()))?
    }
}

/// Takes the first queued request, then a writer, then everything queued by then (up to
/// [`MAX_BATCH`]), and writes it as one batch in its own task; repeats until the queue closes.
async fn dispatch<T, R, F, Fut>(
    mut queue: mpsc::UnboundedReceiver<Job<T, R>>,
    free: Arc<Semaphore>,
    queued: Arc<AtomicUsize>,
    stats: Arc<Stats>,
    write: F,
) where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(Vec<Job<T, R>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let Some(first) = queue.recv().await else {
            return;
        };
        let Ok(writer) = free.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        queued.fetch_sub(batch.len(), Ordering::AcqRel);
        stats.record(batch.len());
        for job in &batch {
            job.span.record("ledger.batch.size", batch.len());
        }
        let written = write(batch);
        tokio::spawn(async move {
            written.await;
            drop(writer);
        });
    }
}

async fn write_inserts(store: &dyn Store, mut batch: Vec<InsertJob>) {
    // A lone request takes the one-row statement: PostgreSQL plans it once (a generic plan),
    // while the multi-row statement's array length is unknown to a generic plan, so it is
    // planned again for every batch; worth it for a batch, not for one row.
    if batch.len() == 1 {
        let job = batch.pop().expect("one job");
        let _ = job.reply.send(store.insert(&job.tenant, &job.write).await);
        return;
    }
    let writes: Vec<(Tenant, Entry)> = batch
        .iter()
        .map(|j| (j.tenant.clone(), j.write.clone()))
        .collect();
    match store.insert_many(&writes).await {
        Ok(inserted) if inserted.len() == batch.len() => {
            for (job, inserted) in batch.into_iter().zip(inserted) {
                let _ = job.reply.send(Ok(inserted));
            }
        }
        Ok(other) => fail_all(
            batch,
            &StoreError::Internal(format!("insert batch answered {} of its rows", other.len())),
        ),
        Err(e) => fail_all(batch, &e),
    }
}

async fn write_finishes(store: &dyn Store, mut batch: Vec<FinishJob>) {
    // One command per key and statement (an UPDATE … FROM would apply only one of two rows
    // for the same key, unpredictably); a later command for a key goes in the next round.
    while !batch.is_empty() {
        if batch.len() == 1 {
            let job = batch.pop().expect("one job");
            let _ = job.reply.send(store.finish(&job.tenant, &job.write).await);
            return;
        }
        let mut keys = HashSet::new();
        let (round, later): (Vec<FinishJob>, Vec<FinishJob>) = batch
            .into_iter()
            .partition(|j| keys.insert((j.tenant.clone(), j.write.key.clone())));
        batch = later;
        let writes: Vec<(Tenant, Finish)> = round
            .iter()
            .map(|j| (j.tenant.clone(), j.write.clone()))
            .collect();
        match store.finish_many(&writes).await {
            Ok(done) if done.len() == round.len() => {
                for (job, done) in round.into_iter().zip(done) {
                    let _ = job.reply.send(Ok(done));
                }
            }
            Ok(other) => fail_all(
                round,
                &StoreError::Internal(format!("finish batch answered {} of its rows", other.len())),
            ),
            Err(e) => fail_all(round, &e),
        }
    }
}

fn fail_all<T, R>(batch: Vec<Job<T, R>>, error: &StoreError) {
    for job in batch {
        let _ = job.reply.send(Err(error.clone()));
    }
}

impl GroupCommit {
    /// Claims a key as the inner store's [`Store::insert`] does, in a batch with the claims
    /// that wait with it.
    ///
    /// # Errors
    /// The batch's error, or `Unavailable` while the store shuts down.
    async fn batch_insert(&self, tenant: &Tenant, entry: &Entry) -> StoreResult<bool> {
        let inner = &self.inner;
        let span = commit_span("insert");
        self.inserts
            .submit(tenant, entry, &span, async |t: &Tenant, e: &Entry| {
                self.stats.record(1);
                inner.insert(t, e).await
            })
            .instrument(span.clone())
            .await
    }

    /// Records an outcome as the inner store's [`Store::finish`] does, in a batch with the
    /// completions that wait with it.
    ///
    /// # Errors
    /// As [`GroupCommit::batch_insert`].
    async fn batch_finish(&self, tenant: &Tenant, cmd: &Finish) -> StoreResult<Option<Finished>> {
        let inner = &self.inner;
        let span = commit_span("finish");
        self.finishes
            .submit(tenant, cmd, &span, async |t: &Tenant, c: &Finish| {
                self.stats.record(1);
                inner.finish(t, c).await
            })
            .instrument(span.clone())
            .await
    }
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}
