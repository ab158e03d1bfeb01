-- The MCP gateway's windows of intent: the same table as migrations/postgres/0009, whose
-- comments say why.
CREATE TABLE ledger_intent_windows (
    tenant      TEXT    NOT NULL,
    fingerprint TEXT    NOT NULL,
    generation  INTEGER NOT NULL CHECK (generation >= 1),
    last_seen   INTEGER NOT NULL,
    PRIMARY KEY (tenant, fingerprint)
) WITHOUT ROWID;

-- History ids are never taken again. WatchApprovals' cursor is an id: a rowid alias without
-- AUTOINCREMENT takes the largest id left plus one, so once the pruner deleted the newest rows
-- (a quiet tenant's whole history), a new event could take an id a watcher had already passed,
-- and it would never see it. AUTOINCREMENT never hands out an id used before (PostgreSQL's
-- identity never does either). SQLite cannot alter a column's definition: the table is built
-- again with its rows (their ids kept, so that cursors given out stay valid), its indexes and
-- the trigger that deletes an entry's history with it.
DROP TRIGGER ledger_history_goes_with_its_entry;

CREATE TABLE ledger_history_0009 (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant    TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    at        INTEGER NOT NULL,
    attempt   INTEGER NOT NULL,
    kind      TEXT    NOT NULL,
    principal TEXT    NOT NULL DEFAULT '',
    detail    TEXT    NOT NULL DEFAULT ''
);

INSERT INTO ledger_history_0009 (id, tenant, key, at, attempt, kind, principal, detail)
SELECT id, tenant, key, at, attempt, kind, principal, detail FROM ledger_history;

DROP TABLE ledger_history;
ALTER TABLE ledger_history_0009 RENAME TO ledger_history;

CREATE INDEX ledger_history_by_entry ON ledger_history (tenant, key, id);
CREATE INDEX ledger_history_by_tenant ON ledger_history (tenant, id);

CREATE TRIGGER ledger_history_goes_with_its_entry AFTER DELETE ON ledger_entries
BEGIN
    DELETE FROM ledger_history WHERE tenant = old.tenant AND key = old.key;
END;
