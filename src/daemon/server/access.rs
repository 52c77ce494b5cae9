//! What a caller may do, decided before dispatch so that no handler knows who called.
//! The node's operator (the daemon's socket) and a `full` key may do everything; a grant
//! is judged by `Grant::admit`; a key of scope `own` (a harness host's) by [`admit_key`]:
//! images, and only the sandboxes and checkpoints it made. Another's sandbox is answered
//! as one that does not exist, so a key learns nothing of what is not its own.

use super::super::grants::Grant;
use super::super::{Daemon, Lock};
use crate::api::{ApiError, Operation};
use forkd_keys::{Key, Scope};
use std::collections::HashMap;
use std::sync::Arc;

/// Who a request is from, once its connection and key are known.
pub enum Who {
    Node,
    Grant(Arc<Grant>),
    Key(Key),
}

impl Who {
    /// The owner of what this request makes: the key's name.
    pub fn owner(&self) -> Option<String> {
        match self {
            Who::Key(k) => Some(k.name.clone()),
            _ => None,
        }
    }

    /// Whose sandboxes and checkpoints a listing shows: `None` for everyone's.
    pub fn sees_only(&self) -> Option<&str> {
        match self {
            Who::Key(k) if k.scope == Scope::Own => Some(&k.name),
            _ => None,
        }
    }
}

/// Whether a listing for `viewer` shows a thing of `owner`.
pub fn shown(viewer: Option<&str>, owner: Option<&str>) -> bool {
    viewer.is_none() || viewer == owner
}

/// What an operation reaches, for a key of scope `own`.
enum Reach {
    /// The daemon's version, health, metrics, and images: read, pulled.
    Open,
    /// Lists, which show only its own.
    Listing,
    /// Makes a sandbox it will own.
    Makes,
    /// The sandbox `{id}`: its own only.
    Sandbox,
    /// The checkpoint `{id}`: its own only.
    Checkpoint,
    /// The node's: paths on the daemon's host, the whole store, other users' grants.
    Operator,
}

fn reach(op: Operation) -> Reach {
    use Operation as O;
    match op {
        O::Version | O::Health | O::Metrics | O::PrometheusMetrics => Reach::Open,
        O::ListImages | O::InspectImage | O::PullImage | O::ListPulls | O::ListBuilds => {
            Reach::Open
        }
        O::ListSandboxes | O::ListCheckpoints => Reach::Listing,
        O::CreateSandbox => Reach::Makes,
        O::InspectSandbox
        | O::RemoveSandbox
        | O::StopSandbox
        | O::ExecInSandbox
        | O::SandboxLogs
        | O::CopyFromSandbox
        | O::CopyToSandbox
        | O::CheckpointSandbox
        | O::SandboxExecs => Reach::Sandbox,
        O::InspectCheckpoint | O::RemoveCheckpoint | O::ForkCheckpoint | O::CheckpointDelta => {
            Reach::Checkpoint
        }
        // A build's context, an import's source and an export's target are paths on the
        // daemon's host; a grant is a socket there.
        O::ImportImage
        | O::BuildImage
        | O::RemoveImage
        | O::ExportCheckpoint
        | O::ImportCheckpoint
        | O::Gc
        | O::GrantSandbox
        | O::InspectGrant
        | O::RevokeGrant => Reach::Operator,
    }
}

/// Admits `op` for `key`, or says why not.
pub fn admit_key(
    d: &Daemon,
    key: &Key,
    op: Operation,
    params: &HashMap<&'static str, String>,
) -> Result<(), ApiError> {
    if key.scope == Scope::Full {
        return Ok(());
    }
    let id = params.get("id").map(String::as_str).unwrap_or_default();
    let mine = |owner: &Option<String>| owner.as_deref() == Some(key.name.as_str());
    match reach(op) {
        Reach::Open | Reach::Listing | Reach::Makes => Ok(()),
        Reach::Sandbox => match d.sandboxes.get(id) {
            Ok(sb) if mine(&sb.record.locked().owner) => Ok(()),
            Ok(_) => Err(ApiError::not_found(format!("no such sandbox: {id}"))),
            Err(e) => Err(e),
        },
        Reach::Checkpoint => match d.checkpoints.get(id) {
            Ok(c) if mine(&c.record.locked().owner) => Ok(()),
            Ok(_) => Err(ApiError::not_found(format!("no such checkpoint: {id}"))),
            Err(e) => Err(e),
        },
        Reach::Operator => Err(ApiError::forbidden(format!(
            "key {:?} has scope own: {} is the node operator's (it names paths on the daemon's host, or acts on the whole node)",
            key.name,
            op.id()
        ))),
    }
}
