//! The conventional gRPC server families (`grpc_server_started_total`,
//! `grpc_server_handled_total`, `grpc_server_handling_seconds`): their labels, and each
//! method's series looked up once.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::{BUCKETS, Labels};
use crate::observe::{Rpc, SERVICE};
use crate::proto::code_name;

/// The labels of a method's gRPC series.
fn method_labels(rpc: Rpc) -> Labels<3> {
    [
        ("grpc_type", "unary"),
        ("grpc_service", SERVICE),
        ("grpc_method", rpc.name()),
    ]
}

/// The labels of a method's `grpc_server_handled_total` series for `code`.
pub(super) fn handled_labels(rpc: Rpc, code: tonic::Code) -> Labels<4> {
    let [t, s, m] = method_labels(rpc);
    [t, s, m, ("grpc_code", code_name(code))]
}

fn handling_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The series of one method in a family, each looked up once: the handles share the family's
/// values.
fn per_method<M: Clone, C: prometheus_client::metrics::family::MetricConstructor<M>>(
    family: &Family<Labels<3>, M, C>,
) -> [M; Rpc::COUNT] {
    Rpc::all().map(|rpc| family.get_or_create_owned(&method_labels(rpc)))
}

/// The gRPC families.
#[derive(Debug)]
pub(super) struct GrpcSeries {
    /// Calls received, by [`Rpc`].
    pub(super) started: [Counter; Rpc::COUNT],
    /// Calls answered, by method and code.
    pub(super) handled: Family<Labels<4>, Counter>,
    /// Calls answered `OK`, by [`Rpc`]: the common case, looked up once.
    pub(super) handled_ok: [Counter; Rpc::COUNT],
    /// Time from the request to the response headers, by [`Rpc`].
    pub(super) seconds: [Histogram; Rpc::COUNT],
}

impl GrpcSeries {
    /// Registers the gRPC families in `registry`, each method's series at zero.
    pub(super) fn register(registry: &mut Registry) -> GrpcSeries {
        let started = Family::<Labels<3>, Counter>::default();
        registry.register(
            "grpc_server_started",
            "Ledger calls received, by method (including calls refused before the handler)",
            started.clone(),
        );
        let handled = Family::<Labels<4>, Counter>::default();
        registry.register(
            "grpc_server_handled",
            "Ledger calls completed, by method and gRPC code (CANCELLED: the caller went away)",
            handled.clone(),
        );
        let seconds = Family::<Labels<3>, Histogram, fn() -> Histogram>::new_with_constructor(
            handling_histogram,
        );
        registry.register_with_unit(
            "grpc_server_handling",
            "Time from a ledger call's request to its response (or to its cancellation), by \
             method",
            Unit::Seconds,
            seconds.clone(),
        );
        GrpcSeries {
            started: per_method(&started),
            handled_ok: Rpc::all()
                .map(|rpc| handled.get_or_create_owned(&handled_labels(rpc, tonic::Code::Ok))),
            handled,
            seconds: per_method(&seconds),
        }
    }
}
