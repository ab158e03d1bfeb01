-- The replay ratio computed from the store: the same figure as the ledger_replay_ratio gauge,
-- for entries started in the last 15 minutes (the default --replay-alarm-window). Run it with
-- psql or sqlite3 against the ledger's database; tests/api/metrics.rs runs both queries after
-- a scripted mix and compares them with the gauge.
--
-- Every entry stands for one claim that got CLAIMED, and replay_count for the claims that got
-- the stored result back, so the ratio is replays / (entries + replays). It agrees with the
-- gauge for claims and replays; the gauge also counts IN_PROGRESS and PREVIOUSLY_FAILED
-- answers, which the store does not record, and is per server, while this covers every
-- server sharing the database. started_at is the current attempt's start (a retry after a
-- retryable failure starts anew), and replays of an entry started before the window count
-- only in the gauge. Add `AND tenant = '…'` or `GROUP BY tool` to break it down. Replays a
-- server answered from its memory reach replay_count within about a second
-- (--replay-memory-bytes), so the figure may lag the gauge by that long.

-- [postgres]
SELECT count(*)::bigint AS entries,
       coalesce(sum(replay_count), 0)::bigint AS replays,
       coalesce(coalesce(sum(replay_count), 0)::float8
                / nullif(count(*) + coalesce(sum(replay_count), 0), 0), 0) AS replay_ratio
FROM ledger_entries
WHERE started_at >= (extract(epoch FROM now() - interval '15 minutes') * 1000000)::bigint;

-- [sqlite]
SELECT count(*) AS entries,
       coalesce(sum(replay_count), 0) AS replays,
       coalesce(coalesce(sum(replay_count), 0) * 1.0
                / nullif(count(*) + coalesce(sum(replay_count), 0), 0), 0.0) AS replay_ratio
FROM ledger_entries
WHERE started_at >= (CAST(strftime('%s', 'now') AS INTEGER) - 15 * 60) * 1000000;
