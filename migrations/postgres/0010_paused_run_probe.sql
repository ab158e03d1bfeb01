-- The probe of a paused run. Every statement that finishes an entry asks whether another call
-- of the entry's run awaits a decision (its run then keeps it: the stores' `kept!`), and a
-- request or a decision reads and extends its run's entries. Those calls are few at any time,
-- but a run can hold thousands of finished calls (a long agent run), and the run index would
-- read every one of them on every finish. This partial index holds only the awaiting calls, by
-- their run, so the probe reads the calls it is about and nothing else.
CREATE INDEX ledger_entries_awaiting_by_run ON ledger_entries (tenant, run_id)
    WHERE status = 'AWAITING_APPROVAL';
