//! The console's HTML: the page frame and its one stylesheet, written with maud's `html!`,
//! which escapes every value spliced into it (keys, runs, tools, arguments, results, errors
//! and principals are the callers' text); and how times, ages, JSON and bytes are shown.

use base64::Engine as _;
use maud::{DOCTYPE, Markup, PreEscaped, Render, html};

use crate::domain::Micros;

/// The console's whole stylesheet, inline in every page: the Content-Security-Policy allows
/// exactly this text (by its hash), and nothing is downloaded.
pub const CSS: &str = "
:root{color-scheme:light;--ink:#1d2430;--mute:#5d6675;--line:#d8dde5;--bg:#f6f7f9;--card:#fff;--warn:#b3261e;--ok:#1b6e3a;--accent:#2456a6}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;color:var(--ink);background:var(--bg)}
header{display:flex;align-items:center;gap:20px;padding:10px 24px;background:#1d2430;color:#fff}
header .brand{font-weight:600;letter-spacing:.02em}
header nav{display:flex;gap:4px;flex:1}
header nav a{color:#c9d3e3;text-decoration:none;padding:6px 10px;border-radius:4px}
header nav a.on{background:#34405a;color:#fff}
header .who{color:#c9d3e3;display:flex;gap:10px;align-items:center}
header .who button{background:none;border:1px solid #56627a;color:#c9d3e3;border-radius:4px;padding:3px 8px;cursor:pointer}
main{padding:20px 24px;max-width:1280px}
h1{font-size:20px;margin:0 0 6px}
h2{font-size:16px;margin:22px 0 8px}
p.lead{color:var(--mute);margin:0 0 16px}
.flash{padding:10px 14px;border-radius:4px;margin:0 0 16px;background:#e8f3ec;border:1px solid #b7dcc4}
.flash.bad{background:#fbeceb;border-color:#efc2bf}
table{border-collapse:collapse;width:100%;background:var(--card);border:1px solid var(--line)}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{background:#eef1f5;font-weight:600;font-size:13px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.mono{white-space:nowrap}
code,pre,.mono{font-family:ui-monospace,'DejaVu Sans Mono',Menlo,Consolas,monospace;font-size:12.5px}
pre{background:var(--card);border:1px solid var(--line);padding:10px;overflow:auto;max-height:480px;white-space:pre-wrap;word-break:break-all;margin:0}
a{color:var(--accent)}
.badge{display:inline-block;padding:1px 7px;border-radius:10px;font-size:12px;font-weight:600;border:1px solid}
.s-UNKNOWN{color:var(--warn);border-color:var(--warn)}
.s-ATTEMPTING{color:#8a5a00;border-color:#8a5a00}
.s-SUCCEEDED{color:var(--ok);border-color:var(--ok)}
.s-FAILED{color:#6b4b9a;border-color:#6b4b9a}
dl.fields{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;background:var(--card);border:1px solid var(--line);padding:12px;margin:0}
dl.fields dt{color:var(--mute)}
dl.fields dd{margin:0;word-break:break-all}
form.filters{display:flex;flex-wrap:wrap;gap:10px;align-items:end;background:var(--card);border:1px solid var(--line);padding:10px;margin:0 0 14px}
form.filters label,form.resolve label{display:flex;flex-direction:column;font-size:12px;color:var(--mute);gap:2px}
input,select,textarea{font:inherit;padding:4px 6px;border:1px solid #b9c1cc;border-radius:3px;background:#fff;color:var(--ink)}
textarea{font-family:ui-monospace,'DejaVu Sans Mono',Menlo,Consolas,monospace;font-size:12.5px;width:100%}
button{font:inherit;padding:5px 12px;border-radius:4px;border:1px solid var(--accent);background:var(--accent);color:#fff;cursor:pointer}
details>summary{cursor:pointer;color:var(--accent)}
form.resolve{display:flex;flex-direction:column;gap:8px;padding:8px 0;min-width:320px}
form.resolve fieldset{border:1px solid var(--line);padding:6px 10px;margin:0;display:flex;flex-direction:column;gap:3px}
form.resolve fieldset label{flex-direction:row;gap:6px;color:var(--ink);font-size:13px}
.card{background:var(--card);border:1px solid var(--line);padding:12px 14px;margin:0 0 14px}
ol.timeline{margin:0;padding-left:20px}
ol.timeline li{margin:2px 0}
.muted{color:var(--mute)}
.warn{color:var(--warn);font-weight:600}
h2.bad,b.bad{color:var(--warn)}
form.decide .buttons{display:flex;gap:8px}
form.decide button.deny{background:var(--warn);border-color:var(--warn)}
.double-effect{border-left:4px solid var(--warn)}
.signin{max-width:420px;margin:40px auto}
.signin form{display:flex;flex-direction:column;gap:10px}
.signin label{display:flex;flex-direction:column;gap:3px;font-size:13px;color:var(--mute)}
.chart{margin:0 0 6px}
.chart svg{background:var(--card);border:1px solid var(--line);max-width:100%;height:auto}
.legend{display:flex;gap:16px;font-size:12px;color:var(--mute);margin:4px 0 18px}
.legend span::before{content:'';display:inline-block;width:10px;height:10px;margin-right:5px;vertical-align:-1px}
.legend .l-claims::before{background:#c9d0da}
.legend .l-replays::before{background:#2456a6}
.legend .l-ratio::before{background:#e07b00;height:3px;vertical-align:3px}
.legend .l-alarm::before{background:#f4c7c3}
.legend .l-reuse::before{background:#b3261e}
.pager{margin:10px 0}
";

/// `text` with each control character (but tab, line feed and carriage return) shown as its
/// Unicode picture (`␀` for NUL; U+FFFD for C1), which a page cannot hold and which would hide
/// or reorder text. Applied to a whole page once written (by `respond::html`): the
/// console's own markup has none, so only callers' text changes. Not an escape: maud has
/// escaped every value already, and a picture is not markup.
pub fn visible(page: String) -> String {
    if !page.chars().any(hidden) {
        return page;
    }
    page.chars()
        .map(|c| match u32::from(c) {
            _ if !hidden(c) => c,
            n @ 0..=0x1f => char::from_u32(0x2400 + n).unwrap_or('\u{fffd}'),
            0x7f => '\u{2421}',
            _ => '\u{fffd}',
        })
        .collect()
}

fn hidden(c: char) -> bool {
    c.is_control() && !matches!(c, '\t' | '\n' | '\r')
}

/// A path with the query string of `pairs` (percent-encoded): `/entries?a=1&b=2`, or `path`
/// alone when every value is empty.
pub fn with_query(path: &str, pairs: &[(&str, &str)]) -> String {
    let mut serializer = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        if !value.is_empty() {
            serializer.append_pair(name, value);
        }
    }
    let encoded = serializer.finish();
    if encoded.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{encoded}")
    }
}

/// The path of an entry's page, percent-encoded (for a link or a redirect's `Location`).
pub fn entry_path(key: &str) -> String {
    with_query("/entry", &[("key", key)])
}

/// Where the page is, for the navigation bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nav {
    /// The landing page: what needs a person.
    Attention,
    /// The calls awaiting a person's decision.
    Approvals,
    /// The entries, by filter or search.
    Entries,
    /// The replay rate.
    Replays,
    /// No tab (sign-in, errors).
    None,
}

/// Who is looking, for the header: their tenant, and the sign-out form when they signed in.
pub struct Viewer<'a> {
    /// The tenant whose entries the pages show.
    pub tenant: &'a str,
    /// The session's CSRF token, for the sign-out form; `None` when there is no sign-in
    /// (no credentials configured).
    pub sign_out_csrf: Option<&'a str>,
}

/// A whole page: the frame, the navigation, an optional flash message, and `body`.
pub fn page(
    title: &str,
    nav: Nav,
    viewer: Option<&Viewer<'_>>,
    flash: Option<&Flash>,
    body: Markup,
) -> Markup {
    let tabs = [
        (Nav::Attention, "/", "Needs a person"),
        (Nav::Approvals, "/approvals", "Awaiting approval"),
        (Nav::Entries, "/entries", "Entries"),
        (Nav::Replays, "/replay-rate", "Replay rate"),
    ];
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · idempotency-ledger" }
                // The Content-Security-Policy allows exactly this text, by its hash.
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    span class="brand" { "idempotency-ledger" }
                    @if let Some(viewer) = viewer {
                        nav {
                            @for (tab, href, label) in tabs {
                                a href=(href) class=[(tab == nav).then_some("on")] { (label) }
                            }
                        }
                        span class="who" {
                            "tenant " b { (viewer.tenant) }
                            @if let Some(csrf) = viewer.sign_out_csrf {
                                form method="post" action="/signout" {
                                    (csrf_field(csrf))
                                    button type="submit" { "Sign out" }
                                }
                            }
                        }
                    }
                }
                main {
                    @if let Some(flash) = flash {
                        p class=(if flash.good { "flash" } else { "flash bad" }) { (flash.text) }
                    }
                    (body)
                }
            }
        }
    }
}

/// The hidden field that carries the session's CSRF token back with a form.
pub fn csrf_field(csrf: &str) -> Markup {
    hidden_field("csrf", csrf)
}

/// A hidden form field.
pub fn hidden_field(name: &str, value: impl Render) -> Markup {
    html! { input type="hidden" name=(name) value=(value); }
}

/// A message shown once at the top of the next page (after a form's redirect).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flash {
    /// What happened.
    pub text: String,
    /// Whether it went as asked (else it is shown as a warning).
    pub good: bool,
}

/// An instant as RFC 3339 in UTC, to the second (`2026-11-30T06:00:00Z`).
pub fn time(m: Micros) -> String {
    prost_types::Timestamp {
        seconds: m.0.div_euclid(1_000_000),
        nanos: 0,
    }
    .to_string()
}

/// An instant as RFC 3339 in UTC, to the microsecond, as stored.
pub fn precise_time(m: Micros) -> String {
    prost_types::Timestamp {
        seconds: m.0.div_euclid(1_000_000),
        nanos: i32::try_from(m.0.rem_euclid(1_000_000) * 1000).unwrap_or(0),
    }
    .to_string()
}

/// A span of time in its two largest units: `45s`, `12m 3s`, `3h 20m`, `2d 4h`.
pub fn span(d: Micros) -> String {
    let s = d.0.max(0) / 1_000_000;
    let (days, hours, minutes, seconds) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    let two = |big: i64, big_unit: &str, small: i64, small_unit: &str| {
        if small == 0 {
            format!("{big}{big_unit}")
        } else {
            format!("{big}{big_unit} {small}{small_unit}")
        }
    };
    if days > 0 {
        two(days, "d", hours, "h")
    } else if hours > 0 {
        two(hours, "h", minutes, "m")
    } else if minutes > 0 {
        two(minutes, "m", seconds, "s")
    } else {
        format!("{seconds}s")
    }
}

/// `text` re-indented two spaces a level, when it is JSON; strings and numbers are kept
/// exactly as written (no parse and print: a number's spelling and a member's order are what
/// was stored). `None` when it is not JSON.
pub fn pretty_json(text: &str) -> Option<String> {
    serde_json::from_str::<serde::de::IgnoredAny>(text).ok()?;
    let mut out = String::with_capacity(text.len() * 2);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = text.chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    };
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                // An empty object or array stays on one line.
                while chars.peek().is_some_and(|c| c.is_ascii_whitespace()) {
                    chars.next();
                }
                let close = if c == '{' { '}' } else { ']' };
                if chars.peek() == Some(&close) {
                    chars.next();
                    out.push(c);
                    out.push(close);
                } else {
                    out.push(c);
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_ascii_whitespace() => {}
            c => out.push(c),
        }
    }
    Some(out)
}

/// How a stored byte string is best shown.
#[derive(Debug, PartialEq, Eq)]
pub enum Shown {
    /// Nothing stored.
    Empty,
    /// JSON, re-indented ([`pretty_json`]).
    Json(String),
    /// UTF-8 text without control characters other than tab and line breaks.
    Text(String),
    /// Anything else: base64 of the whole, and hex of the first [`HEX_SHOWN`] bytes.
    Binary {
        /// Base64 (standard alphabet, padded) of every byte.
        base64: String,
        /// Hex of the first bytes, 32 a line.
        hex: String,
        /// How many bytes there are.
        len: usize,
    },
}

/// How many bytes of a binary value are shown in hex.
pub const HEX_SHOWN: usize = 4096;

/// `bytes` as [`Shown`].
pub fn shown(bytes: &[u8]) -> Shown {
    if bytes.is_empty() {
        return Shown::Empty;
    }
    if let Ok(text) = std::str::from_utf8(bytes) {
        if let Some(json) = pretty_json(text) {
            return Shown::Json(json);
        }
        if !text
            .chars()
            .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
        {
            return Shown::Text(text.to_string());
        }
    }
    let mut hex = String::new();
    for (i, line) in bytes[..bytes.len().min(HEX_SHOWN)].chunks(32).enumerate() {
        if i > 0 {
            hex.push('\n');
        }
        hex.push_str(&hex::encode(line));
    }
    Shown::Binary {
        base64: base64::engine::general_purpose::STANDARD.encode(bytes),
        hex,
        len: bytes.len(),
    }
}

/// [`Shown`] as markup: a label and a `<pre>` block.
pub fn shown_html(value: &Shown) -> Markup {
    match value {
        Shown::Empty => html! { p class="muted" { "(empty)" } },
        Shown::Json(json) => html! {
            p class="muted" { "JSON, indented for reading (strings and numbers as stored)" }
            pre { (json) }
        },
        Shown::Text(text) => html! { p class="muted" { "text" } pre { (text) } },
        Shown::Binary { base64, hex, len } => html! {
            p class="muted" { (len) " bytes that are not text: base64" }
            pre { (base64) }
            p class="muted" {
                "hex"
                @if *len > HEX_SHOWN { " (the first " (HEX_SHOWN) ")" }
            }
            pre { (hex) }
        },
    }
}

/// `text`, cut to `max` characters with `…` when longer.
pub fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_by_construction() {
        let page = page(
            "<t>",
            Nav::Attention,
            Some(&Viewer {
                tenant: "<b>acme</b>",
                sign_out_csrf: Some("\"><script>"),
            }),
            Some(&Flash {
                text: "<script>alert('x')</script> & \"y\"".into(),
                good: false,
            }),
            html! { p { ("<i>run</i>") } },
        )
        .into_string();
        for escaped in [
            "<title>&lt;t&gt; · idempotency-ledger</title>",
            "tenant <b>&lt;b&gt;acme&lt;/b&gt;</b>",
            "value=\"&quot;&gt;&lt;script&gt;\"",
            "&lt;script&gt;alert('x')&lt;/script&gt; &amp; &quot;y&quot;",
            "<p>&lt;i&gt;run&lt;/i&gt;</p>",
        ] {
            assert!(page.contains(escaped), "{escaped}: {page}");
        }
        assert!(page.contains(&format!("<style>{CSS}</style>")), "{page}");
    }

    #[test]
    fn control_characters_are_shown_as_pictures_but_line_breaks_stay() {
        assert_eq!(visible("a\0b\u{1b}c\u{7f}".into()), "a␀b␛c␡");
        assert_eq!(visible("a\u{85}b".into()), "a\u{fffd}b");
        assert_eq!(visible("a\tb\nc\r ü".into()), "a\tb\nc\r ü");
    }

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            with_query("/entry", &[("key", "a&b c\"<")]),
            "/entry?key=a%26b+c%22%3C"
        );
        assert_eq!(with_query("/e", &[("a", "1"), ("b", "2")]), "/e?a=1&b=2");
        assert_eq!(with_query("/e", &[("a", "")]), "/e");
    }

    #[test]
    fn json_is_reindented_without_changing_its_text() {
        let stored = r#"{"b":[1,2.50,{}],"a":"x, \"y\": {z}","n":1e400,"e":[]}"#;
        let pretty = pretty_json(stored).expect("json");
        assert_eq!(
            pretty,
            "{\n  \"b\": [\n    1,\n    2.50,\n    {}\n  ],\n  \"a\": \"x, \\\"y\\\": {z}\",\n  \
             \"n\": 1e400,\n  \"e\": []\n}"
        );
        // Nothing but whitespace outside strings was added.
        let squeeze = |t: &str| {
            let (mut out, mut in_string, mut escaped) = (String::new(), false, false);
            for c in t.chars() {
                if in_string || !c.is_ascii_whitespace() {
                    out.push(c);
                }
                if in_string && !escaped && c == '"' {
                    in_string = false;
                } else if !in_string && c == '"' {
                    in_string = true;
                }
                escaped = in_string && !escaped && c == '\\';
            }
            out
        };
        assert_eq!(squeeze(&pretty), stored);
        assert_eq!(pretty_json("not json"), None);
        assert_eq!(pretty_json("42").as_deref(), Some("42"));
    }

    #[test]
    fn bytes_are_shown_as_json_text_or_binary() {
        assert_eq!(shown(b""), Shown::Empty);
        assert_eq!(shown(b"{\"a\":1}"), Shown::Json("{\n  \"a\": 1\n}".into()));
        assert_eq!(shown(b"done\nok"), Shown::Text("done\nok".into()));
        let Shown::Binary { base64, hex, len } = shown(&[0xff, 0x00, 0x41]) else {
            panic!("binary")
        };
        assert_eq!((base64.as_str(), hex.as_str(), len), ("/wBB", "ff0041", 3));
        // Valid UTF-8 with a NUL is not shown as text.
        assert!(matches!(shown(b"a\0b"), Shown::Binary { .. }));
    }

    #[test]
    fn spans_use_their_two_largest_units() {
        let s = |secs: i64| span(Micros(secs * 1_000_000));
        assert_eq!(s(45), "45s");
        assert_eq!(s(723), "12m 3s");
        assert_eq!(s(12_000), "3h 20m");
        assert_eq!(s(2 * 86_400 + 4 * 3600 + 5), "2d 4h");
        assert_eq!(s(-5), "0s");
        assert_eq!(s(900), "15m");
        assert_eq!(s(86_400), "1d");
    }

    #[test]
    fn times_are_rfc_3339_in_utc() {
        let m = Micros(1_764_482_400_123_456);
        assert_eq!(time(m), "2025-11-30T06:00:00Z");
        assert_eq!(precise_time(m), "2025-11-30T06:00:00.123456Z");
    }
}
