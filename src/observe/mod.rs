//! What the server tells about itself: the Prometheus metrics, the replay-rate alarm, the
//! optional `/metrics` endpoint, the logs (one span and one access line per call), and the
//! traces exported over OTLP when an endpoint is configured.
//!
//! - [`metrics`]: the families, on `prometheus-client`, in a registry that belongs to one
//!   [`Metrics`] (tests run many servers in one process, so there is no global registry), and
//!   the recording API; the refresh loop of the gauges read from the store.
//! - [`replay_rate`]: the replay-rate sliding window, its gauges and its once-per-window warning;
//!   and the per-tenant, per-tool history of the last hour that the operator's console draws
//!   and the `ReplayRate` RPC answers.
//! - [`http`]: `GET /metrics` in the Prometheus text format (0.0.4), served by hyper.
//! - [`grpc_metrics`]: the tower layer that counts the conventional gRPC families.
//! - [`telemetry`]: the log subscriber, the `call` span and the access line, the caller's W3C
//!   trace context, and the exported span of each call.
//! - [`traces`]: the OTLP export (`OTEL_*` settings, the exporter, its batches and its flush)
//!   and the exported spans' names and attributes.
//!
//! # Who counts what
//!
//! Each thing is recorded in one place, so that no call is counted twice in a family:
//!
//! - **What the caller got** (`grpc_server_started_total`, `grpc_server_handled_total`,
//!   `grpc_server_handling_seconds`): [`GrpcMetricsLayer`], around the ledger service, outside
//!   the authentication interceptor and outside the rewrite of tonic's own refusals, so every
//!   ledger call is counted with the code the caller got, also those refused before a handler
//!   runs and those whose caller went away (`CANCELLED`).
//! - **What the ledger did** (`ledger_claims_total`, `ledger_replays_total`,
//!   `ledger_key_reuse_refusals_total`, `ledger_stale_claim_tokens_total`,
//!   `ledger_completions_total`, `ledger_reconcile_resolutions_total`, the replay window and
//!   history, and `ledger_store_errors_total` for the calls' store errors): the service, in
//!   the task that runs the use case, as the ledger's answer comes back ([`Metrics::claim`],
//!   [`Metrics::complete`], [`Metrics::resolutions`], [`Metrics::call_failed`]), so the counts
//!   agree with the store also when the caller's deadline passed or the caller went away; and
//!   the console, for the resolutions it applies.
//! - **Store errors outside calls**: the prune loop ([`Metrics::call_failed`]) and the
//!   refresh loop ([`Metrics::store_error`]). Store errors are counted by
//!   [`crate::storage::StoreError::kind`], never guessed back from a gRPC code.
//! - **Gauges**: `ledger_store_up` by the health probe, `ledger_unresolved_entries` and
//!   `ledger_store_pool_connections` by [`refresh_loop`]; the replay gauges are computed from
//!   the window at each scrape.
//!
//! Labels are bounded: methods, codes, outcomes, statuses and kinds are fixed sets; tool names
//! fold into `other` beyond `--metrics-max-tools`; keys, runs, tenants and their tokens are
//! never labels.

pub mod grpc_metrics;
pub mod http;
pub mod metrics;
pub mod replay_rate;
pub mod telemetry;
pub mod traces;

pub use grpc_metrics::GrpcMetricsLayer;
pub use metrics::{Metrics, MetricsOptions, refresh_loop};

/// The service the gRPC families and the access log describe.
pub const SERVICE: &str = crate::proto::ledger_service_server::SERVICE_NAME;

/// One of the ledger service's RPCs: a `grpc_method` label value, and the access log's `rpc`.
/// The one list of them: their names, the metric families' arrays and the spans' names all come
/// from it (a test holds it to the methods the proto declares, in their order).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    strum::EnumIter,
    strum::EnumCount,
    strum::IntoStaticStr,
    strum::EnumString,
)]
pub enum Rpc {
    /// `Claim`.
    Claim,
    /// `Complete`.
    Complete,
    /// `Lookup`.
    Lookup,
    /// `Reconcile`.
    Reconcile,
    /// `ListEntries`.
    ListEntries,
    /// `RenewLease`.
    RenewLease,
    /// `ReplayRate`.
    ReplayRate,
    /// `AcknowledgeDoubleEffect`.
    AcknowledgeDoubleEffect,
    /// `Decide`.
    Decide,
    /// `ExtendRun`.
    ExtendRun,
    /// `WatchApprovals` (server streaming: its time is until the stream ends).
    WatchApprovals,
}

impl Rpc {
    /// How many RPCs there are.
    pub const COUNT: usize = <Rpc as strum::EnumCount>::COUNT;

    /// Every RPC, in the order the families list them (the order declared above).
    #[must_use]
    pub fn all() -> [Rpc; Rpc::COUNT] {
        let mut every = <Rpc as strum::IntoEnumIterator>::iter();
        std::array::from_fn(|_| every.next().unwrap_or(Rpc::Claim))
    }

    /// The method's name, as the proto spells it.
    #[must_use]
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The RPC a method's name (`Claim`) names, if any.
    #[must_use]
    pub fn named(method: &str) -> Option<Rpc> {
        method.parse().ok()
    }

    /// The RPC a request path (`/idempotency.v1.LedgerService/Claim`) names, if any.
    pub fn from_path(path: &str) -> Option<Rpc> {
        let method = path
            .strip_prefix('/')?
            .strip_prefix(SERVICE)?
            .strip_prefix('/')?;
        Rpc::named(method)
    }

    /// Its place in [`Rpc::all`], for per-method arrays.
    fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_paths_name_the_ledger_methods_only() {
        assert_eq!(
            Rpc::from_path("/idempotency.v1.LedgerService/Claim"),
            Some(Rpc::Claim)
        );
        assert_eq!(
            Rpc::from_path("/idempotency.v1.LedgerService/RenewLease"),
            Some(Rpc::RenewLease)
        );
        assert_eq!(Rpc::from_path("/grpc.health.v1.Health/Check"), None);
        assert_eq!(Rpc::from_path("/idempotency.v1.LedgerService/Nope"), None);
        assert_eq!(Rpc::from_path("/idempotency.v1.LedgerServiceX/Claim"), None);
    }

    #[test]
    fn the_rpcs_are_the_methods_the_proto_declares_in_its_order() {
        use prost::Message as _;
        let set = prost_types::FileDescriptorSet::decode(crate::proto::FILE_DESCRIPTOR_SET)
            .expect("the descriptors decode");
        let service = set
            .file
            .iter()
            .filter(|f| f.package() == "idempotency.v1")
            .flat_map(|f| f.service.iter())
            .find(|s| format!("idempotency.v1.{}", s.name()) == SERVICE)
            .expect("the ledger service is described");
        let declared: Vec<&str> = service.method.iter().map(|m| m.name()).collect();
        let listed: Vec<&str> = Rpc::all().iter().map(|r| r.name()).collect();
        assert_eq!(listed, declared);
    }

    #[test]
    fn every_rpc_sits_at_its_own_index() {
        for (i, rpc) in Rpc::all().into_iter().enumerate() {
            assert_eq!(rpc.index(), i, "{rpc:?}");
        }
    }
}
