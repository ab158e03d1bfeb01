-- Approvals: the same as migrations/postgres/0008, whose comments say why. SQLite cannot alter
-- a CHECK constraint, so the table is built again with the new ones (its rows copied as they
-- are), and its indexes and the history's trigger with it.
DROP TRIGGER ledger_history_goes_with_its_entry;

CREATE TABLE ledger_entries_0008 (
    tenant           TEXT     NOT NULL,
    key              TEXT     NOT NULL,
    run_id           TEXT     NOT NULL,
    tool             TEXT     NOT NULL,
    fingerprint      TEXT     NOT NULL,
    status           TEXT     NOT NULL
        CHECK (status IN ('ATTEMPTING', 'SUCCEEDED', 'FAILED', 'UNKNOWN', 'AWAITING_APPROVAL',
                          'DENIED')),
    attempt          INTEGER  NOT NULL CHECK (attempt >= 1),
    claim_token      TEXT     NOT NULL,
    result           BLOB     NOT NULL DEFAULT x'',
    error            TEXT     NOT NULL DEFAULT '',
    retryable        BOOLEAN  NOT NULL DEFAULT FALSE,
    principal        TEXT     NOT NULL DEFAULT '',
    started_at       INTEGER  NOT NULL,
    finished_at      INTEGER,
    lease_expires_at INTEGER  NOT NULL,
    retention_us     INTEGER  NOT NULL CHECK (retention_us > 0),
    expires_at       INTEGER,
    replay_count     INTEGER  NOT NULL DEFAULT 0,
    reconcile_until  INTEGER,
    has_waiters      BOOLEAN  NOT NULL DEFAULT FALSE,
    arguments        TEXT,
    resolved_by      TEXT     NOT NULL DEFAULT '',
    hold_token       TEXT     NOT NULL DEFAULT '',
    possible_double_effect BOOLEAN NOT NULL DEFAULT FALSE,
    approval_state   TEXT     NOT NULL DEFAULT ''
        CHECK (approval_state IN ('', 'REQUESTED', 'APPROVED', 'DENIED', 'EXPIRED', 'USED')),
    approval_requested_at INTEGER,
    approval_decide_by    INTEGER,
    approval_decided_at   INTEGER,
    approval_decided_by   TEXT    NOT NULL DEFAULT '',
    approval_reason       TEXT    NOT NULL DEFAULT '',
    approval_execute_by   INTEGER,
    PRIMARY KEY (tenant, key),
    CHECK ((status IN ('SUCCEEDED', 'FAILED', 'DENIED')) = (expires_at IS NOT NULL))
) WITHOUT ROWID;

INSERT INTO ledger_entries_0008 (tenant, key, run_id, tool, fingerprint, status, attempt,
    claim_token, result, error, retryable, principal, started_at, finished_at,
    lease_expires_at, retention_us, expires_at, replay_count, reconcile_until, has_waiters,
    arguments, resolved_by, hold_token, possible_double_effect)
SELECT tenant, key, run_id, tool, fingerprint, status, attempt, claim_token, result, error,
    retryable, principal, started_at, finished_at, lease_expires_at, retention_us, expires_at,
    replay_count, reconcile_until, has_waiters, arguments, resolved_by, hold_token,
    possible_double_effect
FROM ledger_entries;

DROP TABLE ledger_entries;
ALTER TABLE ledger_entries_0008 RENAME TO ledger_entries;

CREATE INDEX ledger_entries_expiry ON ledger_entries (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE INDEX ledger_entries_unresolved_by_start ON ledger_entries (tenant, started_at)
    WHERE expires_at IS NULL;
CREATE INDEX ledger_entries_by_run ON ledger_entries (run_id, tenant, started_at);
CREATE INDEX ledger_entries_possible_double_effect ON ledger_entries (tenant, started_at)
    WHERE possible_double_effect;
CREATE INDEX ledger_entries_awaiting ON ledger_entries (tenant, started_at)
    WHERE status = 'AWAITING_APPROVAL';

CREATE TRIGGER ledger_history_goes_with_its_entry AFTER DELETE ON ledger_entries
BEGIN
    DELETE FROM ledger_history WHERE tenant = old.tenant AND key = old.key;
END;

CREATE INDEX ledger_history_by_tenant ON ledger_history (tenant, id);
