-- One Claim of a key that is already SUCCEEDED, which the server answers REPLAYED: exactly the
-- statements it issues for that (as of commit b761659): the claim's INSERT, which conflicts and
-- does nothing (PgStore::INSERT_MANY, alone in its batch), then the one-statement replay, an
-- UPDATE of the replay count checked by status, fingerprint and expiry that returns the entry
-- (sql::REPLAY). Each an autocommit statement; kept in step with the server by hand (see
-- bench/README.md); the value conventions are those of claim_complete.sql.
--
-- The hot set (compare.sh creates it beforehand with bench/pgbench/hot_set.sql): entry h, for
-- h in 1..:hot_keys, has the key md5(run_tag-hot-h)||md5(h-hot-run_tag).
\set h random(1, :hot_keys)
\set k :client_id * 100000000000000 + random(1, 99999999999999)

-- Claim: the INSERT of a fresh attempt, which meets the existing key (PgStore::INSERT_MANY).
INSERT INTO ledger_entries (tenant, key, run_id, tool, fingerprint, status, attempt,
    claim_token, result, error, retryable, principal, started_at, finished_at,
    lease_expires_at, retention_us, expires_at, replay_count)
SELECT * FROM UNNEST(ARRAY[:tenant]::text[],
    ARRAY[md5(:run_tag || '-hot-' || :h) || md5(:h || '-hot-' || :run_tag)]::text[],
    ARRAY[:run_id]::text[], ARRAY[:tool]::text[], ARRAY[:fingerprint]::text[],
    ARRAY[:attempting]::text[], ARRAY[1]::int8[],
    ARRAY[md5(:k || '-token-' || :run_tag)]::text[], ARRAY[''::bytea]::bytea[],
    ARRAY['']::text[], ARRAY[false]::bool[], ARRAY['']::text[],
    ARRAY[(extract(epoch FROM clock_timestamp()) * 1000000)::bigint]::int8[],
    ARRAY[NULL]::int8[],
    ARRAY[(extract(epoch FROM clock_timestamp()) * 1000000)::bigint + :lease_us]::int8[],
    ARRAY[:retention_us]::int8[], ARRAY[NULL]::int8[], ARRAY[0]::int8[])
ON CONFLICT (tenant, key) DO NOTHING RETURNING claim_token;

-- Claim, step 2: count the replay and return the entry (sql::REPLAY).
UPDATE ledger_entries SET replay_count = replay_count + 1
WHERE tenant = :tenant AND key = md5(:run_tag || '-hot-' || :h) || md5(:h || '-hot-' || :run_tag)
    AND status = 'SUCCEEDED' AND fingerprint = :fingerprint
    AND expires_at > (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
RETURNING key, run_id, tool, fingerprint, status, attempt, claim_token, result, error,
    retryable, principal, started_at, finished_at, lease_expires_at, retention_us, expires_at,
    replay_count;
