//! A gated call decided by the person at the client (`--approvals-at-client`): the gateway
//! shows the person a form (the tool and its exact arguments: approve or not, and why), and the
//! answer is a Decide, under the gateway's authority, bound to the fingerprint of what the
//! person was shown; then the call goes on, and acts once approved.
//!
//! On the stateless revision (2026-07-28), a client that says it can show a form is answered
//! with `input_required`; it shows the form and calls again with the answer (`inputResponses`)
//! and the gateway's `requestState` echoed. That state is the question, sealed (HMAC-SHA256
//! under a key only this gateway process holds): the tenant, the entry's key, the fingerprint
//! of the arguments shown, and the request it answers (its `requested_at`). An answer counts
//! only when its seal is intact and each of those is the call's and its entry's as they stand:
//! a "yes" the gateway never asked for, asked about other arguments or another call, or kept
//! from an earlier request (lapsed, or decided) decides nothing, and the person is asked
//! again. The model writes a call's arguments, never its `inputResponses`; and a yes is one
//! Decide: a decision taken stands, and the approval it gives is used once.
//!
//! On a session-based revision, a client that declared it can be asked is sent the form as the
//! gateway's own `elicitation/create` request inside the call (the transport's
//! [`Upstream::elicit`]); its answer is the response to that very request.

use std::fmt::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac as _};
use serde_json::{Value, json};
use sha2::Sha256;

use super::{Call, Gateway, Upstream};
use crate::domain::Tenant;
use crate::domain::approval::Decision;
use crate::domain::fields::Principal;
use crate::ledger::{ClaimInput, ClaimOutput, DecideInput, Outcome};
use crate::mcp::answers;
use crate::mcp::rpc;

/// The key of the gateway's question among a call's `inputRequests` and `inputResponses`.
pub const APPROVAL_INPUT: &str = "idempotency-ledger/approval";
/// What a sealed question (the gateway's `requestState`) starts with.
const SEALED: &str = "idempotency-ledger.approval.";

/// The key the gateway seals its questions with: random, this process's own.
pub struct Seal([u8; 32]);

impl Seal {
    /// A new random key.
    ///
    /// # Errors
    /// The operating system gave no randomness.
    pub fn random() -> Result<Seal, getrandom::Error> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key)?;
        Ok(Seal(key))
    }

    /// The key of a secret shared by replicas (a file's bytes, 32 or more); `None` when it
    /// is shorter.
    #[must_use]
    pub fn from_secret(secret: &[u8]) -> Option<Seal> {
        use sha2::Digest as _;
        (secret.len() >= 32).then(|| {
            let mut hash = Sha256::new();
            hash.update(b"idempotency-ledger mcp approvals seal\0");
            hash.update(secret);
            Seal(hash.finalize().into())
        })
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        Hmac::<Sha256>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!())
    }

    /// The question sealed, as the `requestState` the client echoes.
    fn seal(&self, question: &Question) -> String {
        let body = URL_SAFE_NO_PAD.encode(question.to_json().to_string());
        let mut mac = self.mac();
        mac.update(body.as_bytes());
        let tag = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{SEALED}{body}.{tag}")
    }

    /// The question a `requestState` holds, if this gateway sealed it and nobody changed it.
    fn open(&self, state: &str) -> Option<Question> {
        let (body, tag) = state.strip_prefix(SEALED)?.split_once('.')?;
        let mut mac = self.mac();
        mac.update(body.as_bytes());
        mac.verify_slice(&URL_SAFE_NO_PAD.decode(tag).ok()?).ok()?;
        let json: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(body).ok()?).ok()?;
        Question::from_json(&json)
    }
}

/// Whether a `requestState` is the gateway's (and not the upstream's own).
#[must_use]
pub fn is_gateways(state: &str) -> bool {
    state.starts_with(SEALED)
}

/// What the person was asked: about which entry, which arguments, in which request.
#[derive(Debug, PartialEq, Eq)]
struct Question {
    tenant: String,
    key: String,
    fingerprint: String,
    requested_at: i64,
}

impl Question {
    fn to_json(&self) -> Value {
        json!({"t": self.tenant, "k": self.key, "f": self.fingerprint, "r": self.requested_at})
    }

    fn from_json(json: &Value) -> Option<Question> {
        Some(Question {
            tenant: json.get("t")?.as_str()?.to_string(),
            key: json.get("k")?.as_str()?.to_string(),
            fingerprint: json.get("f")?.as_str()?.to_string(),
            requested_at: json.get("r")?.as_i64()?,
        })
    }

    /// The question an entry awaiting a decision asks now.
    fn of(tenant: &Tenant, claimed: &ClaimOutput) -> Question {
        let entry = &claimed.entry.entry;
        Question {
            tenant: tenant.as_str().to_string(),
            key: entry.key.as_str().to_string(),
            fingerprint: entry.fingerprint.clone(),
            requested_at: entry.approval.requested_at.map_or(0, |at| at.0),
        }
    }
}

/// A client's answer to the gateway's question, as its repeated call carries it.
#[derive(Clone, Debug, Default)]
pub struct PersonAnswer {
    /// The `requestState` it echoed (the sealed question).
    state: String,
    /// Its response to the question (an `ElicitResult`), if it gave one.
    response: Option<Value>,
}

impl PersonAnswer {
    /// Takes the gateway's parts out of a `tools/call`'s `params` (the sealed question and the
    /// response to it), so that the upstream never sees them; `None` when it carries neither.
    pub fn take_from(params: &mut serde_json::Map<String, Value>) -> Option<PersonAnswer> {
        let response = match params.get_mut("inputResponses") {
            Some(Value::Object(responses)) => {
                let response = responses.remove(APPROVAL_INPUT);
                if responses.is_empty() {
                    params.remove("inputResponses");
                }
                response
            }
            _ => None,
        };
        let state = match params.get("requestState").and_then(Value::as_str) {
            Some(state) if is_gateways(state) => {
                let state = state.to_string();
                params.remove("requestState");
                state
            }
            _ => String::new(),
        };
        (response.is_some() || !state.is_empty()).then_some(PersonAnswer { state, response })
    }
}

/// Whether the client of `call` says it can show its user a form (the stateless revision's
/// per-request capabilities).
#[must_use]
pub fn can_be_asked(meta: &Value) -> bool {
    meta.pointer("/io.modelcontextprotocol~1clientCapabilities/elicitation")
        .is_some_and(Value::is_object)
}

/// The form that asks whether the call's arguments may act (`mode` named on the stateless
/// revision, where it is required).
fn form(call: &Call<'_>, claimed: &ClaimOutput, with_mode: bool) -> Value {
    let entry = &claimed.entry.entry;
    let shown = serde_json::to_string_pretty(&call.arguments).unwrap_or_default();
    let mut message = format!(
        "Allow {} to act with these arguments?\n{shown}\n",
        entry.tool.as_str()
    );
    let _ = write!(
        message,
        "Approving lets this call act once, with exactly these arguments (key {}).",
        entry.key.as_str()
    );
    let mut form = json!({
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {
                "approve": {
                    "type": "boolean",
                    "title": "Approve",
                    "description": "Let this call act, once",
                },
                "reason": {
                    "type": "string",
                    "title": "Reason",
                    "description": "Why (kept with the decision)",
                },
            },
            "required": ["approve"],
        },
    });
    if with_mode {
        form["mode"] = json!("form");
    }
    form
}

/// The person's decision and reason, from an accepted form (`approve`, `reason`) or a declined
/// question; `None` when the question was cancelled or the form holds no decision (nobody
/// decided).
fn decision_of(response: &Value) -> Option<(Decision, String)> {
    let reason = response
        .pointer("/content/reason")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match response.get("action").and_then(Value::as_str)? {
        "accept" => match response
            .pointer("/content/approve")
            .and_then(Value::as_bool)?
        {
            true => Some((Decision::Approve, reason.to_string())),
            false => Some((Decision::Deny, reason.to_string())),
        },
        "decline" => Some((Decision::Deny, "declined at the client".to_string())),
        _ => None,
    }
}

impl Gateway {
    /// A gated call awaiting a decision, with `--approvals-at-client`. A client of the
    /// stateless revision that can show a form is asked with `input_required`, and the answer
    /// its next round carries decides when it answers this very question; a session-based
    /// client that can be asked is sent the form (`elicitation/create`) and its answer
    /// decides. Then the call goes on: it acts once approved. A client that cannot be asked
    /// reads the awaiting note, and an approver decides elsewhere.
    pub(super) async fn at_client(
        &self,
        call: &Call<'_>,
        claimed: ClaimOutput,
        input: ClaimInput,
        upstream: &dyn Upstream,
        cancelled: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Option<Value>, Value> {
        let question = Question::of(&call.tenant, &claimed);
        let key = claimed.entry.entry.key.as_str().to_owned();
        let awaiting = || {
            Ok(Some(rpc::result(
                call.id,
                answers::not_done("AWAITING_APPROVAL", &claimed.note, &key),
            )))
        };
        let response = if can_be_asked(&call.meta) {
            let Some(answer) = &call.answer else {
                return Ok(Some(self.ask_person(call, &claimed, &question)));
            };
            if self.seal.open(&answer.state).as_ref() != Some(&question) {
                tracing::warn!(
                    key = claimed.entry.entry.key.log_prefix(),
                    tool = claimed.entry.entry.tool.as_str(),
                    "an answer to a question the gateway did not ask (of this call, its \
                     arguments and this request) decided nothing: the person is asked again"
                );
                return Ok(Some(self.ask_person(call, &claimed, &question)));
            }
            answer.response.clone()
        } else {
            tracing::info!(
                key = claimed.entry.entry.key.log_prefix(),
                tool = claimed.entry.entry.tool.as_str(),
                "a gated call: the person at the client is asked"
            );
            upstream
                .elicit(form(call, &claimed, false), cancelled.clone())
                .await
        };
        let Some((decision, reason)) = response.as_ref().and_then(decision_of) else {
            return awaiting();
        };
        let decided = self
            .backend
            .decide(
                &call.tenant,
                DecideInput {
                    key: claimed.entry.entry.key.clone(),
                    fingerprint: question.fingerprint.clone(),
                    decision,
                    reason,
                },
                &self.person_at_client(),
            )
            .await;
        match decided {
            Ok(done) => self.metrics.decided(decision, done.changed, done.took),
            // Lapsed meanwhile, decided by someone else, or the ledger is unreachable: what
            // stands is said by the next claim (or the refusal).
            Err(e) => {
                tracing::info!(error = %e, "the person's answer at the client was not recorded");
            }
        }
        let claimed = self.claim(call, input, None).await?;
        let key = claimed.entry.entry.key.as_str().to_owned();
        Ok(match claimed.outcome {
            Outcome::Claimed => self.act(call, claimed, upstream, cancelled).await,
            Outcome::Replayed => Some(rpc::result(
                call.id,
                answers::replayed(&claimed.entry.entry.result, &claimed.note, &key),
            )),
            outcome => Some(rpc::result(
                call.id,
                answers::not_done(super::status_told(outcome, &claimed), &claimed.note, &key),
            )),
        })
    }

    /// The `input_required` answer that asks the person whether the call's arguments may act.
    fn ask_person(&self, call: &Call<'_>, claimed: &ClaimOutput, question: &Question) -> Value {
        tracing::info!(
            key = claimed.entry.entry.key.log_prefix(),
            tool = claimed.entry.entry.tool.as_str(),
            "a gated call: the person at the client is asked"
        );
        rpc::result(
            call.id,
            json!({
                "resultType": "input_required",
                "inputRequests": {
                    APPROVAL_INPUT: {
                        "method": "elicitation/create",
                        "params": form(call, claimed, true),
                    },
                },
                "requestState": self.seal.seal(question),
            }),
        )
    }

    /// Who decides at the client: the person using the client the gateway serves, under the
    /// gateway's own authority (its credential decides).
    fn person_at_client(&self) -> Principal {
        let client = self.principal.load();
        let client = if client.as_str().is_empty() {
            "an MCP client"
        } else {
            client.as_str()
        };
        Principal::parse(&format!("person at {client}")).unwrap_or_else(|_| Principal::none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question() -> Question {
        Question {
            tenant: "default".into(),
            key: "k1".into(),
            fingerprint: "f1".into(),
            requested_at: 42,
        }
    }

    #[test]
    fn a_sealed_question_opens_only_under_its_own_key_and_unchanged() {
        let seal = Seal::random().expect("randomness");
        let state = seal.seal(&question());
        assert!(is_gateways(&state));
        assert_eq!(seal.open(&state), Some(question()));
        let other = Seal::random().expect("randomness");
        assert_eq!(other.open(&state), None, "another gateway's key");
        // Another question's body under this one's tag.
        let forged = seal.seal(&Question {
            fingerprint: "f2".into(),
            ..question()
        });
        let (body, _) = forged.rsplit_once('.').expect("a tag");
        let (_, tag) = state.rsplit_once('.').expect("a tag");
        assert_eq!(seal.open(&format!("{body}.{tag}")), None, "a changed body");
        assert_eq!(seal.open("idempotency-ledger.approval.e30"), None, "no tag");
        assert_eq!(seal.open("upstream's own state"), None);
    }

    #[test]
    fn the_answer_is_taken_out_of_the_call_and_read_as_a_decision() {
        let mut params = json!({
            "name": "send",
            "inputResponses": {
                APPROVAL_INPUT: {"action": "accept", "content": {"approve": true, "reason": "ok"}},
                "upstream's": {"action": "accept", "content": {}},
            },
            "requestState": "idempotency-ledger.approval.x.y",
        });
        let params = params.as_object_mut().expect("an object");
        let answer = PersonAnswer::take_from(params).expect("an answer");
        assert_eq!(
            answer.response.as_ref().and_then(decision_of),
            Some((Decision::Approve, "ok".into()))
        );
        assert_eq!(
            Value::Object(params.clone()),
            json!({"name": "send", "inputResponses": {"upstream's": {"action": "accept", "content": {}}}}),
            "the upstream's own parts stay"
        );
        let read = |response: Value| decision_of(&response);
        assert_eq!(
            read(json!({"action": "accept", "content": {"approve": false}})),
            Some((Decision::Deny, String::new()))
        );
        assert_eq!(
            read(json!({"action": "decline"})).map(|d| d.0),
            Some(Decision::Deny)
        );
        assert_eq!(read(json!({"action": "cancel"})), None);
        assert_eq!(
            read(json!({"action": "accept", "content": {"approve": "yes"}})),
            None,
            "not a boolean: nobody decided"
        );
        let mut upstreams = json!({"requestState": "the upstream's", "name": "send"});
        let upstreams = upstreams.as_object_mut().expect("an object");
        assert!(PersonAnswer::take_from(upstreams).is_none());
        assert_eq!(
            upstreams.get("requestState"),
            Some(&json!("the upstream's"))
        );
    }
}
