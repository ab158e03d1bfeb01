-- Reconciliation and cross-server wake-ups.

-- Until when a reconciler holds an unresolved entry it was handed, so that concurrent
-- reconcilers (on one server or several) never get the same entry while the hold lasts.
-- NULL when nobody holds it.
ALTER TABLE ledger_entries ADD COLUMN reconcile_until BIGINT;

-- Set by a Claim that waits for this entry's attempt, so that whoever resolves it sends a
-- NOTIFY only when somebody listens: completions nobody waits for cost no notification.
ALTER TABLE ledger_entries ADD COLUMN has_waiters BOOLEAN NOT NULL DEFAULT FALSE;
