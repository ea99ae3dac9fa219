//! The browser client at `/client/checkout.js` (`web/client/checkout.js`, the
//! one copy of the retry logic a checkout page needs) and its TypeScript types
//! at `/client/checkout.d.ts`: static files compiled in, public like `/demo/`
//! (they hold no secret; the API calls they make carry the buyer's token).
//!
//! A file that changes only with the binary may be cached by anyone, for a
//! while, then revalidated: `max-age` of five minutes (a new build reaches
//! every page within that), and an `ETag` hashed from the bytes at compile
//! time, so that every instance of one build answers the same tag and a
//! `304` when the browser already has it.

use actix_web::http::header::{self, EntityTag};
use actix_web::{HttpRequest, HttpResponse};

const MODULE: Asset = Asset::new(
    include_str!("../../web/client/checkout.js"),
    "text/javascript; charset=utf-8",
);

const TYPES: Asset = Asset::new(
    include_str!("../../web/client/checkout.d.ts"),
    "application/typescript; charset=utf-8",
);

const CACHE_CONTROL: &str = "public, max-age=300";

/// `GET /client/checkout.js`: the ES module.
pub async fn module(req: HttpRequest) -> HttpResponse {
    MODULE.serve(&req)
}

/// `GET /client/checkout.d.ts`: its types.
pub async fn types(req: HttpRequest) -> HttpResponse {
    TYPES.serve(&req)
}

/// A file served as it was compiled in.
struct Asset {
    text: &'static str,
    content_type: &'static str,
    hash: u64,
}

impl Asset {
    const fn new(text: &'static str, content_type: &'static str) -> Self {
        Self {
            text,
            content_type,
            hash: fnv1a(text.as_bytes()),
        }
    }

    /// 200 with the file, or 304 when `If-None-Match` names its tag (weak
    /// comparison, RFC 9110 §13.1.2). Both carry the validators and the
    /// caching headers, so a cache can refresh what it holds.
    fn serve(&self, req: &HttpRequest) -> HttpResponse {
        let tag = EntityTag::new_strong(format!("{:x}-{:016x}", self.text.len(), self.hash));
        let cached = super::conditional::has(req, &tag);
        let mut response = if cached {
            HttpResponse::NotModified()
        } else {
            HttpResponse::Ok()
        };
        response
            .insert_header(header::ETag(tag))
            .insert_header((header::CACHE_CONTROL, CACHE_CONTROL))
            .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"));
        if cached {
            response.finish()
        } else {
            response.content_type(self.content_type).body(self.text)
        }
    }
}

/// FNV-1a, 64 bits: a hash that a `const fn` can compute, for a tag that
/// only has to change when the bytes do.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::fnv1a;

    #[test]
    fn fnv1a_is_the_published_function() {
        // Test vectors of the FNV reference (draft-eastlake-fnv).
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
