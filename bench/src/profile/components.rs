//! Where a callgrind profile's instructions go, by component: each function's own (self)
//! instructions are given to the component its name belongs to (`COMPONENTS`, first match), so
//! the rows add up to the program's total. Inclusive costs nest (the admission layer's poll
//! includes the whole call, a `tracing` `Instrumented` future the handler it wraps), so they
//! cannot be added; self costs can. The standard library's and hashbrown's helpers (`String`'s
//! `from_iter`, a `HashMap`'s insert, a `drop_in_place` of a std type) belong to no component:
//! their instructions go to their callers' components, in proportion to what each call
//! costs (callgrind's call edges), so `hex` collecting a `String` counts for `hex`'s component.
//! Allocation and copying stay rows of their own, and are also broken down by the callers'
//! components ([`Profile::callers_of`]), since that is where they can be cut.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The components, in the order they are tried on a name: a row's label and the path prefixes
/// (or substrings, for C symbols) that put a function in it.
pub const COMPONENTS: &[(&str, &[&str])] = &[
    (
        "allocation (mimalloc)",
        &[
            "mi_",
            "_mi_",
            "mimalloc::",
            "malloc",
            "free",
            "realloc",
            "calloc",
            "__rust_alloc",
            "__rust_dealloc",
            "__rust_realloc",
            "__rdl_",
            "alloc::alloc::",
            "alloc::raw_vec::",
        ],
    ),
    (
        "copying (memcpy, memmove, memset)",
        &[
            "__memcpy",
            "__memmove",
            "__memset",
            "memcpy",
            "memmove",
            "memset",
        ],
    ),
    (
        "gRPC decode and encode (prost, tonic's codec)",
        &[
            "prost::",
            "tonic::codec",
            "tonic_prost::",
            "idempotency_ledger::proto",
        ],
    ),
    (
        "admission, deadline, auth and error layers (src/grpc)",
        &[
            "idempotency_ledger::grpc::admission",
            "idempotency_ledger::grpc::deadline",
            "idempotency_ledger::grpc::auth",
            "idempotency_ledger::credentials",
            "idempotency_ledger::grpc::error",
            "idempotency_ledger::grpc::transport_refusals",
        ],
    ),
    (
        "tracing spans and events",
        &[
            "tracing::",
            "tracing_core::",
            "tracing_subscriber::",
            "tracing_opentelemetry::",
            "opentelemetry",
            "idempotency_ledger::observe::traces",
            "idempotency_ledger::observe::telemetry",
        ],
    ),
    (
        "metrics (prometheus-client, src/observe)",
        &["prometheus_client::", "idempotency_ledger::observe::"],
    ),
    (
        "canonical JSON, SHA-256, hex (core's domain)",
        &[
            "ledger_core::domain::canonical",
            "sha2::",
            "serde_json::",
            "hex::",
            "ledger_core::domain::key",
        ],
    ),
    (
        "replay memory and recent keys (core's ledger)",
        &[
            "ledger_core::ledger::replay_memory",
            "ledger_core::ledger::recent_keys",
        ],
    ),
    (
        "group commit (ledger-stores' group_commit)",
        &["ledger_stores::group_commit"],
    ),
    (
        "sqlx (encode, decode, connection I/O)",
        &[
            "sqlx_core::",
            "sqlx_postgres::",
            "sqlx_sqlite::",
            "libsqlite3",
        ],
    ),
    (
        "our storage code (rows, binds; ledger-stores)",
        &["ledger_stores::", "ledger_core::storage::"],
    ),
    (
        "the rest of ours (service, ledger, domain)",
        &["idempotency_ledger::", "ledger_core::"],
    ),
    (
        "HTTP/2 and transport (h2, hyper, http, tonic, tower)",
        &[
            "h2::",
            "hyper::",
            "hyper_util::",
            "http::",
            "http_body",
            "tonic::",
            "tonic_health::",
            "tower::",
            "tower_layer::",
            "bytes::",
            "httparse::",
            "ledger_bench::",
        ],
    ),
    (
        "tokio (runtime, I/O, timers, sync)",
        &[
            "tokio::",
            "mio::",
            "parking_lot",
            "futures_",
            "socket2::",
            "tokio_stream::",
        ],
    ),
];

/// The row for what matches no component (the C library's other functions, the standard
/// library's calls from the root, the kernel's entry points as valgrind sees them).
pub const OTHER: &str = "other (libc, std, glue)";

/// Functions whose instructions go to their callers when no component claims them (see the
/// module's documentation).
const GLUE: &[&str] = &[
    "core::",
    "alloc::",
    "std::",
    "hashbrown::",
    "<std::",
    "<core::",
    "<alloc::",
];

/// A callgrind profile: every function's self instructions and its callers' call costs.
#[derive(Debug, Default)]
pub struct Profile {
    /// Self instructions by function name.
    pub own: HashMap<String, u64>,
    /// Inclusive instructions of the calls (caller, callee).
    pub calls: HashMap<(String, String), u64>,
    /// The program's total.
    pub total: u64,
}

impl Profile {
    /// Reads a callgrind output file (`--dump-instr=no`, the default: one cost per line).
    ///
    /// # Errors
    ///
    /// When the file cannot be read.
    pub fn read(file: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        Ok(Self::parse(&text))
    }

    /// Parses callgrind's format (name compression, `calls=` lines followed by the call's cost).
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let mut profile = Self::default();
        let mut names: HashMap<String, String> = HashMap::new();
        let mut current = String::new();
        let mut callee = String::new();
        let mut next_is_call = false;
        for line in text.lines() {
            if let Some(spec) = line.strip_prefix("fn=") {
                current = name(spec, &mut names);
            } else if let Some(spec) = line.strip_prefix("cfn=") {
                callee = name(spec, &mut names);
            } else if line.starts_with("calls=") {
                next_is_call = true;
            } else if line.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
                let cost: u64 = line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                if std::mem::take(&mut next_is_call) {
                    *profile
                        .calls
                        .entry((current.clone(), callee.clone()))
                        .or_default() += cost;
                } else {
                    *profile.own.entry(current.clone()).or_default() += cost;
                    profile.total += cost;
                }
            }
        }
        profile
    }

    /// Instructions by component (`COMPONENTS`' labels and [`OTHER`]); they add up to the total.
    #[must_use]
    pub fn by_component(&self) -> BTreeMap<&'static str, f64> {
        let mut rows = BTreeMap::new();
        let mut shares = Shares::new(self);
        for (function, &cost) in &self.own {
            for (row, share) in shares.of(function) {
                *rows.entry(row).or_default() += cost as f64 * share;
            }
        }
        rows
    }

    /// Instructions of the functions of component `row` (e.g. allocation) by the component
    /// of the function that called them (glue followed upwards, as for self costs).
    #[must_use]
    pub fn callers_of(&self, row: &str) -> BTreeMap<&'static str, f64> {
        let mut found = BTreeMap::new();
        let mut shares = Shares::new(self);
        for ((caller, callee), &cost) in &self.calls {
            if component(callee) == row && component(caller) != row {
                for (r, share) in shares.of(caller) {
                    *found.entry(r).or_default() += cost as f64 * share;
                }
            }
        }
        found
    }
}

/// `fn=(12) name` defines name 12, `fn=(12)` refers to it; a plain `fn=name` is uncompressed.
/// A recursion's `'2` suffix is dropped, so each function has one name.
fn name(spec: &str, names: &mut HashMap<String, String>) -> String {
    let full = match spec.strip_prefix('(').and_then(|s| s.split_once(')')) {
        Some((id, rest)) if rest.trim().is_empty() => names.get(id).cloned().unwrap_or_default(),
        Some((id, rest)) => {
            names.insert(id.to_string(), rest.trim().to_string());
            rest.trim().to_string()
        }
        None => spec.to_string(),
    };
    match full.rsplit_once('\'') {
        Some((head, n)) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => head.into(),
        _ => full,
    }
}

/// The component of a function by its name: its type's (or function's) path, else its trait's,
/// else the first component named anywhere in it (a `drop_in_place<sqlx_core::…>`).
#[must_use]
pub fn component(function: &str) -> &'static str {
    let (owner, rest) = match function.strip_prefix('<') {
        Some(inner) => inner.split_once(" as ").unwrap_or((inner, "")),
        None => (function, ""),
    };
    let matches = |text: &str| {
        COMPONENTS
            .iter()
            .find(|(_, prefixes)| prefixes.iter().any(|p| text.starts_with(p)))
            .map(|(row, _)| *row)
    };
    let anywhere = || {
        COMPONENTS
            .iter()
            .filter_map(|(row, prefixes)| {
                prefixes
                    .iter()
                    .filter_map(|p| function.find(p))
                    .min()
                    .map(|at| (at, *row))
            })
            .min()
            .map(|(_, row)| row)
    };
    matches(&without_generics(owner))
        .or_else(|| matches(&without_generics(rest)))
        .or_else(|| (!is_glue(function)).then(anywhere).flatten())
        .or_else(|| is_glue(function).then(anywhere).flatten())
        .unwrap_or(OTHER)
}

/// Whether a function's instructions go to its callers: the standard library's and
/// hashbrown's, unless they are allocation or copying.
fn is_glue(function: &str) -> bool {
    GLUE.iter().any(|g| function.starts_with(g))
}

/// `a::b<c::d>::e` → `a::b::e`.
fn without_generics(text: &str) -> String {
    let mut out = String::new();
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// Which components a function's self instructions go to, and in what shares: its own, or,
/// for glue, its callers', weighted by their calls' costs (memoized; a cycle of glue is
/// [`OTHER`]).
struct Shares<'p> {
    callers: HashMap<&'p str, Vec<(&'p str, u64)>>,
    known: HashMap<String, Vec<(&'static str, f64)>>,
}

impl<'p> Shares<'p> {
    fn new(profile: &'p Profile) -> Self {
        let mut callers: HashMap<&str, Vec<(&str, u64)>> = HashMap::new();
        for ((caller, callee), &cost) in &profile.calls {
            if caller != callee {
                callers.entry(callee).or_default().push((caller, cost));
            }
        }
        Self {
            callers,
            known: HashMap::new(),
        }
    }

    fn of(&mut self, function: &str) -> Vec<(&'static str, f64)> {
        self.resolve(function, &mut Vec::new())
    }

    fn resolve(&mut self, function: &str, path: &mut Vec<String>) -> Vec<(&'static str, f64)> {
        let row = component(function);
        if !(is_glue(function) && row == OTHER) {
            return vec![(row, 1.0)];
        }
        if let Some(known) = self.known.get(function) {
            return known.clone();
        }
        if path.iter().any(|p| p == function) || path.len() > 32 {
            return vec![(OTHER, 1.0)];
        }
        let callers = self.callers.get(function).cloned().unwrap_or_default();
        let sum: u64 = callers.iter().map(|(_, c)| c).sum();
        if sum == 0 {
            return vec![(row, 1.0)];
        }
        path.push(function.to_string());
        let mut shares: HashMap<&'static str, f64> = HashMap::new();
        for (caller, cost) in callers {
            for (r, s) in self.resolve(caller, path) {
                *shares.entry(r).or_default() += s * cost as f64 / sum as f64;
            }
        }
        path.pop();
        let shares: Vec<_> = shares.into_iter().collect();
        self.known.insert(function.to_string(), shares.clone());
        shares
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_is_in_its_types_component_not_its_arguments() {
        let tracing = "<tracing::instrument::Instrumented<idempotency_ledger::grpc::service::X> as core::future::future::Future>::poll";
        assert_eq!(component(tracing), "tracing spans and events");
        assert_eq!(
            component("core::ptr::drop_in_place<sqlx_core::pool::Pool>"),
            COMPONENTS[9].0
        );
        assert_eq!(
            component("<DB as ledger_stores::sql::Columns>::add"),
            COMPONENTS[10].0
        );
        assert_eq!(component("mi_free"), COMPONENTS[0].0);
        assert_eq!(component("__memcpy_avx_unaligned_erms"), COMPONENTS[1].0);
    }

    #[test]
    fn every_crate_of_the_server_is_ours_not_other() {
        // The server is three crates since issue 29's split: a crate missing here would count
        // its code as glue, and the component rows would be wrong without failing.
        for function in [
            "idempotency_ledger::grpc::service::claim",
            "ledger_core::ledger::claim::prepare_claim",
            "ledger_stores::sql_store::methods::insert",
            "ledger_core::storage::values::x",
        ] {
            assert_ne!(component(function), OTHER, "{function}");
        }
        assert_eq!(
            component("ledger_core::domain::canonical::canonicalize"),
            "canonical JSON, SHA-256, hex (core's domain)"
        );
        assert_eq!(
            component("ledger_stores::group_commit::GroupCommit::run"),
            "group commit (ledger-stores' group_commit)"
        );
    }

    #[test]
    fn glue_goes_to_its_callers_and_the_rows_add_up() {
        let text = "events: Ir\nfn=(1) ledger_core::domain::canonical::canonicalize\n0 100\n\
                    cfn=(2) <alloc::string::String as core::iter::FromIterator<char>>::from_iter\n\
                    calls=1 0\n0 50\nfn=(3) h2::proto::poll\n0 30\ncfn=(2)\ncalls=1 0\n0 150\n\
                    fn=(2)\n0 200\n";
        let profile = Profile::parse(text);
        assert_eq!(profile.total, 330);
        let rows = profile.by_component();
        let canonical = rows["canonical JSON, SHA-256, hex (core's domain)"];
        assert!((canonical - 150.0).abs() < 1e-6, "{rows:?}");
        assert!((rows.values().sum::<f64>() - 330.0).abs() < 1e-6);
    }
}
