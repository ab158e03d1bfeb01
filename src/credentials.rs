//! Credentials and tenants: the tokens file, and the check that maps `authorization: Bearer
//! <token>` to a [`Tenant`] and its role, which the gRPC face (its interceptor,
//! `grpc::auth`), the console's sign-in and the MCP gateway's edge all use: it sits below them.
//!
//! The tokens file is re-read on request ([`Credentials::reload`], on SIGHUP): the new table
//! is built whole from the file and then swapped in at once, so every call is checked against
//! one table, old or new, never a mix; a file that cannot be read or parsed leaves the table in
//! force. A call is authenticated once, when it arrives, so a call in flight finishes under the
//! credential it started with.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};

use crate::domain::{Principal, Tenant};

/// Who a credential is: its tenant, and whether it may decide about calls awaiting approval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The tenant its calls act for.
    pub tenant: Tenant,
    /// With the approver role: the principal its decisions are recorded as (`decided_by`).
    pub approver: Option<Principal>,
}

impl Identity {
    /// The identity of every call without credentials configured: tenant `default`, and an
    /// approver (everyone may decide; the start-up log says so).
    #[must_use]
    pub fn anonymous() -> Identity {
        Identity {
            tenant: Tenant::default_tenant(),
            approver: Some(Principal::from_stored(ANONYMOUS_APPROVER.to_string())),
        }
    }
}

/// What a decision is recorded as without credentials configured.
pub const ANONYMOUS_APPROVER: &str = "anonymous (no credentials configured)";

/// The approver role of a call, put in its request extensions beside its tenant: the principal
/// a decision is recorded as, or `None` for a credential without the role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Approver(pub Option<Principal>);

/// How the server decides a call's tenant.
#[derive(Clone, Debug)]
pub enum Tenancy {
    /// No credentials configured: every call is tenant `default`.
    Single,
    /// Each token maps to a tenant (and maybe the approver role). Tokens are kept as sha256
    /// digests, so the lookup does not compare secrets byte by byte and a heap dump holds no
    /// token.
    Tokens(Arc<HashMap<[u8; 32], Identity>>),
}

impl Tenancy {
    /// Reads a tokens file: one `<tenant> <token> [approver[=NAME]]` a line, `#` starts a
    /// comment, blank lines are skipped. A credential with the third column may decide about
    /// calls awaiting approval, recorded as NAME, or as `approver:` and the first 8 hex
    /// characters of its token's digest.
    ///
    /// # Errors
    /// A message naming the file and line of a malformed or duplicate entry, or an empty file.
    pub fn from_file(path: &Path) -> Result<Tenancy, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read tokens file {}: {e}", path.display()))?;
        Tenancy::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the text of a tokens file; see [`Tenancy::from_file`].
    ///
    /// # Errors
    /// A message naming the line of a malformed or duplicate entry, or an empty file.
    pub fn parse(text: &str) -> Result<Tenancy, String> {
        let mut tokens = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(tenant), Some(token), role, None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(format!(
                    "line {}: expected `<tenant> <token> [approver[=NAME]]`",
                    n + 1
                ));
            };
            let key = digest(token);
            let approver = match role {
                None => None,
                Some("approver") => Some(Principal::from_stored(format!(
                    "approver:{}",
                    hex::encode(&key[..4])
                ))),
                Some(role) => match role.strip_prefix("approver=") {
                    Some(name) => Some(Principal::parse(name).map_err(|e| {
                        format!("line {}: the approver's name {}", n + 1, e.message)
                    })?),
                    None => {
                        return Err(format!(
                            "line {}: the third column is a role: `approver` or \
                             `approver=NAME`",
                            n + 1
                        ));
                    }
                },
            };
            let identity = Identity {
                tenant: Tenant::parse(tenant)
                    .map_err(|e| format!("line {}: the tenant {}", n + 1, e.message))?,
                approver,
            };
            if tokens.insert(key, identity).is_some() {
                return Err(format!("line {}: the same token is listed twice", n + 1));
            }
        }
        if tokens.is_empty() {
            return Err("no credentials in the tokens file".to_string());
        }
        Ok(Tenancy::Tokens(Arc::new(tokens)))
    }

    /// How many tenants the credentials name (one without credentials: `default`).
    #[must_use]
    pub fn tenant_count(&self) -> usize {
        match self {
            Tenancy::Single => 1,
            Tenancy::Tokens(map) => map
                .values()
                .map(|i| i.tenant.as_str())
                .collect::<std::collections::HashSet<_>>()
                .len(),
        }
    }

    /// For the start-up log.
    pub fn describe(&self) -> String {
        match self {
            Tenancy::Single => "single tenant `default` (no credentials required)".to_string(),
            Tenancy::Tokens(map) => {
                let mut tenants: Vec<&str> = map.values().map(|i| i.tenant.as_str()).collect();
                tenants.sort_unstable();
                tenants.dedup();
                let approvers = map.values().filter(|i| i.approver.is_some()).count();
                format!(
                    "{} tenants by bearer token ({} credentials, {approvers} approvers)",
                    tenants.len(),
                    map.len()
                )
            }
        }
    }

    /// The identity (tenant, role) a call's metadata authenticates.
    ///
    /// # Errors
    /// `UNAUTHENTICATED` for a missing, malformed or unknown credential. Every failure reads
    /// alike apart from its message, so a caller cannot probe which tokens exist.
    pub fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Identity, Unauthenticated> {
        match self {
            Tenancy::Single => Ok(Identity::anonymous()),
            Tenancy::Tokens(map) => {
                let header = metadata.get("authorization").ok_or(Unauthenticated(
                    "missing credential: send `authorization: Bearer <token>`",
                ))?;
                let token = header
                    .to_str()
                    .ok()
                    .and_then(|v| {
                        v.strip_prefix("Bearer ")
                            .or_else(|| v.strip_prefix("bearer "))
                    })
                    .map(str::trim)
                    .ok_or(Unauthenticated(
                        "malformed credential: send `authorization: Bearer <token>`",
                    ))?;
                map.get(&digest(token))
                    .cloned()
                    .ok_or(Unauthenticated("unknown credential"))
            }
        }
    }

    /// How many credentials of `self` `next` adds and removes (for the reload's log line,
    /// which never shows a token).
    fn changes_to(&self, next: &Tenancy) -> (usize, usize) {
        match (self, next) {
            (Tenancy::Tokens(old), Tenancy::Tokens(new)) => (
                new.keys().filter(|k| !old.contains_key(*k)).count(),
                old.keys().filter(|k| !new.contains_key(*k)).count(),
            ),
            (Tenancy::Single, Tenancy::Tokens(new)) => (new.len(), 0),
            (Tenancy::Tokens(old), Tenancy::Single) => (0, old.len()),
            (Tenancy::Single, Tenancy::Single) => (0, 0),
        }
    }
}

/// The credentials the ledger service checks calls against: the [`Tenancy`] in force, and the
/// tokens file it came from. Cheap to clone; every clone sees a reload.
#[derive(Clone, Debug)]
pub struct Credentials {
    /// The tokens file (`--auth-tokens-file`), when one is configured.
    file: Option<PathBuf>,
    /// The table in force. Replaced whole by [`Credentials::reload`], never edited, and read
    /// without a lock by every call.
    current: Arc<ArcSwap<Tenancy>>,
}

/// What [`Credentials::reload`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    /// No tokens file is configured: the server has one tenant and nothing to re-read.
    NotConfigured,
    /// The file was read and is now in force.
    Replaced {
        /// The new tenancy, as the start-up log describes it.
        tenancy: String,
        /// Credentials in the new file and not in the old one.
        added: usize,
        /// Credentials in the old file and not in the new one (refused from now on).
        removed: usize,
    },
}

impl Credentials {
    /// The credentials of `file` (see [`Tenancy::from_file`]), or one tenant without a file.
    ///
    /// # Errors
    /// As [`Tenancy::from_file`].
    pub fn load(file: Option<&Path>) -> Result<Credentials, String> {
        let tenancy = match file {
            Some(path) => Tenancy::from_file(path)?,
            None => Tenancy::Single,
        };
        Ok(Credentials {
            file: file.map(Path::to_path_buf),
            current: Arc::new(ArcSwap::from_pointee(tenancy)),
        })
    }

    /// The identity `metadata`'s credential authenticates under the table in force now (read
    /// without a lock or a reference count: every call of the ledger service comes through here).
    ///
    /// # Errors
    /// As [`Tenancy::authenticate`].
    pub fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Identity, Unauthenticated> {
        self.current.load().authenticate(metadata)
    }

    /// The table in force now.
    pub fn current(&self) -> Arc<Tenancy> {
        self.current.load_full()
    }

    /// Re-reads the tokens file and puts it in force, whole; calls already admitted keep the
    /// tenant they were admitted as.
    ///
    /// # Errors
    /// The file cannot be read or does not parse (the message names the file and line, never a
    /// token); the credentials in force are kept.
    pub fn reload(&self) -> Result<Reload, String> {
        let Some(path) = &self.file else {
            return Ok(Reload::NotConfigured);
        };
        let next = Arc::new(Tenancy::from_file(path)?);
        let tenancy = next.describe();
        let previous = self.current.swap(next.clone());
        let (added, removed) = previous.changes_to(&next);
        Ok(Reload::Replaced {
            tenancy,
            added,
            removed,
        })
    }
}

/// Why a call's credential was refused: the message says what was missing or wrong, and every
/// refusal reads alike otherwise, so that a caller cannot probe which tokens exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unauthenticated(pub &'static str);

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A token as the server keeps it: its sha256 digest. The console's sessions hold one, so
/// that each request checks the credential it signed in with is still configured, without
/// keeping the token.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Credential([u8; 32]);

impl Credential {
    /// The credential of `token` (as sent after `Bearer `).
    pub fn of(token: &str) -> Credential {
        Credential(digest(token.trim()))
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(..)")
    }
}

impl Tenancy {
    /// Whether callers must present a credential (a tokens file is configured).
    pub fn requires_credentials(&self) -> bool {
        matches!(self, Tenancy::Tokens(_))
    }

    /// The tenant `credential` authenticates; `None` for an unknown one, and without
    /// credentials configured (where there is nothing to present).
    pub fn tenant_of(&self, credential: &Credential) -> Option<Tenant> {
        self.identity_of(credential).map(|i| i.tenant)
    }

    /// The identity `credential` authenticates; `None` for an unknown one, and without
    /// credentials configured.
    pub fn identity_of(&self, credential: &Credential) -> Option<Identity> {
        match self {
            Tenancy::Single => None,
            Tenancy::Tokens(map) => map.get(&credential.0).cloned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataMap;

    fn with_auth(value: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Ok(v) = value.parse() {
            m.insert("authorization", v);
        }
        m
    }

    #[test]
    fn tokens_map_to_tenants_and_comments_are_skipped() {
        let t = Tenancy::parse("# ops\nacme tok-a  # the first\n\nglobex tok-b\n").ok();
        let Some(t) = t else {
            panic!("tokens file should parse")
        };
        assert_eq!(
            t.authenticate(&with_auth("Bearer tok-a"))
                .ok()
                .map(|i| i.tenant),
            Some(Tenant::from_stored("acme".into()))
        );
        assert_eq!(
            t.authenticate(&with_auth("Bearer tok-b"))
                .ok()
                .map(|i| i.tenant),
            Some(Tenant::from_stored("globex".into()))
        );
    }

    #[test]
    fn a_third_column_gives_the_approver_role_named_or_by_digest() {
        let t = Tenancy::parse("acme tok-a\nacme tok-b approver=alice\nacme tok-c approver\n")
            .expect("parses");
        let who = |token: &str| {
            t.authenticate(&with_auth(&format!("Bearer {token}")))
                .ok()
                .and_then(|i| i.approver)
                .map(String::from)
        };
        assert_eq!(who("tok-a"), None);
        assert_eq!(who("tok-b").as_deref(), Some("alice"));
        let by_digest = who("tok-c").unwrap_or_default();
        assert!(
            by_digest.starts_with("approver:") && by_digest.len() == "approver:".len() + 8,
            "{by_digest}"
        );
        assert!(!by_digest.contains("tok-c"));
        assert!(Tenancy::parse("acme tok approve\n").is_err_and(|e| e.contains("line 1")));
        assert!(
            Tenancy::parse("acme tok approver=bad\u{7}\n").is_err_and(|e| e.contains("line 1"))
        );
        assert!(Tenancy::parse("acme tok approver x\n").is_err_and(|e| e.contains("line 1")));
    }

    #[test]
    fn missing_malformed_and_unknown_credentials_are_refused() {
        let Ok(t) = Tenancy::parse("acme tok-a\n") else {
            panic!("tokens file should parse")
        };
        for md in [
            MetadataMap::new(),
            with_auth("tok-a"),
            with_auth("Bearer nope"),
        ] {
            assert!(matches!(t.authenticate(&md), Err(Unauthenticated(_))));
        }
    }

    #[test]
    fn malformed_files_name_the_line() {
        assert!(Tenancy::parse("acme\n").is_err_and(|e| e.contains("line 1")));
        assert!(Tenancy::parse("a t\nb t\n").is_err_and(|e| e.contains("line 2")));
        assert!(Tenancy::parse("# nothing\n").is_err());
        let long = format!("ok tok-1\n{} tok-2\n", "t".repeat(300));
        assert!(
            Tenancy::parse(&long).is_err_and(|e| e.contains("line 2") && e.contains("tenant")),
            "a tenant's name over 256 bytes is refused with its line"
        );
    }

    #[test]
    fn a_reload_swaps_the_whole_table_and_a_broken_file_keeps_the_old_one() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tokens");
        std::fs::write(&path, "acme tok-a\nglobex tok-b\n").expect("write");
        let credentials = Credentials::load(Some(&path)).expect("load");
        let before = credentials.current();
        std::fs::write(&path, "acme tok-a\nacme tok-c\n").expect("write");
        assert_eq!(
            credentials.reload(),
            Ok(Reload::Replaced {
                tenancy: "1 tenants by bearer token (2 credentials, 0 approvers)".into(),
                added: 1,
                removed: 1,
            })
        );
        let after = credentials.current();
        assert!(after.authenticate(&with_auth("Bearer tok-c")).is_ok());
        assert!(after.authenticate(&with_auth("Bearer tok-b")).is_err());
        // A table taken before the reload (a call already admitted) is unchanged.
        assert!(before.authenticate(&with_auth("Bearer tok-b")).is_ok());

        std::fs::write(&path, "acme tok-a\nacme tok-d extra\n").expect("write");
        let refused = credentials.reload().expect_err("a broken file");
        assert!(refused.contains("line 2"), "{refused}");
        assert!(
            !refused.contains("tok-d"),
            "no token in the message: {refused}"
        );
        assert!(
            credentials
                .current()
                .authenticate(&with_auth("Bearer tok-c"))
                .is_ok(),
            "the table in force is kept"
        );
        std::fs::remove_file(&path).expect("remove");
        assert!(credentials.reload().is_err());
        assert!(
            credentials
                .current()
                .authenticate(&with_auth("Bearer tok-c"))
                .is_ok()
        );
    }

    #[test]
    fn without_a_tokens_file_a_reload_does_nothing() {
        let credentials = Credentials::load(None).expect("load");
        assert_eq!(credentials.reload(), Ok(Reload::NotConfigured));
        assert!(matches!(*credentials.current(), Tenancy::Single));
    }

    #[test]
    fn a_credential_names_the_tenant_of_its_token_only() {
        let Ok(t) = Tenancy::parse("acme tok-a\nglobex tok-b\n") else {
            panic!("tokens file should parse")
        };
        assert!(t.requires_credentials());
        assert_eq!(
            t.tenant_of(&Credential::of("tok-b")),
            Some(Tenant::from_stored("globex".into()))
        );
        assert_eq!(
            t.tenant_of(&Credential::of(" tok-a ")),
            Some(Tenant::from_stored("acme".into()))
        );
        assert_eq!(t.tenant_of(&Credential::of("tok-c")), None);
        assert!(!Tenancy::Single.requires_credentials());
        assert_eq!(Tenancy::Single.tenant_of(&Credential::of("tok-a")), None);
    }

    #[test]
    fn without_credentials_everyone_is_the_default_tenant() {
        assert_eq!(
            Tenancy::Single.authenticate(&MetadataMap::new()).ok(),
            Some(Identity::anonymous())
        );
    }
}
