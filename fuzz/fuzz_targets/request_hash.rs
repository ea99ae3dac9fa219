//! `RequestHash::of` is injective across its framing: two
//! different (method, path, body) triples never hash alike. SHA-256 itself is
//! not what is tested; the framing is. So the second triple is mostly made
//! from the same bytes as the first, cut at other places: every way to move
//! bytes across the boundaries of the first, directly or around a separator
//! that a naive framing might put between the parts. An ambiguous framing
//! (plain concatenation, a separator) collides within seconds here.

#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use idempotency::RequestHash;

#[derive(Debug, Arbitrary)]
struct Input {
    method: String,
    path: String,
    body: Vec<u8>,
    /// Which separator the bytes are re-cut around.
    separator: u8,
    /// Where the new boundaries fall, among the possible places.
    cut_a: u32,
    cut_b: u32,
    /// A second triple, independent of the first.
    other: (String, String, Vec<u8>),
}

const SEPARATORS: [&[u8]; 6] = [b"", b"\n", b"\r\n", b" ", b"\0", b"|"];

type Triple<'a> = (&'a str, &'a str, &'a [u8]);

fn hash((method, path, body): Triple<'_>) -> RequestHash {
    RequestHash::of(method, path, body)
}

fn assert_distinct(first: Triple<'_>, second: Triple<'_>) {
    if first != second {
        assert_ne!(
            hash(first),
            hash(second),
            "{first:?} and {second:?} hash alike"
        );
    } else {
        assert_eq!(hash(first), hash(second), "{first:?} hashes two ways");
    }
}

fuzz_target!(|input: Input| {
    let first: Triple<'_> = (&input.method, &input.path, &input.body);
    assert_eq!(hash(first), hash(first), "the hash is deterministic");

    let (method, path, body) = &input.other;
    assert_distinct(first, (method, path, body));

    // The first triple's bytes, joined around a separator, then cut at two
    // occurrences of that separator: the same bytes, other boundaries.
    let separator = SEPARATORS[usize::from(input.separator) % SEPARATORS.len()];
    let joined = [
        input.method.as_bytes(),
        separator,
        input.path.as_bytes(),
        separator,
        &input.body,
    ]
    .concat();
    let places: Vec<usize> = if separator.is_empty() {
        (0..=joined.len()).collect()
    } else {
        joined
            .windows(separator.len())
            .enumerate()
            .filter(|(_, window)| *window == separator)
            .map(|(at, _)| at)
            .collect()
    };
    if places.is_empty() {
        return;
    }
    let a = places[input.cut_a as usize % places.len()];
    let b = places[input.cut_b as usize % places.len()];
    let (a, b) = (a.min(b), a.max(b));
    if a + separator.len() > b {
        return; // overlapping occurrences: no triple
    }
    let (Ok(method), Ok(path)) = (
        std::str::from_utf8(&joined[..a]),
        std::str::from_utf8(&joined[a + separator.len()..b]),
    ) else {
        return; // a method or path must be text
    };
    assert_distinct(first, (method, path, &joined[b + separator.len()..]));
});
