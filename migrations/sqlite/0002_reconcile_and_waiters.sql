-- Reconciliation holds; see migrations/postgres for the reasoning. SQLite serves one process,
-- so has_waiters is kept only to share the statements with PostgreSQL.
ALTER TABLE ledger_entries ADD COLUMN reconcile_until INTEGER;
ALTER TABLE ledger_entries ADD COLUMN has_waiters BOOLEAN NOT NULL DEFAULT FALSE;
