-- The unresolved-entries index, keyed by what only the reconcile pick says.
--
-- The old index's predicate, status IN ('ATTEMPTING', 'UNKNOWN'), was implied by every
-- statement that writes one entry (a Complete's `status = 'ATTEMPTING' OR …`, a Reconcile
-- answer, a waiter's mark), so PostgreSQL's generic plans for them chose it with only `tenant`
-- as the index condition and filtered every unresolved entry of the tenant, and every dead
-- index entry a completion left behind, instead of taking the primary key: a Complete cost
-- 0.75 ms of database time under load rather than 0.1 ms, and would grow with the backlog.
--
-- An entry is unresolved exactly when it has no expiry (the table's CHECK constraint
-- resolved_entries_expire), and only the reconcile pick says `expires_at IS NULL`.
DROP INDEX ledger_entries_unresolved;

CREATE INDEX ledger_entries_unresolved_by_start ON ledger_entries (tenant, started_at)
    WHERE expires_at IS NULL;
