//! `IdempotencyKey`: 1–255 visible ASCII characters (0x21–0x7E), also accepted
//! in the structured-field string form `"…"`, which means the text inside.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the Idempotency-Key header is empty")]
    Empty,
    #[error("the Idempotency-Key is longer than 255 characters")]
    TooLong,
    #[error("the Idempotency-Key may only hold visible ASCII characters (0x21-0x7E)")]
    InvalidCharacter,
    #[error("the Idempotency-Key has an unbalanced or inner quote")]
    Quote,
    #[error("more than one Idempotency-Key header was sent")]
    Repeated,
}

impl IdempotencyKey {
    pub const MAX_LEN: usize = 255;

    /// Parses the raw header bytes.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        let (inner, quoted) = match raw {
            [b'"', inner @ .., b'"'] => (inner, true),
            _ => (raw, false),
        };
        if inner.is_empty() {
            return Err(KeyError::Empty);
        }
        if inner.len() > Self::MAX_LEN {
            return Err(KeyError::TooLong);
        }
        if !inner.iter().all(|c| (0x21..=0x7e).contains(c)) {
            return Err(KeyError::InvalidCharacter);
        }
        // A quote outside the structured form, or an escape inside it, would
        // give one key two spellings.
        if inner.contains(&b'"') || (quoted && inner.contains(&b'\\')) {
            return Err(KeyError::Quote);
        }
        let text = std::str::from_utf8(inner).map_err(|_| KeyError::InvalidCharacter)?;
        Ok(Self(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_visible_ascii_and_the_quoted_form() {
        let cases: [(&[u8], &str); 4] = [
            (b"a", "a"),
            (
                b"9f1c2b7e-3f2a-4d7e-9a61-0c1f2e3d4b5a",
                "9f1c2b7e-3f2a-4d7e-9a61-0c1f2e3d4b5a",
            ),
            (b"\"abc\"", "abc"),
            (b"!~{}[]<>", "!~{}[]<>"),
        ];
        for (raw, want) in cases {
            assert_eq!(
                IdempotencyKey::parse(raw).unwrap().as_str(),
                want,
                "{raw:?}"
            );
        }
    }

    #[test]
    fn the_quoted_and_bare_forms_are_the_same_key() {
        assert_eq!(
            IdempotencyKey::parse(b"\"k-1\"").unwrap(),
            IdempotencyKey::parse(b"k-1").unwrap()
        );
    }

    #[test]
    fn length_is_1_to_255_inside_the_quotes() {
        assert!(IdempotencyKey::parse(&[b'k'; 255]).is_ok());
        assert_eq!(IdempotencyKey::parse(&[b'k'; 256]), Err(KeyError::TooLong));
        let mut quoted = vec![b'"'];
        quoted.extend([b'k'; 255]);
        quoted.push(b'"');
        assert!(IdempotencyKey::parse(&quoted).is_ok());
    }

    #[test]
    fn rejects_everything_else() {
        let cases: [(&[u8], KeyError, &str); 9] = [
            (b"", KeyError::Empty, "empty"),
            (b"\"\"", KeyError::Empty, "empty quotes"),
            (b"a b", KeyError::InvalidCharacter, "space"),
            (b"a\tb", KeyError::InvalidCharacter, "control character"),
            ("clé".as_bytes(), KeyError::InvalidCharacter, "non-ASCII"),
            (b"\"abc", KeyError::Quote, "unbalanced opening quote"),
            (b"abc\"", KeyError::Quote, "unbalanced closing quote"),
            (b"\"a\"b\"", KeyError::Quote, "inner quote"),
            (b"\"a\\b\"", KeyError::Quote, "escape inside quotes"),
        ];
        for (raw, want, why) in cases {
            assert_eq!(IdempotencyKey::parse(raw), Err(want), "{why}");
        }
    }
}
