//! The client half of the commands that talk to a running server: how to reach it
//! ([`Connection`], shared by every such command), a connected `Session`, why a command failed
//! and how that is told (stderr, exit status), and stdout that survives `| head`.
//!
//! Exit statuses: 0 success, 1 when the entry asked for does not exist, 2 any other failure (as
//! for clap's usage errors).

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request};

use crate::defaults::parse_duration;
use crate::grpc::pb::ledger_service_client::LedgerServiceClient;
use crate::proto::code_name;

/// Exit status of `entry KEY` when there is no entry with that key.
pub const EXIT_NOT_FOUND: u8 = 1;
/// Exit status of every other failure (connection, credential, a refused request).
pub const EXIT_FAILURE: u8 = 2;

/// How to reach the server: shared by every client command.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// The server's URL: `http://HOST:PORT`, or `https://HOST:PORT` for TLS (with --ca-cert).
    /// Without a scheme, `http://` is assumed.
    #[arg(long, env = "LEDGER_SERVER", default_value = "http://127.0.0.1:50051")]
    pub server: String,

    /// Bearer token of the tenant whose entries to read or change, sent as `authorization: Bearer TOKEN` (prefer the
    /// environment variable: a flag is visible in the process list).
    #[arg(long, env = "LEDGER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// PEM CA certificate that signed the server's TLS certificate (an https:// --server).
    #[arg(long, env = "LEDGER_CA_CERT")]
    pub ca_cert: Option<PathBuf>,

    /// PEM client certificate, for a server that requires mutual TLS (needs --client-key).
    #[arg(long, env = "LEDGER_CLIENT_CERT", requires = "client_key")]
    pub client_cert: Option<PathBuf>,

    /// PEM private key of --client-cert.
    #[arg(long, env = "LEDGER_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,

    /// The name the server's certificate is checked against, when it differs from the host of
    /// --server (a certificate for `localhost` reached by IP address).
    #[arg(long, env = "LEDGER_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,

    /// Deadline of connecting and of each call.
    #[arg(long, default_value = crate::defaults::shown(crate::defaults::CLIENT_TIMEOUT), value_parser = parse_duration)]
    pub timeout: Duration,
}

/// Why a command failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// The server answered with an error.
    Rpc(tonic::Status),
    /// The server could not be reached.
    Connect { server: String, detail: String },
    /// A flag's value cannot be used (a file that cannot be read, a malformed token).
    Usage(String),
    /// Writing the output failed (other than the reader going away).
    Output(std::io::Error),
    /// The server broke the protocol (the same page token twice, an answer without its entry).
    Protocol(String),
    /// There is no entry with the KEY given: the message says what was looked for.
    NoEntry(String),
    /// More than one entry matches a key prefix or an external_ref.
    Ambiguous {
        /// What was looked for.
        text: String,
        /// The first matching keys.
        keys: Vec<String>,
        /// How many entries matched.
        count: u64,
        /// How many entries were searched when the search stopped at its limit (then `count`
        /// is a lower bound); `None` when every entry of the tenant was.
        searched: Option<u64>,
    },
    /// The server left the entry as it was, for a reason the command tells as the server would
    /// have refused a `Complete` (`ALREADY_RESOLVED`, `LEASE_NOT_ENDED`).
    Refused {
        /// The `ErrorInfo`-style reason.
        reason: &'static str,
        /// What stands and what to do.
        message: String,
    },
    /// A search for a key prefix or an external_ref stopped at its limit with fewer than two
    /// matches: whether another entry matches further on is not known.
    SearchCut {
        /// What was looked for.
        text: String,
        /// How many entries were searched.
        read: u64,
        /// The one key that matched among them, if any.
        found: Option<String>,
    },
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Failure {
        Failure::Rpc(s)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        Failure::Output(e)
    }
}

/// A connected client and what every call of one command carries.
pub(super) struct Session {
    /// The ledger's client over one channel (cloning it shares the channel).
    client: LedgerServiceClient<Channel>,
    /// The `authorization` header, when --token was given.
    auth: Option<MetadataValue<Ascii>>,
    /// The deadline of each call.
    timeout: Duration,
}

impl Session {
    /// The client, for one call.
    pub(super) fn client(&self) -> LedgerServiceClient<Channel> {
        self.client.clone()
    }

    /// `msg` as a request with the credential and the deadline.
    pub(super) fn request<T>(&self, msg: T) -> Request<T> {
        let mut request = Request::new(msg);
        request.set_timeout(self.timeout);
        if let Some(auth) = &self.auth {
            request.metadata_mut().insert("authorization", auth.clone());
        }
        request
    }
}

/// Connects (eagerly, so that an unreachable server is told apart from a refused call) and
/// prepares the `authorization` header.
pub(super) async fn connect(c: &Connection) -> Result<Session, Failure> {
    let server = if c.server.contains("://") {
        c.server.clone()
    } else {
        format!("http://{}", c.server)
    };
    let auth = match &c.token {
        Some(token) => Some(
            MetadataValue::try_from(format!("Bearer {token}"))
                .map_err(|_| Failure::Usage("--token must be printable ASCII".into()))?,
        ),
        None => None,
    };
    let mut endpoint = Endpoint::from_shared(server.clone())
        .map_err(|e| Failure::Usage(format!("--server {server}: {e}")))?
        .connect_timeout(c.timeout);
    let https = endpoint.uri().scheme_str() == Some("https");
    if https {
        let ca = c.ca_cert.as_ref().ok_or_else(|| {
            Failure::Usage(
                "an https:// --server needs --ca-cert: this build trusts no system roots".into(),
            )
        })?;
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
        if let (Some(cert), Some(key)) = (&c.client_cert, &c.client_key) {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        if let Some(name) = &c.tls_server_name {
            tls = tls.domain_name(name.clone());
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| Failure::Usage(format!("TLS settings: {}", chain(&e))))?;
    } else if c.ca_cert.is_some() || c.client_cert.is_some() {
        return Err(Failure::Usage(
            "--ca-cert and --client-cert need an https:// --server".into(),
        ));
    }
    let channel = endpoint.connect().await.map_err(|e| Failure::Connect {
        server: server.clone(),
        detail: chain(&e),
    })?;
    Ok(Session {
        client: LedgerServiceClient::new(channel),
        auth,
        timeout: c.timeout,
    })
}

fn read(path: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| Failure::Usage(format!("cannot read {}: {e}", path.display())))
}

/// An error and its sources, as one line: tonic's transport errors say only "transport error"
/// at the top, and the cause (connection refused, a certificate problem) is further down.
fn chain(e: &dyn StdError) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// Prints the failure to stderr and chooses the exit status: [`EXIT_NOT_FOUND`] when the
/// entry asked for does not exist (an answer, not a failure), else [`EXIT_FAILURE`].
/// `connection` says how the command was told to reach the server, so that a refusal can name
/// the flag to change.
pub(super) fn report(failure: &Failure, connection: &Connection) -> ExitCode {
    let mut stderr = std::io::stderr().lock();
    let message = failure_message(failure, connection.token.is_some());
    // Nothing better can be done if stderr itself is gone.
    let _ = writeln!(stderr, "{message}");
    match failure {
        Failure::NoEntry(_) => ExitCode::from(EXIT_NOT_FOUND),
        _ => ExitCode::from(EXIT_FAILURE),
    }
}

/// The line(s) [`report`] prints. `token_given`: whether --token (or `LEDGER_TOKEN`) was set.
pub(super) fn failure_message(failure: &Failure, token_given: bool) -> String {
    match failure {
        Failure::Rpc(s) => {
            use tonic_types::StatusExt;
            let mut text = format!("error: {}", code_name(s.code()));
            if let Some(info) = s.get_details_error_info() {
                let _ = write!(text, " ({})", info.reason);
            }
            match s.code() {
                // The server's words are for a gRPC caller ("send `authorization: Bearer
                // <token>`"); this command's user sets a flag or a variable instead.
                Code::Unauthenticated if !token_given => text.push_str(
                    ": the server requires a credential: give the tenant's token with --token \
                     or the LEDGER_TOKEN environment variable",
                ),
                Code::Unauthenticated => {
                    let _ = write!(
                        text,
                        ": {} (the token given with --token or LEDGER_TOKEN)",
                        s.message()
                    );
                }
                _ => {
                    let _ = write!(text, ": {}", s.message());
                }
            }
            if s.code() == Code::Unimplemented {
                text.push_str("\n(the server is older than this command: upgrade it)");
            }
            text
        }
        Failure::Connect { server, detail } => {
            format!("error: cannot connect to {server}: {detail}")
        }
        Failure::Usage(m) => format!("error: {m}"),
        Failure::Output(e) => format!("error: cannot write the output: {e}"),
        Failure::Protocol(m) => format!("error: {m}"),
        Failure::NoEntry(m) => m.clone(),
        Failure::Refused { reason, message } => {
            format!("error: FAILED_PRECONDITION ({reason}): {message}")
        }
        Failure::Ambiguous {
            text,
            keys,
            count,
            searched,
        } => {
            let how_many = match searched {
                None => format!("{count} entries match it"),
                Some(read) => {
                    format!("at least {count} entries match it (of the first {read} searched)")
                }
            };
            let mut text =
                format!("error: `{text}` is ambiguous: {how_many}, by key prefix or external_ref:");
            for key in keys {
                let _ = write!(text, "\n  {key}");
            }
            let unlisted = count.saturating_sub(keys.len() as u64);
            if unlisted > 0 {
                let _ = write!(text, "\n  … and {unlisted} more");
            }
            text.push_str(
                "\ngive more of the key, or all of it (`entries --wide` shows whole keys)",
            );
            text
        }
        Failure::SearchCut {
            text,
            read,
            found: None,
        } => format!(
            "error: no entry with key {text}, and none of the tenant's first {read} entries \
             starts with it or has it as external_ref; the search stops there: give the whole \
             key (`entries --wide` shows whole keys)"
        ),
        Failure::SearchCut {
            text,
            read,
            found: Some(key),
        } => format!(
            "error: `{text}` matches {key} among the tenant's first {read} entries, but the \
             search stops there and another entry may match further on: give the whole key"
        ),
    }
}

/// Stdout that treats a reader who went away (`entries | head`) as the end of the job rather
/// than an error: `println!` would panic there.
pub(super) struct Output {
    out: std::io::StdoutLock<'static>,
    closed: bool,
}

impl Output {
    /// Stdout, locked for the command.
    pub(super) fn stdout() -> Output {
        Output {
            out: std::io::stdout().lock(),
            closed: false,
        }
    }

    /// Writes `text` (nothing once the reader went away).
    pub(super) fn write(&mut self, text: &str) -> Result<(), Failure> {
        if self.closed {
            return Ok(());
        }
        match self.out.write_all(text.as_bytes()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            other => other.map_err(Failure::from),
        }
    }

    /// Flushes what was written.
    pub(super) fn flush(&mut self) -> Result<(), Failure> {
        match self.out.flush() {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_code_the_reason_and_the_message() {
        use tonic_types::{ErrorDetails, StatusExt};
        let status = tonic::Status::with_error_details(
            Code::Unauthenticated,
            "unknown bearer token",
            ErrorDetails::with_error_info(
                "UNAUTHENTICATED",
                "idempotency.v1",
                std::collections::HashMap::new(),
            ),
        );
        assert_eq!(
            failure_message(&Failure::Rpc(status), true),
            "error: UNAUTHENTICATED (UNAUTHENTICATED): unknown bearer token (the token given \
             with --token or LEDGER_TOKEN)"
        );
        // The commands that look up a key tell a missing entry as Failure::NoEntry; a
        // NOT_FOUND that reaches here is an error like any other.
        let missing = tonic::Status::not_found("no entry with this key");
        assert_eq!(
            failure_message(&Failure::Rpc(missing), true),
            "error: NOT_FOUND: no entry with this key"
        );
        assert_eq!(code_name(Code::FailedPrecondition), "FAILED_PRECONDITION");
    }

    #[test]
    fn a_missing_credential_names_the_flag_and_the_variable_not_the_header() {
        let status = tonic::Status::unauthenticated(
            "missing credential: send `authorization: Bearer <token>`",
        );
        let message = failure_message(&Failure::Rpc(status), false);
        assert_eq!(
            message,
            "error: UNAUTHENTICATED: the server requires a credential: give the tenant's token \
             with --token or the LEDGER_TOKEN environment variable"
        );
    }

    #[test]
    fn an_ambiguous_key_lists_how_many_and_which_entries_match() {
        let keys: Vec<String> = (0..12).map(|i| format!("wf-42:step-{i}")).collect();
        let message = failure_message(
            &Failure::Ambiguous {
                text: "wf-42:".into(),
                keys: keys[..10].to_vec(),
                count: 12,
                searched: None,
            },
            true,
        );
        let lines: Vec<&str> = message.lines().collect();
        assert_eq!(
            lines[0],
            "error: `wf-42:` is ambiguous: 12 entries match it, by key prefix or external_ref:"
        );
        assert_eq!(
            &lines[1..11],
            keys[..10]
                .iter()
                .map(|k| format!("  {k}"))
                .collect::<Vec<_>>()
        );
        assert_eq!(lines[11], "  … and 2 more");
        assert!(lines[12].starts_with("give more of the key"), "{message}");
        let cut = failure_message(
            &Failure::Ambiguous {
                text: "wf-42:".into(),
                keys: keys[..2].to_vec(),
                count: 2,
                searched: Some(20_000),
            },
            true,
        );
        assert!(
            cut.contains("at least 2 entries match it (of the first 20000 searched)"),
            "{cut}"
        );
        assert!(!cut.contains("more\n"), "{cut}");
    }
}
