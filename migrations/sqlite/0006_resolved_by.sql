-- Who settled an outcome nobody knew: the principal a Reconcile names (a reconciler's name, or
-- the console's signed-in operator), written by the statement that resolves the entry. Empty
-- when the claimant's own Complete resolved it, while the entry is unresolved, and for entries
-- resolved before this migration. A new attempt (a retry after a retryable failure) starts
-- with it empty again. A constant default, so adding the column rewrites no row.
ALTER TABLE ledger_entries ADD COLUMN resolved_by TEXT NOT NULL DEFAULT '';
