-- The audit trail (ListEntries).
--
-- The arguments of the current attempt as kept for audit: canonical JSON text, with members
-- named like secrets replaced under the default policy (--store-arguments redacted), or NULL
-- when the server keeps none (--store-arguments none) and for entries claimed before this
-- migration. Keys and fingerprints never depend on this column.
ALTER TABLE ledger_entries ADD COLUMN arguments TEXT;

-- A run's trace in order, page by page: ListEntries by run reads this index in the order it
-- returns entries (started_at, then key) and continues after the page cursor. Listings
-- without a run read the tenant's entries and sort them; they are an operator's occasional
-- question, while every claim pays for each index, so no second index serves them.
CREATE INDEX ledger_entries_by_run ON ledger_entries (tenant, run_id, started_at, key);
