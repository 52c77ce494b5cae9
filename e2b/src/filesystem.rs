//! envd's `filesystem.Filesystem` service: `Stat`, `MakeDir`, `Move`, `ListDir` and
//! `Remove` as forkd's file operations (`POST /v1/sandboxes/{id}/fs`), carried out as
//! the request's user.

use crate::connect::{self, Code, Error};
use crate::envd::{rpc_error, unary_error, Target};
use crate::wire::{entry_info, field, number};
use crate::{blocking, failure, json, Body, Gateway};
use forkd_api::{FsAnswer, FsOp, FsRequest};
use serde_json::{json, Value};
use std::sync::Arc;

type Answer = hyper::Response<Body>;

pub async fn serve(
    _gw: Arc<Gateway>,
    t: Target,
    basic: Option<String>,
    method: &str,
    req: hyper::Request<hyper::body::Incoming>,
) -> Answer {
    let body = match crate::read_body(req.into_body(), connect::MAX_MESSAGE).await {
        Ok(b) => b,
        Err(e) => return unary_error(&Error::new(Code::InvalidArgument, e)),
    };
    let msg: Value = match serde_json::from_slice(if body.is_empty() { b"{}" } else { &body }) {
        Ok(m) => m,
        Err(e) => {
            return unary_error(&Error::new(
                Code::InvalidArgument,
                format!("the message is not JSON: {e}"),
            ))
        }
    };
    let method = method.to_string();
    match blocking(move || call(&t, basic.as_deref(), &method, &msg)).await {
        Ok(Ok(v)) => json(200, &v),
        Ok(Err(e)) => unary_error(&e),
        Err(e) => unary_error(&Error::new(Code::Internal, e)),
    }
}

fn call(t: &Target, basic: Option<&str>, method: &str, msg: &Value) -> Result<Value, Error> {
    let user = t.user(basic).to_string();
    let path = |camel: &str| -> Result<String, Error> {
        let p = field(msg, camel, camel)
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| Error::new(Code::InvalidArgument, format!("{camel} is required")))?;
        Ok(t.path(&user, p))
    };
    let one = |a: FsAnswer| -> Result<Value, Error> {
        let entry = a.entries.first().and_then(entry_info).unwrap_or(json!({}));
        Ok(json!({ "entry": entry }))
    };
    match method {
        "Stat" => one(op(
            t,
            &user,
            FsOp::Stat {
                path: path("path")?,
            },
        )?),
        "MakeDir" => {
            let p = path("path")?;
            let a = op(t, &user, FsOp::MakeDir { path: p.clone() })?;
            if a.created == Some(false) {
                return Err(Error::new(
                    Code::AlreadyExists,
                    format!("directory {p} already exists"),
                ));
            }
            one(a)
        }
        "Move" => one(op(
            t,
            &user,
            FsOp::Move {
                from: path("source")?,
                to: path("destination")?,
            },
        )?),
        "ListDir" => {
            let depth = number(field(msg, "depth", "depth"))
                .unwrap_or(1)
                .clamp(1, 64) as u32;
            let a = op(
                t,
                &user,
                FsOp::List {
                    path: path("path")?,
                    depth,
                },
            )?;
            let entries: Vec<Value> = a.entries.iter().filter_map(entry_info).collect();
            Ok(json!({ "entries": entries }))
        }
        "Remove" => {
            op(
                t,
                &user,
                FsOp::Remove {
                    path: path("path")?,
                },
            )?;
            Ok(json!({}))
        }
        "WatchDir" | "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => Err(Error::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{method}: watching is not served by forkd yet"),
        )),
        other => Err(Error::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem has no method {other}"),
        )),
    }
}

fn op(t: &Target, user: &str, op: FsOp) -> Result<FsAnswer, Error> {
    let body = FsRequest {
        op,
        user: Some(user.to_string()),
    };
    let path = format!("/v1/sandboxes/{}/fs", forkd_api::url::encode(&t.id));
    t.client.send("POST", &path, &body).map_err(|e| {
        let (status, message) = failure(&e);
        rpc_error(status, message)
    })
}
