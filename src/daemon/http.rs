//! The request and answer as handlers see them, made from and turned into hyper's: the
//! path still percent-encoded, the query decoded, the body read whole within its bound.

use crate::api::{url, ApiError};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::collections::HashMap;
use std::convert::Infallible;

/// Largest JSON request body accepted (an exec's stdin included).
pub const MAX_JSON_BODY: usize = 64 << 20;
/// The longest a body may go without a byte arriving.
pub const BODY_IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// The body of every answer: whole, or streamed (a protocol translation's server
/// streams).
pub type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// The largest body a request to `path` may carry: uploads (a tar for `cp`, a file, a
/// build's context) are
/// binary and may be as large as `copy_limit`, every other body is JSON.
pub fn body_limit(method: &str, path: &str, copy_limit: usize) -> usize {
    let path = path.trim_end_matches('/');
    let upload = (method == "PUT"
        && path.starts_with("/v1/sandboxes/")
        && (path.ends_with("/files") || path.ends_with("/file")))
        || (method == "POST" && path == "/v1/images/build/upload");
    if upload {
        copy_limit
    } else {
        MAX_JSON_BODY
    }
}

pub struct Request {
    pub method: String,
    /// The path as sent, still percent-encoded (segments are decoded after routing, so
    /// an encoded '/' stays inside its segment).
    pub path: String,
    pub query: HashMap<String, String>,
    /// The caller's registry credentials (`X-Registry-Config`), as sent: read by pulls
    /// and builds only, and never logged.
    pub registry_config: Option<String>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, ApiError> {
        let body: &[u8] = if self.body.is_empty() {
            b"{}"
        } else {
            &self.body
        };
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
    }
}

/// The method, path and query of a request's head.
pub fn target(
    parts: &hyper::http::request::Parts,
) -> Result<(String, String, HashMap<String, String>), ApiError> {
    let query = match parts.uri.query() {
        Some(q) => parse_query(q)?,
        None => HashMap::new(),
    };
    Ok((
        parts.method.as_str().to_string(),
        parts.uri.path().to_string(),
        query,
    ))
}

/// Reads a body of at most `limit` bytes, as it arrives: memory grows with what the
/// client sends, not with what its Content-Length claims, and a claim over the limit is
/// refused before a byte is read.
pub async fn read_body(
    parts: &hyper::http::request::Parts,
    body: hyper::body::Incoming,
    limit: usize,
) -> Result<Vec<u8>, ApiError> {
    let over = |len: String| {
        ApiError::bad_request(format!(
            "request body of {len} is over the limit of {limit} bytes for {} {}{}",
            parts.method,
            parts.uri.path(),
            if limit == MAX_JSON_BODY {
                ""
            } else {
                " (FORKD_MAX_COPY_BYTES sets it)"
            }
        ))
    };
    if let Some(v) = parts.headers.get(hyper::header::CONTENT_LENGTH) {
        let len: u64 = v
            .to_str()
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| ApiError::bad_request(format!("bad Content-Length {v:?}")))?;
        if len > limit as u64 {
            return Err(over(format!("{len} bytes")));
        }
    }
    let mut body = body;
    let mut out = Vec::new();
    loop {
        let Ok(next) = tokio::time::timeout(BODY_IDLE, body.frame()).await else {
            return Err(ApiError::bad_request(format!(
                "request body stalled: no byte for {} s after {} bytes",
                BODY_IDLE.as_secs(),
                out.len()
            )));
        };
        let Some(frame) = next else {
            break;
        };
        let frame = frame.map_err(|e| {
            let eof = e.is_incomplete_message()
                || std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<std::io::Error>())
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::UnexpectedEof);
            ApiError::bad_request(if eof {
                format!(
                    "request body ended after {} bytes, short of its length",
                    out.len()
                )
            } else {
                format!("read request body after {} bytes: {e}", out.len())
            })
        })?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(over("more bytes".into()));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

fn parse_query(q: &str) -> Result<HashMap<String, String>, ApiError> {
    let mut out = HashMap::new();
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(url::decode(k)?, url::decode(v)?);
    }
    Ok(out)
}

pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json<T: serde::Serialize>(status: u16, value: &T) -> Self {
        Response {
            status,
            content_type: "application/json",
            body: serde_json::to_vec(value).expect("serialisable"),
        }
    }

    pub fn error(e: &ApiError) -> Self {
        Self::json(e.status(), e)
    }

    /// hyper's answer, with the request id.
    pub fn into_hyper(self, request_id: &str) -> hyper::Response<Body> {
        let mut r = hyper::Response::new(full(self.body));
        *r.status_mut() = hyper::StatusCode::from_u16(self.status)
            .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
        let h = r.headers_mut();
        h.insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(self.content_type),
        );
        if let Ok(v) = hyper::header::HeaderValue::from_str(request_id) {
            h.insert("x-request-id", v);
        }
        r
    }
}

/// The answer that switches a connection to `protocol`.
pub fn upgrade(protocol: &'static str, request_id: &str) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(full(Bytes::new()));
    *r.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("Upgrade"),
    );
    h.insert(
        hyper::header::UPGRADE,
        hyper::header::HeaderValue::from_static(protocol),
    );
    if let Ok(v) = hyper::header::HeaderValue::from_str(request_id) {
        h.insert("x-request-id", v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_coding_round_trips() {
        for s in ["/etc/passwd", "a b/ç%?&=", ""] {
            assert_eq!(url::decode(&url::encode(s)).unwrap(), s);
        }
        assert!(url::decode("%zz").is_err());
        assert!(url::decode("%4").is_err());
    }

    #[test]
    fn queries_are_parsed() {
        let q = parse_query("path=%2Fetc%2Fhosts&force=true&x").unwrap();
        assert_eq!(q["path"], "/etc/hosts");
        assert_eq!(q["force"], "true");
        assert_eq!(q["x"], "");
    }

    #[test]
    fn uploads_alone_take_the_copy_limit() {
        assert_eq!(body_limit("PUT", "/v1/sandboxes/a/files", 9), 9);
        assert_eq!(body_limit("POST", "/v1/sandboxes", 9), MAX_JSON_BODY);
    }
}
