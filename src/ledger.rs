//! The ledger's use cases, Claim, Complete and Lookup, driven over a [`Store`]: validate the
//! input, derive the key, let the domain decide, apply the store's compare-and-set write, and
//! start over from a fresh read when a concurrent writer won the race.
//!
//! Independent of gRPC, so the conformance suite runs the same calls against every backend.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::Tenant;
use crate::domain::canonical::{self, Canonicalization, JsonLimits};
use crate::domain::key::{self, ExplicitKey, Principal, RunId, ToolName};
use crate::domain::redact::ArgumentsPolicy;
use crate::domain::time::Clock;
use crate::domain::{
    ClaimDecision, CompleteDecision, Completion, Entry, FinalStatus, Micros, RenewDecision, Status,
    decide_claim, decide_complete, decide_renew,
};
use crate::error::LedgerError;
use crate::storage::{Finish, Finished, ListQuery, Store, UnresolvedQuery};
use crate::wait::WaitHub;

/// How often a lost compare-and-set race is retried before the call gives up. Each retry
/// follows another writer's success, so reaching this means a pathological storm.
const MAX_RACES: usize = 16;

/// The retry hint for an entry whose outcome is unknown: reconciliation takes a while.
const UNKNOWN_RETRY_AFTER: Duration = Duration::from_secs(30);

/// The server's limits and defaults for requests.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Lease when a claim sets none.
    pub default_lease: Duration,
    /// Longest lease a claim may ask for.
    pub max_lease: Duration,
    /// Retention when a claim sets none.
    pub default_retention: Duration,
    /// Longest retention a claim may ask for.
    pub max_retention: Duration,
    /// Longest a claim may wait for an attempt in flight.
    pub max_wait: Duration,
    /// Size and depth limits of `arguments_json`.
    pub json: JsonLimits,
    /// Largest result (and error text) a completion may store.
    pub max_result_bytes: usize,
    /// Prefix of every entry's `external_ref`.
    pub external_ref_prefix: String,
    /// How long a reconciler holds the unresolved entries it was handed.
    pub reconcile_lease: Duration,
    /// How many entries Reconcile hands out when the request sets no limit.
    pub reconcile_default_limit: u32,
    /// The most entries (and resolutions) one Reconcile call handles.
    pub reconcile_max_limit: u32,
    /// How often a key that claims wait on is read from a store other servers share: the
    /// wake-up bound when announcements are off (`--wait-wakeup poll`), and the safety net
    /// for missed announcements otherwise.
    pub wait_poll_interval: Duration,
    /// What of a claim's arguments is kept for audit (`--store-arguments`, `--redact-field`).
    pub arguments: ArgumentsPolicy,
    /// How many entries ListEntries returns when the request sets no page size.
    pub list_default_page_size: u32,
    /// The most entries one ListEntries page holds.
    pub list_max_page_size: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            default_lease: Duration::from_secs(60),
            max_lease: Duration::from_secs(3600),
            default_retention: Duration::from_secs(24 * 3600),
            max_retention: Duration::from_secs(30 * 24 * 3600),
            max_wait: Duration::from_secs(30),
            json: JsonLimits::default(),
            max_result_bytes: 1_048_576,
            external_ref_prefix: "idem-".to_string(),
            reconcile_lease: Duration::from_secs(60),
            reconcile_default_limit: 100,
            reconcile_max_limit: 1000,
            wait_poll_interval: Duration::from_secs(1),
            arguments: ArgumentsPolicy::default(),
            list_default_page_size: 100,
            list_max_page_size: 1000,
        }
    }
}

/// A Claim as the caller sent it (durations already converted; `None` means unset).
#[derive(Clone, Debug, Default)]
pub struct ClaimInput {
    /// The run; required unless `key` is set.
    pub run_id: String,
    /// The tool; always required.
    pub tool: String,
    /// The arguments as JSON text; always required.
    pub arguments_json: String,
    /// An explicit key, or empty to derive one.
    pub key: String,
    /// How the arguments are canonicalized.
    pub canonicalization: Canonicalization,
    /// The lease asked for.
    pub lease: Option<Duration>,
    /// The retention asked for.
    pub retention: Option<Duration>,
    /// How long to wait for an attempt in flight (already bounded by the call's deadline).
    pub wait: Option<Duration>,
    /// Who asks.
    pub principal: String,
}

/// A Complete as the caller sent it.
#[derive(Clone, Debug)]
pub struct CompleteInput {
    /// The entry's key.
    pub key: String,
    /// The token from the claim.
    pub claim_token: String,
    /// The reported outcome.
    pub status: FinalStatus,
    /// The result, only with success.
    pub result: Vec<u8>,
    /// The error, with failure or unknown.
    pub error: String,
    /// With failure: may the intent be tried again.
    pub retryable: bool,
}

/// A Lookup: either `key`, or `run_id` + `tool` + `arguments_json`.
#[derive(Clone, Debug, Default)]
pub struct LookupInput {
    /// The key, or empty to derive it.
    pub key: String,
    /// The run, to derive the key.
    pub run_id: String,
    /// The tool, to derive the key.
    pub tool: String,
    /// The arguments, to derive the key.
    pub arguments_json: String,
    /// How the arguments are canonicalized.
    pub canonicalization: Canonicalization,
}

/// What a Claim found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The caller holds the claim and must act.
    Claimed,
    /// The stored result is returned; no action.
    Replayed,
    /// An attempt is in flight or unknown; no action.
    InProgress,
    /// The stored permanent error is returned; no action.
    PreviouslyFailed,
}

/// An entry as a caller is shown it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryView {
    /// The stored entry.
    pub entry: Entry,
    /// The status callers are told (an attempt past its lease reads as unknown).
    pub status: Status,
    /// The deterministic reference for external systems.
    pub external_ref: String,
}

/// The answer to a Claim.
#[derive(Clone, Debug)]
pub struct ClaimOutput {
    /// What the caller should do.
    pub outcome: Outcome,
    /// The entry after the claim.
    pub entry: EntryView,
    /// The fencing token, with `Claimed` only.
    pub claim_token: Option<String>,
    /// A sentence for the model; empty with `Claimed`.
    pub note: String,
    /// With `InProgress`: when trying again is worthwhile.
    pub retry_after: Option<Duration>,
}

/// The answer to a Complete.
#[derive(Clone, Debug)]
pub struct CompleteOutput {
    /// The entry as stored.
    pub entry: EntryView,
    /// True when this outcome had already been recorded.
    pub already_completed: bool,
}

/// What a reconciler found out about one entry.
#[derive(Clone, Debug)]
pub struct ResolutionInput {
    /// The entry's key.
    pub key: String,
    /// `Succeeded` when the effect was found, `Failed` when it was not.
    pub status: FinalStatus,
    /// The result found, with `Succeeded`.
    pub result: Vec<u8>,
    /// What was (not) found, with `Failed`.
    pub error: String,
    /// With `Failed`: may the intent be tried again.
    pub retryable: bool,
}

/// A Reconcile: which unresolved entries to hand out, and the answers about earlier ones.
#[derive(Clone, Debug, Default)]
pub struct ReconcileInput {
    /// Only entries whose attempt started at least this long ago.
    pub older_than: Option<Duration>,
    /// Only entries of this tool; empty for all.
    pub tool: String,
    /// How many to hand out; 0 for the server's default.
    pub limit: u32,
    /// Findings to apply first.
    pub resolutions: Vec<ResolutionInput>,
    /// Apply the resolutions only: hand out (and hold) nothing new.
    pub resolve_only: bool,
}

/// A RenewLease as the caller sent it.
#[derive(Clone, Debug)]
pub struct RenewInput {
    /// The entry's key.
    pub key: String,
    /// The token of the claim that holds the attempt.
    pub claim_token: String,
    /// The new lease, from now; `None` for the server's default.
    pub lease: Option<Duration>,
}

/// The answer to a Reconcile.
#[derive(Clone, Debug)]
pub struct ReconcileOutput {
    /// Unresolved entries, oldest first, now held for the caller.
    pub pending: Vec<EntryView>,
    /// The entries the resolutions named, as they stand afterwards.
    pub resolved: Vec<EntryView>,
}

/// A ListEntries request, converted.
#[derive(Clone, Debug, Default)]
pub struct ListInput {
    /// Only this run's entries; any run when empty.
    pub run_id: String,
    /// Only this tool's entries; any tool when empty.
    pub tool: String,
    /// Only entries in this state as Lookup reports it.
    pub status: Option<Status>,
    /// Only entries whose current attempt started at or after this.
    pub started_after: Option<Micros>,
    /// Only entries whose current attempt started before this.
    pub started_before: Option<Micros>,
    /// At most this many entries; 0 for the server's default.
    pub page_size: u32,
    /// Where a previous page ended (its `next_page_token`); empty for the first page.
    pub page_token: String,
}

/// A page of a listing.
#[derive(Clone, Debug)]
pub struct ListOutput {
    /// The entries, by started_at and then key, with their stored arguments.
    pub entries: Vec<EntryView>,
    /// Where the next page starts; empty when this page is the last.
    pub next_page_token: String,
}

/// The ledger: a cheap-to-clone handle over a store, a clock and the server's limits.
#[derive(Clone)]
pub struct Ledger {
    /// Where entries live.
    store: Arc<dyn Store>,
    /// Where time comes from (manual in tests).
    clock: Arc<dyn Clock>,
    /// Defaults and limits for requests.
    limits: Arc<Limits>,
    /// The claims waiting on this server for attempts in flight.
    waits: Arc<WaitHub>,
    /// Keys this server recently saw succeed: a hint for the claim path, never a decision.
    finished: Arc<RecentKeys>,
}

impl Ledger {
    /// A ledger over `store`. Waiting claims are woken in-process by completions on this server;
    /// on a store other servers share, a watched key is also read every
    /// `limits.wait_poll_interval`.
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, limits: Limits) -> Ledger {
        let poll = store.shared().then_some(limits.wait_poll_interval);
        Ledger {
            waits: Arc::new(WaitHub::new(store.clone(), clock.clone(), poll)),
            finished: Arc::new(RecentKeys::default()),
            store,
            clock,
            limits: Arc::new(limits),
        }
    }

    /// Wakes this server's waiters on the changes other servers announce (PostgreSQL
    /// LISTEN/NOTIFY); without it, they learn of them by polling only. Call once, inside the
    /// runtime.
    pub fn listen_for_announcements(&self) {
        let Some(mut announcements) = self.store.subscribe() else {
            return;
        };
        let waits = self.waits.clone();
        tokio::spawn(async move {
            while let Some((tenant, key)) = announcements.recv().await {
                waits.wake(&tenant, &key);
            }
        });
    }

    /// The waiting claims of this server.
    pub fn waits(&self) -> &WaitHub {
        &self.waits
    }

    /// The store, for health probes and migrations.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The limits this ledger enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Claims a key before acting. With a wait, holds the call while the entry is in flight.
    ///
    /// # Errors
    /// `InvalidArgument` for malformed input (nothing is written); `KeyReused` for an explicit
    /// key with other arguments; `Unavailable`/`Internal` from the store.
    pub async fn claim(
        &self,
        tenant: &Tenant,
        input: ClaimInput,
    ) -> Result<ClaimOutput, LedgerError> {
        let request = self.prepare_claim(input)?;
        let output = self.claim_once(tenant, &request).await?;
        let until = match request.wait {
            Some(wait) if !wait.is_zero() && in_flight(&output) => Instant::now() + wait,
            _ => return Ok(output),
        };
        // Wait: register first, then mark the entry so other servers announce its change,
        // then re-read in the loop, so that no completion can slip between read and sleep.
        let watch = self.waits.watch(tenant.as_str(), &request.key);
        self.store
            .mark_waiting(tenant.as_str(), &request.key)
            .await?;
        loop {
            let changed = watch.notified();
            let output = self.claim_once(tenant, &request).await?;
            if !in_flight(&output) || Instant::now() >= until {
                return Ok(output);
            }
            // The lease ending turns the attempt unknown: answer then too.
            let lease_left = output
                .entry
                .entry
                .lease_expires_at
                .minus(self.clock.now())
                .to_duration();
            let wake_at = until.min(Instant::now() + lease_left);
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    /// Records the outcome of a claimed attempt; answers after it is committed.
    ///
    /// # Errors
    /// `InvalidArgument` for malformed input; `NotFound`, `StaleClaimToken` or
    /// `AlreadyResolved` as the entry stands (nothing changes); `Unavailable`/`Internal` from
    /// the store.
    pub async fn complete(
        &self,
        tenant: &Tenant,
        input: CompleteInput,
    ) -> Result<CompleteOutput, LedgerError> {
        let key = ExplicitKey::parse(&input.key)?;
        if input.claim_token.is_empty() {
            return Err(LedgerError::invalid("claim_token", "is required"));
        }
        let completion = Completion {
            status: input.status,
            result: input.result,
            error: input.error,
            retryable: input.retryable,
        };
        self.check_outcome(&completion)?;
        let mut finish = Finish {
            key: key.as_str().to_string(),
            claim_token: input.claim_token,
            completion,
            now: self.clock.now(),
            also_unknown: false,
        };
        // The common case in one statement: the claimant completes its own attempt in flight.
        if let Some(done) = self.store.finish(tenant.as_str(), &finish).await? {
            return Ok(self.completed(tenant, done, finish.now).await);
        }
        // Otherwise read the entry to learn what to answer, and write only if the domain says so.
        for _ in 0..MAX_RACES {
            let now = self.clock.now();
            let Some(existing) = self.store.get(tenant.as_str(), key.as_str()).await? else {
                return Err(LedgerError::NotFound);
            };
            match decide_complete(&existing, &finish.claim_token, &finish.completion, now) {
                CompleteDecision::NotFound => return Err(LedgerError::NotFound),
                CompleteDecision::StaleToken => return Err(LedgerError::StaleClaimToken),
                CompleteDecision::AlreadyResolved => {
                    return Err(LedgerError::AlreadyResolved(existing.status.as_str()));
                }
                CompleteDecision::AlreadyCompleted => {
                    return Ok(CompleteOutput {
                        entry: self.view(existing, now),
                        already_completed: true,
                    });
                }
                CompleteDecision::Apply => {
                    finish.now = now;
                    finish.also_unknown = true;
                    if let Some(done) = self.store.finish(tenant.as_str(), &finish).await? {
                        return Ok(self.completed(tenant, done, now).await);
                    }
                }
            }
        }
        Err(LedgerError::Internal(format!(
            "complete of {} lost {MAX_RACES} races in a row",
            key.as_str()
        )))
    }

    /// Extends the lease of the caller's own attempt to `lease` from now, while that lease has
    /// not ended.
    ///
    /// # Errors
    /// `InvalidArgument` for malformed input or a lease above `--max-lease`; `NotFound`;
    /// `StaleClaimToken` when the token is not the current attempt's; `LeaseEnded` when the
    /// entry is resolved, reported UNKNOWN or past its lease (nothing changes); store errors.
    pub async fn renew_lease(
        &self,
        tenant: &Tenant,
        input: RenewInput,
    ) -> Result<EntryView, LedgerError> {
        let key = ExplicitKey::parse(&input.key)?;
        if input.claim_token.is_empty() {
            return Err(LedgerError::invalid("claim_token", "is required"));
        }
        let lease = bounded(
            "lease",
            input.lease,
            self.limits.default_lease,
            self.limits.max_lease,
        )?;
        let now = self.clock.now();
        let until = now.plus(Micros::from_duration(lease));
        // The common case in one statement; a read only to say why it did not apply.
        if let Some(entry) = self
            .store
            .renew(
                tenant.as_str(),
                key.as_str(),
                &input.claim_token,
                until,
                now,
            )
            .await?
        {
            return Ok(self.view(entry, now));
        }
        let Some(existing) = self.store.get(tenant.as_str(), key.as_str()).await? else {
            return Err(LedgerError::NotFound);
        };
        let now = self.clock.now();
        match decide_renew(&existing, &input.claim_token, now) {
            RenewDecision::NotFound => Err(LedgerError::NotFound),
            RenewDecision::StaleToken => Err(LedgerError::StaleClaimToken),
            RenewDecision::LeaseEnded => Err(LedgerError::LeaseEnded(
                existing.effective_status(now).as_str(),
            )),
            // The statement did not apply, yet the entry read afterwards would: only a clock
            // that went backwards between the two explains it.
            RenewDecision::Apply => Err(LedgerError::Internal(format!(
                "renewal of {} did not apply to an attempt in its lease",
                key.as_str()
            ))),
        }
    }

    /// The answer to a Complete that wrote its outcome, after waking whoever waits for it.
    async fn completed(&self, tenant: &Tenant, done: Finished, now: Micros) -> CompleteOutput {
        if done.entry.status == Status::Succeeded {
            self.finished.insert(tenant.as_str(), &done.entry.key);
        }
        self.changed(tenant, &done.entry.key, done.has_waiters)
            .await;
        CompleteOutput {
            entry: self.view(done.entry, now),
            already_completed: false,
        }
    }

    /// Reads an entry by key, or by the fields Claim derives it from.
    ///
    /// # Errors
    /// `InvalidArgument` for malformed input; `NotFound` when there is none (or it expired, or
    /// it is another tenant's); `Unavailable`/`Internal` from the store.
    pub async fn lookup(
        &self,
        tenant: &Tenant,
        input: LookupInput,
    ) -> Result<EntryView, LedgerError> {
        let key = if input.key.is_empty() {
            if input.run_id.is_empty() && input.tool.is_empty() && input.arguments_json.is_empty() {
                return Err(LedgerError::invalid(
                    "key",
                    "give either key, or run_id, tool and arguments_json",
                ));
            }
            let run_id = RunId::parse(&input.run_id)?;
            let (_, canonical, tool, _) =
                self.canonical_request(&input.tool, &input.arguments_json, input.canonicalization)?;
            key::derive_key(&run_id, &tool, &canonical, input.canonicalization)
        } else {
            if !(input.run_id.is_empty()
                && input.tool.is_empty()
                && input.arguments_json.is_empty())
            {
                return Err(LedgerError::invalid(
                    "key",
                    "give either key, or run_id, tool and arguments_json, not both",
                ));
            }
            ExplicitKey::parse(&input.key)?.as_str().to_string()
        };
        let now = self.clock.now();
        match self.store.get(tenant.as_str(), &key).await? {
            Some(entry) if !entry.is_expired(now) => Ok(self.audit_view(entry, now)),
            _ => Err(LedgerError::NotFound),
        }
    }

    /// A page of the tenant's entries that match `input`, by started_at and then key, with
    /// their stored arguments, and the token of the next page when more may follow. Paging
    /// uses the last entry's (started_at, key) as the cursor, so entries that do not change
    /// meanwhile are listed exactly once across pages, whatever else is written; an entry
    /// retried meanwhile moves to its new attempt's start.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed filter, a page token of another listing, or an empty
    /// time range; `Unavailable`/`Internal` from the store.
    pub async fn list_entries(
        &self,
        tenant: &Tenant,
        input: ListInput,
    ) -> Result<ListOutput, LedgerError> {
        let run_id = if input.run_id.is_empty() {
            String::new()
        } else {
            RunId::parse(&input.run_id)?.as_str().to_string()
        };
        let tool = if input.tool.is_empty() {
            String::new()
        } else {
            ToolName::parse(&input.tool)?.as_str().to_string()
        };
        if let (Some(from), Some(before)) = (input.started_after, input.started_before)
            && from >= before
        {
            return Err(LedgerError::invalid(
                "started_before",
                "must be later than started_after",
            ));
        }
        let filters = list_filters_digest(&run_id, &tool, input.status, &input);
        let after = if input.page_token.is_empty() {
            None
        } else {
            Some(parse_page_token(&input.page_token, &filters)?)
        };
        let page_size = match input.page_size {
            0 => self.limits.list_default_page_size,
            n => n.min(self.limits.list_max_page_size),
        };
        let now = self.clock.now();
        let query = ListQuery {
            run_id,
            tool,
            status: input.status,
            started_from: input.started_after.unwrap_or(Micros(i64::MIN)),
            started_before: input.started_before.unwrap_or(Micros(i64::MAX)),
            after,
            // One more than the page: whether it exists says if a next page does.
            limit: page_size.saturating_add(1),
            now,
        };
        let mut entries = self.store.list(tenant.as_str(), &query).await?;
        let more = entries.len() > page_size as usize;
        entries.truncate(page_size as usize);
        let next_page_token = match entries.last() {
            Some(last) if more => page_token(last.started_at, &last.key, &filters),
            _ => String::new(),
        };
        Ok(ListOutput {
            entries: entries
                .into_iter()
                .map(|e| self.audit_view(e, now))
                .collect(),
            next_page_token,
        })
    }

    /// Applies what reconcilers found, then hands out up to `limit` unresolved entries, oldest
    /// first, holding each for this caller for the reconcile lease.
    ///
    /// A resolution applies only to an entry whose outcome is unknown; an entry already
    /// resolved (by its claimant's late Complete, or another reconciler) is returned as it
    /// stands, and a key that does not exist for this tenant is left out of `resolved`.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed request (checked whole before anything is written);
    /// `Unavailable`/`Internal` from the store.
    pub async fn reconcile(
        &self,
        tenant: &Tenant,
        input: ReconcileInput,
    ) -> Result<ReconcileOutput, LedgerError> {
        let max = self.limits.reconcile_max_limit;
        if input.resolutions.len() > max as usize {
            return Err(LedgerError::invalid(
                "resolutions",
                format!(
                    "{} resolutions; at most {max} per call",
                    input.resolutions.len()
                ),
            ));
        }
        if !input.tool.is_empty() {
            ToolName::parse(&input.tool)?;
        }
        let mut checked = Vec::with_capacity(input.resolutions.len());
        for (i, r) in input.resolutions.into_iter().enumerate() {
            let key = ExplicitKey::parse(&r.key).map_err(|e| {
                LedgerError::invalid("resolutions", format!("[{i}].key: {}", e.message))
            })?;
            if r.status == FinalStatus::Unknown {
                return Err(LedgerError::invalid(
                    "resolutions",
                    format!("[{i}].status must be STATUS_SUCCEEDED or STATUS_FAILED"),
                ));
            }
            let completion = Completion {
                status: r.status,
                result: r.result,
                error: r.error,
                retryable: r.retryable,
            };
            self.check_outcome(&completion).map_err(|e| match e {
                LedgerError::InvalidArgument {
                    reason,
                    message,
                    field,
                } => LedgerError::InvalidArgument {
                    field: "resolutions",
                    reason,
                    message: format!("[{i}].{field} {message}"),
                },
                other => other,
            })?;
            checked.push((key, completion));
        }

        let mut resolved = Vec::with_capacity(checked.len());
        for (key, completion) in checked {
            if let Some(view) = self.resolve_one(tenant, key.as_str(), &completion).await? {
                resolved.push(view);
            }
        }

        if input.resolve_only {
            return Ok(ReconcileOutput {
                pending: Vec::new(),
                resolved,
            });
        }
        let now = self.clock.now();
        let limit = match input.limit {
            0 => self.limits.reconcile_default_limit,
            n => n.min(max),
        };
        let older_than = input
            .older_than
            .map(Micros::from_duration)
            .unwrap_or_default();
        let query = UnresolvedQuery {
            now,
            started_before: now.minus(older_than),
            tool: input.tool,
            limit,
            hold_until: now.plus(Micros::from_duration(self.limits.reconcile_lease)),
        };
        let pending = self
            .store
            .take_unresolved(tenant.as_str(), &query)
            .await?
            .into_iter()
            .map(|e| self.view(e, now))
            .collect();
        Ok(ReconcileOutput { pending, resolved })
    }

    /// Deletes finished entries past their expiry, `batch` at a time, until none is left;
    /// returns how many. Each batch is one short statement, so claims never wait long.
    ///
    /// # Errors
    /// `Unavailable`/`Internal` from the store; batches already deleted stay deleted.
    pub async fn prune(&self, batch: u32) -> Result<u64, LedgerError> {
        let mut total = 0;
        loop {
            let deleted = self.store.prune(self.clock.now(), batch).await?;
            total += deleted;
            if deleted < u64::from(batch) {
                return Ok(total);
            }
            // Let claims waiting for the write lock (SQLite) or for I/O go first.
            tokio::task::yield_now().await;
        }
    }

    /// Applies one resolution, re-reading when a concurrent writer changed the entry.
    async fn resolve_one(
        &self,
        tenant: &Tenant,
        key: &str,
        completion: &Completion,
    ) -> Result<Option<EntryView>, LedgerError> {
        for _ in 0..MAX_RACES {
            let now = self.clock.now();
            let Some(existing) = self.store.get(tenant.as_str(), key).await? else {
                return Ok(None);
            };
            if existing.is_expired(now) {
                return Ok(None);
            }
            if existing.effective_status(now) != Status::Unknown {
                // Resolved already, or an attempt still in flight: nothing to reconcile.
                return Ok(Some(self.view(existing, now)));
            }
            let done = completion.apply_to(&existing, now);
            if let Some(has_waiters) = self.store.resolve(tenant.as_str(), &done, now).await? {
                self.changed(tenant, key, has_waiters).await;
                return Ok(Some(self.view(done, now)));
            }
        }
        Err(LedgerError::Internal(format!(
            "resolution of {key} lost {MAX_RACES} races in a row"
        )))
    }

    /// After an entry left ATTEMPTING/UNKNOWN: wake this server's waiters, and announce it to
    /// other servers when some claim waits for it. The outcome is already committed, so a
    /// failed announcement only delays waiters until their poll.
    async fn changed(&self, tenant: &Tenant, key: &str, has_waiters: bool) {
        self.waits.wake(tenant.as_str(), key);
        if has_waiters
            && self.store.shared()
            && let Err(e) = self.store.announce(tenant.as_str(), key).await
        {
            tracing::warn!(error = %e, "could not announce a completion to other servers");
        }
    }

    /// The deterministic external reference of `key`: the prefix plus 16 hex characters, the
    /// key's own when it is a derived (64 lowercase hex) key, else those of sha256(key).
    pub fn external_ref(&self, key: &str) -> String {
        external_ref(&self.limits.external_ref_prefix, key)
    }

    /// An entry as Claim, Complete and Reconcile answer it: about its outcome, without the
    /// arguments kept for audit (which only some of their statements read back).
    fn view(&self, mut entry: Entry, now: Micros) -> EntryView {
        entry.arguments = None;
        self.audit_view(entry, now)
    }

    /// An entry as Lookup and ListEntries show it: with the arguments kept for audit.
    fn audit_view(&self, entry: Entry, now: Micros) -> EntryView {
        EntryView {
            status: entry.effective_status(now),
            external_ref: self.external_ref(&entry.key),
            entry,
        }
    }

    /// Validates a claim and derives its key and fingerprint; nothing is written on error.
    fn prepare_claim(&self, input: ClaimInput) -> Result<PreparedClaim, LedgerError> {
        let (fingerprint, canonical, tool, value) =
            self.canonical_request(&input.tool, &input.arguments_json, input.canonicalization)?;
        let arguments = self.limits.arguments.stored(&value, &canonical);
        let run_id = if input.key.is_empty() || !input.run_id.is_empty() {
            Some(RunId::parse(&input.run_id)?)
        } else {
            None
        };
        let key = match (&run_id, input.key.is_empty()) {
            (Some(run_id), true) => {
                key::derive_key(run_id, &tool, &canonical, input.canonicalization)
            }
            _ => ExplicitKey::parse(&input.key)?.as_str().to_string(),
        };
        let principal = Principal::parse(&input.principal)?;
        let lease = bounded(
            "lease",
            input.lease,
            self.limits.default_lease,
            self.limits.max_lease,
        )?;
        let retention = bounded(
            "retention",
            input.retention,
            self.limits.default_retention,
            self.limits.max_retention,
        )?;
        Ok(PreparedClaim {
            key,
            run_id: run_id.map(|r| r.as_str().to_string()).unwrap_or_default(),
            tool: tool.as_str().to_string(),
            fingerprint,
            principal: principal.as_str().to_string(),
            lease: Micros::from_duration(lease),
            retention: Micros::from_duration(retention),
            wait: input.wait.map(|w| w.min(self.limits.max_wait)),
            arguments,
        })
    }

    /// Canonicalizes the arguments and returns (fingerprint, canonical text, tool, the value
    /// the text was written from).
    fn canonical_request(
        &self,
        tool: &str,
        arguments_json: &str,
        mode: Canonicalization,
    ) -> Result<(String, String, ToolName, canonical::Value), LedgerError> {
        let tool = ToolName::parse(tool)?;
        if arguments_json.is_empty() {
            // The same reason as the shared key vectors give for empty text, with a hint.
            return Err(LedgerError::InvalidArgument {
                field: "arguments_json",
                reason: "INVALID_JSON",
                message: "is required (empty text is not JSON); a tool without arguments sends {}"
                    .to_string(),
            });
        }
        let (value, canonical) =
            canonical::canonical_value(arguments_json, mode, &self.limits.json)
                .map_err(|e| LedgerError::from_canonical("arguments_json", e))?;
        Ok((
            key::fingerprint(&tool, &canonical, mode),
            canonical,
            tool,
            value,
        ))
    }

    /// The rules every reported outcome follows: result only with success, retryable only with
    /// failure, sizes within the limit.
    fn check_outcome(&self, input: &Completion) -> Result<(), LedgerError> {
        if !input.result.is_empty() && input.status != FinalStatus::Succeeded {
            return Err(LedgerError::invalid(
                "result",
                "is stored only with STATUS_SUCCEEDED; describe a failure in error",
            ));
        }
        if input.retryable && input.status != FinalStatus::Failed {
            return Err(LedgerError::invalid(
                "retryable",
                "applies only to STATUS_FAILED",
            ));
        }
        let max = self.limits.max_result_bytes;
        if input.result.len() > max {
            return Err(LedgerError::InvalidArgument {
                field: "result",
                reason: "RESULT_TOO_LARGE",
                message: format!("is {} bytes; the limit is {max}", input.result.len()),
            });
        }
        if input.error.len() > max {
            return Err(LedgerError::InvalidArgument {
                field: "error",
                reason: "RESULT_TOO_LARGE",
                message: format!("is {} bytes; the limit is {max}", input.error.len()),
            });
        }
        Ok(())
    }

    /// One pass of the claim: insert, or read and act on what is there.
    async fn claim_once(
        &self,
        tenant: &Tenant,
        request: &PreparedClaim,
    ) -> Result<ClaimOutput, LedgerError> {
        // A key this server saw succeed recently is most likely a repeat: try the replay
        // first, which spares the insert (and its wait on the row lock of a concurrent replay).
        let mut replay_tried = false;
        if self
            .finished
            .probably_contains(tenant.as_str(), &request.key)
        {
            replay_tried = true;
            let now = self.clock.now();
            if let Some(entry) = self
                .store
                .replay(tenant.as_str(), &request.key, &request.fingerprint, now)
                .await?
            {
                let note = replay_note(&entry);
                return Ok(self.answer(Outcome::Replayed, entry, now, note, None));
            }
        }
        for _ in 0..MAX_RACES {
            let now = self.clock.now();
            let fresh = request.new_entry(now, 1, new_claim_token()?);
            if self.store.insert(tenant.as_str(), &fresh).await? {
                return Ok(self.claimed(fresh, now));
            }
            // The row exists. The most common reason is a repeat of a finished call: replay it
            // in one statement (unless that was just tried and missed).
            if !std::mem::take(&mut replay_tried)
                && let Some(entry) = self
                    .store
                    .replay(tenant.as_str(), &request.key, &request.fingerprint, now)
                    .await?
            {
                self.finished.insert(tenant.as_str(), &request.key);
                let note = replay_note(&entry);
                return Ok(self.answer(Outcome::Replayed, entry, now, note, None));
            }
            // Otherwise read it in its own statement (a CTE on the insert would not see a row
            // committed after its snapshot) and let the domain decide.
            let Some(existing) = self.store.get(tenant.as_str(), &request.key).await? else {
                continue; // pruned in between: insert again
            };
            match decide_claim(&existing, &request.fingerprint, now) {
                ClaimDecision::KeyReused => return Err(LedgerError::KeyReused),
                decision @ (ClaimDecision::StartOver | ClaimDecision::Retry) => {
                    // A retry continues the entry's attempts; an expired entry starts over.
                    let attempt = if decision == ClaimDecision::Retry {
                        existing.attempt.saturating_add(1)
                    } else {
                        1
                    };
                    let next = request.new_entry(now, attempt, fresh.claim_token);
                    if self
                        .store
                        .restart(tenant.as_str(), &existing.claim_token, &next)
                        .await?
                    {
                        return Ok(self.claimed(next, now));
                    }
                }
                // Became a success after the replay statement looked: go round again.
                ClaimDecision::Replay => {}
                ClaimDecision::PreviouslyFailed => {
                    let note = failed_note(&existing);
                    return Ok(self.answer(Outcome::PreviouslyFailed, existing, now, note, None));
                }
                ClaimDecision::InProgress => {
                    let status = existing.effective_status(now);
                    let (note, retry_after) = if status == Status::Attempting {
                        let remaining = existing.lease_expires_at.minus(now).to_duration();
                        (
                            IN_FLIGHT_NOTE.to_string(),
                            remaining.clamp(Duration::from_millis(100), Duration::from_secs(1)),
                        )
                    } else {
                        (UNKNOWN_NOTE.to_string(), UNKNOWN_RETRY_AFTER)
                    };
                    return Ok(self.answer(
                        Outcome::InProgress,
                        existing,
                        now,
                        note,
                        Some(retry_after),
                    ));
                }
            }
        }
        Err(LedgerError::Internal(format!(
            "claim of {} lost {MAX_RACES} races in a row",
            request.key
        )))
    }

    fn claimed(&self, entry: Entry, now: Micros) -> ClaimOutput {
        let token = entry.claim_token.clone();
        ClaimOutput {
            outcome: Outcome::Claimed,
            entry: self.view(entry, now),
            claim_token: Some(token),
            note: String::new(),
            retry_after: None,
        }
    }

    fn answer(
        &self,
        outcome: Outcome,
        entry: Entry,
        now: Micros,
        note: String,
        retry_after: Option<Duration>,
    ) -> ClaimOutput {
        ClaimOutput {
            outcome,
            entry: self.view(entry, now),
            claim_token: None,
            note,
            retry_after,
        }
    }
}

/// How many recently finished keys the claim path remembers; the set starts over when full.
const RECENT_KEYS: usize = 65_536;

/// A bounded set of (tenant, key) hashes. A hit only makes the claim try the replay
/// statement first; the store still checks status, fingerprint and expiry, so a stale or
/// colliding entry costs one statement, never a wrong answer.
#[derive(Default)]
struct RecentKeys(std::sync::Mutex<std::collections::HashSet<u64>>);

impl RecentKeys {
    fn hash(tenant: &str, key: &str) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (tenant, key).hash(&mut h);
        h.finish()
    }

    fn insert(&self, tenant: &str, key: &str) {
        let mut set = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if set.len() >= RECENT_KEYS {
            set.clear();
        }
        set.insert(Self::hash(tenant, key));
    }

    fn probably_contains(&self, tenant: &str, key: &str) -> bool {
        let set = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        set.contains(&Self::hash(tenant, key))
    }
}

/// Whether a claim found an attempt still in flight (what a waiting claim waits out).
fn in_flight(output: &ClaimOutput) -> bool {
    output.outcome == Outcome::InProgress && output.entry.status == Status::Attempting
}

/// A validated claim with its derived key.
#[derive(Clone, Debug)]
struct PreparedClaim {
    key: String,
    run_id: String,
    tool: String,
    fingerprint: String,
    principal: String,
    lease: Micros,
    retention: Micros,
    wait: Option<Duration>,
    /// What is stored of the arguments (see [`ArgumentsPolicy`]).
    arguments: Option<String>,
}

impl PreparedClaim {
    fn new_entry(&self, now: Micros, attempt: u32, claim_token: String) -> Entry {
        Entry {
            key: self.key.clone(),
            run_id: self.run_id.clone(),
            tool: self.tool.clone(),
            fingerprint: self.fingerprint.clone(),
            status: Status::Attempting,
            attempt,
            claim_token,
            result: Vec::new(),
            error: String::new(),
            retryable: false,
            principal: self.principal.clone(),
            started_at: now,
            finished_at: None,
            lease_expires_at: now.plus(self.lease),
            retention: self.retention,
            expires_at: None,
            replay_count: 0,
            arguments: self.arguments.clone(),
        }
    }
}

/// What a page token is bound to: the listing's filters, so that a token cannot continue a
/// different listing (its cursor would skip or repeat entries there).
fn list_filters_digest(
    run_id: &str,
    tool: &str,
    status: Option<Status>,
    input: &ListInput,
) -> String {
    use sha2::{Digest, Sha256};
    let bound = |m: Option<Micros>| m.map_or_else(String::new, |m| m.0.to_string());
    let text = [
        run_id,
        tool,
        status.map_or("", Status::as_str),
        &bound(input.started_after),
        &bound(input.started_before),
    ]
    .join("\0");
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}

/// Version of the page token's layout.
const PAGE_TOKEN_VERSION: &str = "p1";

/// An opaque page token: hex of `p1 NUL started_at NUL filters NUL key`.
fn page_token(started_at: Micros, key: &str, filters: &str) -> String {
    hex::encode(format!(
        "{PAGE_TOKEN_VERSION}\0{}\0{filters}\0{key}",
        started_at.0
    ))
}

/// The cursor in a page token made for a listing with these `filters`.
fn parse_page_token(token: &str, filters: &str) -> Result<(Micros, String), LedgerError> {
    let invalid = |message: &str| LedgerError::InvalidArgument {
        field: "page_token",
        reason: "INVALID_PAGE_TOKEN",
        message: message.to_string(),
    };
    let text = hex::decode(token)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| {
            invalid("is not a page token from this server; pass next_page_token as is")
        })?;
    let mut parts = text.splitn(4, '\0');
    let (Some(PAGE_TOKEN_VERSION), Some(started), Some(bound), Some(key)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid(
            "is not a page token from this server; pass next_page_token as is",
        ));
    };
    let started = started
        .parse::<i64>()
        .map_err(|_| invalid("is not a page token from this server; pass next_page_token as is"))?;
    if bound != filters {
        return Err(invalid(
            "belongs to a listing with other filters; repeat the filters of the call that \
             returned it, or start over without a page_token",
        ));
    }
    Ok((Micros(started), key.to_string()))
}

const IN_FLIGHT_NOTE: &str = "This action is already being performed by another attempt of the \
    same request; do not repeat it. No new action was taken. Check again shortly for its result.";

const UNKNOWN_NOTE: &str = "An earlier attempt of this action may or may not have taken effect: \
    its outcome is unknown and is being reconciled. Do not repeat it. No new action was taken.";

fn replay_note(entry: &Entry) -> String {
    if entry.run_id.is_empty() {
        "This action was already performed for this request; returning the earlier result. No \
         new action was taken."
            .to_string()
    } else {
        "This action was already performed in this run; returning the earlier result. No new \
         action was taken."
            .to_string()
    }
}

fn failed_note(entry: &Entry) -> String {
    let scope = if entry.run_id.is_empty() {
        "for this request"
    } else {
        "in this run"
    };
    let error = if entry.error.is_empty() {
        "no error was given".to_string()
    } else {
        entry.error.clone()
    };
    format!(
        "This action already failed permanently {scope} ({error}). No new action was taken; \
         do not retry it with the same arguments."
    )
}

/// The requested duration, or the default when unset; zero and above-maximum are refused.
fn bounded(
    field: &'static str,
    asked: Option<Duration>,
    default: Duration,
    max: Duration,
) -> Result<Duration, LedgerError> {
    match asked {
        None => Ok(default),
        // Time is kept in whole microseconds: less than one would be stored as zero.
        Some(d) if d < Duration::from_micros(1) => Err(LedgerError::invalid(
            field,
            "must be at least 1 microsecond; leave it unset for the server's default",
        )),
        Some(d) if d > max => Err(LedgerError::invalid(
            field,
            format!("{d:?} is above the server's maximum of {max:?}"),
        )),
        Some(d) => Ok(d),
    }
}

/// A fresh 128-bit random claim token, hex.
fn new_claim_token() -> Result<String, LedgerError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| LedgerError::Internal(format!("no randomness for a claim token: {e}")))?;
    Ok(hex::encode(bytes))
}

/// See [`Ledger::external_ref`].
pub fn external_ref(prefix: &str, key: &str) -> String {
    let derived = key.len() == 64 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if derived {
        format!("{prefix}{}", &key[..16])
    } else {
        use sha2::Digest;
        let digest = hex::encode(sha2::Sha256::digest(key.as_bytes()));
        format!("{prefix}{}", &digest[..16])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_refs_take_the_derived_keys_prefix_or_hash_an_explicit_key() {
        let derived = "0123456789abcdef".repeat(4);
        assert_eq!(external_ref("idem-", &derived), "idem-0123456789abcdef");
        let explicit = external_ref("x-", "wf-1:step-2");
        assert_eq!(explicit.len(), 2 + 16);
        assert_eq!(explicit, external_ref("x-", "wf-1:step-2"));
        assert_ne!(explicit, external_ref("x-", "wf-1:step-3"));
    }

    #[test]
    fn durations_default_when_unset_and_are_refused_out_of_range() {
        let d = Duration::from_secs(60);
        let max = Duration::from_secs(3600);
        assert_eq!(bounded("lease", None, d, max).ok(), Some(d));
        assert!(bounded("lease", Some(Duration::ZERO), d, max).is_err());
        assert!(bounded("lease", Some(Duration::from_nanos(999)), d, max).is_err());
        assert!(bounded("lease", Some(Duration::from_micros(1)), d, max).is_ok());
        assert!(bounded("lease", Some(max + Duration::from_micros(1)), d, max).is_err());
        assert_eq!(bounded("lease", Some(max), d, max).ok(), Some(max));
    }

    #[test]
    fn claim_tokens_are_fresh_each_time() {
        let a = new_claim_token().ok();
        let b = new_claim_token().ok();
        assert_eq!(a.as_ref().map(String::len), Some(32));
        assert_ne!(a, b);
    }
}
