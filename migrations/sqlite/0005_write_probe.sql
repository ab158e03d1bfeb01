-- The write probe of the health check. After a write failed for want of disk space, health
-- reports NOT_SERVING until a write of a typical size commits again: the probe upserts one
-- row of 64 KiB of random bytes here (so it needs as many new pages as a claim with a large
-- result, and compresses to nothing smaller) and deletes it, each in its own commit. Nothing
-- else reads or writes this table; it is empty except while a probe runs.
CREATE TABLE ledger_write_probe (
    id INTEGER PRIMARY KEY,
    filler BLOB NOT NULL
);
