-- One Claim of a new key and one Complete of it: exactly the statements the server issues for
-- them when each is alone in its group-commit batch (src/storage/sql.rs INSERT and FINISH: a
-- lone request takes the one-row statement), each an autocommit statement, with values of the
-- same shapes. The server writes concurrent claims (and completions) as one multi-row
-- statement instead (PgStore::INSERT_MANY / FINISH_MANY); pgbench cannot, so this is the
-- per-operation cost without group commit. Kept in step with the server by hand: see
-- bench/README.md.
--
-- The server binds its parameters; here they are pgbench parameters (`-D name=value` from
-- compare.sh, or pgbench variables), except that pgbench has no string or clock functions and
-- refuses empty `-D` values: the 64-hex key and the 32-hex claim token are md5() expressions
-- of the variable `k`, the clock (microseconds since the epoch) is read in SQL, and empty
-- strings, NULLs and constants are literals.
--
-- A new key per transaction: the client's id and a random 46-bit number, under the run's tag.
\set k :client_id * 100000000000000 + random(1, 99999999999999)

-- Claim: INSERT ... VALUES ... ON CONFLICT DO NOTHING (sql::INSERT); the rows affected say
-- whether this claim won.
INSERT INTO ledger_entries (tenant, key, run_id, tool, fingerprint, status, attempt,
    claim_token, result, error, retryable, principal, started_at, finished_at,
    lease_expires_at, retention_us, expires_at, replay_count, arguments)
VALUES (:tenant, md5(:run_tag || '-' || :k) || md5(:k || '-' || :run_tag), :run_id, :tool,
    :fingerprint, :attempting, 1, md5(:k || '-token-' || :run_tag), ''::bytea, '', false, '',
    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, NULL,
    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + :lease_us, :retention_us,
    NULL, 0, :arguments)
ON CONFLICT (tenant, key) DO NOTHING;

-- Complete: the guarded UPDATE, no prior read (sql::FINISH).
UPDATE ledger_entries SET status = :succeeded, result = :result::bytea, error = '',
    retryable = false,
    finished_at = CASE WHEN :succeeded IN ('SUCCEEDED', 'FAILED')
    THEN (extract(epoch FROM clock_timestamp()) * 1000000)::bigint END,
    expires_at = CASE WHEN :succeeded IN ('SUCCEEDED', 'FAILED')
    THEN (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + retention_us END,
    reconcile_until = NULL
WHERE tenant = :tenant AND key = md5(:run_tag || '-' || :k) || md5(:k || '-' || :run_tag)
    AND claim_token = md5(:k || '-token-' || :run_tag)
    AND (status = 'ATTEMPTING' OR (status = 'UNKNOWN' AND :also_unknown::bool))
RETURNING key, run_id, tool, fingerprint, status, attempt, claim_token, result, error,
    retryable, principal, started_at, finished_at, lease_expires_at, retention_us, expires_at,
    replay_count, has_waiters;
