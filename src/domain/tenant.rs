//! The tenant a call acts for: taken from the caller's credential, never from the request body.

/// The tenant a call acts for. Every entry belongs to one; a tenant never reads, completes or
/// detects another's keys.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tenant(pub String);

impl Tenant {
    /// The only tenant of a server without credentials.
    pub fn default_tenant() -> Tenant {
        Tenant("default".to_string())
    }

    /// The tenant's name, as stored beside each of its entries.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
