-- The probe of a paused run: the index of migrations/postgres/0010, whose comments say why,
-- here with the columns the probe reads, so that SQLite reads it alone (a covering index).
CREATE INDEX ledger_entries_awaiting_by_run ON ledger_entries
    (tenant, run_id, status, approval_execute_by, approval_decide_by)
    WHERE status = 'AWAITING_APPROVAL';

-- What SQLite's query planner may assume of the ledger's tables. With no statistics it takes
-- the leading column of any index for a selective one, so a statement that names the tenant
-- and a run read the whole tenant through the primary key (a tenant is most of the table),
-- and every finish grew slower with every entry the ledger held. These figures (the form
-- ANALYZE writes: the rows of the index, then how many rows share each prefix of its columns)
-- describe a ledger in use: many entries per tenant, a few per key, tens per run, few
-- unresolved or awaiting calls. They are written only where no statistics exist for the
-- tables yet (an operator's own ANALYZE, on the ledger's real rows, is kept), and read by
-- every connection opened from now on and, once the schema changed, by those already open.
ANALYZE sqlite_schema;

INSERT INTO sqlite_stat1 (tbl, idx, stat)
SELECT tbl, idx, stat FROM (
    SELECT 'ledger_entries' AS tbl, 'ledger_entries' AS idx, '1000000 100000 1' AS stat
    UNION ALL SELECT 'ledger_entries', 'ledger_entries_by_run', '1000000 20 20 1'
    UNION ALL SELECT 'ledger_entries', 'ledger_entries_expiry', '1000000 1'
    UNION ALL SELECT 'ledger_entries', 'ledger_entries_unresolved_by_start', '1000 100 1'
    UNION ALL SELECT 'ledger_entries', 'ledger_entries_awaiting', '100 10 1'
    UNION ALL SELECT 'ledger_entries', 'ledger_entries_awaiting_by_run', '100 10 1 1 1 1'
    UNION ALL SELECT 'ledger_entries', 'ledger_entries_possible_double_effect', '10 1 1'
    UNION ALL SELECT 'ledger_history', 'ledger_history_by_entry', '4000000 400000 4 1'
    UNION ALL SELECT 'ledger_history', 'ledger_history_by_tenant', '4000000 400000 1'
    UNION ALL SELECT 'ledger_intent_windows', 'ledger_intent_windows', '100000 10000 1'
)
WHERE NOT EXISTS (
    SELECT 1 FROM sqlite_stat1
    WHERE tbl IN ('ledger_entries', 'ledger_history', 'ledger_intent_windows')
);

ANALYZE sqlite_schema;
