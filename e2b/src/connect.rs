//! The Connect protocol's framing, as envd speaks it with the JSON codec: a server
//! stream's body is a run of envelopes (a flag byte, a 4-byte big-endian length, the
//! message), the last one flagged [`END_STREAM`] and holding `{}` or `{"error": ...}`;
//! a unary call's body is the bare message. Errors carry a code by name.

/// A compressed envelope (refused: envd's clients send none).
pub const COMPRESSED: u8 = 0x01;
/// The envelope that ends a stream.
pub const END_STREAM: u8 = 0x02;
/// An envelope's header: the flag byte and the length.
pub const HEADER: usize = 5;
/// The largest message accepted in a request envelope.
pub const MAX_MESSAGE: usize = 16 << 20;
/// A server stream's content type (exactly this: the SDK refuses parameters).
pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";

/// Connect's error codes, by the names its wire carries, with the HTTP status a unary
/// call answers them with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    Unauthenticated,
    FailedPrecondition,
    ResourceExhausted,
    DeadlineExceeded,
    Unimplemented,
    Unavailable,
    Internal,
}

impl Code {
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::Unauthenticated => "unauthenticated",
            Code::FailedPrecondition => "failed_precondition",
            Code::ResourceExhausted => "resource_exhausted",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::Unimplemented => "unimplemented",
            Code::Unavailable => "unavailable",
            Code::Internal => "internal",
        }
    }

    pub fn status(self) -> u16 {
        match self {
            Code::InvalidArgument => 400,
            Code::NotFound => 404,
            Code::AlreadyExists => 409,
            Code::PermissionDenied => 403,
            Code::Unauthenticated => 401,
            Code::FailedPrecondition => 412,
            Code::ResourceExhausted => 429,
            Code::DeadlineExceeded => 504,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Internal => 500,
        }
    }
}

/// A Connect error: its code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: Code,
    pub message: String,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }

    /// The error as JSON: `{"code": NAME, "message": ...}`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.name(), "message": self.message })
    }
}

/// One envelope of `message`.
pub fn envelope(flags: u8, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + message.len());
    out.push(flags);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The envelope that ends a stream, with its error if it failed.
pub fn end_of_stream(error: Option<&Error>) -> Vec<u8> {
    let body = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({ "error": e.json() }),
    };
    envelope(END_STREAM, body.to_string().as_bytes())
}

/// Why a request's envelopes could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The body ended inside an envelope.
    Truncated { at: usize },
    /// An envelope claims more than [`MAX_MESSAGE`].
    TooLarge { len: usize },
    /// A compressed envelope, or a flag this side does not know.
    Flags { flags: u8 },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Truncated { at } => {
                write!(f, "the body ends inside the envelope at byte {at}")
            }
            FrameError::TooLarge { len } => write!(
                f,
                "an envelope of {len} bytes is over the limit of {MAX_MESSAGE}"
            ),
            FrameError::Flags { flags } => write!(
                f,
                "envelope flags {flags:#04x}: compressed or unknown envelopes are not accepted"
            ),
        }
    }
}

/// An envelope read from a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope<'a> {
    pub end: bool,
    pub message: &'a [u8],
}

/// Reads every envelope of a whole body, in order.
pub fn envelopes(mut body: &[u8]) -> Result<Vec<Envelope<'_>>, FrameError> {
    let mut out = Vec::new();
    let mut at = 0;
    while !body.is_empty() {
        if body.len() < HEADER {
            return Err(FrameError::Truncated { at });
        }
        let flags = body[0];
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        if flags & !END_STREAM != 0 {
            return Err(FrameError::Flags { flags });
        }
        if len > MAX_MESSAGE {
            return Err(FrameError::TooLarge { len });
        }
        let Some(message) = body.get(HEADER..HEADER + len) else {
            return Err(FrameError::Truncated { at });
        };
        out.push(Envelope {
            end: flags & END_STREAM != 0,
            message,
        });
        body = &body[HEADER + len..];
        at += HEADER + len;
    }
    Ok(out)
}

/// The one message of a server-streaming call's request body.
pub fn request_message(body: &[u8]) -> Result<&[u8], Error> {
    let all = envelopes(body).map_err(|e| Error::new(Code::InvalidArgument, e.to_string()))?;
    match all.as_slice() {
        [one] if !one.end => Ok(one.message),
        _ => Err(Error::new(
            Code::InvalidArgument,
            format!(
                "a server-streaming call's request is one message, not {} envelopes",
                all.len()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_refuse_what_is_malformed() {
        let mut body = envelope(0, br#"{"a":1}"#);
        body.extend(end_of_stream(None));
        let all = envelopes(&body).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!((all[0].end, all[0].message), (false, &br#"{"a":1}"#[..]));
        assert_eq!((all[1].end, all[1].message), (true, &b"{}"[..]));
        assert_eq!(
            envelopes(&body[..body.len() - 1]),
            Err(FrameError::Truncated { at: 12 })
        );
        assert_eq!(envelopes(&[0, 0, 0]), Err(FrameError::Truncated { at: 0 }));
        assert_eq!(
            envelopes(&envelope(COMPRESSED, b"x")),
            Err(FrameError::Flags { flags: 1 })
        );
        let huge = [0, 0xff, 0xff, 0xff, 0xff];
        assert!(matches!(envelopes(&huge), Err(FrameError::TooLarge { .. })));
        assert_eq!(request_message(&envelope(0, b"{}")).unwrap(), b"{}");
        assert!(request_message(&body).is_err());
        assert!(request_message(b"").is_err());
        let err = end_of_stream(Some(&Error::new(Code::NotFound, "gone")));
        let v: serde_json::Value = serde_json::from_slice(&err[HEADER..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(err[0], END_STREAM);
    }
}
