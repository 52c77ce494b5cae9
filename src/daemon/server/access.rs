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
    /// The owner of what this request makes: the key's id.
    pub fn owner(&self) -> Option<String> {
        match self {
            Who::Key(k) => Some(k.id.clone()),
            _ => None,
        }
    }

    /// Whose sandboxes and checkpoints a listing shows: `None` for everyone's.
    pub fn sees_only(&self) -> Option<&str> {
        match self {
            Who::Key(k) if k.scope == Scope::Own => Some(&k.id),
            _ => None,
        }
    }

    /// A key confined to what it made (scope `own`).
    pub fn is_confined(&self) -> bool {
        matches!(self, Who::Key(k) if k.scope == Scope::Own)
    }
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
        // A pull's name is its fully qualified reference (a key may not pick another, which
        // could replace an image others use), and its credentials are the caller's only.
        // The context comes in the request: nothing of the daemon's host is named. The
        // handler refuses a key of scope own an image name that exists (it could
        // replace an image others use).
        O::BuildImageUpload => Reach::Open,
        O::ListImages | O::InspectImage | O::PullImage => Reach::Open,
        O::ListSandboxes | O::ListCheckpoints => Reach::Listing,
        O::CreateSandbox => Reach::Makes,
        O::InspectSandbox
        | O::RemoveSandbox
        | O::StopSandbox
        | O::ExecInSandbox
        | O::SandboxLogs
        | O::CopyFromSandbox
        | O::CopyToSandbox
        | O::FileOperation
        | O::ReadFile
        | O::WriteFile
        | O::SetSandboxExpiry
        | O::ResumeSandbox
        | O::CheckpointSandbox
        | O::SandboxExecs => Reach::Sandbox,
        O::InspectCheckpoint | O::RemoveCheckpoint | O::ForkCheckpoint | O::CheckpointDelta => {
            Reach::Checkpoint
        }
        // A build's context, an import's source and an export's target are paths on the
        // daemon's host; a grant is a socket there; the pulls and builds under way are
        // everyone's.
        O::ListPulls
        | O::ListBuilds
        | O::ImportImage
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

/// Admits `op` for `key`, or says why not. For a key of scope `own`, the `{id}` it
/// names is looked for among its own sandboxes or checkpoints only (a prefix too) and
/// replaced by the full id, so the handler acts on what was admitted.
pub fn admit_key(
    d: &Daemon,
    key: &Key,
    op: Operation,
    params: &mut HashMap<&'static str, String>,
) -> Result<(), ApiError> {
    if key.scope == Scope::Full {
        return Ok(());
    }
    let id = params.get("id").cloned().unwrap_or_default();
    match reach(op) {
        Reach::Open | Reach::Listing | Reach::Makes => Ok(()),
        Reach::Sandbox => {
            let sb = own_sandbox(d, &key.id, &id)?;
            params.insert("id", sb.id.to_string());
            Ok(())
        }
        Reach::Checkpoint => {
            let c = own_checkpoint(d, &key.id, &id)?;
            params.insert("id", c.id.to_string());
            Ok(())
        }
        Reach::Operator => Err(ApiError::forbidden(format!(
            "key {:?} has scope own: {} is the node operator's (it names paths on the daemon's host, or acts on the whole node or on others' work)",
            key.name,
            op.id()
        ))),
    }
}

/// The sandbox `id` (or a prefix) names among those `owner` made.
pub fn own_sandbox(
    d: &Daemon,
    owner: &str,
    id: &str,
) -> Result<Arc<super::super::Sandbox>, ApiError> {
    // The table's lock is let go before any record's is taken.
    let named = super::super::by_prefix(d.sandboxes.table.locked().by_id(), id);
    let mine = named
        .into_iter()
        .filter(|sb| sb.record.locked().owner.as_deref() == Some(owner))
        .collect();
    super::super::one_of(mine, id, "sandbox")
}

/// The checkpoint `id` (or a prefix) names among those `owner` made.
pub fn own_checkpoint(
    d: &Daemon,
    owner: &str,
    id: &str,
) -> Result<Arc<super::super::checkpoints::Checkpoint>, ApiError> {
    let named = super::super::by_prefix(&d.checkpoints.table.locked(), id);
    let mine = named
        .into_iter()
        .filter(|c| c.record.locked().owner.as_deref() == Some(owner))
        .collect();
    super::super::one_of(mine, id, "checkpoint")
}

/// An image's `used_by` as `viewer` may see it: only its own sandboxes.
pub fn own_users(d: &Daemon, viewer: Option<&str>, used_by: &mut Vec<String>) {
    let Some(owner) = viewer else {
        return;
    };
    used_by.retain(|id| own_sandbox(d, owner, id).is_ok());
}
