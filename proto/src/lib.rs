//! The exec protocol spoken on a sandbox's control socket.
//!
//! The init of every sandbox listens on `/.forkd/run/init.sock` inside the sandbox. A
//! client (the daemon, or the daemon on behalf of a CLI) connects, sends one
//! [`Kind::Request`] frame with an [`ExecRequest`] in JSON, then streams frames both
//! ways until a [`Kind::Exit`] frame closes the exchange. The daemon forwards the same
//! frames unchanged to CLI clients that upgrade their HTTP connection, so there is one
//! wire format end to end.
//!
//! A frame is a 1-byte kind, a 4-byte big-endian payload length, then the payload.
//! Payloads larger than [`MAX_FRAME`] are refused.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

mod fs;
pub use fs::{FsAnswer, FsEntry, FsKind, FsOp};

/// Largest accepted payload (output is chunked well below this).
pub const MAX_FRAME: usize = 16 << 20;
/// Size of the frame header.
pub const HEADER: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// client -> init: the JSON [`ExecRequest`], first frame only.
    Request = 1,
    /// client -> init: bytes for the command's standard input.
    Stdin = 2,
    /// client -> init: end of standard input.
    StdinEof = 3,
    /// init -> client: bytes the command wrote to standard output (or the tty).
    Stdout = 4,
    /// init -> client: bytes the command wrote to standard error.
    Stderr = 5,
    /// init -> client: the JSON [`ExecExit`]; last frame.
    Exit = 6,
    /// init -> client: the JSON [`ExecStarted`], once the command runs.
    Started = 7,
    /// init -> client: a JSON `{"message": ...}` when the command could not be started.
    Error = 8,
    /// client -> init: terminal size, two big-endian u16 (rows, cols).
    Resize = 9,
    /// client -> init: a signal for the command, one byte (its number); `SIGKILL` ends
    /// the command's whole tree, as a timeout does. An init that predates it ignores it.
    Signal = 10,
}

impl Kind {
    pub fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Request,
            2 => Kind::Stdin,
            3 => Kind::StdinEof,
            4 => Kind::Stdout,
            5 => Kind::Stderr,
            6 => Kind::Exit,
            7 => Kind::Started,
            8 => Kind::Error,
            9 => Kind::Resize,
            10 => Kind::Signal,
            _ => return None,
        })
    }
}

/// The program of forkd's own tools inside every sandbox.
pub const TOOL_PROGRAM: &str = "/.forkd/init";

/// What to run, and how.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Program and arguments (`PATH` is searched). Empty when `shell` is given.
    #[serde(default)]
    pub argv: Vec<String>,
    /// A shell command line, run as `/bin/sh -c LINE`.
    #[serde(default)]
    pub shell: Option<String>,
    /// Extra environment, `KEY=VALUE`, applied over the sandbox's defaults.
    #[serde(default)]
    pub env: Vec<String>,
    /// Working directory inside the sandbox (default `/`).
    #[serde(default)]
    pub cwd: Option<String>,
    /// `NAME`, `UID` or `UID:GID` (default root).
    #[serde(default)]
    pub user: Option<String>,
    /// Kill the command's whole process tree after this many milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Run on a new pseudo-terminal (interactive use).
    #[serde(default)]
    pub tty: bool,
    /// The client sends stdin frames; otherwise stdin is `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
    /// Start in the background: output goes to `/.forkd/logs/<log>.log` inside the
    /// sandbox and the exchange ends with a `Started` frame.
    #[serde(default)]
    pub detach: bool,
    /// Log name for detached commands (validated: `[A-Za-z0-9_.-]`, not starting with `.`).
    #[serde(default)]
    pub log: Option<String>,
    /// Standard error goes to the standard output's pipe (`2>&1`), so the output is in
    /// the exact order the command wrote it. Left out of the wire form when false, so an
    /// init restored from an older checkpoint still reads every request that does not
    /// ask for it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub merge_stderr: bool,
    /// The command outlives its client: a client that goes away leaves it running (its
    /// output is dropped until another attaches), and a client may attach to it later
    /// by its pid (`attach`). With no client attached it holds no connection to the
    /// host, so a live checkpoint takes it with the sandbox. Left out of the wire form
    /// when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub keep: bool,
    /// Attach to the kept command of this pid (in the sandbox) instead of running one:
    /// the exchange goes on as the command's own (a `Started` frame, its output, its
    /// exit), replacing the client attached before, if any. Nothing else may be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach: Option<i32>,
    /// Run one of forkd's own tools (in every sandbox, whatever its image) instead of
    /// `argv` or `shell`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<Tool>,
}

/// forkd's own tools an exec may run (`ExecRequest::tool`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Tool {
    /// Changes under the directory `path` as they happen (inotify), one JSON line each
    /// on stdout: `{"name": PATH, "type": "create"|"write"|"remove"|"rename"|"chmod"}`,
    /// PATH relative to `path`; first `{"ready": true}` once it watches.
    Watch {
        path: String,
        #[serde(default)]
        recursive: bool,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl ExecRequest {
    /// Checks the request before anything runs; the message names the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(pid) = self.attach {
            let bare = ExecRequest {
                attach: Some(pid),
                ..Default::default()
            };
            if *self != bare || pid <= 0 {
                return Err(
                    "attach names a kept command's pid (above 0), and nothing else: no argv, shell or other setting".into(),
                );
            }
            return Ok(());
        }
        if self.keep && self.detach {
            return Err("keep is for a command with a client: not with detach".into());
        }
        if self.merge_stderr && (self.tty || self.detach) {
            return Err("merge_stderr is for commands with pipes: not with tty or detach".into());
        }
        match (&self.shell, self.argv.is_empty(), &self.tool) {
            (None, true, Some(Tool::Watch { path, .. }))
                if !path.starts_with('/') || path.contains('\0') =>
            {
                return Err(format!("tool watch: path {path:?} must be absolute"));
            }
            (None, true, Some(_)) => {}
            (_, _, Some(_)) => {
                return Err("a tool runs instead of argv or shell, not with them".into())
            }
            (Some(_), false, None) => return Err("give either argv or shell, not both".into()),
            (None, true, None) => return Err("argv is empty and no shell command given".into()),
            _ => {}
        }
        if self
            .argv
            .iter()
            .chain(self.env.iter())
            .any(|s| s.contains('\0'))
        {
            return Err("argv and env must not contain NUL bytes".into());
        }
        if let Some(e) = self
            .env
            .iter()
            .find(|e| !e.contains('=') || e.starts_with('='))
        {
            return Err(format!("env entry {e:?} is not KEY=VALUE"));
        }
        if let Some(log) = &self.log {
            if !valid_log_name(log) {
                return Err(format!(
                    "log name {log:?} must be [A-Za-z0-9_.-], not starting with '.'"
                ));
            }
        }
        if self.detach && self.tty {
            return Err("a detached command cannot have a tty".into());
        }
        Ok(())
    }

    /// The argv actually executed (a tool's is the sandbox's `/.forkd/init`'s).
    pub fn command_line(&self) -> Vec<String> {
        match (&self.shell, &self.tool) {
            (_, Some(Tool::Watch { path, recursive })) => vec![
                TOOL_PROGRAM.into(),
                "__watch".into(),
                serde_json::json!({ "path": path, "recursive": recursive }).to_string(),
            ],
            (Some(line), None) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
            (None, None) => self.argv.clone(),
        }
    }
}

pub fn valid_log_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Sent once the command runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecStarted {
    /// Pid inside the sandbox.
    pub pid: i32,
    /// For detached commands: the log file inside the sandbox.
    #[serde(default)]
    pub log_path: Option<String>,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecExit {
    /// Exit status, or 128 + signal number when killed (shell convention).
    pub exit_code: i32,
    /// The signal that killed it, if any.
    pub signal: Option<i32>,
    /// The timeout fired and the whole tree was killed.
    pub timed_out: bool,
    /// Wall time from start to exit, microseconds.
    pub duration_us: u64,
}

/// Writes one frame.
pub fn write_frame<W: Write>(w: &mut W, kind: Kind, payload: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(HEADER + payload.len());
    encode_frame(&mut buf, kind, payload);
    w.write_all(&buf)
}

/// Appends one frame to `buf`.
pub fn encode_frame(buf: &mut Vec<u8>, kind: Kind, payload: &[u8]) {
    buf.push(kind as u8);
    buf.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    buf.extend_from_slice(payload);
}

/// Parses a frame header.
pub fn decode_header(h: &[u8; HEADER]) -> io::Result<(Kind, usize)> {
    let kind = Kind::from_u8(h[0]).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unknown frame kind {}", h[0]),
        )
    })?;
    let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is too large"),
        ));
    }
    Ok((kind, len))
}

/// Reads one frame; `Ok(None)` on a clean end of stream.
pub fn read_frame<R: Read>(r: &mut R) -> io::Result<Option<(Kind, Vec<u8>)>> {
    let mut h = [0u8; HEADER];
    match r.read_exact(&mut h) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let (kind, len) = decode_header(&h)?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some((kind, payload)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_binary_payloads() {
        let payload: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        let mut buf = Vec::new();
        write_frame(&mut buf, Kind::Stdout, &payload).unwrap();
        write_frame(&mut buf, Kind::Exit, b"{}").unwrap();
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r).unwrap(), Some((Kind::Stdout, payload)));
        assert_eq!(
            read_frame(&mut r).unwrap(),
            Some((Kind::Exit, b"{}".to_vec()))
        );
        assert_eq!(read_frame(&mut r).unwrap(), None);
    }

    #[test]
    fn oversized_and_unknown_frames_are_refused() {
        let mut h = [Kind::Stdout as u8, 0xff, 0xff, 0xff, 0xff];
        assert!(decode_header(&h)
            .unwrap_err()
            .to_string()
            .contains("too large"));
        h[0] = 99;
        assert!(decode_header(&h)
            .unwrap_err()
            .to_string()
            .contains("unknown frame kind 99"));
    }

    #[test]
    fn requests_are_validated() {
        let mut r = ExecRequest {
            argv: vec!["ls".into()],
            ..Default::default()
        };
        assert!(r.validate().is_ok());
        r.shell = Some("ls".into());
        assert!(r.validate().unwrap_err().contains("not both"));
        r.argv.clear();
        r.env = vec!["NOEQUALS".into()];
        assert!(r.validate().unwrap_err().contains("NOEQUALS"));
        r.env.clear();
        r.log = Some("../x".into());
        assert!(r.validate().unwrap_err().contains("log name"));
        assert_eq!(r.command_line(), vec!["/bin/sh", "-c", "ls"]);
        let empty = ExecRequest::default();
        assert!(empty.validate().unwrap_err().contains("argv is empty"));
    }
}
