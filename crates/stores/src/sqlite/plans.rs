//! What SQLite's query planner makes of the statements a call runs, on a migrated file: none
//! reads a whole tenant (the primary key searched by the tenant alone, or the table scanned),
//! so a call costs the same on a ledger of ten entries and of ten million. Migration 0010 gives
//! the planner the statistics that say a tenant is most of the table; without them it took the
//! tenant for a selective column and every finish read the tenant's every entry.

use super::SqliteStore;
use crate::sql;
use crate::storage::PoolOptions;
use crate::storage::sql_store::Dialect as _;

/// Every statement of a call's path and of the sweeps, by name. `LIST` (a page of a tenant's
/// entries, by the filters a person chose) and `COUNT_UNRESOLVED` (every tenant's backlog, by
/// its partial index) read what they are asked to and are not here.
const STATEMENTS: &[(&str, &str)] = &[
    ("GET", sql::GET),
    ("INSERT", sql::INSERT),
    ("RESTART", sql::RESTART),
    ("FINISH", sql::FINISH),
    ("REPLAY", sql::REPLAY),
    ("ADD_REPLAYS", sql::ADD_REPLAYS),
    ("RENEW", sql::RENEW),
    ("RESOLVE", sql::RESOLVE),
    ("APPEND_HISTORY", sql::APPEND_HISTORY),
    ("HISTORY", sql::HISTORY),
    ("MARK_DOUBLE_EFFECT", sql::MARK_DOUBLE_EFFECT),
    ("ACKNOWLEDGE_DOUBLE_EFFECT", sql::ACKNOWLEDGE_DOUBLE_EFFECT),
    ("DOUBLE_EFFECTS", sql::DOUBLE_EFFECTS),
    ("MARK_WAITING", sql::MARK_WAITING),
    ("INTENT_GENERATION", sql::INTENT_GENERATION),
    ("CURRENT_INTENT", sql::CURRENT_INTENT),
    ("TAKE_KEY", sql::TAKE_KEY),
    ("LIST_RUN", sql::LIST_RUN),
    ("INSERT_REQUEST", sql::INSERT_REQUEST),
    ("REQUEST_AGAIN", sql::REQUEST_AGAIN),
    ("USE_APPROVAL", sql::USE_APPROVAL),
    ("APPROVE", sql::APPROVE),
    ("DENY", sql::DENY),
    ("LAPSED_APPROVALS", sql::LAPSED_APPROVALS),
    ("NEXT_LAPSE", sql::NEXT_LAPSE),
    ("EXPIRE_APPROVAL", sql::EXPIRE_APPROVAL),
    ("EXTEND_RUN_OF_KEY", sql::EXTEND_RUN_OF_KEY),
    ("KEEP_PAUSED_RUNS", sql::KEEP_PAUSED_RUNS),
    ("ENTRY_KEY", sql::ENTRY_KEY),
    ("EXTEND_RUN_UNTIL", sql::EXTEND_RUN_UNTIL),
    ("RUN_KEPT_UNTIL", sql::RUN_KEPT_UNTIL),
    ("APPROVAL_EVENTS", sql::APPROVAL_EVENTS),
];

/// The partial indexes a statement may read whole: each holds only the few entries it is
/// about (unresolved, awaiting a decision, marked as a possible double effect).
const SMALL_INDEXES: &[&str] = &[
    "ledger_entries_unresolved_by_start",
    "ledger_entries_awaiting",
    "ledger_entries_awaiting_by_run",
    "ledger_entries_possible_double_effect",
];

/// Whether a line of `EXPLAIN QUERY PLAN` reads a whole tenant or table of the ledger's.
fn reads_everything(line: &str) -> bool {
    let whole_tenant = line.contains("USING PRIMARY KEY (tenant=?)")
        || line.contains("USING COVERING INDEX ledger_entries (tenant=?)");
    let scan = line.starts_with("SCAN ")
        && line.contains("ledger_")
        && !SMALL_INDEXES
            .iter()
            .any(|index| line.ends_with(&format!("INDEX {index}")));
    whole_tenant || scan
}

#[tokio::test]
async fn no_statement_of_a_call_reads_a_whole_tenant() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let store = SqliteStore::open(&url, &PoolOptions::default())
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    let (mut wrong, mut lines) = (Vec::new(), 0);
    for (name, text) in STATEMENTS {
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {text}")))
                .fetch_all(store.pool.pool())
                .await
                .unwrap_or_else(|e| panic!("EXPLAIN {name}: {e}"));
        lines += plan.len(); // a plain INSERT has none
        wrong.extend(
            plan.iter()
                .filter(|(_, _, _, line)| reads_everything(line))
                .map(|(_, _, _, line)| format!("{name}: {line}")),
        );
    }
    assert!(lines > STATEMENTS.len(), "{lines} lines of plans");
    assert!(
        wrong.is_empty(),
        "statements that read a whole tenant:\n{wrong:#?}"
    );
}

#[test]
fn a_search_of_the_tenant_alone_and_a_scan_of_a_large_index_are_caught() {
    assert!(reads_everything("SEARCH p USING PRIMARY KEY (tenant=?)"));
    assert!(reads_everything(
        "SCAN ledger_entries USING INDEX ledger_entries_by_run"
    ));
    assert!(reads_everything("SCAN ledger_history"));
    assert!(!reads_everything(
        "SEARCH ledger_entries USING PRIMARY KEY (tenant=? AND key=?)"
    ));
    assert!(!reads_everything(
        "SCAN ledger_entries USING COVERING INDEX ledger_entries_awaiting_by_run"
    ));
}
