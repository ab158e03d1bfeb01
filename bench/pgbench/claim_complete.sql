-- One Claim of a new key and one Complete of it: exactly the statements the server issues for
-- them when each is alone in its group-commit batch (src/storage/postgres.rs INSERT_MANY and
-- FINISH_MANY, as of commit b761659), each an autocommit statement, with values of the same
-- shapes. The server batches concurrent claims (and completions) into one such statement with
-- longer arrays; pgbench cannot, so this is the per-operation cost without group commit.
-- Kept in step with the server by hand: see bench/README.md.
--
-- The server binds one array per column; here each array is built around pgbench parameters
-- (`-D name=value` from compare.sh, or pgbench variables) with ARRAY[...], except that
-- pgbench has no string or clock functions and refuses empty `-D` values: the 64-hex key and
-- the 32-hex claim token are md5() expressions of the variable `k`, the clock (microseconds
-- since the epoch) is read in SQL, and empty strings, NULLs and constants are literals.
--
-- A new key per transaction: the client's id and a random 46-bit number, under the run's tag.
\set k :client_id * 100000000000000 + random(1, 99999999999999)

-- Claim: INSERT ... SELECT FROM UNNEST ... ON CONFLICT DO NOTHING (PgStore::INSERT_MANY).
INSERT INTO ledger_entries (tenant, key, run_id, tool, fingerprint, status, attempt,
    claim_token, result, error, retryable, principal, started_at, finished_at,
    lease_expires_at, retention_us, expires_at, replay_count)
SELECT * FROM UNNEST(ARRAY[:tenant]::text[],
    ARRAY[md5(:run_tag || '-' || :k) || md5(:k || '-' || :run_tag)]::text[],
    ARRAY[:run_id]::text[], ARRAY[:tool]::text[], ARRAY[:fingerprint]::text[],
    ARRAY[:attempting]::text[], ARRAY[1]::int8[],
    ARRAY[md5(:k || '-token-' || :run_tag)]::text[], ARRAY[''::bytea]::bytea[],
    ARRAY['']::text[], ARRAY[false]::bool[], ARRAY['']::text[],
    ARRAY[(extract(epoch FROM clock_timestamp()) * 1000000)::bigint]::int8[],
    ARRAY[NULL]::int8[],
    ARRAY[(extract(epoch FROM clock_timestamp()) * 1000000)::bigint + :lease_us]::int8[],
    ARRAY[:retention_us]::int8[], ARRAY[NULL]::int8[], ARRAY[0]::int8[])
ON CONFLICT (tenant, key) DO NOTHING RETURNING claim_token;

-- Complete: the guarded UPDATE ... FROM UNNEST, no prior read (PgStore::FINISH_MANY).
UPDATE ledger_entries AS e SET status = v.status, result = v.result, error = v.error,
    retryable = v.retryable,
    finished_at = CASE WHEN v.status IN ('SUCCEEDED', 'FAILED') THEN v.now END,
    expires_at = CASE WHEN v.status IN ('SUCCEEDED', 'FAILED')
    THEN v.now + e.retention_us END, reconcile_until = NULL
FROM UNNEST(ARRAY[:tenant]::text[],
    ARRAY[md5(:run_tag || '-' || :k) || md5(:k || '-' || :run_tag)]::text[],
    ARRAY[md5(:k || '-token-' || :run_tag)]::text[], ARRAY[:succeeded]::text[],
    ARRAY[:result::bytea]::bytea[], ARRAY['']::text[], ARRAY[false]::bool[],
    ARRAY[(extract(epoch FROM clock_timestamp()) * 1000000)::bigint]::int8[],
    ARRAY[false]::bool[])
    AS v(tenant, key, claim_token, status, result, error, retryable, now, also_unknown)
WHERE e.tenant = v.tenant AND e.key = v.key AND e.claim_token = v.claim_token
    AND (e.status = 'ATTEMPTING' OR (e.status = 'UNKNOWN' AND v.also_unknown))
RETURNING e.key, e.run_id, e.tool, e.fingerprint, e.status, e.attempt, e.claim_token,
    e.result, e.error, e.retryable, e.principal, e.started_at, e.finished_at,
    e.lease_expires_at, e.retention_us, e.expires_at, e.replay_count, e.has_waiters;
