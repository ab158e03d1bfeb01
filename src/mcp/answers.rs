//! What the client receives for a governed `tools/call`, each a normal `CallToolResult` the model
//! can act on: the upstream's own result when this call acted; on a repeat, the stored result
//! marked `_meta["idempotency-ledger/replayed"]` with the ledger's note as its last text block;
//! and for every outcome where nothing was done now (in flight, unknown, awaiting a person,
//! denied, failed for good), the ledger's note as an error result, so that the model reads it
//! and does not take the call as done.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Map, Value};

/// The `_meta` key that marks a replayed result.
pub const REPLAYED: &str = "idempotency-ledger/replayed";
/// The `_meta` key of the ledger's note for the model.
pub const NOTE: &str = "idempotency-ledger/note";
/// The `_meta` key of the entry's status as the ledger tells it.
pub const STATUS: &str = "idempotency-ledger/status";
/// The `_meta` key of the entry's key (what an operator settles it by).
pub const KEY: &str = "idempotency-ledger/key";
/// The `_meta` key a client sets on a call to name its run.
pub const RUN: &str = "idempotency-ledger/run";

/// The note when this very call's answer was lost: the upstream acted or not, nobody knows.
pub const LOST_NOTE: &str = "The outcome of this action is unknown: the tool's server did not \
    answer it. It was not sent again and will not be; it is being verified. Do not repeat it \
    and do not try other ways to do it; tell the user its outcome is being checked.";

/// The stored result of an earlier success, as a repeat receives it: the same result, marked
/// replayed, with the note as one more text block (what the model reads). A stored result that
/// is not a JSON object (written by something else than the gateway) is carried as text.
#[must_use]
pub fn replayed(stored: &[u8], note: &str, key: &str) -> Value {
    let mut result = match serde_json::from_slice::<Value>(stored) {
        Ok(Value::Object(object)) => Value::Object(object),
        _ => plain_text(&String::from_utf8_lossy(stored)),
    };
    if let Some(content) = result
        .as_object_mut()
        .map(|o| {
            o.entry("content")
                .or_insert_with(|| Value::Array(Vec::new()))
        })
        .and_then(Value::as_array_mut)
    {
        content.push(text_block(note));
    }
    mark(&mut result, "SUCCEEDED", note, key);
    if let Some(meta) = meta_of(&mut result) {
        meta.insert(REPLAYED.to_string(), Value::Bool(true));
    }
    // A result stored from a session-based call lacks the stateless revision's `resultType`,
    // which a client of that revision requires; a session-based client takes it as any other
    // member (results are open to more).
    if let Some(object) = result.as_object_mut() {
        object
            .entry("resultType")
            .or_insert_with(|| Value::String("complete".to_string()));
    }
    result
}

/// What stands for the result of a call that acted but whose answer was lost, once its paired
/// read found the effect: the note and the read's text, as an error result with the status
/// SUCCEEDED. An error result, because it is not the tool's own result: a client checks a
/// normal result against the tool's output schema, which the read's answer does not follow.
#[must_use]
pub fn performed_without_result(read: &Value, note: &str, key: &str) -> Value {
    let mut blocks = vec![ContentBlock::text(note)];
    blocks.extend(
        read.get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .map(|t| ContentBlock::text(t.to_string())),
    );
    let mut result =
        serde_json::to_value(CallToolResult::error(blocks)).unwrap_or_else(|_| plain_text(note));
    mark(&mut result, "SUCCEEDED", note, key);
    result
}

/// An error result carrying `note` (nothing was done now): in flight, unknown, awaiting a
/// person, denied, failed for good, or not sent because the ledger could not answer.
#[must_use]
pub fn not_done(status: &str, note: &str, key: &str) -> Value {
    let mut result = serde_json::to_value(CallToolResult::error(vec![ContentBlock::text(note)]))
        .unwrap_or_else(|_| plain_text(note));
    mark(&mut result, status, note, key);
    result
}

/// The text a failure stores as its error: the text blocks of an `isError` result, or what
/// the upstream's JSON-RPC error said.
#[must_use]
pub fn error_text(result: &Value) -> String {
    let texts: Vec<&str> = result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    if texts.is_empty() {
        "the tool answered with an error".to_string()
    } else {
        texts.join("\n")
    }
}

/// Whether a result asks the client for input before the tool goes on (`resultType`
/// `input_required`, the stateless revision's multi-round trip).
#[must_use]
pub fn asks_for_input(result: &Value) -> bool {
    result.get("resultType").and_then(Value::as_str) == Some("input_required")
}

/// Whether a `CallToolResult` says the tool failed.
#[must_use]
pub fn is_error(result: &Value) -> bool {
    result.get("isError").and_then(Value::as_bool) == Some(true)
}

/// One text content block.
fn text_block(text: &str) -> Value {
    serde_json::to_value(ContentBlock::text(text))
        .unwrap_or_else(|_| serde_json::json!({"type": "text", "text": text}))
}

/// A result of one text block, for what cannot be built otherwise.
fn plain_text(text: &str) -> Value {
    serde_json::json!({"content": [{"type": "text", "text": text}]})
}

/// Sets the ledger's `_meta` members on `result`: its status, note and key.
fn mark(result: &mut Value, status: &str, note: &str, key: &str) {
    if let Some(meta) = meta_of(result) {
        meta.insert(STATUS.to_string(), Value::String(status.to_string()));
        meta.insert(NOTE.to_string(), Value::String(note.to_string()));
        meta.insert(KEY.to_string(), Value::String(key.to_string()));
    }
}

/// The result's `_meta` object, made if it has none (`None` when `result` is no object).
fn meta_of(result: &mut Value) -> Option<&mut Map<String, Value>> {
    let meta = result
        .as_object_mut()?
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut()
}

/// What kind of answer a `tools/call` got, for the metrics: `passed` (a tool that passes
/// live), `refused` (a JSON-RPC error), `asked` (a person at the client), `replayed`, `acted`
/// (the upstream's own result), `input_required` (the tool asks for input first), the status
/// the ledger told in lower case (or `failed` for the tool's own error result) (`attempting`,
/// `unknown`, `awaiting_approval`, `denied`, `failed`, `succeeded` for a paired read's find),
/// or `cancelled` (no answer).
#[must_use]
pub fn kind(answer: Option<&Value>, passes: bool) -> &'static str {
    let Some(answer) = answer else {
        return "cancelled";
    };
    let Some(result) = answer.get("result") else {
        return "refused";
    };
    if passes {
        return "passed";
    }
    if result.get("resultType").and_then(Value::as_str) == Some("input_required")
        && result
            .pointer("/inputRequests/idempotency-ledger~1approval")
            .is_some()
    {
        return "asked";
    }
    let meta = result.get("_meta");
    if meta.and_then(|m| m.get(REPLAYED)) == Some(&Value::Bool(true)) {
        return "replayed";
    }
    match meta.and_then(|m| m.get(STATUS)).and_then(Value::as_str) {
        Some("ATTEMPTING") => "attempting",
        Some("UNKNOWN") => "unknown",
        Some("AWAITING_APPROVAL") => "awaiting_approval",
        Some("DENIED") => "denied",
        Some("FAILED") => "failed",
        Some("SUCCEEDED") => "succeeded",
        _ if asks_for_input(result) => "input_required",
        _ if is_error(result) => "failed",
        _ => "acted",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_answer_is_counted_as_its_kind() {
        let result = |r: Value| Some(json!({"jsonrpc": "2.0", "id": 1, "result": r}));
        let told = |status: &str| result(not_done(status, "note", "k"));
        let own = result(json!({"content": []}));
        assert_eq!(kind(None, false), "cancelled");
        assert_eq!(
            kind(Some(&json!({"error": {"code": -32602}})), false),
            "refused"
        );
        assert_eq!(kind(own.as_ref(), true), "passed");
        assert_eq!(kind(own.as_ref(), false), "acted");
        assert_eq!(
            kind(result(replayed(b"{}", "note", "k")).as_ref(), false),
            "replayed"
        );
        assert_eq!(
            kind(
                result(json!({"resultType": "input_required",
                              "inputRequests": {"idempotency-ledger/approval": {}}}))
                .as_ref(),
                false
            ),
            "asked"
        );
        assert_eq!(
            kind(
                result(json!({"resultType": "input_required", "inputRequests": {"x": {}}}))
                    .as_ref(),
                false
            ),
            "input_required"
        );
        assert_eq!(
            kind(
                result(json!({"isError": true, "content": []})).as_ref(),
                false
            ),
            "failed"
        );
        for (status, counted) in [
            ("ATTEMPTING", "attempting"),
            ("UNKNOWN", "unknown"),
            ("AWAITING_APPROVAL", "awaiting_approval"),
            ("DENIED", "denied"),
            ("FAILED", "failed"),
            ("SUCCEEDED", "succeeded"),
        ] {
            assert_eq!(kind(told(status).as_ref(), false), counted);
        }
    }

    #[test]
    fn a_replay_is_the_stored_result_marked_with_the_note_last() {
        let stored = json!({
            "content": [{"type": "text", "text": "sent message m-1"}],
            "structuredContent": {"id": "m-1"},
            "_meta": {"upstream/own": 1},
        });
        let note = "This action was already performed; no new action was taken.";
        let out = replayed(stored.to_string().as_bytes(), note, "k-1");
        assert_eq!(out["structuredContent"], json!({"id": "m-1"}));
        assert_eq!(out["content"][0]["text"], "sent message m-1");
        assert_eq!(out["content"][1]["text"], note);
        assert_eq!(out["_meta"][REPLAYED], true);
        assert_eq!(
            out["_meta"]["upstream/own"], 1,
            "the upstream's own _meta stays"
        );
        assert_eq!(out["_meta"][KEY], "k-1");
        assert_eq!(
            out["resultType"], "complete",
            "what a stateless client requires"
        );
        assert!(!is_error(&out));
        // Something else stored: carried as text.
        let odd = replayed(b"plain bytes", note, "k-2");
        assert_eq!(odd["content"][0]["text"], "plain bytes");
        assert_eq!(odd["content"][1]["text"], note);
    }

    #[test]
    fn nothing_done_reads_as_an_error_with_the_note() {
        let out = not_done("UNKNOWN", LOST_NOTE, "k-3");
        assert!(is_error(&out));
        assert_eq!(out["content"][0]["text"], LOST_NOTE);
        assert_eq!(out["_meta"][STATUS], "UNKNOWN");
        assert_eq!(error_text(&out), LOST_NOTE);
        assert_eq!(
            error_text(&json!({"isError": true, "content": []})),
            "the tool answered with an error"
        );
    }
}
