//! The signature of a webhook event, one scheme both ways: Payrail signs
//! the events it sends this service (`Payrail-Signature`, checked by
//! `payrail::Verifier`), and this service signs the order events it sends
//! the shop (`Stagedoor-Signature`, `jobs::outcomes`) the same way:
//! `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">`. Written
//! once, so that what is checked and what is sent cannot drift apart.

use std::fmt::Write;

use hmac::digest::CtOutput;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// An HMAC-SHA256, comparable in constant time.
pub type Tag = CtOutput<Hmac<Sha256>>;

/// The MAC of `"<timestamp>.<body>"` under `secret`.
pub fn tag(secret: &[u8], timestamp: u64, body: &[u8]) -> Tag {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize()
}

/// The header value that signs `body` at `timestamp`: `t=…,v1=…`.
pub fn header(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    let mut header = format!("t={timestamp},v1=");
    for byte in tag(secret, timestamp, body).into_bytes() {
        // Writing to a String cannot fail.
        let _ = write!(header, "{byte:02x}");
    }
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_the_hmac_of_timestamp_dot_body() {
        // `printf '1700000000.{}' | openssl dgst -sha256 -hmac key`
        assert_eq!(
            header(b"key", 1_700_000_000, b"{}"),
            "t=1700000000,v1=9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae"
        );
    }
}
