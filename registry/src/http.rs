//! What every request to a registry shares: retries and their waits, headers, the
//! excerpt of an error's body, and the token a request sends.

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ureq::http::Response;
use ureq::Body;

use crate::config::Endpoint;

/// How failed requests are retried.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Tries of one request, the first included.
    pub attempts: u32,
    /// The first wait; each further one doubles.
    pub base: Duration,
    /// No wait is longer, `Retry-After` included.
    pub max_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 6,
            base: Duration::from_millis(500),
            max_wait: Duration::from_secs(60),
        }
    }
}

/// What the next request to a repository (or, with an empty repository, to every
/// repository of a registry) sends as `Authorization`.
pub(crate) struct Token {
    pub(crate) header: String,
    pub(crate) until: Instant,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Percent-encodes a query value.
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(crate) fn header<'a>(resp: &'a Response<Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

/// `host[:port]` of a URL.
pub(crate) fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    rest.split(['/', '?', '#']).next().unwrap_or(rest)
}

pub(crate) fn retry_after(resp: &Response<Body>) -> Option<Duration> {
    header(resp, "retry-after")?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

pub(crate) fn retryable(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

pub(crate) fn excerpt(resp: Response<Body>) -> String {
    let mut body = resp.into_body();
    let bytes = body
        .with_config()
        .limit(4096)
        .read_to_vec()
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    // A registry's JSON errors: {"errors":[{"code":..,"message":..}]}.
    #[derive(serde::Deserialize)]
    struct Errs {
        errors: Vec<E>,
    }
    #[derive(serde::Deserialize)]
    struct E {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    if let Ok(e) = serde_json::from_slice::<Errs>(&bytes) {
        return e
            .errors
            .iter()
            .map(|e| format!("{} {}", e.code, e.message).trim().to_owned())
            .collect::<Vec<_>>()
            .join("; ");
    }
    text.chars().take(200).collect::<String>().trim().to_owned()
}

/// A request being made: what the error messages say.
pub(crate) struct Call<'a> {
    pub(crate) endpoint: &'a Endpoint,
    pub(crate) step: &'a str,
}

impl Call<'_> {
    pub(crate) fn reference(&self) -> String {
        self.endpoint.reference.to_string()
    }
}

/// Whether a failed request may succeed if tried again: a connection refused, reset or
/// timed out may; a certificate that does not verify, or a malformed answer, will not.
pub(crate) fn transient(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::Io(io) => matches!(
            io.kind(),
            io::ErrorKind::ConnectionRefused
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::TimedOut
                | io::ErrorKind::UnexpectedEof
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::Interrupted
        ),
        ureq::Error::Timeout(_) | ureq::Error::ConnectionFailed => true,
        _ => false,
    }
}

pub(crate) fn backoff(p: &RetryPolicy, attempt: u32) -> Duration {
    p.base
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(p.max_wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_backoff() {
        assert_eq!(authority("https://a.example:5000/v2/x?y"), "a.example:5000");
        assert_eq!(authority("http://127.0.0.1/"), "127.0.0.1");
        assert_eq!(encode("repository:a/b:pull"), "repository%3Aa%2Fb%3Apull");
        let p = RetryPolicy {
            attempts: 5,
            base: Duration::from_millis(100),
            max_wait: Duration::from_secs(1),
        };
        assert_eq!(backoff(&p, 1), Duration::from_millis(100));
        assert_eq!(backoff(&p, 3), Duration::from_millis(400));
        assert_eq!(backoff(&p, 10), Duration::from_secs(1));
    }
}
