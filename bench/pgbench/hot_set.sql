-- The hot set replay.sql claims: :hot_keys SUCCEEDED entries that expire in the future, keyed
-- as replay.sql derives the keys. compare.sh runs it with psql -v tenant=... -v run_tag=...
-- -v hot_keys=... -v tool=... -v fingerprint=... -v result=... -v retention_us=...
INSERT INTO ledger_entries (tenant, key, run_id, tool, fingerprint, status, attempt,
    claim_token, result, error, retryable, principal, started_at, finished_at,
    lease_expires_at, retention_us, expires_at, replay_count)
SELECT :'tenant', md5(:'run_tag' || '-hot-' || h) || md5(h || '-hot-' || :'run_tag'),
    'bench-hot-' || h, :'tool', :'fingerprint', 'SUCCEEDED', 1,
    md5(h || '-hot-token-' || :'run_tag'), convert_to(:'result', 'UTF8'), '', false, '',
    now_us, now_us, now_us + 60000000, :retention_us, now_us + :retention_us, 0
FROM generate_series(1, :hot_keys) AS h,
    LATERAL (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us) AS t
ON CONFLICT (tenant, key) DO NOTHING;
