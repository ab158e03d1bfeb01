-- Fenced findings: a reconciler's finding is about one attempt, gathered while it held the
-- entry, and settles that attempt only.
--
-- The token of the entry's newest Reconcile hand-out: a fresh random value minted at every
-- hand-out, so that a finding sent with an older hold (its holder stalled, the entry handed
-- out again since) is recognised as stale. Empty until the entry is first handed out. A
-- resolution applies only while the entry is still at the attempt it observed and this is
-- still the token it was given. A constant default, so adding the column rewrites no row.
ALTER TABLE ledger_entries ADD COLUMN hold_token TEXT NOT NULL DEFAULT '';

-- Set when a finding said that an earlier attempt's effect exists while a later attempt was
-- started (or after the attempt had been recorded as not done): the intent may have acted
-- twice. Cleared only by a person's acknowledgement.
ALTER TABLE ledger_entries ADD COLUMN possible_double_effect BOOLEAN NOT NULL DEFAULT FALSE;

-- The marked entries, for the gauge and the console's first section: almost always empty, so
-- the partial index costs nothing on the claim path.
CREATE INDEX ledger_entries_possible_double_effect ON ledger_entries (tenant, started_at)
    WHERE possible_double_effect;

-- What happened to an entry besides its own columns, append-only: every finding (applied or
-- stale, with the attempt it observed and who sent it), the marks and acknowledgements of a
-- possible double effect. Deleted with its entry (the foreign key's cascade), so retention
-- holds for it too. Written only off the claim path.
CREATE TABLE ledger_history (
    id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant    TEXT   NOT NULL,
    key       TEXT   NOT NULL,
    -- Microseconds since the epoch, on the server's clock, as every time of the ledger.
    at        BIGINT NOT NULL,
    -- The attempt the event concerns (a finding: the attempt it observed).
    attempt   BIGINT NOT NULL,
    kind      TEXT   NOT NULL,
    principal TEXT   NOT NULL DEFAULT '',
    detail    TEXT   NOT NULL DEFAULT '',
    CONSTRAINT ledger_history_entry FOREIGN KEY (tenant, key)
        REFERENCES ledger_entries (tenant, key) ON DELETE CASCADE
);

-- An entry's history in order; also what the cascade finds the rows of a deleted entry by.
CREATE INDEX ledger_history_by_entry ON ledger_history (tenant, key, id);
