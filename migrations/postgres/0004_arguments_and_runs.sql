-- The audit trail (ListEntries).
--
-- The arguments of the current attempt as kept for audit: canonical JSON text, with members
-- named like secrets replaced under the default policy (--store-arguments redacted), or NULL
-- when the server keeps none (--store-arguments none) and for entries claimed before this
-- migration. Keys and fingerprints never depend on this column.
ALTER TABLE ledger_entries ADD COLUMN arguments TEXT;

-- A run's trace in order, page by page: ListEntries by run reads this index in start order
-- and continues after the page cursor (entries that started in the same microsecond are put
-- in key order by an incremental sort). The run leads, not the tenant: on a new, empty table
-- every index costs the planner the same, and a Lookup's generic plan, cached for the
-- connection, could take an index led by the tenant and keep it as the table grows; an index
-- led by the run cannot serve a lookup by tenant and key. (tests/api/plans.rs checks the plans
-- on an empty table.) Listings without a run read the tenant's entries and sort them; they
-- are an operator's occasional question, while every claim pays for each index, so no second
-- index serves them.
CREATE INDEX ledger_entries_by_run ON ledger_entries (run_id, tenant, started_at);
