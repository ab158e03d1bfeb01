//! JSON-RPC 2.0 messages as the gateway reads and writes them: values it can pass on unchanged,
//! classified just enough to route them, and the errors it answers itself.
//!
//! The gateway keeps every message as the JSON value it arrived as: a message it does not
//! govern goes on with every member it had, those of revisions and extensions the gateway does
//! not know included (a typed model would drop them). It reads a `tools/call` with rmcp's
//! model, and writes the results it answers itself with it.

use serde_json::{Value, json};

/// JSON-RPC's "Parse error".
pub const PARSE_ERROR: i64 = -32700;
/// "Invalid Request".
pub const INVALID_REQUEST: i64 = -32600;
/// "Method not found".
pub const METHOD_NOT_FOUND: i64 = -32601;
/// "Invalid params".
pub const INVALID_PARAMS: i64 = -32602;
/// "Internal error": kept for the gateway's own faults (a bug), never for the ledger's or the
/// upstream's state.
pub const INTERNAL_ERROR: i64 = -32603;
/// A server error in the range JSON-RPC leaves to implementations: the ledger or the upstream
/// cannot be reached, so the call was not sent (or its fate is told in the message).
pub const UNAVAILABLE: i64 = -32001;

/// A message, routed by its shape.
#[derive(Debug, PartialEq)]
pub enum Kind<'a> {
    /// A request: it has an id and a method.
    Request {
        /// Its id, as sent.
        id: &'a Value,
        /// Its method.
        method: &'a str,
    },
    /// A notification: a method without an id.
    Notification {
        /// Its method.
        method: &'a str,
    },
    /// A response: an id with a result or an error.
    Response {
        /// The id of the request it answers.
        id: &'a Value,
    },
    /// Several messages in one (JSON-RPC batches, of the 2025-03-26 revision only).
    Batch,
    /// Not a JSON-RPC 2.0 message: why.
    Invalid(&'static str),
}

/// What `message` is.
#[must_use]
pub fn kind(message: &Value) -> Kind<'_> {
    if message.is_array() {
        return Kind::Batch;
    }
    let Some(object) = message.as_object() else {
        return Kind::Invalid("a message is a JSON object");
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Kind::Invalid("a message carries \"jsonrpc\": \"2.0\"");
    }
    let id = object
        .get("id")
        .filter(|id| id.is_string() || id.is_number());
    match (object.get("method"), id) {
        (Some(Value::String(method)), Some(id)) => Kind::Request { id, method },
        (Some(Value::String(method)), None) if !object.contains_key("id") => {
            Kind::Notification { method }
        }
        (Some(_), _) => Kind::Invalid("a request's method is a text and its id a text or number"),
        (None, Some(id)) if object.contains_key("result") || object.contains_key("error") => {
            Kind::Response { id }
        }
        (None, _) => Kind::Invalid("a message is a request, a notification or a response"),
    }
}

/// Whether a JSON-RPC error says the request was refused before anything ran: it did not parse,
/// was not a request, named no such method, or its params were refused (an unknown tool,
/// arguments its schema refuses). Any other error may come after the tool acted.
#[must_use]
pub fn refused_before_acting(error: &Value) -> bool {
    matches!(
        error.get("code").and_then(Value::as_i64),
        Some(PARSE_ERROR | INVALID_REQUEST | METHOD_NOT_FOUND | INVALID_PARAMS)
    )
}

/// The key a request is known by while it waits for its answer: its id as JSON text, so that
/// `1` and `"1"` stay two requests.
#[must_use]
pub fn id_key(id: &Value) -> String {
    id.to_string()
}

/// A response with `result` to the request `id`.
#[must_use]
pub fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// An error response to the request `id` (null when the id could not be read).
#[must_use]
pub fn error(id: Option<&Value>, code: i64, message: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id.cloned().unwrap_or(Value::Null),
        "error": {"code": code, "message": message},
    })
}

/// A request the gateway sends itself, with an id no client uses (its own prefix and number).
#[must_use]
pub fn own_request(n: u64, method: &str, params: Value) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": own_id(n),
        "method": method,
        "params": params,
    })
}

/// The id of the gateway's own `n`th request.
#[must_use]
pub fn own_id(n: u64) -> Value {
    Value::String(format!("idempotency-ledger-gateway:{n}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_told_apart_by_their_shape() {
        let request = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call"});
        assert_eq!(
            kind(&request),
            Kind::Request {
                id: &json!(7),
                method: "tools/call"
            }
        );
        let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled"});
        assert_eq!(
            kind(&note),
            Kind::Notification {
                method: "notifications/cancelled"
            }
        );
        let answer = json!({"jsonrpc": "2.0", "id": "a", "result": {}});
        assert_eq!(kind(&answer), Kind::Response { id: &json!("a") });
        assert_eq!(kind(&json!([request])), Kind::Batch);
        for bad in [
            json!("text"),
            json!({"id": 1, "method": "x"}),
            json!({"jsonrpc": "1.0", "id": 1, "method": "x"}),
            json!({"jsonrpc": "2.0", "id": {"a": 1}, "method": "x"}),
            json!({"jsonrpc": "2.0", "method": 3}),
            json!({"jsonrpc": "2.0", "id": 1}),
        ] {
            assert!(matches!(kind(&bad), Kind::Invalid(_)), "{bad}");
        }
        assert_ne!(id_key(&json!(1)), id_key(&json!("1")));
    }
}
