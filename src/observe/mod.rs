//! What the server tells about itself. For now its logs ([`telemetry`]): the subscriber, one
//! `call` span and one access line per ledger RPC.

pub mod telemetry;
