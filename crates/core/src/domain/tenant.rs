//! The tenant a call acts for: taken from the caller's credential, never from the request body.

use super::fields::InvalidField;

/// The tenant a call acts for. Every entry belongs to one; a tenant never reads, completes or
/// detects another's keys.
///
/// Built only by [`Tenant::parse`] (a name from the tokens file: 1 to 256 bytes of UTF-8
/// without control characters or blanks) or read back from the store ([`Tenant::from_stored`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tenant(String);

impl Tenant {
    /// The only tenant of a server without credentials.
    pub fn default_tenant() -> Tenant {
        Tenant("default".to_string())
    }

    /// Validates a tenant's name.
    ///
    /// # Errors
    /// [`InvalidField`] for field `tenant` if `name` is empty, longer than 256 bytes, or holds
    /// a control character or a blank (the tokens file separates its columns with blanks).
    pub fn parse(name: &str) -> Result<Tenant, InvalidField> {
        super::fields::check_text("tenant", name, 1, 256)?;
        if name.contains(char::is_whitespace) {
            return Err(InvalidField {
                field: "tenant",
                message: "must not contain blanks".to_owned(),
            });
        }
        Ok(Tenant(name.to_owned()))
    }

    /// A tenant read back from the store or another server's announcement: written by this
    /// code from a parsed one, so not checked again.
    #[must_use]
    pub fn from_stored(name: String) -> Tenant {
        Tenant(name)
    }

    /// The tenant's name, as stored beside each of its entries.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_name_is_one_printable_word() {
        assert_eq!(
            Tenant::parse("acme").map(|t| t.as_str().to_owned()),
            Ok("acme".into())
        );
        assert_eq!(Tenant::parse("").unwrap_err().field, "tenant");
        assert!(Tenant::parse("ac me").is_err());
        assert!(Tenant::parse("acme\u{7}").is_err());
        assert!(Tenant::parse(&"a".repeat(257)).is_err());
        assert!(Tenant::parse(&"a".repeat(256)).is_ok());
    }
}
