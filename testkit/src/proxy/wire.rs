//! PostgreSQL's wire protocol, read just enough for the cuts: message framing in both
//! directions, which prepared statements and portals write `ledger_entries`, where a batch
//! with a write ends, and where the connection is (startup, TLS, authentication, ready).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::Phase;
use super::link::Link;

/// Splits a byte stream into PostgreSQL messages.
#[derive(Default)]
struct Framer {
    buf: Vec<u8>,
}

impl Framer {
    /// Appends `data` and hands each complete message to `each` as (tag, body); `untagged`
    /// says whether the next message has no tag byte (startup phase).
    fn feed(
        &mut self,
        data: &[u8],
        mut untagged: impl FnMut() -> Untagged,
        mut each: impl FnMut(u8, &[u8]),
    ) {
        self.buf.extend_from_slice(data);
        let mut at = 0;
        loop {
            let rest = &self.buf[at..];
            let (tag, header) = match untagged() {
                Untagged::One => {
                    // A single byte answer (the server's reply to SSLRequest).
                    let Some(&b) = rest.first() else { break };
                    each(b, &[]);
                    at += 1;
                    continue;
                }
                Untagged::Length => (0u8, 4usize),
                Untagged::No => (rest.first().copied().unwrap_or(0), 5usize),
            };
            if rest.len() < header {
                break;
            }
            let len_at = header - 4;
            let len = u32::from_be_bytes([
                rest[len_at],
                rest[len_at + 1],
                rest[len_at + 2],
                rest[len_at + 3],
            ]) as usize;
            let total = len_at + len.max(4);
            if rest.len() < total {
                break;
            }
            each(tag, &rest[header..total]);
            at += total;
        }
        self.buf.drain(..at);
    }
}

enum Untagged {
    /// Tagged messages.
    No,
    /// A length-prefixed message without tag (startup, SSLRequest, CancelRequest).
    Length,
    /// One raw byte.
    One,
}

/// The client's side of the protocol, reduced to what the cuts need.
#[derive(Default)]
pub(super) struct Frontend {
    framer: Framer,
    started: bool,
    /// Prepared statement name → whether it writes `ledger_entries`.
    statements: HashMap<String, bool>,
    /// Portal name → whether its statement writes.
    portals: HashMap<String, bool>,
    /// An `Execute` of a write since the last `Sync`.
    write_in_batch: bool,
}

impl Frontend {
    /// Feeds client bytes; returns how many write requests they completed (a `Sync` after an
    /// `Execute` of a write, or a simple `Query` of a write).
    pub(super) fn feed(&mut self, data: &[u8], link: &Link) -> usize {
        let mut writes = 0;
        let Frontend {
            framer,
            started,
            statements,
            portals,
            write_in_batch,
        } = self;
        let started_flag = std::cell::Cell::new(*started);
        framer.feed(
            data,
            || {
                if started_flag.get() {
                    Untagged::No
                } else {
                    Untagged::Length
                }
            },
            |tag, body| {
                if !started_flag.get() {
                    // body: protocol version or request code, then parameters.
                    let code = body
                        .get(..4)
                        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                        .unwrap_or(0);
                    match code {
                        80_877_103 => {
                            link.ssl_requested.store(true, Ordering::SeqCst);
                            link.enter(Phase::SslAnswer);
                        }
                        // GSSENCRequest and CancelRequest: more untagged traffic or none.
                        80_877_104 | 80_877_102 => {}
                        _ => started_flag.set(true),
                    }
                    return;
                }
                match tag {
                    b'P' => {
                        let mut fields = body.split(|b| *b == 0);
                        let name = fields.next().unwrap_or_default();
                        let query = fields.next().unwrap_or_default();
                        statements.insert(lossy(name), is_write(query));
                    }
                    b'B' => {
                        let mut fields = body.split(|b| *b == 0);
                        let portal = fields.next().unwrap_or_default();
                        let statement = fields.next().unwrap_or_default();
                        let write = statements.get(&lossy(statement)).copied().unwrap_or(false);
                        portals.insert(lossy(portal), write);
                    }
                    b'E' => {
                        let portal = body.split(|b| *b == 0).next().unwrap_or_default();
                        if portals.get(&lossy(portal)).copied().unwrap_or(false) {
                            *write_in_batch = true;
                        }
                    }
                    b'S' => writes += usize::from(std::mem::take(write_in_batch)),
                    b'Q' => writes += usize::from(is_write(body)),
                    b'C' => {
                        // Close: 'S' statement or 'P' portal, then its name.
                        if let Some((&kind, name)) = body.split_first() {
                            let name = lossy(name.split(|b| *b == 0).next().unwrap_or_default());
                            if kind == b'S' {
                                statements.remove(&name);
                            } else {
                                portals.remove(&name);
                            }
                        }
                    }
                    _ => {}
                }
            },
        );
        *started = started_flag.get();
        writes
    }
}

/// The server's side of the protocol: counts `ReadyForQuery` messages.
#[derive(Default)]
pub(super) struct Backend {
    framer: Framer,
    /// The one-byte answer to an SSLRequest was seen (or none was asked for).
    ssl_answered: bool,
    /// The server accepted TLS: the stream is opaque from here on.
    opaque: bool,
}

impl Backend {
    pub(super) fn feed(&mut self, data: &[u8], link: &Link) -> usize {
        if self.opaque {
            return 0;
        }
        let mut ready = 0;
        let awaiting_ssl =
            std::cell::Cell::new(!self.ssl_answered && link.ssl_requested.load(Ordering::SeqCst));
        let opaque = std::cell::Cell::new(false);
        self.framer.feed(
            data,
            || {
                if awaiting_ssl.get() {
                    Untagged::One
                } else {
                    Untagged::No
                }
            },
            |tag, body| {
                if awaiting_ssl.get() {
                    awaiting_ssl.set(false);
                    opaque.set(tag == b'S');
                    link.enter(if tag == b'S' {
                        Phase::Tls
                    } else {
                        Phase::Startup
                    });
                } else if tag == b'Z' {
                    ready += 1;
                    link.enter(Phase::Ready);
                } else if tag == b'R' {
                    // An authentication request: code 0 is AuthenticationOk.
                    let ok = body.get(..4) == Some(&[0, 0, 0, 0][..]);
                    link.enter(if ok {
                        Phase::Startup
                    } else {
                        Phase::Authentication
                    });
                }
            },
        );
        if link.ssl_requested.load(Ordering::SeqCst) && !awaiting_ssl.get() {
            self.ssl_answered = true;
        }
        if opaque.get() {
            self.opaque = true;
            self.framer.buf.clear();
        }
        ready
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether a statement's text writes the ledger's table (the statements a cut must hit: claims'
/// inserts, completions, replays, restarts), or is a COMMIT.
fn is_write(query: &[u8]) -> bool {
    let text = String::from_utf8_lossy(query).to_ascii_uppercase();
    let verb = text.trim_start();
    if verb.starts_with("COMMIT") {
        return true;
    }
    text.contains("LEDGER_ENTRIES")
        && (verb.starts_with("INSERT")
            || verb.starts_with("UPDATE")
            || verb.starts_with("DELETE")
            || (verb.starts_with("WITH") && (text.contains("UPDATE") || text.contains("DELETE"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&u32::try_from(body.len() + 4).unwrap().to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn a_sync_after_a_write_execute_counts_once_across_chunk_boundaries() {
        let link = Link::default();
        let mut f = Frontend::default();
        let mut startup = 8u32.to_be_bytes().to_vec();
        startup.extend_from_slice(&196_608u32.to_be_bytes());
        assert_eq!(f.feed(&startup, &link), 0);
        let mut stream = Vec::new();
        stream.extend(tagged(b'P', b"s1\0UPDATE ledger_entries SET x = 1\0\0\0"));
        stream.extend(tagged(b'B', b"\0s1\0\0\0\0\0\0\0"));
        stream.extend(tagged(b'E', b"\0\0\0\0\0"));
        stream.extend(tagged(b'S', b""));
        stream.extend(tagged(b'P', b"s2\0SELECT 1\0\0\0"));
        stream.extend(tagged(b'B', b"\0s2\0\0\0\0\0\0\0"));
        stream.extend(tagged(b'E', b"\0\0\0\0\0"));
        stream.extend(tagged(b'S', b""));
        let (a, b) = stream.split_at(7);
        assert_eq!(f.feed(a, &link) + f.feed(b, &link), 1);
    }
}
