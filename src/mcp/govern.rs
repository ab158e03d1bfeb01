//! One `tools/call` through the gateway: the tool's governance (the policy, else the upstream's
//! hints), the call's run (its `_meta`, its trace, or its window), the Claim, and then either
//! the upstream's answer recorded with a Complete, or the ledger's answer without forwarding.
//! Whatever the transport, a call reaches the upstream only after the ledger said `CLAIMED`,
//! and an answer that is lost (the upstream died, the call timed out, the client cancelled it
//! after it was sent) is recorded as unknown, never sent again.

mod at_client;
mod confirm;
mod learn;
mod outcome;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::watch;

use super::answers::{self, RUN};
use super::backend::Backend;
use super::policy::{Governance, Hints, McpPolicy, Once};
use super::rpc;
use crate::domain::fields::{Principal, RunId, ToolName};
use crate::domain::key::ClaimKey;
use crate::domain::{FinalStatus, Status, Tenant};
use crate::error::LedgerError;
use crate::ledger::{ClaimInput, ClaimOutput, CompleteInput, Ledger, Outcome, WaitFor};
use crate::observe::metrics::Metrics;
use at_client::PersonAnswer;
pub use at_client::Seal;
use confirm::Settled;
use outcome::outcome_of;

/// How the gateway governs calls, from its command line.
#[derive(Clone, Debug)]
pub struct Rules {
    /// The window of intent of a call that names no run (`--same-intent-within`).
    pub same_intent_within: Duration,
    /// A call's W3C trace id is its run when it names none (`--run-from-trace`).
    pub run_from_trace: bool,
    /// How long a repeat waits for an attempt in flight before it is told so.
    pub wait: Duration,
    /// The lease of an attempt, renewed while the upstream works on it.
    pub lease: Duration,
    /// How long the upstream may take to answer a governed call before its outcome is
    /// recorded as unknown (`--call-timeout`).
    pub call_timeout: Duration,
    /// How long a finished entry is kept; `None` for the ledger's default.
    pub retention: Option<Duration>,
    /// How long an outcome stays unknown before its paired read asks the upstream (an effect
    /// may still be landing right after the answer was lost: `--confirm-after`).
    pub confirm_after: Duration,
    /// A gated call asks the person at the client, where the client can show a form
    /// (`--approvals-at-client`): the answer decides under the gateway's authority.
    pub approvals_at_client: bool,
}

/// What the upstream answered a message the gateway forwarded, or why no answer will come.
#[derive(Debug)]
pub enum Answer {
    /// The response, whole (a result or a JSON-RPC error).
    Response(Value),
    /// No answer will come: the upstream exited, the connection broke, or the time ran out.
    Lost(String),
    /// The request surely never reached the upstream (no connection could be opened to it, or
    /// the gateway is stopping): nothing was done.
    NotSent(String),
}

/// The upstream as a governed call uses it: send one request, wait for its answer. A
/// transport implements it; `cancelled` turns true when the client cancels the request.
#[async_trait]
pub trait Upstream: Send + Sync {
    /// Sends `request` (with the id it carries) and waits for the upstream's answer.
    async fn call(&self, request: Value, cancelled: watch::Receiver<bool>) -> Answer;

    /// Asks the client's user (an `elicitation/create` request with `params`, on a
    /// session-based revision, where the client declared it can be asked) and waits for the
    /// result, until the call is cancelled. `None` when this transport cannot ask the client,
    /// or no answer came.
    async fn elicit(&self, _params: Value, _cancelled: watch::Receiver<bool>) -> Option<Value> {
        None
    }
}

/// The gateway's ledger side: the ledger, the tenant it writes for, its rules and policy, and
/// what it learned of the upstream (its name and its tools' hints). Shared by every call.
pub struct Gateway {
    /// The ledger the calls are claimed in.
    backend: Backend,
    /// The tenant the entries are written for.
    tenant: Tenant,
    /// How calls are governed.
    rules: Rules,
    /// The policy in force (swapped whole on SIGHUP).
    policy: ArcSwap<McpPolicy>,
    /// The upstream's name (`--name`, else its `serverInfo.name`), the prefix of every
    /// entry's tool; empty until known.
    upstream: ArcSwap<String>,
    /// Each tool's hints, as the upstream's last `tools/list` gave them.
    hints: Mutex<HashMap<String, Hints>>,
    /// Who the entries are claimed by: the client, as it named itself.
    principal: ArcSwap<Principal>,
    /// The number of the gateway's next own request (a paired read, a question of the name).
    reads: AtomicU64,
    /// Set once the log said the upstream's name is unknown.
    warned_unnamed: std::sync::atomic::AtomicBool,
    /// Set once a `tools/list` result taught the tools' hints.
    listed: std::sync::atomic::AtomicBool,
    /// Seals the questions a person at the client is asked (`--approvals-at-client`).
    seal: Seal,
    /// The ledger's metrics, and the gateway's answers per tool.
    metrics: Arc<Metrics>,
}

impl Gateway {
    /// A gateway over `ledger` for `tenant`, with `rules` and `policy`; `name` is the
    /// upstream's name when the command line gives one; `seal` seals its questions to a person
    /// at the client; what it does is counted in `metrics`.
    #[must_use]
    pub fn new(
        backend: Backend,
        tenant: Tenant,
        rules: Rules,
        policy: McpPolicy,
        name: Option<String>,
        seal: Seal,
        metrics: Arc<Metrics>,
    ) -> Gateway {
        Gateway {
            backend,
            tenant,
            rules,
            policy: ArcSwap::from_pointee(policy),
            upstream: ArcSwap::from_pointee(name.unwrap_or_default()),
            hints: Mutex::default(),
            principal: ArcSwap::from_pointee(Principal::none()),
            reads: AtomicU64::new(1),
            warned_unnamed: std::sync::atomic::AtomicBool::new(false),
            listed: std::sync::atomic::AtomicBool::new(false),
            seal,
            metrics,
        }
    }

    /// The ledger in this process, when the gateway has one (for its upkeep and console).
    #[must_use]
    pub fn ledger(&self) -> Option<&Ledger> {
        self.backend.local()
    }

    /// Puts `policy` in force for the calls that start from now on.
    pub fn set_policy(&self, policy: McpPolicy) {
        self.policy.store(Arc::new(policy));
    }

    /// Whether the upstream's name is known.
    #[must_use]
    pub fn knows_upstream(&self) -> bool {
        !self.upstream.load().is_empty()
    }

    /// Whether the `tools/call` request `message` goes through the ledger (its cancellation
    /// then stays with the gateway).
    #[must_use]
    pub fn governs(&self, message: &Value) -> bool {
        message
            .pointer("/params/name")
            .and_then(Value::as_str)
            .is_some_and(|name| matches!(self.governance(name), Governance::Once(_)))
    }

    /// What the gateway does with a call of `tool`.
    fn governance(&self, tool: &str) -> Governance {
        let hints = self
            .hints
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(tool)
            .copied();
        self.policy.load().governance(tool, hints)
    }

    /// Answers the `tools/call` request `message` (with id `id`) for `tenant` (the gateway's
    /// own when `None`: stdio): passes it through, or governs it. `None` when nothing is to be
    /// answered (the client cancelled the call). Each answer is counted, with a log line.
    pub async fn call_tool(
        &self,
        tenant: Option<&Tenant>,
        message: Value,
        id: &Value,
        upstream: &dyn Upstream,
        cancelled: watch::Receiver<bool>,
    ) -> Option<Value> {
        let name = message
            .pointer("/params/name")
            .and_then(Value::as_str)
            .unwrap_or("(no name)")
            .to_owned();
        let passes = matches!(self.governance(&name), Governance::Pass);
        let began = std::time::Instant::now();
        let answer = self
            .answer_call(tenant, message, id, upstream, cancelled)
            .await;
        let kind = answers::kind(answer.as_ref(), passes);
        let tool = format!("{}/{name}", self.upstream_prefix());
        self.metrics.mcp_call(&tool, kind);
        let key = answer
            .as_ref()
            .and_then(|a| a.pointer("/result/_meta"))
            .and_then(|m| m.get(answers::KEY))
            .and_then(Value::as_str)
            .map(|k| k.get(..12).unwrap_or(k).to_owned());
        tracing::info!(
            tool,
            answer = kind,
            key,
            latency_ms = began.elapsed().as_secs_f64() * 1000.0,
            "a tools/call answered"
        );
        answer
    }

    /// [`Gateway::call_tool`]'s answer.
    async fn answer_call(
        &self,
        tenant: Option<&Tenant>,
        message: Value,
        id: &Value,
        upstream: &dyn Upstream,
        cancelled: watch::Receiver<bool>,
    ) -> Option<Value> {
        self.learn_what_is_missing(&message, upstream).await;
        // A person's answer to the gateway's question is the gateway's, never the upstream's.
        let mut message = message;
        let answer = message
            .get_mut("params")
            .and_then(Value::as_object_mut)
            .and_then(PersonAnswer::take_from);
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        let Some(name) = params
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_owned)
        else {
            return Some(rpc::error(
                Some(id),
                rpc::INVALID_PARAMS,
                "tools/call needs params.name, the tool's name",
            ));
        };
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => Value::Object(serde_json::Map::new()),
            Some(Value::Object(o)) => Value::Object(o.clone()),
            Some(_) => {
                return Some(rpc::error(
                    Some(id),
                    rpc::INVALID_PARAMS,
                    "tools/call's params.arguments must be a JSON object; the call was neither \
                     recorded nor sent",
                ));
            }
        };
        let once = match self.governance(&name) {
            Governance::Pass => {
                return match upstream.call(message, cancelled).await {
                    Answer::Response(response) => Some(response),
                    Answer::Lost(why) | Answer::NotSent(why) => {
                        Some(rpc::error(Some(id), rpc::UNAVAILABLE, &why))
                    }
                };
            }
            Governance::Once(once) => once,
        };
        let call = Call {
            tenant: tenant.cloned().unwrap_or_else(|| self.tenant.clone()),
            message,
            id,
            name,
            arguments,
            meta: params.get("_meta").cloned().unwrap_or(Value::Null),
            once,
            answer,
        };
        match self.govern(&call, upstream, cancelled).await {
            Ok(answer) => answer,
            Err(refusal) => Some(refusal),
        }
    }

    /// A governed call: claim, then act through the upstream or answer from the ledger.
    async fn govern(
        &self,
        call: &Call<'_>,
        upstream: &dyn Upstream,
        cancelled: watch::Receiver<bool>,
    ) -> Result<Option<Value>, Value> {
        let tool = self.tool_name(call)?;
        // A call that names no run is claimed in its window's run, which the ledger counts
        // (the key is then replaced by it).
        let run = self.run_of(call)?;
        let window = run.is_none().then_some(self.rules.same_intent_within);
        let mut input = ClaimInput {
            tool,
            arguments_json: call.arguments.to_string(),
            key: ClaimKey::Derived(run.unwrap_or_else(|| RunId::from_stored(String::new()))),
            canonicalization: Default::default(),
            lease: Some(self.rules.lease),
            retention: self.rules.retention,
            wait: Some(self.rules.wait),
            wait_for: WaitFor::Attempt,
            answer_by: None,
            principal: (**self.principal.load()).clone(),
            require_approval: call
                .once
                .gate
                .as_ref()
                .is_some_and(|g| g.applies(&call.arguments)),
        };
        let mut claimed = self.claim(call, input.clone(), window).await?;
        // Claimed again (after a decision, after a paired read), the call names the run it
        // was claimed in.
        if let Some(run) = &claimed.entry.entry.run_id {
            input.key = ClaimKey::Derived(run.clone());
        }
        if claimed.outcome == Outcome::AwaitingApproval && self.rules.approvals_at_client {
            return self
                .at_client(call, claimed, input, upstream, cancelled)
                .await;
        }
        // A repeat that meets an outcome nobody knows asks the paired read, when there is one;
        // what it settles decides this call (found: replayed; not found: this call acts).
        if claimed.outcome == Outcome::InProgress
            && claimed.entry.status == Status::Unknown
            && let Some(confirm) = &call.once.confirm
            && !matches!(
                self.settle(call, &claimed.entry, confirm, upstream).await,
                Settled::Unsettled
            )
        {
            claimed = self.claim(call, input, None).await?;
        }
        let key = claimed.entry.entry.key.as_str().to_owned();
        let answer = match claimed.outcome {
            Outcome::Claimed => return Ok(self.act(call, claimed, upstream, cancelled).await),
            Outcome::Replayed => {
                answers::replayed(&claimed.entry.entry.result, &claimed.note, &key)
            }
            outcome => answers::not_done(status_told(outcome, &claimed), &claimed.note, &key),
        };
        tracing::debug!(
            key = claimed.entry.entry.key.log_prefix(),
            tool = claimed.entry.entry.tool.as_str(),
            outcome = claimed.outcome.as_str(),
            "a governed call was answered by the ledger; nothing was sent"
        );
        Ok(Some(rpc::result(call.id, answer)))
    }

    /// The claimed call goes to the upstream (its lease renewed meanwhile); its answer is
    /// recorded, then given to the client as the upstream gave it.
    async fn act(
        &self,
        call: &Call<'_>,
        claimed: ClaimOutput,
        upstream: &dyn Upstream,
        mut cancelled: watch::Receiver<bool>,
    ) -> Option<Value> {
        let entry = &claimed.entry.entry;
        let Some(token) = claimed.claim_token.clone() else {
            return Some(rpc::error(
                Some(call.id),
                rpc::INTERNAL_ERROR,
                "the ledger claimed the call without a claim token",
            ));
        };
        // The client's cancellation is not the upstream's: a governed call, once sent, runs
        // to its end so that its outcome is recorded (an upstream stopped mid-action would
        // leave it unknown). The client, which cancelled, is not answered.
        let (_kept, never) = watch::channel(false);
        let sent = upstream.call(call.message.clone(), never);
        let answer = tokio::select! {
            answer = tokio::time::timeout(self.rules.call_timeout, sent) => answer.unwrap_or_else(|_| {
                Answer::Lost(format!(
                    "the upstream did not answer within {:?} (--call-timeout)",
                    self.rules.call_timeout
                ))
            }),
            () = self.renew_while_waiting(&call.tenant, entry.key.clone(), token.clone()) => {
                Answer::Lost("the lease could not be renewed".to_string())
            }
        };
        let was_cancelled = *cancelled.borrow_and_update();
        let key = entry.key.as_str().to_owned();
        let outcome::Outcome {
            status,
            result,
            error,
            retryable,
            reply,
        } = outcome_of(call, answer, &key);
        let recorded = self
            .record(
                &call.tenant,
                CompleteInput {
                    key: entry.key.clone(),
                    claim_token: token,
                    status,
                    result,
                    error,
                    retryable,
                },
            )
            .await;
        let reply = match (status, recorded, &call.once.confirm) {
            (FinalStatus::Unknown, Some(unknown), Some(confirm)) => Some(rpc::result(
                call.id,
                self.settled_answer(call, &unknown, confirm, upstream).await,
            )),
            _ => reply,
        };
        // A cancelled request gets no answer (the protocol's rule); its outcome is recorded.
        if was_cancelled { None } else { reply }
    }

    /// Claims `call`'s intent (counted as any claim); the refusal to answer when the ledger
    /// refuses or cannot be reached.
    async fn claim(
        &self,
        call: &Call<'_>,
        input: ClaimInput,
        window: Option<Duration>,
    ) -> Result<ClaimOutput, Value> {
        let tool = input.tool.clone();
        let result = self.backend.claim(&call.tenant, input, window).await;
        self.metrics.claim(&call.tenant, tool.as_str(), &result);
        result.map_err(|e| refusal(call.id, &e))
    }

    /// What the entries' tools start with: the upstream's name, `upstream` while unknown.
    fn upstream_prefix(&self) -> String {
        let upstream = self.upstream.load();
        if upstream.is_empty() {
            "upstream".to_string()
        } else {
            upstream.as_str().to_string()
        }
    }

    /// The entry's tool: `<upstream>/<tool>`.
    fn tool_name(&self, call: &Call<'_>) -> Result<ToolName, Value> {
        ToolName::parse(&format!("{}/{}", self.upstream_prefix(), call.name)).map_err(|e| {
            rpc::error(
                Some(call.id),
                rpc::INVALID_PARAMS,
                &format!("the tool's name cannot be recorded: {}", e.message),
            )
        })
    }

    /// The call's run: the one its `_meta` names, else (when asked) its trace id, else
    /// `None`: its window of intent's. Never the request's id.
    fn run_of(&self, call: &Call<'_>) -> Result<Option<RunId>, Value> {
        if let Some(named) = call.meta.get(RUN) {
            return named
                .as_str()
                .ok_or("is not a text")
                .and_then(|s| {
                    RunId::parse(s)
                        .map_err(|_| "is not a run id (1 to 256 bytes, no control characters)")
                })
                .map(Some)
                .map_err(|why| {
                    rpc::error(
                        Some(call.id),
                        rpc::INVALID_PARAMS,
                        &format!("_meta[\"{RUN}\"] {why}; the call was neither recorded nor sent"),
                    )
                });
        }
        if self.rules.run_from_trace
            && let Some(trace) = call
                .meta
                .get("traceparent")
                .and_then(Value::as_str)
                .and_then(trace_id)
        {
            return Ok(Some(RunId::from_stored(format!("trace-{trace}"))));
        }
        Ok(None)
    }
}

/// A governed `tools/call`, read.
struct Call<'a> {
    /// The tenant it is recorded for.
    tenant: Tenant,
    /// The request as it came, forwarded unchanged when it acts.
    message: Value,
    /// Its id.
    id: &'a Value,
    /// The tool's name at the upstream.
    name: String,
    /// Its arguments (`{}` when it sent none).
    arguments: Value,
    /// Its `_meta`.
    meta: Value,
    /// How the policy governs it.
    once: Once,
    /// The person's answer to the gateway's question, when it carries one.
    answer: Option<PersonAnswer>,
}

/// The status a call answered without acting is told: the entry's own while in flight or
/// unknown, else the outcome's.
fn status_told(outcome: Outcome, claimed: &ClaimOutput) -> &str {
    match outcome {
        Outcome::InProgress => claimed.entry.status.as_str(),
        Outcome::PreviouslyFailed => "FAILED",
        Outcome::AwaitingApproval => "AWAITING_APPROVAL",
        Outcome::Denied => "DENIED",
        Outcome::Claimed | Outcome::Replayed => "SUCCEEDED",
    }
}

/// The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), unless it is all
/// zeros (invalid, as the recommendation says).
fn trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let (_version, trace) = (parts.next()?, parts.next()?);
    (trace.len() == 32
        && trace
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && trace.bytes().any(|b| b != b'0'))
    .then_some(trace)
}

/// The JSON-RPC error for a call the ledger refused or could not record: its arguments are
/// wrong (`INVALID_PARAMS`), or the ledger cannot be reached (then the call was not sent).
fn refusal(id: &Value, e: &LedgerError) -> Value {
    match e {
        LedgerError::InvalidArgument { .. } | LedgerError::KeyReused => rpc::error(
            Some(id),
            rpc::INVALID_PARAMS,
            &format!("the call was neither recorded nor sent: {e}"),
        ),
        _ => rpc::error(
            Some(id),
            rpc::UNAVAILABLE,
            &format!(
                "the idempotency ledger could not record the call, so it was not sent ({e}); \
                 it is safe to try again"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_gives_its_trace_id_unless_it_is_invalid() {
        assert_eq!(
            trace_id("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(
            trace_id("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            None
        );
        assert_eq!(trace_id("00-XYZ-00f067aa0ba902b7-01"), None);
        assert_eq!(trace_id("garbage"), None);
    }
}
