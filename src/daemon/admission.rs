//! One admission for every operation that makes sandboxes (a create, a fork, a build's
//! steps), before anything is made: the volume usable, room in the watch of inits' exits
//! and under the host's ceilings, and limits that are complete, valid and holdable here.

use super::Daemon;
use crate::api::{ApiError, Limits};

/// What an operation asks to be admitted for.
pub(crate) struct Ask<'a> {
    /// The operation as errors name it ("create", "fork of checkpoint C", "build of I").
    pub what: &'a str,
    /// The sandboxes it makes, and the tasks each starts with.
    pub sandboxes: usize,
    pub tasks_each: usize,
    /// Whether the operator's defaults fill what the limits leave unset (a create, a
    /// build), or they stand as given (a fork keeps its checkpoint's).
    pub defaults: bool,
}

impl Daemon {
    /// Admits `ask` with `limits` (completed in place when `ask.defaults`), or says why
    /// not: 503 for what the volume or the host lacks now, 409 for the watch, 400 for
    /// limits that are invalid or cannot be held here.
    pub(crate) fn admit(&self, ask: Ask<'_>, limits: &mut Limits) -> Result<(), ApiError> {
        self.node.volume_usable(ask.what)?;
        self.sandboxes.can_watch(ask.sandboxes)?;
        self.node
            .within_ceilings(ask.what, ask.sandboxes, ask.tasks_each)?;
        if ask.defaults {
            *limits = default_limits(limits, &self.config, self.node.disk_quotas.is_ok());
        }
        limits
            .validate()
            .map_err(|e| ApiError::bad_request(format!("limits: {e}")))?;
        match (&limits.disk_bytes, &self.node.disk_quotas) {
            (Some(_), Err(why)) => Err(ApiError::bad_request(format!("disk_bytes: {why}"))),
            _ => Ok(()),
        }
    }
}

/// `limits` with the operator's defaults where it sets nothing.
fn default_limits(limits: &Limits, config: &super::config::Config, disk_quotas: bool) -> Limits {
    let mut out = limits.clone();
    if out.pids.is_none() {
        out.pids = config.default_pids;
    }
    if out.memory_bytes.is_none() {
        out.memory_bytes = config.default_memory;
    }
    if out.disk_bytes.is_none() && disk_quotas {
        out.disk_bytes = config.default_disk;
    }
    out
}
