//! PostgreSQL's own hashes of a distribution column's value, as Citus
//! places a row by them: Bob Jenkins's lookup3 as PostgreSQL's
//! `hash_bytes` and `hash_bytes_uint32` compute it, so that a route finds
//! a row's shard with no lookup.

/// PostgreSQL's `hashtext` of a string (in a deterministic collation, as
/// every key column is): its bytes through Bob Jenkins's lookup3 hash as
/// PostgreSQL's `hash_bytes` computes it, read as a signed integer. Citus
/// places a row of a table distributed by a text column by this hash.
pub fn hashtext(text: &str) -> i32 {
    let bytes = text.as_bytes();
    // PostgreSQL hashes at most 2^31 bytes (a text datum is under 1 GiB):
    // the length is taken modulo 2^32 as its C code does.
    let seed = 0x9e37_79b9_u32
        .wrapping_add(bytes.len() as u32)
        .wrapping_add(3_923_095);
    let (mut a, mut b, mut c) = (seed, seed, seed);
    let mut blocks = bytes.chunks_exact(12);
    for block in &mut blocks {
        a = a.wrapping_add(word(&block[0..4]));
        b = b.wrapping_add(word(&block[4..8]));
        c = c.wrapping_add(word(&block[8..12]));
        mix(&mut a, &mut b, &mut c);
    }
    let mut tail = [0u8; 12];
    let rest = blocks.remainder();
    tail[..rest.len()].copy_from_slice(rest);
    a = a.wrapping_add(word(&tail[0..4]));
    b = b.wrapping_add(word(&tail[4..8]));
    // The lowest byte of `c` is the length's: the last bytes go above it.
    c = c.wrapping_add(word(&tail[8..12]) << 8);
    finish(&mut a, &mut b, &mut c);
    c as i32
}

/// PostgreSQL's `hashint4` of an integer (`hash_bytes_uint32`: lookup3's
/// `final` over the one word). Citus places a row of a table distributed by
/// an integer column by this hash.
pub fn hashint4(value: i32) -> i32 {
    let seed = 0x9e37_79b9_u32.wrapping_add(4).wrapping_add(3_923_095);
    let (mut a, mut b, mut c) = (seed.wrapping_add(value as u32), seed, seed);
    finish(&mut a, &mut b, &mut c);
    c as i32
}

/// Four bytes as a little-endian word, as the hash reads them on any machine.
fn word(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// lookup3's `mix`, one row per line of it: `x -= y; x ^= y <<< k; y += z`.
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    for (x, y, z, k) in [(0, 2, 1, 4), (1, 0, 2, 6), (2, 1, 0, 8), (0, 2, 1, 16), (1, 0, 2, 19), (2, 1, 0, 4)] {
        let mut v = [*a, *b, *c];
        v[x] = v[x].wrapping_sub(v[y]);
        v[x] ^= v[y].rotate_left(k);
        v[y] = v[y].wrapping_add(v[z]);
        [*a, *b, *c] = v;
    }
}

/// lookup3's `final`, one row per line of it: `x ^= y; x -= y <<< k`.
fn finish(a: &mut u32, b: &mut u32, c: &mut u32) {
    for (x, y, k) in [(2, 1, 14), (0, 2, 11), (1, 0, 25), (2, 1, 16), (0, 2, 4), (1, 0, 14), (2, 1, 24)] {
        let mut v = [*a, *b, *c];
        v[x] ^= v[y];
        v[x] = v[x].wrapping_sub(v[y].rotate_left(k));
        [*a, *b, *c] = v;
    }
}
