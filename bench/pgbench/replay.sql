-- One Claim of a key that is already SUCCEEDED, which the server answers REPLAYED: exactly the
-- statement it issues for that once it has seen the key finish (a server remembers recently
-- finished keys, so a claim of one tries the replay first): the one-statement replay, an UPDATE
-- of the replay count checked by status, fingerprint and expiry that returns the entry, with
-- synchronous_commit off for its own transaction so that its commit does not wait for the WAL
-- flush (PgStore::REPLAY), autocommit. A server that has not seen the key first runs the
-- claim's INSERT, which conflicts; during a measured run every hot key has been seen. Kept in
-- step with the server by hand (see bench/README.md); the value conventions are those of
-- claim_complete.sql.
--
-- The hot set (compare.sh creates it beforehand with bench/pgbench/hot_set.sql): entry h, for
-- h in 1..:hot_keys, has the key md5(run_tag-hot-h)||md5(h-hot-run_tag).
\set h random(1, :hot_keys)

-- Count the replay and return the entry, committing without the flush (PgStore::REPLAY).
WITH no_flush_wait AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE ledger_entries SET replay_count = replay_count + 1 FROM no_flush_wait
WHERE tenant = :tenant AND key = md5(:run_tag || '-hot-' || :h) || md5(:h || '-hot-' || :run_tag)
    AND status = 'SUCCEEDED' AND fingerprint = :fingerprint
    AND expires_at > (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
RETURNING key, run_id, tool, fingerprint, status, attempt, claim_token, result, error,
    retryable, principal, started_at, finished_at, lease_expires_at, retention_us, expires_at,
    replay_count;
