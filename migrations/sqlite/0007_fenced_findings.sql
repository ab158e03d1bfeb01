-- Fenced findings: the same shape as migrations/postgres/0007, whose comments say why.
ALTER TABLE ledger_entries ADD COLUMN hold_token TEXT NOT NULL DEFAULT '';

ALTER TABLE ledger_entries ADD COLUMN possible_double_effect BOOLEAN NOT NULL DEFAULT FALSE;

CREATE INDEX ledger_entries_possible_double_effect ON ledger_entries (tenant, started_at)
    WHERE possible_double_effect;

CREATE TABLE ledger_history (
    id        INTEGER PRIMARY KEY,
    tenant    TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    at        INTEGER NOT NULL,
    attempt   INTEGER NOT NULL,
    kind      TEXT    NOT NULL,
    principal TEXT    NOT NULL DEFAULT '',
    detail    TEXT    NOT NULL DEFAULT ''
);

CREATE INDEX ledger_history_by_entry ON ledger_history (tenant, key, id);

-- SQLite enforces foreign keys only where each connection turns them on: a trigger deletes an
-- entry's history with it instead, whatever deletes the entry (the pruner).
CREATE TRIGGER ledger_history_goes_with_its_entry AFTER DELETE ON ledger_entries
BEGIN
    DELETE FROM ledger_history WHERE tenant = old.tenant AND key = old.key;
END;
