//! Traces over OTLP: configured the OpenTelemetry way, from the `OTEL_*` environment
//! variables, and set up only when an endpoint is named, so that a server without one pays
//! nothing for it on its calls.
//!
//! Each ledger RPC is one span of kind SERVER, a child of the caller's `traceparent` (W3C trace
//! context, read by the OpenTelemetry propagator in [`super::telemetry`]), named
//! `idempotency.v1.LedgerService/<Method>` with the RPC semantic conventions' attributes
//! (`rpc.system`, `rpc.service`, `rpc.method`, `rpc.grpc.status_code`) and the ledger's
//! (`ledger.tool`, `ledger.outcome`, `ledger.status`, `ledger.attempt`, `ledger.key_prefix`,
//! `ledger.tenant`, `ledger.reason`): identifiers and answers chosen by the server, never an
//! argument, a result, an error text or a token. Two kinds of child span tell where a call's
//! time went: `ledger.batch_commit` (a claim's insert or a completion, waiting for and written
//! in a group-commit batch, [`crate::storage`]) and `ledger.claim_wait` (a claim waiting for an
//! attempt in flight, [`crate::ledger`]).
//!
//! The spans are `tracing` spans of the target [`TARGET`], which only the OpenTelemetry layer
//! sees (the log never shows them, whatever `RUST_LOG` says); without an endpoint no layer sees
//! them, so they are never created. Finished spans go to a bounded queue (the SDK's batch
//! processor, `OTEL_BSP_*`) that a thread of its own sends in batches: a call never waits for
//! the collector, a full queue drops spans (the SDK logs the first drop once, and the count at
//! shutdown), a failing collector is logged once until an export succeeds again, and the
//! queue is flushed when the server stops ([`TraceExport::shutdown`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::registry::LookupSpan;

/// The target of the spans that are exported and never logged: the call's server span and its
/// children. The core's, which its use cases and the stores' group commit write too.
pub const TARGET: &str = ledger_core::TRACE_TARGET;

/// The name under which the ledger's spans are reported (the instrumentation scope).
const SCOPE: &str = "idempotency-ledger";

/// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names one.
pub const DEFAULT_SERVICE_NAME: &str = "idempotency-ledger";

/// How long the flush at shutdown may take: the queue's last batch, after the in-flight calls
/// drained. A collector that does not answer in that time loses those spans, and the process
/// still exits.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The exporter's own time limit per batch (`OTEL_EXPORTER_OTLP_TIMEOUT`) when none is set.
const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How the spans leave the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceProtocol {
    /// OTLP over gRPC (`grpc`, the default), to port 4317 by convention.
    Grpc,
    /// OTLP over HTTP with protobuf bodies (`http/protobuf`), to `<endpoint>/v1/traces`.
    HttpProtobuf,
}

impl TraceProtocol {
    /// The value `OTEL_EXPORTER_OTLP_PROTOCOL` spells it with.
    pub fn as_str(self) -> &'static str {
        match self {
            TraceProtocol::Grpc => "grpc",
            TraceProtocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// The trace settings the environment gives, checked before anything starts.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceConfig {
    /// Where spans go, as the variable that named it says (the signal's own variable first).
    pub endpoint: String,
    /// How they go.
    pub protocol: TraceProtocol,
    /// `OTEL_TRACES_SAMPLER` (and its argument), as written.
    pub sampler: String,
    /// The ratio of a ratio-based sampler.
    pub ratio: f64,
    /// The bound of one export, retries included.
    pub export_timeout: Duration,
}

/// Why the trace settings cannot be used; the server refuses to start rather than run without
/// the traces its operator asked for.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TraceConfigError {
    /// A variable holds a value this server does not know.
    #[error("{name}={value:?}: {why}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// What it holds.
        value: String,
        /// What it may hold.
        why: &'static str,
    },
    /// The exporter could not be built from them.
    #[error("the OTLP exporter: {0}")]
    Exporter(String),
}

impl TraceConfig {
    /// The settings `var` reads (the process environment in production, a table in tests), or
    /// `None` when no traces are wanted: no endpoint, `OTEL_SDK_DISABLED=true`, or
    /// `OTEL_TRACES_EXPORTER=none`.
    ///
    /// # Errors
    /// A variable holds a value the server cannot honour (an unknown protocol or sampler, a
    /// ratio outside 0..=1, an exporter other than `otlp`).
    pub fn from_vars(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<TraceConfig>, TraceConfigError> {
        // Empty means unset, as the specification says of every OTEL_ variable.
        let get = |name: &str| {
            var(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match get("OTEL_TRACES_EXPORTER").as_deref() {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(TraceConfigError::Invalid {
                    name: "OTEL_TRACES_EXPORTER",
                    value: other.to_string(),
                    why: "this server exports over OTLP only: otlp or none",
                });
            }
        }
        let (endpoint_var, endpoint) = match (
            get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(e), _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", e),
            (None, Some(e)) => ("OTEL_EXPORTER_OTLP_ENDPOINT", e),
            (None, None) => return Ok(None),
        };
        let (protocol_var, protocol) = match get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
            Some(p) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", Some(p)),
            None => (
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                get("OTEL_EXPORTER_OTLP_PROTOCOL"),
            ),
        };
        // gRPC by default: the server is a gRPC service and already carries its stack.
        let protocol = match protocol.as_deref() {
            None | Some("grpc") => TraceProtocol::Grpc,
            Some("http/protobuf") => TraceProtocol::HttpProtobuf,
            Some(other) => {
                return Err(TraceConfigError::Invalid {
                    name: protocol_var,
                    value: other.to_string(),
                    why: "grpc or http/protobuf",
                });
            }
        };
        // No TLS client is built in for the collector (neither transport has trust roots here):
        // refused now, rather than failing every export later.
        if endpoint.to_ascii_lowercase().starts_with("https:") {
            return Err(TraceConfigError::Invalid {
                name: endpoint_var,
                value: endpoint,
                why: "traces are sent over plain http only: point the server at a collector or \
                      agent it reaches without TLS (on the host, or a sidecar)",
            });
        }
        let sampler = get("OTEL_TRACES_SAMPLER").unwrap_or_else(|| "parentbased_always_on".into());
        let ratio = match get("OTEL_TRACES_SAMPLER_ARG") {
            None => 1.0,
            Some(arg) => match arg.parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => r,
                _ => {
                    return Err(TraceConfigError::Invalid {
                        name: "OTEL_TRACES_SAMPLER_ARG",
                        value: arg,
                        why: "a ratio from 0 to 1",
                    });
                }
            },
        };
        let config = TraceConfig {
            endpoint,
            protocol,
            sampler,
            ratio,
            export_timeout: export_timeout(&get),
        };
        config.sampler()?;
        Ok(Some(config))
    }

    /// The sampler `OTEL_TRACES_SAMPLER` names.
    fn sampler(&self) -> Result<Sampler, TraceConfigError> {
        let ratio = || Box::new(Sampler::TraceIdRatioBased(self.ratio));
        Ok(match self.sampler.as_str() {
            "always_on" => Sampler::AlwaysOn,
            "always_off" => Sampler::AlwaysOff,
            "traceidratio" => Sampler::TraceIdRatioBased(self.ratio),
            "parentbased_always_on" => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
            "parentbased_always_off" => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
            "parentbased_traceidratio" => Sampler::ParentBased(ratio()),
            _ => {
                return Err(TraceConfigError::Invalid {
                    name: "OTEL_TRACES_SAMPLER",
                    value: self.sampler.clone(),
                    why: "always_on, always_off, traceidratio, parentbased_always_on, \
                          parentbased_always_off or parentbased_traceidratio",
                });
            }
        })
    }

    /// The endpoint without what it may carry besides its address (credentials, a query), for
    /// the start-up log.
    pub fn shown_endpoint(&self) -> &str {
        let after_scheme = self.endpoint.find("://").map_or(0, |at| at + 3);
        let rest = &self.endpoint[after_scheme..];
        let host_start = rest
            .find('@')
            .map_or(after_scheme, |at| after_scheme + at + 1);
        let host_end = self.endpoint[host_start..]
            .find(['/', '?', '#'])
            .map_or(self.endpoint.len(), |at| host_start + at);
        &self.endpoint[host_start..host_end]
    }
}

/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` or `OTEL_EXPORTER_OTLP_TIMEOUT`, in milliseconds, as
/// the exporter reads them.
fn export_timeout(get: &impl Fn(&str) -> Option<String>) -> Duration {
    get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
        .or_else(|| get("OTEL_EXPORTER_OTLP_TIMEOUT"))
        .and_then(|ms| ms.parse::<u64>().ok())
        .map_or(DEFAULT_EXPORT_TIMEOUT, Duration::from_millis)
}

/// The running export: the tracer the log subscriber's OpenTelemetry layer uses, and the
/// provider to flush when the server stops.
pub struct TraceExport {
    /// Owns the batch processor and its thread.
    provider: SdkTracerProvider,
    /// What was sent and what failed, for the shutdown line.
    health: Arc<ExportHealth>,
    /// What the environment asked for.
    config: TraceConfig,
}

impl TraceExport {
    /// Sets up the export the `OTEL_*` environment variables describe, or nothing when they
    /// name no endpoint. Call inside the tokio runtime: the exports run on it.
    ///
    /// # Errors
    /// See [`TraceConfigError`].
    pub fn from_env() -> Result<Option<TraceExport>, TraceConfigError> {
        match TraceConfig::from_vars(|name| std::env::var(name).ok())? {
            Some(config) => TraceExport::start(config).map(Some),
            None => Ok(None),
        }
    }

    /// Starts the exporter and its batch processor for `config`.
    ///
    /// # Errors
    /// The exporter cannot be built (an endpoint that is not a URL, say).
    pub fn start(config: TraceConfig) -> Result<TraceExport, TraceConfigError> {
        let builder = opentelemetry_otlp::SpanExporter::builder();
        // The crate reads the endpoint, headers, timeout and compression variables itself.
        let exporter = match config.protocol {
            TraceProtocol::Grpc => builder.with_tonic().with_protocol(Protocol::Grpc).build(),
            TraceProtocol::HttpProtobuf => builder
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .build(),
        }
        .map_err(|e| TraceConfigError::Exporter(e.to_string()))?;
        let health = Arc::new(ExportHealth::default());
        let exporter = OnRuntime {
            inner: Arc::new(exporter),
            runtime: tokio::runtime::Handle::current(),
            // The exporter's own deadline ends its retries; this one ends an export that
            // hangs anyway (a collector that accepts and never answers).
            timeout: config.export_timeout + Duration::from_secs(1),
            health: health.clone(),
        };
        // The batch processor reads OTEL_BSP_* (queue size, batch size, delay) itself.
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(config.sampler()?)
            .with_resource(resource())
            .build();
        Ok(TraceExport {
            provider,
            health,
            config,
        })
    }

    /// What the environment asked for.
    pub fn config(&self) -> &TraceConfig {
        &self.config
    }

    /// The layer that turns the spans of [`TARGET`] (and those only) into OpenTelemetry spans.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        use tracing_subscriber::Layer as _;
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer(SCOPE))
            // Only what the ledger sets: no source locations, threads, timings or targets, and
            // no OpenTelemetry context made current on every enter (nothing reads it).
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_level(false)
            .with_tracked_inactivity(false)
            .with_context_activation(false)
            .with_error_fields_to_exceptions(false)
            .with_error_events_to_exceptions(false)
            .with_error_events_to_status(false)
            .with_error_records_to_exceptions(false)
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(TARGET, tracing::Level::TRACE),
            )
    }

    /// Flushes the spans still queued (those of the calls that finished while the server
    /// drained) and stops the exporter, in at most `FLUSH_TIMEOUT`; logs what was sent.
    pub async fn shutdown(self) {
        let provider = self.provider.clone();
        // Blocking: the processor's thread does the last export (on this runtime) first.
        let flushed =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH_TIMEOUT))
                .await;
        let (exported, failed) = self.health.counts();
        match flushed {
            Ok(Ok(())) => tracing::info!(
                spans_exported = exported,
                spans_not_exported = failed,
                "trace export stopped"
            ),
            Ok(Err(e)) => tracing::warn!(
                error = %e,
                spans_exported = exported,
                spans_not_exported = failed,
                "trace export stopped without flushing every span"
            ),
            Err(e) => tracing::warn!(error = %e, "trace export stopped: the flush failed"),
        }
    }
}

/// `service.name` as the environment says (`OTEL_SERVICE_NAME`, then `OTEL_RESOURCE_ATTRIBUTES`),
/// else [`DEFAULT_SERVICE_NAME`]; `service.version` is the crate's.
fn resource() -> opentelemetry_sdk::Resource {
    use opentelemetry_sdk::Resource;
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    let builder = Resource::builder()
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    if named {
        builder.build()
    } else {
        builder.with_service_name(DEFAULT_SERVICE_NAME).build()
    }
}

/// How the exports went, for the logs: a failure is logged once, until an export succeeds.
#[derive(Debug, Default)]
struct ExportHealth {
    /// The last export failed.
    failing: AtomicBool,
    /// Spans the collector accepted.
    exported: AtomicU64,
    /// Spans whose export failed (dropped: the processor does not send a batch twice).
    failed: AtomicU64,
}

impl ExportHealth {
    fn record(&self, spans: usize, result: &OTelSdkResult) {
        match result {
            Ok(()) => {
                self.exported.fetch_add(spans as u64, Ordering::Relaxed);
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("trace export recovered: the collector accepts spans again");
                }
            }
            Err(e) => {
                self.failed.fetch_add(spans as u64, Ordering::Relaxed);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        error = %e,
                        "cannot export spans to the OTLP collector; calls go on, and their \
                         spans are dropped until an export succeeds (logged once until then)"
                    );
                }
            }
        }
    }

    fn counts(&self) -> (u64, u64) {
        (
            self.exported.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

/// An exporter whose exports run on the server's tokio runtime, bounded in time, whatever
/// thread asks: the batch processor's thread blocks on them, and both transports need the
/// runtime (tonic's channel, hyper's client). Failures are logged here, once (see
/// [`ExportHealth`]), instead of by the processor at every batch.
#[derive(Debug)]
struct OnRuntime<E> {
    /// The OTLP exporter; shared with the export in flight.
    inner: Arc<E>,
    /// Where exports run.
    runtime: tokio::runtime::Handle,
    /// The most one export may take.
    timeout: Duration,
    /// Where its outcome is told.
    health: Arc<ExportHealth>,
}

impl<E: SpanExporter + 'static> SpanExporter for OnRuntime<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let inner = self.inner.clone();
        let timeout = self.timeout;
        let sent = self
            .runtime
            .spawn(async move { tokio::time::timeout(timeout, inner.export(batch)).await })
            .await;
        let result = match sent {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(OTelSdkError::Timeout(timeout)),
            Err(e) => Err(OTelSdkError::InternalFailure(e.to_string())),
        };
        self.health.record(spans, &result);
        // Told above; the processor would log every failed batch again.
        Ok(())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        // Called once, when the provider is built, before any export shares the exporter.
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.set_resource(resource),
            None => tracing::warn!("the trace exporter's resource could not be set"),
        }
    }
}

/// The name of a ledger RPC's span, as the RPC conventions write it: `<service>/<method>`;
/// a method the service does not have is `_OTHER`.
pub(super) fn span_name(method: &str) -> &'static str {
    /// Each RPC's span name, made once from the one list of RPCs.
    static NAMES: std::sync::LazyLock<[String; super::Rpc::COUNT]> =
        std::sync::LazyLock::new(|| {
            super::Rpc::all().map(|rpc| format!("{}/{}", super::SERVICE, rpc.name()))
        });
    match super::Rpc::named(method) {
        Some(rpc) => NAMES[rpc as usize].as_str(),
        None => {
            const_format::concatcp!(crate::proto::ledger_service_server::SERVICE_NAME, "/_OTHER")
        }
    }
}

/// The `rpc.method` of a request's method: its name, or `_OTHER` for one the service does not
/// have (the caller's text is not echoed).
pub(super) fn method_attribute(method: &str) -> &'static str {
    span_name(method)
        .rsplit_once('/')
        .map_or("_OTHER", |(_, m)| m)
}

/// Whether a gRPC server span whose call ended with `code` has the status ERROR, as the RPC
/// conventions say: the codes that mean the server failed, not the caller.
pub(super) fn is_error_status(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::Unknown
            | Code::DeadlineExceeded
            | Code::Unimplemented
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::observe::Rpc;

    fn config(vars: &[(&str, &str)]) -> Result<Option<TraceConfig>, TraceConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        TraceConfig::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn without_an_endpoint_nothing_is_set_up() {
        assert_eq!(config(&[]), Ok(None));
        assert_eq!(
            config(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", " "),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_SERVICE_NAME", "x"),
                ("OTEL_TRACES_SAMPLER", "always_on"),
            ]),
            Ok(None)
        );
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317");
        assert_eq!(config(&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")]), Ok(None));
        assert_eq!(
            config(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]),
            Ok(None)
        );
    }

    #[test]
    fn an_endpoint_alone_exports_over_grpc_with_the_parent_based_always_on_sampler() {
        let c = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")])
            .expect("valid")
            .expect("on");
        assert_eq!(c.endpoint, "http://collector:4317");
        assert_eq!(c.protocol, TraceProtocol::Grpc);
        assert_eq!(c.sampler, "parentbased_always_on");
        assert_eq!(c.export_timeout, DEFAULT_EXPORT_TIMEOUT);
        assert!(matches!(c.sampler(), Ok(Sampler::ParentBased(_))));
    }

    #[test]
    fn the_traces_own_variables_win_over_the_general_ones() {
        let c = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4317"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://traces:4318/v1/traces",
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "3000"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2500"),
        ])
        .expect("valid")
        .expect("on");
        assert_eq!(c.endpoint, "http://traces:4318/v1/traces");
        assert_eq!(c.protocol, TraceProtocol::HttpProtobuf);
        assert_eq!(c.export_timeout, Duration::from_millis(2500));
    }

    #[test]
    fn unknown_protocols_samplers_exporters_and_ratios_are_refused_with_the_variable_named() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317");
        for (vars, name) in [
            (
                vec![endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                vec![endpoint, ("OTEL_TRACES_SAMPLER", "sometimes")],
                "OTEL_TRACES_SAMPLER",
            ),
            (
                vec![
                    endpoint,
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
                ],
                "OTEL_TRACES_SAMPLER_ARG",
            ),
            (
                vec![endpoint, ("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTEL_TRACES_EXPORTER",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                vec![(
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "HTTPS://collector:4317",
                )],
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            ),
        ] {
            match config(&vars) {
                Err(TraceConfigError::Invalid { name: got, .. }) => assert_eq!(got, name),
                other => panic!("{vars:?}: {other:?}"),
            }
        }
        let ratio = config(&[
            endpoint,
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ])
        .expect("valid")
        .expect("on");
        assert_eq!(ratio.ratio, 0.25);
    }

    #[test]
    fn the_logged_endpoint_leaves_out_credentials_and_paths() {
        let shown = |endpoint: &str| {
            config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)])
                .expect("valid")
                .expect("on")
                .shown_endpoint()
                .to_string()
        };
        assert_eq!(shown("http://127.0.0.1:4317"), "127.0.0.1:4317");
        assert_eq!(
            shown("http://user:secret@collector.example:4318/v1/traces?key=k"),
            "collector.example:4318"
        );
        assert_eq!(shown("collector:4317"), "collector:4317");
    }

    #[test]
    fn span_names_are_the_service_and_the_method() {
        for rpc in Rpc::all() {
            assert_eq!(
                span_name(rpc.name()),
                format!("{}/{}", crate::observe::SERVICE, rpc.name())
            );
            assert_eq!(method_attribute(rpc.name()), rpc.name());
        }
        assert_eq!(method_attribute("sk_live_x"), "_OTHER");
        assert_eq!(method_attribute("unknown"), "_OTHER");
    }

    #[test]
    fn only_server_failures_make_a_span_an_error() {
        use tonic::Code;
        for code in [Code::Internal, Code::Unavailable, Code::Unimplemented] {
            assert!(is_error_status(code), "{code:?}");
        }
        for code in [
            Code::Ok,
            Code::InvalidArgument,
            Code::NotFound,
            Code::FailedPrecondition,
            Code::Unauthenticated,
            Code::ResourceExhausted,
            Code::Cancelled,
        ] {
            assert!(!is_error_status(code), "{code:?}");
        }
    }
}
