//! `IdempotencyKey::parse` on any header bytes: it never panics;
//! a key it returns is 1-255 visible ASCII characters, the text as sent or
//! the text inside the quotes; and the bare and quoted forms of one text are
//! one key.

#![no_main]

use libfuzzer_sys::fuzz_target;
use idempotency::IdempotencyKey;

fuzz_target!(|raw: &[u8]| {
    let shown = raw.escape_ascii();
    let bare = IdempotencyKey::parse(raw);
    if let Ok(key) = &bare {
        let text = key.as_str().as_bytes();
        assert!(
            (1..=IdempotencyKey::MAX_LEN).contains(&text.len()),
            "{shown} gave a key of {} bytes",
            text.len()
        );
        assert!(
            text.iter().all(|c| (0x21..=0x7e).contains(c)),
            "{shown} gave a key that is not visible ASCII: {key:?}"
        );
        assert!(!text.contains(&b'"'), "{shown} gave a key with a quote");
        let unquoted = raw.strip_prefix(b"\"").and_then(|r| r.strip_suffix(b"\""));
        assert!(
            text == raw || unquoted == Some(text),
            "{shown} gave {key:?}, which is neither the text nor the text inside the quotes"
        );
        // Parsing a key's text again gives the same key.
        assert_eq!(IdempotencyKey::parse(text).as_ref(), Ok(key));
    }

    // The structured-field form of the same text.
    let mut quoted = Vec::with_capacity(raw.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(raw);
    quoted.push(b'"');
    match (&bare, IdempotencyKey::parse(&quoted)) {
        (Ok(bare), Ok(quoted)) => assert_eq!(bare, &quoted, "{shown}"),
        (Err(error), Ok(quoted)) => {
            panic!("{shown} is refused ({error}) but its quoted form is the key {quoted:?}")
        }
        // A backslash is refused inside quotes (it would be an escape, giving
        // one key two spellings), and a text that is already quoted cannot be
        // quoted again. Any other valid text is valid quoted too.
        (Ok(bare), Err(error)) => assert!(
            raw.contains(&b'\\') || raw.contains(&b'"'),
            "{shown} is the key {bare:?} but its quoted form is refused: {error}"
        ),
        (Err(_), Err(_)) => {}
    }
});
