-- Approvals: a call that must wait for a person's decision, held with the decision, bound to
-- the exact arguments (the fingerprint), used once.
--
-- Two statuses more: AWAITING_APPROVAL (nothing was done; a person has been asked; like an
-- unresolved entry it has no expiry) and DENIED (terminal and finished: it expires after its
-- retention, as SUCCEEDED and FAILED do). NOT VALID, then VALIDATE: the new checks are added
-- without an exclusive lock for the time of a scan of the table.
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_status_check;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_status_check CHECK (
    status IN ('ATTEMPTING', 'SUCCEEDED', 'FAILED', 'UNKNOWN', 'AWAITING_APPROVAL', 'DENIED')
) NOT VALID;
ALTER TABLE ledger_entries VALIDATE CONSTRAINT ledger_entries_status_check;
ALTER TABLE ledger_entries DROP CONSTRAINT resolved_entries_expire;
ALTER TABLE ledger_entries ADD CONSTRAINT resolved_entries_expire CHECK (
    (status IN ('SUCCEEDED', 'FAILED', 'DENIED')) = (expires_at IS NOT NULL)
) NOT VALID;
ALTER TABLE ledger_entries VALIDATE CONSTRAINT resolved_entries_expire;

-- The approval of the entry's intent: '' when none was needed, else REQUESTED, APPROVED,
-- DENIED, EXPIRED or USED. Its times are microseconds since the epoch, as every time of the
-- ledger; decide_by and execute_by are judged at claim time on the ledger's clock (aligned to
-- the database's), not only by the sweeper that records expiries. decided_by is the approver
-- credential's principal, never the request body's. Constant defaults: adding them rewrites
-- no row.
ALTER TABLE ledger_entries ADD COLUMN approval_state TEXT NOT NULL DEFAULT ''
    CHECK (approval_state IN ('', 'REQUESTED', 'APPROVED', 'DENIED', 'EXPIRED', 'USED'));
ALTER TABLE ledger_entries ADD COLUMN approval_requested_at BIGINT;
ALTER TABLE ledger_entries ADD COLUMN approval_decide_by BIGINT;
ALTER TABLE ledger_entries ADD COLUMN approval_decided_at BIGINT;
ALTER TABLE ledger_entries ADD COLUMN approval_decided_by TEXT NOT NULL DEFAULT '';
ALTER TABLE ledger_entries ADD COLUMN approval_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE ledger_entries ADD COLUMN approval_execute_by BIGINT;

-- The calls awaiting a decision, oldest first per tenant (the console's page, the gauge, the
-- sweeper that records expired requests): few at any time, so the partial index is small and
-- costs the claim path nothing.
CREATE INDEX ledger_entries_awaiting ON ledger_entries (tenant, started_at)
    WHERE status = 'AWAITING_APPROVAL';

-- A tenant's events in order: WatchApprovals reads the history from a cursor (its id).
CREATE INDEX ledger_history_by_tenant ON ledger_history (tenant, id);
