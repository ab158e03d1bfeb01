//! PostgreSQL's plans for the server's statements: every statement about one entry finds it by
//! the primary key, and the reconcile pick by the unresolved-entries index, also in the
//! generic plans a prepared statement settles on, and with a large backlog of unresolved
//! entries in one tenant, and on a new, empty table with the server's session settings. (Before
//! migration 0003 the completions' generic plans used the unresolved index with `tenant` alone
//! as its condition and filtered the whole backlog; on an empty table a batch's generic plan
//! scanned the table, and kept doing so as it grew.)

use idempotency_ledger::storage::postgres::{PgStore, SESSION_SETTINGS};
use idempotency_ledger::storage::sql;
use sqlx::Connection;

use crate::support::{Backend, TestDb};

/// Unresolved entries of the one tenant the statements are asked about.
const BACKLOG: usize = 20_000;

#[tokio::test]
async fn statements_on_one_entry_use_the_primary_key_in_generic_plans() {
    let db = TestDb::new(Backend::Postgres);
    let _store = db.store(1).await; // migrated
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    sqlx::query(SESSION_SETTINGS)
        .bind("10s")
        .execute(&mut conn)
        .await
        .expect("the server's session settings");
    // A new, empty table: no statistics yet. A plan cached now is kept while the table grows.
    check_plans(&mut conn).await;
    // The steady state: nearly every entry finished, a few in flight. Here the old index
    // looked cheapest to the planner.
    add_entries(&mut conn, "SUCCEEDED", BACKLOG, 0).await;
    add_entries(&mut conn, "ATTEMPTING", 10, BACKLOG).await;
    check_plans(&mut conn).await;
    // A large backlog of unknown outcomes in the same tenant.
    add_entries(&mut conn, "UNKNOWN", BACKLOG, BACKLOG + 10).await;
    check_plans(&mut conn).await;
}

/// Adds `count` entries of tenant `acme` in `status`, numbered from `from`, and analyzes.
async fn add_entries(conn: &mut sqlx::PgConnection, status: &str, count: usize, from: usize) {
    sqlx::query(
        "INSERT INTO ledger_entries (tenant, key, run_id, tool, fingerprint, status, attempt, \
         claim_token, started_at, finished_at, lease_expires_at, retention_us, expires_at) \
         SELECT 'acme', md5(i::text) || md5('k' || i), 'run', 'issue_credit', 'fp', $1, 1, \
         md5('t' || i), i, CASE WHEN $1 = 'SUCCEEDED' THEN i END, i, 1000, \
         CASE WHEN $1 = 'SUCCEEDED' THEN i + 1000 END \
         FROM generate_series($2, $3) AS i",
    )
    .bind(status)
    .bind(i64::try_from(from + 1).expect("fits"))
    .bind(i64::try_from(from + count).expect("fits"))
    .execute(&mut *conn)
    .await
    .expect("entries");
    sqlx::query("ANALYZE ledger_entries")
        .execute(&mut *conn)
        .await
        .expect("analyze");
}

/// Asserts the generic plans of the statements about one entry and of the reconcile pick.
async fn check_plans(conn: &mut sqlx::PgConnection) {
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .expect("generic plans");

    // The parameters' types, as the server binds them.
    let entry = "text, text, text, text, text, text, int8, text, bytea, text, bool, text, \
                 int8, int8, int8, int8, int8, int8, text";
    let by_key = [
        ("GET", sql::GET, "text, text".to_string()),
        ("RESTART", sql::RESTART, format!("{entry}, text")),
        (
            "FINISH",
            sql::FINISH,
            "text, text, text, text, bytea, text, bool, int8, bool".into(),
        ),
        ("REPLAY", PgStore::REPLAY, "text, text, text, int8".into()),
        (
            "RESOLVE",
            sql::RESOLVE,
            "text, text, text, bytea, text, bool, int8, int8, int8, text, int8, text".into(),
        ),
        ("MARK_WAITING", sql::MARK_WAITING, "text, text".into()),
        (
            "TAKE_KEY",
            sql::TAKE_KEY,
            "text, int8, int8, text, text, int8, int8, text".into(),
        ),
        (
            "MARK_DOUBLE_EFFECT",
            sql::MARK_DOUBLE_EFFECT,
            "text, text, int8".into(),
        ),
        (
            "ACKNOWLEDGE_DOUBLE_EFFECT",
            sql::ACKNOWLEDGE_DOUBLE_EFFECT,
            "text, text".into(),
        ),
        (
            "ADD_REPLAYS_MANY",
            PgStore::ADD_REPLAYS_MANY,
            "text[], text[], text[], int8[]".into(),
        ),
        (
            "FINISH_MANY",
            PgStore::FINISH_MANY,
            "text[], text[], text[], text[], bytea[], text[], bool[], int8[], bool[]".into(),
        ),
    ];
    for (name, statement, types) in by_key {
        let plan = generic_plan(conn, name, statement, &types).await;
        assert!(
            plan.contains("ledger_entries_pkey"),
            "{name} does not use the primary key:\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan on ledger_entries"),
            "{name} scans the table:\n{plan}"
        );
        // A write that finishes an entry asks whether its run is paused: by the index of the
        // calls awaiting a decision, never by reading the run (migration 0010).
        if statement.contains("p.status = 'AWAITING_APPROVAL'") {
            assert!(
                plan.contains("ledger_entries_awaiting_by_run"),
                "{name} reads its run to find a pause:\n{plan}"
            );
        }
    }
    let run_page = generic_plan(
        conn,
        "LIST_RUN",
        sql::LIST_RUN,
        "text, text, text, text, int8, int8, int8, text, int8, int8, bool",
    )
    .await;
    assert!(
        run_page.contains("ledger_entries_by_run"),
        "a run's listing does not use the run index:\n{run_page}"
    );
    let pick = generic_plan(
        conn,
        "TAKE_UNRESOLVED",
        PgStore::TAKE_UNRESOLVED,
        "text, int8, int8, text, int8, int8, int8, text",
    )
    .await;
    assert!(
        pick.contains("ledger_entries_unresolved_by_start"),
        "the reconcile pick does not use the unresolved index:\n{pick}"
    );
    let history = generic_plan(conn, "HISTORY", sql::HISTORY, "text, text").await;
    assert!(
        history.contains("ledger_history_by_entry"),
        "an entry's history is not read by its index:\n{history}"
    );
}

/// `EXPLAIN` of the statement's generic plan, prepared with parameters of `types` (all NULL
/// when explained: a generic plan does not look at them).
async fn generic_plan(
    conn: &mut sqlx::PgConnection,
    name: &str,
    statement: &str,
    types: &str,
) -> String {
    let params = types.split(',').count();
    let prepared = format!("plan_{}", name.to_lowercase());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "PREPARE {prepared}({types}) AS {statement}"
    )))
    .execute(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("prepare {name}: {e}"));
    let nulls = vec!["NULL"; params].join(", ");
    let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "EXPLAIN EXECUTE {prepared}({nulls})"
    )))
    .fetch_all(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("explain {name}: {e}"));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DEALLOCATE {prepared}")))
        .execute(&mut *conn)
        .await
        .expect("deallocate");
    rows.into_iter().map(|(line,)| line + "\n").collect()
}
