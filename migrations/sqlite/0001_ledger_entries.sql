-- One row per (tenant, key): the ledger's whole state. Same shape as the PostgreSQL schema;
-- see migrations/postgres for the reasoning behind each column.
--
-- Times are microseconds since the Unix epoch (INTEGER), the server's clock being the only one.
CREATE TABLE ledger_entries (
    tenant           TEXT     NOT NULL,
    key              TEXT     NOT NULL,
    run_id           TEXT     NOT NULL,
    tool             TEXT     NOT NULL,
    fingerprint      TEXT     NOT NULL,
    status           TEXT     NOT NULL
        CHECK (status IN ('ATTEMPTING', 'SUCCEEDED', 'FAILED', 'UNKNOWN')),
    attempt          INTEGER  NOT NULL CHECK (attempt >= 1),
    claim_token      TEXT     NOT NULL,
    -- BLOB keeps NUL bytes and any encoding intact.
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
    PRIMARY KEY (tenant, key),
    CHECK ((status IN ('SUCCEEDED', 'FAILED')) = (expires_at IS NOT NULL))
) WITHOUT ROWID;

CREATE INDEX ledger_entries_expiry ON ledger_entries (expires_at)
    WHERE expires_at IS NOT NULL;

CREATE INDEX ledger_entries_unresolved ON ledger_entries (tenant, started_at)
    WHERE status IN ('ATTEMPTING', 'UNKNOWN');
