//! The request hash: SHA-256 over the method, the path with its query and the
//! exact body bytes. Each part is length-prefixed, so no two different
//! requests frame to the same bytes (`"POST", "/a", "b"` never meets
//! `"POST", "/ab", ""`).

use sha2::{Digest, Sha256};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHash([u8; 32]);

impl RequestHash {
    const DOMAIN: &'static [u8] = b"stagedoor-request-v1";

    pub fn of(method: &str, path_and_query: &str, body: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(Self::DOMAIN);
        for part in [method.as_bytes(), path_and_query.as_bytes(), body] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        Self(hasher.finalize().into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moving_bytes_between_parts_changes_the_hash() {
        let base = RequestHash::of("POST", "/orders", b"{}");
        assert_ne!(base, RequestHash::of("POST", "/orders{", b"}"));
        assert_ne!(base, RequestHash::of("POST/", "orders", b"{}"));
        assert_ne!(base, RequestHash::of("POST", "/holds", b"{}"));
        assert_ne!(base, RequestHash::of("POST", "/orders?x=1", b"{}"));
        assert_ne!(base, RequestHash::of("POST", "/orders", b"{} "));
        assert_eq!(base, RequestHash::of("POST", "/orders", b"{}"));
    }
}
