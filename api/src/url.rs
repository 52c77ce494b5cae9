//! Percent-encoding of paths and query values, the same on both sides of the socket.

use super::ApiError;

/// Percent-decoding (with '+' as space in queries being a form convention we do not use).
pub fn decode(s: &str) -> Result<String, ApiError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .ok_or_else(|| ApiError::bad_request(format!("bad escape in {s:?}")))?;
            out.push(
                u8::from_str_radix(hex, 16)
                    .map_err(|_| ApiError::bad_request(format!("bad escape in {s:?}")))?,
            );
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| ApiError::bad_request(format!("{s:?} is not UTF-8 once decoded")))
}

/// Percent-encodes everything but unreserved characters and '/'.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for &c in s.as_bytes() {
        if c.is_ascii_alphanumeric() || b"-._~/".contains(&c) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// Percent-encodes one path segment: like [`encode`], and `/` too (an image name such as
/// `library/alpine` is one `{name}` segment).
pub fn encode_segment(s: &str) -> String {
    encode(s).replace('/', "%2F")
}
