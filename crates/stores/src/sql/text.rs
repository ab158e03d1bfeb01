//! Statement text built at compile time from the claim's one column list ([`super::CLAIM`]):
//! the column names, their placeholders and PostgreSQL's array casts, so that a column added
//! to the list reaches every statement that writes a claim, numbered right.

use super::Column;

/// The longest statement text built here.
const CAP: usize = 2048;

/// Text being built in a `const` (or `static`) initializer.
pub(crate) struct Text {
    bytes: [u8; CAP],
    len: usize,
}

impl Text {
    /// No text yet.
    pub(crate) const fn new() -> Text {
        Text {
            bytes: [0; CAP],
            len: 0,
        }
    }

    /// `s` appended.
    pub(crate) const fn push(mut self, s: &str) -> Text {
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            self.bytes[self.len + i] = b[i];
            i += 1;
        }
        self.len += b.len();
        self
    }

    /// `n` in decimal appended.
    pub(crate) const fn number(mut self, n: usize) -> Text {
        let mut digits = [0u8; 20];
        let mut count = 0;
        let mut rest = n;
        loop {
            digits[count] = b'0' + (rest % 10) as u8;
            count += 1;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        while count > 0 {
            count -= 1;
            self.bytes[self.len] = digits[count];
            self.len += 1;
        }
        self
    }

    /// `$n` appended.
    pub(crate) const fn placeholder(self, n: usize) -> Text {
        self.push("$").number(n)
    }

    /// The names of `columns`, comma-separated, each after `prefix` (`"e."`, or none).
    pub(crate) const fn names(mut self, columns: &[Column], prefix: &str) -> Text {
        let mut i = 0;
        while i < columns.len() {
            if i > 0 {
                self = self.push(", ");
            }
            self = self.push(prefix).push(columns[i].name);
            i += 1;
        }
        self
    }

    /// `$first`, `$first + 1`, … for `count` placeholders, comma-separated.
    pub(crate) const fn placeholders(mut self, first: usize, count: usize) -> Text {
        let mut i = 0;
        while i < count {
            if i > 0 {
                self = self.push(", ");
            }
            self = self.placeholder(first + i);
            i += 1;
        }
        self
    }

    /// `$1::type[]`, `$2::type[]`, … one array per column of `columns`: PostgreSQL's multi-row
    /// forms (`UNNEST`) bind each column as one array.
    pub(crate) const fn arrays(mut self, columns: &[Column]) -> Text {
        let mut i = 0;
        while i < columns.len() {
            if i > 0 {
                self = self.push(", ");
            }
            self = self
                .placeholder(i + 1)
                .push("::")
                .push(columns[i].pg_type)
                .push("[]");
            i += 1;
        }
        self
    }

    /// The text.
    pub(crate) const fn as_str(&self) -> &str {
        let (text, _) = self.bytes.as_slice().split_at(self.len);
        match core::str::from_utf8(text) {
            Ok(s) => s,
            Err(_) => panic!("statement text is ASCII"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Text;

    #[test]
    fn numbers_and_placeholders_are_written_in_decimal() {
        static T: Text = Text::new()
            .push("(")
            .placeholders(8, 4)
            .push(") ")
            .number(0);
        assert_eq!(T.as_str(), "($8, $9, $10, $11) 0");
    }
}
