//! An acknowledgement means committed: every write statement of both stores, with its COMMIT
//! made to fail, answers an error and leaves nothing behind.
//!
//! The failure is injected at the commit itself, not at the statement: on PostgreSQL a
//! deferred constraint trigger raises an I/O error (SQLSTATE 58030) when the transaction
//! commits; on SQLite a trigger writes an orphan row under a deferred foreign key, which SQLite
//! checks only when the (implicit) transaction commits. A store that reads only the first row
//! of a `RETURNING` statement (SQLite's `fetch_optional`) never sees that error and
//! acknowledges a write that was rolled back: this suite fails then.

use std::sync::Arc;
use std::time::Duration;

use idempotency_ledger::domain::{
    Approval, ApprovalState, ClaimToken, Completion, Entry, FinalStatus, Key, Micros, Principal,
    RunId, Status, Tenant, ToolName,
};
use idempotency_ledger::storage::{self, Finish, StoreError, UnresolvedQuery};

use crate::support::{Backend, TestDb};

on_every_store!(every_write_reports_a_commit_that_fails_and_leaves_nothing_behind);

const TENANT: &str = "doomed";

fn tenant() -> Tenant {
    Tenant::parse(TENANT).expect("tenant")
}

/// A key as the store holds it.
fn k(key: &str) -> Key {
    Key::from_stored(key.to_string())
}

/// A claim token as the store holds it.
fn tok(token: &str) -> ClaimToken {
    ClaimToken::from_stored(token.to_string())
}

/// Makes the commit of every write to `ledger_entries` (and to the write probe's table) fail
/// while armed.
struct CommitFailure {
    backend: Backend,
    url: String,
}

impl CommitFailure {
    async fn install(db: &TestDb) -> CommitFailure {
        // Installed and armed on the database itself, not through a pooler.
        let this = CommitFailure {
            backend: db.backend,
            url: db.direct_url.clone(),
        };
        let statements: &[&str] = match db.backend {
            Backend::Postgres | Backend::PgBouncer => &[
                "CREATE TABLE test_armed (x int)",
                "CREATE FUNCTION test_fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN \
                   IF EXISTS (SELECT 1 FROM test_armed) THEN \
                     RAISE EXCEPTION 'injected failure at COMMIT' USING ERRCODE = '58030'; \
                   END IF; \
                   RETURN NULL; \
                 END $$",
                "CREATE CONSTRAINT TRIGGER test_fail_at_commit \
                 AFTER INSERT OR UPDATE OR DELETE ON ledger_entries \
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW \
                 EXECUTE FUNCTION test_fail_at_commit()",
                "CREATE CONSTRAINT TRIGGER test_fail_probe_at_commit \
                 AFTER INSERT OR UPDATE OR DELETE ON ledger_write_probe \
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW \
                 EXECUTE FUNCTION test_fail_at_commit()",
                "CREATE CONSTRAINT TRIGGER test_fail_history_at_commit \
                 AFTER INSERT OR UPDATE OR DELETE ON ledger_history \
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW \
                 EXECUTE FUNCTION test_fail_at_commit()",
            ],
            Backend::Sqlite => &[
                "CREATE TABLE test_armed (x INTEGER)",
                "CREATE TABLE test_parent (id INTEGER PRIMARY KEY)",
                "CREATE TABLE test_child (parent INTEGER \
                 REFERENCES test_parent (id) DEFERRABLE INITIALLY DEFERRED)",
                "CREATE TRIGGER test_doom_insert AFTER INSERT ON ledger_entries \
                 WHEN EXISTS (SELECT 1 FROM test_armed) \
                 BEGIN INSERT INTO test_child VALUES (42); END",
                "CREATE TRIGGER test_doom_update AFTER UPDATE ON ledger_entries \
                 WHEN EXISTS (SELECT 1 FROM test_armed) \
                 BEGIN INSERT INTO test_child VALUES (42); END",
                "CREATE TRIGGER test_doom_delete AFTER DELETE ON ledger_entries \
                 WHEN EXISTS (SELECT 1 FROM test_armed) \
                 BEGIN INSERT INTO test_child VALUES (42); END",
                "CREATE TRIGGER test_doom_probe AFTER INSERT ON ledger_write_probe \
                 WHEN EXISTS (SELECT 1 FROM test_armed) \
                 BEGIN INSERT INTO test_child VALUES (42); END",
                "CREATE TRIGGER test_doom_history AFTER INSERT ON ledger_history \
                 WHEN EXISTS (SELECT 1 FROM test_armed) \
                 BEGIN INSERT INTO test_child VALUES (42); END",
            ],
        };
        for s in statements {
            this.run(s).await;
        }
        this
    }

    async fn run(&self, statement: &'static str) {
        crate::support::execute_on(self.backend, &self.url, statement).await;
    }

    async fn arm(&self) {
        self.run("INSERT INTO test_armed VALUES (1)").await;
    }

    async fn disarm(&self) {
        self.run("DELETE FROM test_armed").await;
    }

    /// What the store must answer: the injected cause, classified.
    fn expected(&self, error: &StoreError) -> bool {
        match self.backend {
            Backend::Postgres | Backend::PgBouncer => matches!(error, StoreError::Io(_)),
            // SQLITE_CONSTRAINT_FOREIGNKEY: a constraint the ledger did not expect.
            Backend::Sqlite => matches!(error, StoreError::Internal(_)),
        }
    }
}

fn attempt(key: &str, token: &str, now: Micros) -> Entry {
    Entry {
        key: k(key),
        run_id: Some(RunId::from_stored("run-1".into())),
        tool: ToolName::from_stored("issue_credit".into()),
        fingerprint: "f".repeat(64),
        status: Status::Attempting,
        attempt: 1,
        claim_token: tok(token),
        result: Vec::new(),
        error: String::new(),
        retryable: false,
        principal: Principal::none(),
        started_at: now,
        finished_at: None,
        lease_expires_at: now.plus(Micros::from_duration(Duration::from_secs(60))),
        retention: Micros::from_duration(Duration::from_secs(3600)),
        expires_at: None,
        replay_count: 0,
        arguments: Some("{}".into()),
        resolved_by: Principal::none(),
        hold_token: idempotency_ledger::domain::HoldToken::none(),
        possible_double_effect: false,
        approval: Default::default(),
    }
}

fn finish(key: &str, token: &str, status: FinalStatus, now: Micros) -> Finish {
    Finish {
        key: k(key),
        claim_token: tok(token),
        completion: if status == FinalStatus::Succeeded {
            Completion::success(b"result".to_vec())
        } else {
            Completion::new(status, Vec::new(), "why".into(), false).expect("an outcome")
        },
        now,
        also_unknown: true,
    }
}

/// Runs `write` with commits failing, and checks that it answered the injected error and that
/// the entries of `keys` read afterwards as they did before.
async fn fails_cleanly<T: std::fmt::Debug>(
    store: &Arc<dyn storage::Store>,
    inject: &CommitFailure,
    what: &str,
    keys: &[&str],
    write: impl std::future::Future<Output = Result<T, StoreError>>,
) {
    let mut before = Vec::new();
    for key in keys {
        before.push((
            store.get(&tenant(), &k(key)).await.expect("get"),
            store.history(&tenant(), &k(key)).await.expect("history"),
        ));
    }
    inject.arm().await;
    let answer = write.await;
    inject.disarm().await;
    match &answer {
        Err(e) if inject.expected(e) => {}
        other => panic!("{what}: a commit that failed was answered {other:?}"),
    }
    for (key, before) in keys.iter().zip(before) {
        let after = (
            store.get(&tenant(), &k(key)).await.expect("get"),
            store.history(&tenant(), &k(key)).await.expect("history"),
        );
        assert_eq!(
            after, before,
            "{what}: the failed commit left a change behind on {key}"
        );
    }
}

async fn every_write_reports_a_commit_that_fails_and_leaves_nothing_behind(b: Backend) {
    let db = TestDb::new(b);
    let store = db.backend(4).await;
    let inject = CommitFailure::install(&db).await;
    let now = Micros::now();
    let hour = Micros::from_duration(Duration::from_secs(3600));

    // Claims: the one-row insert and the batch insert.
    fails_cleanly(
        &store,
        &inject,
        "INSERT",
        &["k-new"],
        store.insert(&tenant(), &attempt("k-new", "t-new", now)),
    )
    .await;
    let batch = vec![
        (tenant(), attempt("k-b1", "t-b1", now)),
        (tenant(), attempt("k-b2", "t-b2", now)),
    ];
    fails_cleanly(
        &store,
        &inject,
        "INSERT_MANY",
        &["k-b1", "k-b2"],
        store.insert_many(&batch),
    )
    .await;

    // Completions: one row, and a batch, of attempts that exist.
    for (key, token) in [("k-1", "t-1"), ("k-2", "t-2"), ("k-3", "t-3")] {
        assert!(
            store
                .insert(&tenant(), &attempt(key, token, now))
                .await
                .expect("set up")
        );
    }
    fails_cleanly(
        &store,
        &inject,
        "FINISH",
        &["k-1"],
        store.finish(
            &tenant(),
            &finish("k-1", "t-1", FinalStatus::Succeeded, now),
        ),
    )
    .await;
    let finishes = vec![
        (tenant(), finish("k-2", "t-2", FinalStatus::Succeeded, now)),
        (tenant(), finish("k-3", "t-3", FinalStatus::Failed, now)),
    ];
    fails_cleanly(
        &store,
        &inject,
        "FINISH_MANY",
        &["k-2", "k-3"],
        store.finish_many(&finishes),
    )
    .await;

    // The lease: renewing it, and marking a waiter.
    fails_cleanly(
        &store,
        &inject,
        "RENEW",
        &["k-1"],
        store.renew(&tenant(), &k("k-1"), &tok("t-1"), now.plus(hour), now),
    )
    .await;
    fails_cleanly(
        &store,
        &inject,
        "MARK_WAITING",
        &["k-1"],
        store.mark_waiting(&tenant(), &k("k-1")),
    )
    .await;

    // Replays and restarts need resolved entries: k-1 succeeded, k-2 failed retryably.
    let done = store
        .finish(
            &tenant(),
            &finish("k-1", "t-1", FinalStatus::Succeeded, now),
        )
        .await
        .expect("set up")
        .expect("applied");
    fails_cleanly(
        &store,
        &inject,
        "REPLAY",
        &["k-1"],
        store.replay(&tenant(), &k("k-1"), &done.entry.fingerprint, now),
    )
    .await;
    let mut next = attempt("k-1", "t-1b", now);
    next.attempt = 2;
    fails_cleanly(
        &store,
        &inject,
        "RESTART",
        &["k-1"],
        store.restart(&tenant(), &tok("t-1"), &next),
    )
    .await;

    // Reconciliation: the hand-out (which holds entries) and a resolution, of an unknown one.
    let later = now.plus(Micros::from_duration(Duration::from_secs(120)));
    let query = UnresolvedQuery {
        now: later,
        started_before: later,
        tool: None,
        limit: 10,
        hold_until: later.plus(hour),
        keys: Vec::new(),
        unknown_before: later,
        hold_token: idempotency_ledger::domain::HoldToken::from_stored("hold-1".into()),
    };
    fails_cleanly(
        &store,
        &inject,
        "TAKE_UNRESOLVED",
        &["k-2", "k-3"],
        store.take_unresolved(&tenant(), &query),
    )
    .await;
    let mut found = store
        .get(&tenant(), &k("k-2"))
        .await
        .expect("get")
        .expect("k-2");
    found.status = Status::Succeeded;
    found.result = b"found".to_vec();
    found.finished_at = Some(later);
    found.expires_at = Some(later.plus(found.retention));
    let note = idempotency_ledger::domain::HistoryEvent {
        at: later,
        attempt: found.attempt,
        kind: idempotency_ledger::domain::EventKind::FindingApplied,
        principal: Principal::none(),
        detail: "found".into(),
    };
    fails_cleanly(
        &store,
        &inject,
        "RESOLVE",
        &["k-2"],
        store.resolve(&tenant(), &found, later, &note),
    )
    .await;

    // The history and the marks of a possible double effect, each alone and with its note.
    fails_cleanly(
        &store,
        &inject,
        "APPEND_HISTORY",
        &["k-3"],
        store.append_history(&tenant(), &k("k-3"), &note),
    )
    .await;
    fails_cleanly(
        &store,
        &inject,
        "MARK_DOUBLE_EFFECT",
        &["k-3"],
        store.mark_double_effect(&tenant(), &k("k-3"), &note),
    )
    .await;
    assert!(
        store
            .mark_double_effect(&tenant(), &k("k-3"), &note)
            .await
            .expect("mark")
    );
    fails_cleanly(
        &store,
        &inject,
        "ACKNOWLEDGE_DOUBLE_EFFECT",
        &["k-3"],
        store.acknowledge_double_effect(&tenant(), &k("k-3"), &note),
    )
    .await;

    // Pruning deletes: k-1 expires an hour after it finished.
    fails_cleanly(
        &store,
        &inject,
        "PRUNE",
        &["k-1"],
        store.prune(now.plus(hour).plus(hour), 100),
    )
    .await;

    // The health check's write probe.
    fails_cleanly(&store, &inject, "PROBE_WRITE", &[], store.probe_write()).await;

    // Disarmed, the same writes go through: the failures above were the injection's. One
    // pass once pruned nothing on PostgreSQL on a loaded CI machine (not reproduced since, 12
    // runs beside two CPU hogs); the one way we know for that is a row another transaction
    // holds, which the prune skips (SKIP LOCKED) for its next pass. So up to 20 passes.
    let mut pruned = 0;
    for _ in 0..20 {
        pruned += store
            .prune(now.plus(hour).plus(hour), 100)
            .await
            .expect("prune");
        if pruned >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(pruned >= 1, "k-1 is pruned once commits succeed");
    store.probe_write().await.expect("probe");

    // Approvals, on run-1 with one finished entry (k-5): a request (which keeps its run's
    // finished entries in its own transaction), a decision (likewise), a lapse, and the sweep
    // that keeps paused runs.
    assert!(
        store
            .insert(&tenant(), &attempt("k-5", "t-5", now))
            .await
            .expect("set up")
    );
    store
        .finish(
            &tenant(),
            &finish("k-5", "t-5", FinalStatus::Succeeded, now),
        )
        .await
        .expect("set up")
        .expect("applied");
    let minutes = |n: u64| Micros::from_duration(Duration::from_secs(60 * n));
    let asked = |key: &str, token: &str, decide_by: Micros| {
        let mut e = attempt(key, token, now);
        e.status = Status::AwaitingApproval;
        e.lease_expires_at = decide_by;
        e.approval = Approval::requested(now, decide_by);
        e
    };
    let request_note = |key: &str| idempotency_ledger::domain::HistoryEvent {
        at: now,
        attempt: 1,
        kind: idempotency_ledger::domain::EventKind::ApprovalRequested,
        principal: Principal::none(),
        detail: format!("asked about {key}"),
    };
    let a = asked("k-a", "t-a", now.plus(minutes(90)));
    fails_cleanly(
        &store,
        &inject,
        "INSERT_REQUEST",
        &["k-a", "k-5"],
        store.insert_request(&tenant(), &a, &request_note("k-a")),
    )
    .await;
    assert!(
        store
            .insert_request(&tenant(), &a, &request_note("k-a"))
            .await
            .expect("set up")
    );
    let approval = Approval {
        state: ApprovalState::Approved,
        decided_at: Some(now.plus(minutes(1))),
        decided_by: Principal::parse("alice").expect("principal"),
        reason: "ok".into(),
        execute_by: Some(now.plus(minutes(60))),
        ..Approval::default()
    };
    fails_cleanly(
        &store,
        &inject,
        "DECIDE",
        &["k-a", "k-5"],
        store.decide(
            &tenant(),
            &k("k-a"),
            &a.fingerprint,
            &approval,
            &request_note("k-a"),
        ),
    )
    .await;
    let lapsing = asked("k-l", "t-l", now.plus(minutes(1)));
    assert!(
        store
            .insert_request(&tenant(), &lapsing, &request_note("k-l"))
            .await
            .expect("set up")
    );
    let lapsed_at = now.plus(minutes(1));
    fails_cleanly(
        &store,
        &inject,
        "EXPIRE_APPROVAL",
        &["k-l", "k-5"],
        store.expire_approval(
            &tenant(),
            &k("k-l"),
            "the approval lapsed",
            lapsed_at,
            lapsed_at.plus(minutes(1)),
            &request_note("k-l"),
        ),
    )
    .await;
    // What a finish racing the request would leave: k-5 kept only for its own retention.
    db.execute(
        "UPDATE ledger_entries SET expires_at = finished_at + retention_us WHERE key = 'k-5'",
    )
    .await;
    fails_cleanly(
        &store,
        &inject,
        "KEEP_PAUSED_RUNS",
        &["k-5"],
        store.keep_paused_runs(),
    )
    .await;
}
