//! The daemon's edge: the API's types (requests, records' public forms) turned into the
//! runtime's and back. The API defines its contract on its own; here, and only here,
//! the two meet.

use crate::api;

/// What of `limits` a sandbox's cgroups hold (its disk limit is held on its layer).
pub fn cgroup_limits(limits: &api::Limits) -> forkd_cgroups::Limits {
    forkd_cgroups::Limits {
        memory_bytes: limits.memory_bytes,
        pids: limits.pids,
        cpu_millis: limits.cpu_millis,
    }
}

/// The network a sandbox asked for, as the runtime takes it.
pub fn network(n: &api::Network) -> forkd_net::Network {
    forkd_net::Network {
        mode: match n.mode {
            api::NetworkMode::None => forkd_net::Mode::None,
            api::NetworkMode::Egress => forkd_net::Mode::Egress,
            api::NetworkMode::Allowlist => forkd_net::Mode::Allowlist,
        },
        hosts: n.hosts.clone(),
    }
}

/// A sandbox's network as the API shows it.
pub fn api_network(n: &forkd_net::Network) -> api::Network {
    api::Network {
        mode: match n.mode {
            forkd_net::Mode::None => api::NetworkMode::None,
            forkd_net::Mode::Egress => api::NetworkMode::Egress,
            forkd_net::Mode::Allowlist => api::NetworkMode::Allowlist,
        },
        hosts: n.hosts.clone(),
    }
}

/// A lease as the API shows a sandbox's network (rules in `table`).
pub fn network_info(l: &forkd_net::Lease, table: &str) -> api::NetworkInfo {
    api::NetworkInfo {
        table: table.to_string(),
        mode: api_network(&l.network),
        address: l.address().to_string(),
        gateway: l.gateway().to_string(),
        link: l.link.clone(),
        allowed: l.allowed.iter().map(|n| n.to_string()).collect(),
        nameservers: l.nameservers.iter().map(|n| n.to_string()).collect(),
    }
}

/// The filter a sandbox asked for, as the runtime takes it.
pub fn seccomp(s: api::Seccomp) -> forkd_sandbox::Seccomp {
    match s {
        api::Seccomp::Default => forkd_sandbox::Seccomp::Default,
        api::Seccomp::Unconfined => forkd_sandbox::Seccomp::Unconfined,
    }
}

/// A sandbox's filter as the API shows it.
pub fn api_seccomp(s: forkd_sandbox::Seccomp) -> api::Seccomp {
    match s {
        forkd_sandbox::Seccomp::Default => api::Seccomp::Default,
        forkd_sandbox::Seccomp::Unconfined => api::Seccomp::Unconfined,
    }
}

/// An image's run configuration as the API shows it.
pub fn image_config(c: forkd_layers::ImageConfig) -> api::ImageConfig {
    api::ImageConfig {
        env: c.env,
        cmd: c.cmd,
        entrypoint: c.entrypoint,
        working_dir: c.working_dir,
        user: c.user,
        labels: c.labels,
        exposed_ports: c.exposed_ports,
        shell: c.shell,
        stop_signal: c.stop_signal,
        volumes: c.volumes,
    }
}

/// The caller's registry credentials (the `X-Registry-Config` header's value) as the
/// registry client takes them; an error names the header and the registry, never a secret.
pub fn registry_given(
    header: Option<&str>,
) -> Result<Option<forkd_registry::auth::Given>, crate::api::ApiError> {
    let Some(value) = header else {
        return Ok(None);
    };
    let config = api::registry_auth::decode(value).map_err(api::ApiError::bad_request)?;
    let mut given = forkd_registry::auth::Given::new();
    for (registry, a) in config {
        let from = format!(
            "the caller's {}",
            a.from.as_deref().unwrap_or("credentials")
        );
        let cred = match (a.identitytoken, a.username, a.password) {
            (Some(token), user, _) => forkd_registry::auth::Credential {
                username: user.unwrap_or_else(|| "<token>".into()),
                secret: token,
                identity_token: true,
                from,
            },
            (None, Some(username), Some(secret)) => forkd_registry::auth::Credential {
                username,
                secret,
                identity_token: false,
                from,
            },
            _ => {
                return Err(api::ApiError::bad_request(format!(
                    "{}: the credentials for {registry} have neither a user name and password nor an identity token",
                    api::registry_auth::HEADER
                )))
            }
        };
        given.insert(registry, cred);
    }
    Ok(Some(given))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_and_filters_go_both_ways() {
        for n in [
            api::Network::none(),
            api::Network::egress(),
            api::Network::allowlist(vec!["10.0.0.0/8".into(), "pypi.example".into()]),
        ] {
            assert_eq!(api_network(&network(&n)), n);
            // One wire form: a record written with either type reads as the other.
            assert_eq!(
                serde_json::to_string(&n).unwrap(),
                serde_json::to_string(&network(&n)).unwrap()
            );
        }
        for s in [api::Seccomp::Default, api::Seccomp::Unconfined] {
            assert_eq!(api_seccomp(seccomp(s)), s);
            assert_eq!(s.as_str(), seccomp(s).as_str());
        }
    }
}
