//! A small blocking client for the daemon's API over its Unix socket, used by the CLI
//! and the tests. One request per connection; exec can upgrade the connection to the
//! frame protocol.

use crate::{ApiError, EXEC_UPGRADE};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

pub use crate::defaults::{DEFAULT_ROOT, DEFAULT_SOCKET};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the forkd daemon at {socket}: {source}\nstart one with: forkd daemon --socket {socket} (or set FORKD_SOCKET)")]
    NoDaemon {
        socket: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Api(ApiError),
    #[error("talking to the daemon: {0}")]
    Protocol(String),
}

#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

pub struct HttpResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Client {
    pub fn new(socket: &Path) -> Self {
        Client {
            socket: socket.to_path_buf(),
        }
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
                    self.socket.display()
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    fn connect(&self) -> Result<UnixStream, ClientError> {
        UnixStream::connect(&self.socket).map_err(|source| ClientError::NoDaemon {
            socket: self.socket.display().to_string(),
            source,
        })
    }

    fn send_head(
        stream: &mut UnixStream,
        method: &str,
        path: &str,
        extra: &str,
        body: &[u8],
    ) -> Result<(), ClientError> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: forkd\r\nContent-Length: {}\r\n{extra}\r\n",
            body.len()
        );
        stream
            .write_all(head.as_bytes())
            .and_then(|_| stream.write_all(body))
            .map_err(|e| ClientError::Protocol(format!("send {method} {path}: {e}")))
    }

    /// Reads the status line and headers; returns (status, headers, reader).
    fn read_head(
        stream: UnixStream,
    ) -> Result<(u16, Vec<(String, String)>, BufReader<UnixStream>), ClientError> {
        let mut r = BufReader::new(stream);
        let mut line = String::new();
        r.read_line(&mut line)
            .map_err(|e| ClientError::Protocol(format!("read response: {e}")))?;
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ClientError::Protocol(format!("malformed status line {line:?}")))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            r.read_line(&mut line)
                .map_err(|e| ClientError::Protocol(format!("read response: {e}")))?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        Ok((status, headers, r))
    }

    /// Sends a request and reads the whole response.
    pub fn raw(&self, method: &str, path: &str, body: &[u8]) -> Result<HttpResponse, ClientError> {
        let mut s = self.connect()?;
        Self::send_head(&mut s, method, path, "", body)?;
        let (status, headers, mut r) = Self::read_head(s)?;
        let mut body = Vec::new();
        match headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse::<usize>().ok())
        {
            Some(n) => {
                body.resize(n, 0);
                r.read_exact(&mut body)
                    .map_err(|e| ClientError::Protocol(format!("read body: {e}")))?;
            }
            None => {
                r.read_to_end(&mut body)
                    .map_err(|e| ClientError::Protocol(format!("read body: {e}")))?;
            }
        }
        Ok(HttpResponse { status, body })
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
        Self::send_head(
            &mut s,
            "POST",
            &path,
            &format!("Connection: Upgrade\r\nUpgrade: {EXEC_UPGRADE}\r\n"),
            &body,
        )?;
        // Read the head byte by byte: frames follow it directly and must stay unread.
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match s.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => {
                    return Err(ClientError::Protocol(
                        "connection closed during exec upgrade".into(),
                    ))
                }
            }
        }
        let text = String::from_utf8_lossy(&head);
        let status: u16 = text
            .split(' ')
            .nth(1)
            .and_then(|x| x.parse().ok())
            .unwrap_or(0);
        if status != 101 {
            let n = text
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0u8; n];
            let _ = s.read_exact(&mut body);
            return Err(Self::api_error(&HttpResponse { status, body }));
        }
        Ok(s)
    }
}
