-- The MCP gateway's windows of intent (`idempotency-ledger mcp`): a call that names no run is
-- the same intent as an identical call (same tenant and fingerprint, that is the same tool and
-- canonical arguments) made less than the gateway's window before it, and a new intent after.
-- `generation` numbers the intents of one call: the gateway derives the call's key from it, so
-- concurrent first calls on any number of gateways get one key (the upsert on the primary key
-- serializes them) and the first call after a quiet window gets the next. `last_seen` is when
-- the last identical call came, in microseconds since the epoch, as every time of the ledger.
-- One small row per distinct call; written only by the gateway, never on the claim path of the
-- gRPC API.
CREATE TABLE ledger_intent_windows (
    tenant      TEXT   NOT NULL,
    fingerprint TEXT   NOT NULL,
    generation  BIGINT NOT NULL CHECK (generation >= 1),
    last_seen   BIGINT NOT NULL,
    PRIMARY KEY (tenant, fingerprint)
);
