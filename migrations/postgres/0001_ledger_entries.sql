-- One row per (tenant, key): the ledger's whole state.
--
-- Times are microseconds since the Unix epoch (BIGINT) rather than timestamptz, so that the
-- PostgreSQL and SQLite stores compare instants identically and the server's clock, passed as
-- a parameter, is the only clock (tests move it by hand to expire leases and retention).
CREATE TABLE ledger_entries (
    -- From the credential, never from the request body.
    tenant           TEXT     NOT NULL,
    -- hex(sha256(...)) for derived keys, or the caller's explicit key (printable ASCII).
    key              TEXT     NOT NULL,
    run_id           TEXT     NOT NULL,
    tool             TEXT     NOT NULL,
    fingerprint      TEXT     NOT NULL,
    -- Stored names rather than numbers so that an operator with psql reads them as-is.
    status           TEXT     NOT NULL
        CHECK (status IN ('ATTEMPTING', 'SUCCEEDED', 'FAILED', 'UNKNOWN')),
    attempt          BIGINT   NOT NULL CHECK (attempt >= 1),
    claim_token      TEXT     NOT NULL,
    -- Results are opaque bytes: jsonb cannot hold \u0000 and text cannot hold NUL.
    result           BYTEA    NOT NULL DEFAULT '\x',
    error            TEXT     NOT NULL DEFAULT '',
    retryable        BOOLEAN  NOT NULL DEFAULT FALSE,
    principal        TEXT     NOT NULL DEFAULT '',
    started_at       BIGINT   NOT NULL,
    finished_at      BIGINT,
    lease_expires_at BIGINT   NOT NULL,
    retention_us     BIGINT   NOT NULL CHECK (retention_us > 0),
    -- NULL while unresolved: ATTEMPTING and UNKNOWN entries never expire.
    expires_at       BIGINT,
    replay_count     BIGINT   NOT NULL DEFAULT 0,
    -- The claim's atomicity rests on this constraint: INSERT ... ON CONFLICT DO NOTHING.
    CONSTRAINT ledger_entries_pkey PRIMARY KEY (tenant, key),
    CONSTRAINT resolved_entries_expire CHECK (
        (status IN ('SUCCEEDED', 'FAILED')) = (expires_at IS NOT NULL)
    )
);

-- Pruning walks finished entries by expiry; unresolved rows have no expiry and stay out of it.
CREATE INDEX ledger_entries_expiry ON ledger_entries (expires_at)
    WHERE expires_at IS NOT NULL;

-- Reconciliation lists unresolved entries oldest first; the partial index stays small because
-- almost every entry is resolved.
CREATE INDEX ledger_entries_unresolved ON ledger_entries (tenant, started_at)
    WHERE status IN ('ATTEMPTING', 'UNKNOWN');
