//! A small blocking client for the daemon's API, over its Unix socket or TCP (TLS; see
//! `transport.rs`), used by the CLI and the tests. One request per connection; exec can
//! upgrade the connection to the frame protocol. Answers are parsed by httparse.

use crate::transport::Endpoint;
use crate::{ApiError, EXEC_UPGRADE};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use crate::defaults::{DEFAULT_ROOT, DEFAULT_SOCKET};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the forkd daemon at {socket}: {source}{hint}")]
    NoDaemon {
        socket: String,
        hint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Api(ApiError),
    #[error("talking to the daemon: {0}")]
    Protocol(String),
}

/// Kept TCP connections a client holds at most.
const POOLED: usize = 16;

#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
    /// Kept-alive connections to a TCP endpoint, shared by the client's clones.
    pool: Arc<Mutex<Vec<UnixStream>>>,
}

pub struct HttpResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Client {
    /// A client of the daemon on `socket`.
    pub fn new(socket: &Path) -> Self {
        Client::at(Endpoint::Unix(socket.to_path_buf()))
    }

    /// A client of the daemon at `endpoint`.
    pub fn at(endpoint: Endpoint) -> Self {
        Client {
            endpoint,
            pool: Arc::default(),
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The socket from `FORKD_SOCKET`, or the default.
    pub fn default_socket() -> PathBuf {
        crate::defaults::socket()
    }

    /// Waits until the daemon answers `GET /v1/version`: the one readiness rule for
    /// whoever starts a daemon (the demo, a shard's node, the tests and benchmarks).
    /// `still_starting` is asked between attempts and returns why to stop waiting (the
    /// daemon process exited, say). Errors name the socket, the time waited and the last
    /// error.
    pub fn wait_ready(
        &self,
        timeout: std::time::Duration,
        mut still_starting: impl FnMut() -> Result<(), String>,
    ) -> Result<(), String> {
        let t = std::time::Instant::now();
        loop {
            let err = match self.call::<crate::VersionInfo>("GET", "/v1/version", None) {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            still_starting()?;
            if t.elapsed() >= timeout {
                return Err(format!(
                    "the daemon on {} did not answer within {timeout:?}: {err}",
                    self.endpoint
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    fn connect(&self) -> Result<UnixStream, ClientError> {
        self.endpoint
            .connect()
            .map_err(|source| ClientError::NoDaemon {
                socket: self.endpoint.to_string(),
                hint: match &self.endpoint {
                    Endpoint::Unix(p) => format!(
                        "\nstart one with: forkd daemon --socket {} (or set FORKD_SOCKET)",
                        p.display()
                    ),
                    Endpoint::Tcp(_) | Endpoint::Dial(_) => String::new(),
                },
                source,
            })
    }

    fn send_head(
        &self,
        stream: &mut UnixStream,
        method: &str,
        path: &str,
        extra: &str,
        body: &[u8],
    ) -> Result<(), ClientError> {
        let auth = match self.endpoint.key() {
            Some(k) => format!("Authorization: Bearer {k}\r\n"),
            None => String::new(),
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: forkd\r\nContent-Length: {}\r\n{auth}{extra}\r\n",
            body.len()
        );
        stream
            .write_all(head.as_bytes())
            .and_then(|_| stream.write_all(body))
            .map_err(|e| ClientError::Protocol(format!("send {method} {path}: {e}")))
    }

    /// Sends a request and reads the whole response.
    pub fn raw(&self, method: &str, path: &str, body: &[u8]) -> Result<HttpResponse, ClientError> {
        self.raw_with(method, path, &[], body)
    }

    /// Sends a request with more headers (names and values without CR or LF) and reads
    /// the whole response.
    pub fn raw_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<HttpResponse, ClientError> {
        // A Unix socket's connection carries one request; a TCP one (TLS) is kept for the
        // next, since making one costs a handshake.
        let keep = matches!(self.endpoint, Endpoint::Tcp(_));
        let mut extra = String::from(if keep { "" } else { "Connection: close\r\n" });
        for (k, v) in headers {
            if [k, v].iter().any(|x| x.contains(['\r', '\n'])) {
                return Err(ClientError::Protocol(format!(
                    "header {k} holds a line break"
                )));
            }
            extra.push_str(&format!("{k}: {v}\r\n"));
        }
        if keep {
            if let Some(mut s) = self.pooled() {
                // A kept connection the daemon closed just as it was taken (idle too
                // long) ends before a byte of answer. Whether the request ran then is
                // not known, so only a request that may run twice goes again.
                let again = matches!(method, "GET" | "HEAD");
                let sent = self.send_head(&mut s, method, path, &extra, body);
                match sent.map_err(Unanswered::Failed).and_then(|()| read_answer(&mut s)) {
                    Ok((resp, reusable)) => {
                        if reusable {
                            self.put_back(s);
                        }
                        return Ok(resp);
                    }
                    Err(Unanswered::Nothing) if again => {}
                    Err(Unanswered::Nothing) => {
                        return Err(ClientError::Protocol(format!(
                            "the daemon closed a kept connection before answering {method} {path}: it may or may not have run"
                        )))
                    }
                    Err(Unanswered::Failed(e)) => return Err(e),
                }
            }
        }
        let mut s = self.connect()?;
        self.send_head(&mut s, method, path, &extra, body)?;
        match read_answer(&mut s) {
            Ok((resp, reusable)) => {
                if keep && reusable {
                    self.put_back(s);
                }
                Ok(resp)
            }
            Err(Unanswered::Nothing) => Err(ClientError::Protocol(
                "the daemon closed the connection without answering".into(),
            )),
            Err(Unanswered::Failed(e)) => Err(e),
        }
    }

    /// A kept connection that is still open, if there is one: one the daemon closed
    /// (idle too long) reads as ended, and is let go.
    fn pooled(&self) -> Option<UnixStream> {
        loop {
            let s = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
            if s.set_nonblocking(true).is_err() {
                continue;
            }
            let mut byte = [0u8; 1];
            let open = matches!(
                (&s).read(&mut byte),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
            );
            if open && s.set_nonblocking(false).is_ok() {
                return Some(s);
            }
        }
    }

    /// Keeps a connection for a next request (a few at most).
    fn put_back(&self, s: UnixStream) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < POOLED {
            pool.push(s);
        }
    }

    /// Sends a request; decodes a JSON answer or the daemon's typed error.
    pub fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<T, ClientError> {
        let bytes = body
            .map(|b| serde_json::to_vec(b).expect("json"))
            .unwrap_or_default();
        let resp = self.raw(method, path, &bytes)?;
        Self::decode(resp)
    }

    /// Sends a typed request (one of this crate's request types); decodes a JSON answer or
    /// the daemon's typed error.
    pub fn send<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let bytes = serde_json::to_vec(body).expect("json");
        Self::decode(self.raw(method, path, &bytes)?)
    }

    /// [`Client::send`] with more headers.
    pub fn send_with<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &B,
    ) -> Result<T, ClientError> {
        let bytes = serde_json::to_vec(body).expect("json");
        Self::decode(self.raw_with(method, path, headers, &bytes)?)
    }

    pub fn decode<T: serde::de::DeserializeOwned>(resp: HttpResponse) -> Result<T, ClientError> {
        if resp.status >= 400 {
            return Err(Self::api_error(&resp));
        }
        serde_json::from_slice(&resp.body)
            .map_err(|e| ClientError::Protocol(format!("decode response: {e}")))
    }

    pub fn api_error(resp: &HttpResponse) -> ClientError {
        match serde_json::from_slice::<ApiError>(&resp.body) {
            Ok(e) => ClientError::Api(e),
            Err(_) => ClientError::Protocol(format!(
                "status {} with body {}",
                resp.status,
                String::from_utf8_lossy(&resp.body)
            )),
        }
    }

    /// Starts an exec on an upgraded connection; returns the raw stream carrying frames.
    pub fn exec_stream(
        &self,
        sandbox: &str,
        req: &forkd_proto::ExecRequest,
    ) -> Result<UnixStream, ClientError> {
        let mut s = self.connect()?;
        let body = serde_json::to_vec(req).expect("json");
        let path = format!("/v1/sandboxes/{}/exec", crate::url::encode(sandbox));
        self.send_head(
            &mut s,
            "POST",
            &path,
            &format!("Connection: Upgrade\r\nUpgrade: {EXEC_UPGRADE}\r\n"),
            &body,
        )?;
        // Read the head byte by byte: frames follow it directly and must stay unread.
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        let (status, length) = loop {
            match s.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => {
                    return Err(ClientError::Protocol(
                        "connection closed during exec upgrade".into(),
                    ))
                }
            }
            if head.ends_with(b"\r\n\r\n") {
                match parse_head(&head)? {
                    Some(h) => break (h.status, h.length),
                    None => return Err(ClientError::Protocol("malformed answer head".into())),
                }
            }
        };
        if status != 101 {
            let mut body = vec![0u8; length.unwrap_or(0)];
            let _ = s.read_exact(&mut body);
            return Err(Self::api_error(&HttpResponse { status, body }));
        }
        Ok(s)
    }
}

/// An answer's head, as far as reading the answer goes.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    /// Its length in bytes.
    len: usize,
    status: u16,
    /// The body's length, if given.
    length: Option<usize>,
    chunked: bool,
    /// The daemon closes the connection after it.
    close: bool,
}

/// Why no answer came.
enum Unanswered {
    /// The connection ended before a byte of it.
    Nothing,
    Failed(ClientError),
}

/// Reads one answer; says whether the connection may carry another.
fn read_answer(s: &mut UnixStream) -> Result<(HttpResponse, bool), Unanswered> {
    let proto =
        |e: std::io::Error| Unanswered::Failed(ClientError::Protocol(format!("read answer: {e}")));
    let mut buf = Vec::with_capacity(8192);
    let mut chunk = [0u8; 8192];
    let head = loop {
        let n = match s.read(&mut chunk) {
            Ok(n) => n,
            Err(_) if buf.is_empty() => return Err(Unanswered::Nothing),
            Err(e) => return Err(proto(e)),
        };
        if n == 0 {
            return Err(if buf.is_empty() {
                Unanswered::Nothing
            } else {
                Unanswered::Failed(ClientError::Protocol(format!(
                    "incomplete answer head ({} bytes)",
                    buf.len()
                )))
            });
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(h) = parse_head(&buf).map_err(Unanswered::Failed)? {
            break h;
        }
    };
    let mut rest = buf.split_off(head.len);
    let (body, reusable) = if head.chunked {
        loop {
            if let Some(body) = dechunk(&rest).map_err(Unanswered::Failed)? {
                break (body, !head.close);
            }
            let n = s.read(&mut chunk).map_err(proto)?;
            if n == 0 {
                return Err(Unanswered::Failed(ClientError::Protocol(
                    "chunked answer cut short".into(),
                )));
            }
            rest.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = head.length {
        if rest.len() < n {
            let have = rest.len();
            rest.resize(n, 0);
            s.read_exact(&mut rest[have..]).map_err(|e| {
                Unanswered::Failed(ClientError::Protocol(format!(
                    "answer cut short after {have} of {n} bytes: {e}"
                )))
            })?;
        }
        rest.truncate(n);
        (rest, !head.close)
    } else {
        s.read_to_end(&mut rest).map_err(proto)?;
        (rest, false)
    };
    Ok((
        HttpResponse {
            status: head.status,
            body,
        },
        reusable,
    ))
}

/// An answer's head, parsed by httparse once it is all in `buf`.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, ClientError> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    let n = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(ClientError::Protocol(format!("malformed answer head: {e}"))),
    };
    let mut head = Head {
        len: n,
        status: r.code.unwrap_or(0),
        length: None,
        chunked: false,
        close: false,
    };
    for h in r.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            head.length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok());
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked = h.value.eq_ignore_ascii_case(b"chunked");
        } else if h.name.eq_ignore_ascii_case("connection") {
            head.close = h.value.eq_ignore_ascii_case(b"close");
        }
    }
    Ok(Some(head))
}

/// A chunked body, joined; `None` until all of it is in `raw`.
fn dechunk(mut raw: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
    let bad = |what: &str| ClientError::Protocol(format!("malformed chunked answer: {what}"));
    let mut out = Vec::new();
    loop {
        let (at, size) = match httparse::parse_chunk_size(raw) {
            Ok(httparse::Status::Complete(x)) => x,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(bad("bad chunk size")),
        };
        let size = usize::try_from(size).map_err(|_| bad("chunk too large"))?;
        raw = &raw[at..];
        if size == 0 {
            // The last chunk, then (no trailers) the closing line.
            return Ok(raw.starts_with(b"\r\n").then_some(out));
        }
        if raw.len() < size + 2 {
            return Ok(None);
        }
        if &raw[size..size + 2] != b"\r\n" {
            return Err(bad("a chunk does not end where its size says"));
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_and_chunks_are_read() {
        let head = b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nConnection: close\r\n\r\n{}";
        assert_eq!(
            parse_head(head).unwrap(),
            Some(Head {
                len: head.len() - 2,
                status: 201,
                length: Some(2),
                chunked: false,
                close: true
            })
        );
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\n").unwrap(), None);
        assert!(parse_head(b"nonsense\r\n\r\n").is_err());
        assert_eq!(
            dechunk(b"3\r\nabc\r\n1\r\nd\r\n0\r\n\r\n")
                .unwrap()
                .unwrap(),
            b"abcd"
        );
        assert_eq!(dechunk(b"3\r\nab").unwrap(), None);
        assert_eq!(dechunk(b"3\r\nabc\r\n0\r\n").unwrap(), None);
        assert!(dechunk(b"3\r\nabcd\r\n").is_err());
    }
}
