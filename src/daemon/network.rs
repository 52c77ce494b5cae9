//! Sandbox networks in the daemon: which sandbox holds which lease, and the points of a
//! sandbox's life where a lease is made (create, fork) and given back (stop, remove, a
//! failed start, a restart that finds the sandbox gone). The mechanism (veth pairs,
//! rules, name files) is `forkd_net`; see docs/NETWORK.md.

use super::log;
use super::Lock as _;
use crate::api::ApiError;
use forkd_net::{Lease, NetError, Network, Policy};
use forkd_sandbox::SandboxId;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

fn api_error(context: &str, e: NetError) -> ApiError {
    match e {
        NetError::Invalid(m) => ApiError::bad_request(format!("network: {m}")),
        NetError::Unavailable(_) | NetError::PoolExhausted(_) => {
            ApiError::conflict(format!("{context}: {e}"))
        }
        other => ApiError::from_chain(context, &other),
    }
}

/// What a sandbox gets: nothing, or a network namespace already plumbed and its lease.
pub(super) struct Connected {
    pub netns: OwnedFd,
    pub lease: Lease,
}

impl super::services::Sandboxes {
    /// Checks and resolves a requested network, before anything is made.
    pub(super) fn network_policy(&self, network: &Network) -> Result<Option<Policy>, ApiError> {
        Policy::resolve(network).map_err(|e| api_error("network", e))
    }

    /// A new network namespace for sandbox `id` with a veth, an address, its rules, and
    /// the name files under `rootfs` (bound over `/etc` by the sandbox's set-up, or
    /// restored as mounts by CRIU).
    pub(super) fn connect(
        &self,
        id: &SandboxId,
        policy: &Policy,
        rootfs: &Path,
        hostname: &str,
    ) -> Result<Connected, ApiError> {
        let ctx = format!("sandbox {id}: network");
        let netns = self
            .spare_netns
            .take()
            .map_err(|e| ApiError::from_chain(&format!("{ctx}: create a network namespace"), &e))?;
        // Held across the change: leases are made and given back one at a time, so the
        // table is never cleared under a lease being made.
        let lease = {
            let mut leases = self.leases.locked();
            let held: Vec<&Lease> = leases.values().collect();
            let lease = self
                .egress
                .lease(
                    policy,
                    &forkd_net::link_name(id.as_str()),
                    &held,
                    netns.as_fd(),
                )
                .map_err(|e| api_error(&ctx, e))?;
            leases.insert(id.clone(), lease.clone());
            lease
        };
        if let Err(e) = forkd_net::dns::write(rootfs, &lease, hostname) {
            self.disconnect(id);
            return Err(ApiError::internal(format!(
                "{ctx}: write {}: {e}",
                rootfs.join(forkd_net::dns::DIR).display()
            )));
        }
        log::info(&format!(
            "sandbox {id}: {} on {} ({} via {})",
            lease.network,
            forkd_net::SANDBOX_LINK,
            lease.address(),
            lease.link
        ));
        Ok(Connected { netns, lease })
    }

    /// Gives back sandbox `id`'s lease, if it holds one: its rules and its link go.
    pub(super) fn disconnect(&self, id: &SandboxId) {
        let mut leases = self.leases.locked();
        let Some(lease) = leases.remove(id) else {
            return;
        };
        let remaining: Vec<&Lease> = leases.values().collect();
        if let Err(e) = self.egress.release(&lease, &remaining) {
            log::warn(&format!(
                "sandbox {id}: release its network {}: {e}",
                lease.address()
            ));
        }
    }

    /// After a restart: the leases of the sandboxes still running are held again, links
    /// left by sandboxes that went meanwhile are deleted, and the table is rewritten to
    /// hold exactly the rules of the held leases (or deleted, with none).
    pub(super) fn recover_network(&self, alive: Vec<(SandboxId, Lease)>, gone: Vec<Lease>) {
        for l in &gone {
            if let Err(e) =
                forkd_net::netlink::Route::open().and_then(|mut r| r.delete_link(&l.link))
            {
                log::warn(&format!("delete link {}: {e}", l.link));
            }
        }
        let mut leases = self.leases.locked();
        leases.extend(alive);
        let held: Vec<&Lease> = leases.values().collect();
        if let Err(e) = self.egress.reconcile(&held) {
            log::warn(&format!("egress rules not restored: {e}"));
        }
    }
}
