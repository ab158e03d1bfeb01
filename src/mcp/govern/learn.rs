//! What the gateway learns of the upstream and the client, from the messages that pass and,
//! where a call needs it and no client asked, from the upstream itself: the upstream's name
//! (the prefix of every entry's tool), its tools' hints (which pass live), and who the client
//! says it is (the entries' principal).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;

use super::{Answer, Gateway, Upstream};
use crate::domain::fields::Principal;
use crate::mcp::policy::Hints;

impl Gateway {
    /// Learns the upstream's name from what it said of itself, unless one is known (the
    /// command line's, or an earlier one: a name never changes under running entries).
    pub fn learn_upstream(&self, name: &str) {
        if !self.knows_upstream() && !name.is_empty() {
            tracing::info!(
                upstream = name,
                "the upstream's name: its tools are <name>/<tool>"
            );
            self.upstream.store(Arc::new(name.to_string()));
        }
    }

    /// Learns who the client is, for the entries' principal.
    pub fn learn_client(&self, name: &str) {
        if let Ok(principal) = Principal::parse(&format!("mcp:{name}")) {
            self.principal.store(Arc::new(principal));
        }
    }

    /// Learns the tools' hints from a `tools/list` result.
    pub fn learn_tools(&self, result: &Value) {
        let Some(tools) = result.get("tools").and_then(Value::as_array) else {
            return;
        };
        self.listed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let mut hints = self
            .hints
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for tool in tools {
            if let Some(name) = tool.get("name").and_then(Value::as_str) {
                hints.insert(name.to_string(), Hints::of(tool));
            }
        }
    }

    /// What a call needs to know of the upstream and the gateway has not learned from the
    /// client's own requests, asked of the upstream itself: its name (`server/discover`) and
    /// its tools' hints (`tools/list`; a client of the stateless revision need not list them).
    /// Each carries the protocol members of the client's `call`'s `_meta`. A session-based
    /// upstream does not know `server/discover`: its name then stays unknown (entries are
    /// `upstream/<tool>`, which the log says once: pass `--name`).
    pub(super) async fn learn_what_is_missing(&self, call: &Value, upstream: &dyn Upstream) {
        if !self.knows_upstream() {
            if let Some(result) = self.ask(call, "server/discover", upstream).await {
                self.learn_from_discover(&result);
            }
            if !self.knows_upstream()
                && !self
                    .warned_unnamed
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::warn!(
                    "the upstream did not say its name: its tools are recorded as \
                     upstream/<tool>; pass --name to name it"
                );
            }
        }
        // Asked once: an upstream that cannot list its tools governs them all.
        if !self.listed.swap(true, std::sync::atomic::Ordering::Relaxed)
            && let Some(result) = self.ask(call, "tools/list", upstream).await
        {
            self.learn_tools(&result);
        }
    }

    /// The result of the gateway's own request `method` to the upstream, if it answered one.
    pub(super) async fn ask(
        &self,
        call: &Value,
        method: &str,
        upstream: &dyn Upstream,
    ) -> Option<Value> {
        let n = self
            .reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut meta = serde_json::Map::new();
        if let Some(object) = call.pointer("/params/_meta").and_then(Value::as_object) {
            for (key, value) in object {
                if key.starts_with("io.modelcontextprotocol/") {
                    meta.insert(key.clone(), value.clone());
                }
            }
        }
        let request = serde_json::json!({
            "jsonrpc": "2.0",
            "id": format!("idempotency-ledger-gateway:{method}:{n}"),
            "method": method,
            "params": {"_meta": meta},
        });
        let (_never, cancelled) = watch::channel(false);
        match tokio::time::timeout(Duration::from_secs(10), upstream.call(request, cancelled)).await
        {
            Ok(Answer::Response(response)) => response.get("result").cloned(),
            _ => None,
        }
    }

    /// Learns the upstream's name from a `server/discover` result (or an initialize one).
    pub fn learn_from_discover(&self, result: &Value) {
        let name = result
            .pointer("/_meta/io.modelcontextprotocol~1serverInfo/name")
            .or_else(|| result.pointer("/serverInfo/name"))
            .and_then(Value::as_str);
        if let Some(name) = name {
            self.learn_upstream(name);
        }
    }
}
