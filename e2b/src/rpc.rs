//! What every envd call shares: the sandbox it is for ([`Target`]: forkd's API as the
//! sandbox's owner, and what was read of it; its users and paths), and Connect's errors
//! as answers (unary, and a server stream that fails at once).

use crate::connect::{self, Code, Error};
use crate::{json, Body, SandboxFacts};
use forkd_api::client::Client;
use std::sync::Arc;

type Answer = hyper::Response<Body>;

/// A sandbox envd serves: forkd's API as its owner, and what was read of it.
#[derive(Clone)]
pub struct Target {
    pub id: String,
    pub client: Client,
    pub facts: Arc<SandboxFacts>,
}

impl Target {
    /// The user a request acts as: the one it names, else the sandbox's default.
    pub fn user<'a>(&'a self, named: Option<&'a str>) -> &'a str {
        named.filter(|u| !u.is_empty()).unwrap_or(&self.facts.user)
    }

    /// An absolute path: a relative one is in `user`'s home.
    pub fn path(&self, user: &str, path: &str) -> String {
        if path.starts_with('/') {
            return path.to_string();
        }
        let home = self
            .facts
            .homes
            .get(user)
            .or_else(|| self.facts.homes.get(&self.facts.user))
            .cloned()
            .unwrap_or_else(|| "/root".to_string());
        let rel = path.trim_start_matches("./");
        if rel.is_empty() || rel == "." {
            home
        } else {
            format!("{}/{rel}", home.trim_end_matches('/'))
        }
    }
}

/// A unary call's error: its status, and `{code: NAME, message}`.
pub fn unary_error(e: &Error) -> Answer {
    json(e.code.status(), &e.json())
}

/// forkd's refusal as Connect's error.
pub fn rpc_error(status: u16, message: String) -> Error {
    let code = match status {
        400 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::AlreadyExists,
        503 => Code::Unavailable,
        _ => Code::Internal,
    };
    Error::new(code, message)
}

/// A server stream that fails at once: 200, and only its end, holding the error.
pub fn stream_error(e: &Error) -> Answer {
    crate::with_type(
        200,
        connect::STREAM_CONTENT_TYPE,
        connect::end_of_stream(Some(e)),
    )
}
