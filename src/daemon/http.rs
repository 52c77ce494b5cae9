//! Just enough HTTP/1.1 for a local API on a Unix socket: one request per connection,
//! bodies delimited by Content-Length, responses that close the connection, and an
//! upgrade path that hands the raw stream to the exec protocol.

use crate::api::{url, ApiError};
use std::collections::HashMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const MAX_HEAD: usize = 64 * 1024;
/// Largest JSON request body accepted (an exec's stdin included).
pub const MAX_JSON_BODY: usize = 64 << 20;

/// The largest body a request to `path` may carry: uploads (a tar for `cp`) are
/// binary and may be as large as `copy_limit`, every other body is JSON.
pub fn body_limit(method: &str, path: &str, copy_limit: usize) -> usize {
    let upload = method == "PUT"
        && path.starts_with("/v1/sandboxes/")
        && path.trim_end_matches('/').ends_with("/files");
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
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

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

/// Reads one request. `Ok(None)` when the client closed the connection first.
/// Reads one request; an upload may carry at most `copy_limit` bytes.
pub async fn read_request(
    stream: &mut UnixStream,
    copy_limit: usize,
) -> Result<Option<Request>, ApiError> {
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return Err(ApiError::bad_request("request head larger than 64 KiB"));
        }
        let mut chunk = [0u8; 8192];
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| ApiError::bad_request(format!("read request: {e}")))?;
        if n == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(ApiError::bad_request("truncated request head"))
            };
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = std::str::from_utf8(&buf[..head_end])
        .map_err(|_| ApiError::bad_request("request head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let start = lines.next().unwrap_or_default();
    let mut parts = start.split(' ');
    let (method, target) = match (parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v)) if v.starts_with("HTTP/1.") => (m.to_string(), t.to_string()),
        _ => {
            return Err(ApiError::bad_request(format!(
                "malformed request line {start:?}"
            )))
        }
    };
    let mut headers = HashMap::new();
    for line in lines {
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| ApiError::bad_request(format!("malformed header {line:?}")))?;
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), parse_query(q)?),
        None => (target, HashMap::new()),
    };
    if headers.contains_key("transfer-encoding") {
        return Err(ApiError::bad_request(
            "chunked request bodies are not supported: send Content-Length",
        ));
    }
    let len: usize = match headers.get("content-length") {
        Some(v) => v
            .parse()
            .map_err(|_| ApiError::bad_request(format!("bad Content-Length {v:?}")))?,
        None => 0,
    };
    let limit = body_limit(&method, &path, copy_limit);
    if len > limit {
        return Err(ApiError::bad_request(format!(
            "request body of {len} bytes is over the limit of {limit} bytes for {method} {path}{}",
            if limit == MAX_JSON_BODY {
                ""
            } else {
                " (FORKD_MAX_COPY_BYTES sets it)"
            }
        )));
    }
    let mut body = buf[head_end + 4..].to_vec();
    if body.len() < len
        && headers
            .get("expect")
            .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
    {
        stream
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .map_err(|e| ApiError::bad_request(format!("write 100 Continue: {e}")))?;
    }
    // Read as it arrives: memory grows with what the client sends, not with what its
    // Content-Length claims.
    let mut chunk = vec![0u8; 64 << 10];
    while body.len() < len {
        let want = (len - body.len()).min(chunk.len());
        let n = stream
            .read(&mut chunk[..want])
            .await
            .map_err(|e| ApiError::bad_request(format!("read request body: {e}")))?;
        if n == 0 {
            return Err(ApiError::bad_request(format!(
                "request body ended after {} of {len} bytes",
                body.len()
            )));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len);
    Ok(Some(Request {
        method,
        path,
        query,
        headers,
        body,
    }))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
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
}

pub fn reason(status: u16) -> &'static str {
    match status {
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        409 => "Conflict",
        _ => "Internal Server Error",
    }
}

pub async fn write_response(
    stream: &mut UnixStream,
    resp: &Response,
    request_id: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nX-Request-Id: {}\r\nConnection: close\r\n\r\n",
        resp.status,
        reason(resp.status),
        resp.content_type,
        resp.body.len(),
        request_id
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&resp.body).await?;
    stream.flush().await
}

pub async fn write_upgrade(
    stream: &mut UnixStream,
    protocol: &str,
    request_id: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: {protocol}\r\nX-Request-Id: {request_id}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await
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
}
