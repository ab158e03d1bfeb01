//! The server's TLS, served over our own accept loop rather than tonic's: tonic fixes its TLS
//! configuration when it binds, and the certificate must be replaceable without a restart.
//! [`ServerTls`] holds the rustls configuration in force; [`ServerTls::reload`] builds a new
//! one whole from `--tls-cert`, `--tls-key` and `--tls-client-ca` and swaps it in at once (a
//! file that cannot be read, does not parse, or a key that does not match the certificate,
//! leaves the configuration in force). Each connection's handshake takes the configuration of
//! the moment it was accepted, so connections already open keep theirs.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::{self, PemObject};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_stream::{Stream, StreamExt as _};

use crate::connections::Connection;

/// How long a client has to finish its TLS handshake; a stalled one is closed so that its
/// task and socket are not held.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The files the TLS configuration is read from.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// PEM certificate chain, the server's own certificate first (`--tls-cert`).
    pub cert: PathBuf,
    /// PEM private key of that certificate (`--tls-key`).
    pub key: PathBuf,
    /// PEM CA certificates that client certificates must chain to (`--tls-client-ca`): with
    /// it, mutual TLS.
    pub client_ca: Option<PathBuf>,
}

/// The server's TLS configuration in force, replaceable while the server runs.
#[derive(Debug)]
pub struct ServerTls {
    /// Where it is read from, again on each reload.
    files: TlsFiles,
    /// The configuration new connections are accepted with; replaced whole, never edited.
    current: ArcSwap<ServerConfig>,
}

impl ServerTls {
    /// Reads `files` into a configuration.
    ///
    /// # Errors
    /// A message naming the file that cannot be read or does not hold what it should, or the
    /// key that does not match the certificate. Never the key's contents.
    pub fn load(files: TlsFiles) -> Result<ServerTls, String> {
        let config = server_config(&files)?;
        Ok(ServerTls {
            files,
            current: ArcSwap::from_pointee(config),
        })
    }

    /// Re-reads the files and, if they make a whole configuration, puts it in force for the
    /// connections accepted from now on.
    ///
    /// # Errors
    /// As [`ServerTls::load`]; the configuration in force is kept.
    pub fn reload(&self) -> Result<(), String> {
        let config = server_config(&self.files)?;
        self.current.store(Arc::new(config));
        Ok(())
    }

    /// The TLS connections of `connections`: each accepted TCP connection's handshake runs in
    /// a task of its own (a slow client holds up nobody), with the configuration in force when
    /// it was accepted. A failed handshake is logged at debug and dropped. Ends when the
    /// returned stream is dropped, ending the handshakes still running.
    pub fn accept(
        self: Arc<Self>,
        connections: impl Stream<Item = io::Result<Connection>> + Send + 'static,
    ) -> impl Stream<Item = io::Result<TlsStream<Connection>>> {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            let mut connections = std::pin::pin!(connections);
            let mut handshakes = JoinSet::new();
            loop {
                tokio::select! {
                    () = tx.closed() => return,
                    next = connections.next() => match next {
                        Some(Ok(connection)) => {
                            let acceptor = TlsAcceptor::from(self.current.load_full());
                            handshakes.spawn(tokio::time::timeout(
                                HANDSHAKE_TIMEOUT,
                                acceptor.accept(connection),
                            ));
                        }
                        Some(Err(e)) => {
                            if tx.send(Err(e)).await.is_err() {
                                return;
                            }
                        }
                        None => return,
                    },
                    Some(done) = handshakes.join_next(), if !handshakes.is_empty() => {
                        match done {
                            Ok(Ok(Ok(stream))) => {
                                if tx.send(Ok(stream)).await.is_err() {
                                    return;
                                }
                            }
                            Ok(Ok(Err(e))) => tracing::debug!(error = %e, "TLS handshake failed"),
                            Ok(Err(_)) => tracing::debug!(
                                timeout = ?HANDSHAKE_TIMEOUT,
                                "TLS handshake did not finish in time"
                            ),
                            Err(e) => tracing::debug!(error = %e, "TLS handshake task ended"),
                        }
                    }
                }
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}

/// A whole rustls configuration from `files`: the certificate chain with its key (checked to
/// match), the client CA when given, and HTTP/2 by ALPN, as gRPC needs.
fn server_config(files: &TlsFiles) -> Result<ServerConfig, String> {
    let provider: Arc<CryptoProvider> = Arc::new(ring::default_provider());
    let chain = certificates(&files.cert)?;
    let key = private_key(&files.key)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for ca in certificates(path)? {
                roots
                    .add(ca)
                    .map_err(|e| format!("{}: not a usable CA certificate: {e}", path.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{}: {e}", path.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => format!(
            "the private key in {} does not match the certificate in {}",
            files.key.display(),
            files.cert.display()
        ),
        e => format!("{} with {}: {e}", files.cert.display(), files.key.display()),
    })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The PEM certificates of `path`, at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let text = read(path)?;
    let certificates = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {}", path.display(), pem_problem(&e)))?;
    if certificates.is_empty() {
        return Err(format!(
            "{}: no PEM certificate in the file",
            path.display()
        ));
    }
    Ok(certificates)
}

/// The PEM private key of `path` (PKCS#8, PKCS#1 or SEC1).
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let text = read(path)?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| match e {
        pem::Error::NoItemsFound => format!("{}: no PEM private key in the file", path.display()),
        e => format!("{}: {}", path.display(), pem_problem(&e)),
    })
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// What is wrong with a PEM file, in words that quote nothing of it (it may be a key).
fn pem_problem(e: &pem::Error) -> &'static str {
    match e {
        pem::Error::MissingSectionEnd { .. } => "a PEM section has no END line",
        pem::Error::IllegalSectionStart { .. } => "a PEM BEGIN line is malformed",
        pem::Error::Base64Decode(_) => "a PEM section is not valid base64",
        pem::Error::NoItemsFound => "nothing of the expected kind in the file",
        pem::Error::SectionTooLarge => "a PEM section is too large",
        _ => "not a valid PEM file",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> TlsFiles {
        let cert = rcgen::generate_simple_self_signed(vec![name.to_string()]).expect("cert");
        let files = TlsFiles {
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
            client_ca: None,
        };
        std::fs::write(&files.cert, cert.cert.pem()).expect("write");
        std::fs::write(&files.key, cert.signing_key.serialize_pem()).expect("write");
        files
    }

    #[test]
    fn a_key_that_does_not_match_or_parse_is_refused_and_the_old_configuration_kept() {
        let dir = tempfile::tempdir().expect("dir");
        let first = write_pair(dir.path(), "first");
        let other = write_pair(dir.path(), "other");
        let tls = ServerTls::load(first.clone()).expect("load");
        let before = tls.current.load_full();

        std::fs::copy(&other.key, &first.key).expect("copy");
        let mismatch = tls.reload().expect_err("a key of another certificate");
        assert!(mismatch.contains("does not match"), "{mismatch}");
        assert!(Arc::ptr_eq(&before, &tls.current.load_full()));

        std::fs::write(&first.key, "-----BEGIN PRIVATE KEY-----\nnot base64!\n").expect("w");
        let broken = tls.reload().expect_err("a broken key");
        assert!(broken.contains("first.key"), "{broken}");
        assert!(!broken.contains("not base64"), "no key material: {broken}");
        assert!(Arc::ptr_eq(&before, &tls.current.load_full()));

        std::fs::copy(&other.cert, &first.cert).expect("copy");
        std::fs::copy(&other.key, &first.key).expect("copy");
        tls.reload().expect("a matching pair");
        assert!(!Arc::ptr_eq(&before, &tls.current.load_full()));
        assert_eq!(tls.current.load().alpn_protocols, vec![b"h2".to_vec()]);
    }

    #[test]
    fn an_empty_certificate_file_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let files = write_pair(dir.path(), "x");
        std::fs::write(&files.cert, "").expect("write");
        let refused = ServerTls::load(files).expect_err("no certificate");
        assert!(refused.contains("no PEM certificate"), "{refused}");
    }
}
