//! The families labelled by tool (`ledger_claims_total`, `ledger_replays_total`,
//! `ledger_key_reuse_refusals_total`): one tool's series, and the fold of the names beyond
//! `--metrics-max-tools` into `other`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::ledger::Outcome;

/// The label value tool names fold into beyond `--metrics-max-tools`.
const OTHER_TOOL: &str = "other";

/// A label set with a tool name among its values.
type ToolLabels<const N: usize> = [(&'static str, Cow<'static, str>); N];

/// One tool's series.
#[derive(Debug)]
pub(super) struct ToolSeries {
    /// `ledger_claims_total`, by [`Outcome::ALL`].
    pub(super) claims: [Counter; Outcome::ALL.len()],
    /// `ledger_replays_total`.
    pub(super) replays: Counter,
    /// `ledger_key_reuse_refusals_total`.
    pub(super) key_reused: Counter,
}

/// The families labelled by tool.
#[derive(Debug, Default)]
struct ToolFamilies {
    claims: Family<ToolLabels<2>, Counter>,
    replays: Family<ToolLabels<1>, Counter>,
    key_reused: Family<ToolLabels<1>, Counter>,
}

impl ToolFamilies {
    /// Creates `tool`'s series in every family, at zero.
    fn series(&self, tool: &str) -> ToolSeries {
        let name = || Cow::Owned(tool.to_string());
        ToolSeries {
            claims: Outcome::ALL.map(|outcome| {
                let label = Cow::Owned(outcome.as_str().to_ascii_lowercase());
                self.claims
                    .get_or_create_owned(&[("outcome", label), ("tool", name())])
            }),
            replays: self.replays.get_or_create_owned(&[("tool", name())]),
            key_reused: self.key_reused.get_or_create_owned(&[("tool", name())]),
        }
    }
}

/// The tool names that have their own label value: at most `max`, then everything else is
/// `other`.
#[derive(Debug)]
pub(super) struct Tools {
    max: usize,
    families: ToolFamilies,
    /// `ledger_mcp_calls_total`: the MCP gateway's answers, by answer and tool (made as they
    /// come: a server that is no gateway shows none).
    gateway_calls: Family<ToolLabels<2>, Counter>,
    named: RwLock<HashMap<String, Arc<ToolSeries>>>,
    /// Always shown, so that a rate over it exists before any name folds.
    other: Arc<ToolSeries>,
}

impl Tools {
    /// Registers the families labelled by tool in `registry`, with the `other` series at zero;
    /// at most `max` names get their own.
    pub(super) fn register(registry: &mut Registry, max: usize) -> Tools {
        let tools = Tools::new(max);
        registry.register(
            "ledger_claims",
            "Claims answered, by outcome and tool (tools beyond --metrics-max-tools are \"other\")",
            tools.families.claims.clone(),
        );
        registry.register(
            "ledger_replays",
            "Claims answered with the stored result (ledger_claims_total{outcome=\"replayed\"}), \
             by tool",
            tools.families.replays.clone(),
        );
        registry.register(
            "ledger_mcp_calls",
            "The MCP gateway's answers to tools/call, by answer (acted, replayed, passed, \
             asked, refused, cancelled, or the status the ledger told) and tool \
             (<upstream>/<tool>)",
            tools.gateway_calls.clone(),
        );
        registry.register(
            "ledger_key_reuse_refusals",
            "Claims refused because an explicit key came with another tool or other arguments \
             (KEY_REUSED_WITH_DIFFERENT_REQUEST), by tool",
            tools.families.key_reused.clone(),
        );
        tools
    }

    fn new(max: usize) -> Tools {
        let families = ToolFamilies::default();
        Tools {
            max,
            other: Arc::new(families.series(OTHER_TOOL)),
            families,
            gateway_calls: Family::default(),
            named: RwLock::default(),
        }
    }

    /// Counts one answer of the MCP gateway to a call of `tool` (folded into `other` as the
    /// claims' names are).
    pub(super) fn gateway_call(&self, tool: &str, answer: &'static str) {
        let label = if Arc::ptr_eq(&self.get(tool), &self.other) {
            Cow::Borrowed(OTHER_TOOL)
        } else {
            Cow::Owned(tool.to_string())
        };
        self.gateway_calls
            .get_or_create(&[("answer", Cow::Borrowed(answer)), ("tool", label)])
            .inc();
    }

    /// The series `tool` counts into.
    pub(super) fn get(&self, tool: &str) -> Arc<ToolSeries> {
        // A poisoned lock only means a panic elsewhere mid-insert; the map is still usable.
        if let Some(series) = self
            .named
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(tool)
        {
            return series.clone();
        }
        let mut named = self.named.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(series) = named.get(tool) {
            return series.clone();
        }
        if named.len() >= self.max || tool == OTHER_TOOL {
            return self.other.clone();
        }
        let series = Arc::new(self.families.series(tool));
        named.insert(tool.to_string(), series.clone());
        series
    }
}
