//! Answers and the headers every answer carries.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use maud::{Markup, html};

use super::html::{Flash, Nav, page, visible};

/// Sets the headers of every answer: no framing, no sniffing, no referrer beyond this
/// console (keys are in URLs; within it, browsers then send `Origin` with a form, which
/// `no-referrer` would make `null`), no caching (pages hold entries), and the
/// Content-Security-Policy.
pub fn secure(answer: &mut Response, csp: &HeaderValue) {
    let headers = answer.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, csp.clone());
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
}

/// An HTML page with `status`.
pub fn html(status: StatusCode, page: Markup) -> Response {
    let content_type = [(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    )];
    (status, content_type, visible(page.into_string())).into_response()
}

/// A short page that only says `message`.
pub fn plain(status: StatusCode, message: &str) -> Response {
    let title = status.canonical_reason().unwrap_or("Error");
    let body = html! { h1 { (title) } p { (message) } };
    html(status, page(title, Nav::None, None, None, body))
}

/// 403 with `message`; nothing was changed.
pub fn forbidden(message: &str) -> Response {
    plain(StatusCode::FORBIDDEN, message)
}

/// 303 to `location` (a path of this console).
pub fn redirect(location: &str) -> Response {
    let location = if location.starts_with('/') && !location.starts_with("//") {
        location
    } else {
        "/"
    };
    match HeaderValue::from_str(location) {
        Ok(value) => (StatusCode::SEE_OTHER, [(header::LOCATION, value)]).into_response(),
        Err(_) => StatusCode::SEE_OTHER.into_response(),
    }
}

/// A flash message that went as asked.
pub fn good(text: impl Into<String>) -> Flash {
    Flash {
        text: text.into(),
        good: true,
    }
}

/// A flash message that did not.
pub fn bad(text: impl Into<String>) -> Flash {
    Flash {
        text: text.into(),
        good: false,
    }
}
