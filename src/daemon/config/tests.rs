use super::*;

#[test]
fn plain_tcp_is_loopback_only_and_tls_comes_whole() {
    let c = with(&[("FORKD_LISTEN", "tcp://127.0.0.1:7070, tcp://[::1]:7071")]).unwrap();
    assert_eq!(c.listen.tcp.len(), 2);
    assert!(c.listen.tls.is_none());
    let e = with(&[("FORKD_LISTEN", "tcp://0.0.0.0:7070")])
        .unwrap_err()
        .0;
    assert!(
        e.contains("loopback only") && e.contains("FORKD_TLS_CERT"),
        "{e}"
    );
    let c = with(&[
        ("FORKD_LISTEN", "tcp://0.0.0.0:7070"),
        ("FORKD_TLS_CERT", "/c.pem"),
        ("FORKD_TLS_KEY", "/k.pem"),
    ])
    .unwrap();
    assert_eq!(c.listen.tcp[0].port(), 7070);
    assert!(with(&[("FORKD_TLS_CERT", "/c.pem")]).is_err());
    assert!(with(&[("FORKD_TLS_CLIENT_CA", "/ca.pem")]).is_err());
    for bad in ["http://127.0.0.1:1", "tcp://127.0.0.1", "127.0.0.1:1"] {
        assert!(with(&[("FORKD_LISTEN", bad)]).is_err(), "{bad}");
    }
}

fn with(pairs: &[(&str, &str)]) -> Result<Config, SettingError> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::read(&move |n| map.get(n).cloned())
}

#[test]
fn defaults_hold_without_variables() {
    let c = with(&[]).unwrap();
    assert_eq!(c.default_pids, Some(2048));
    assert_eq!(c.default_memory, None);
    assert_eq!(c.max_layers, 128);
    assert!(c.templates);
    assert_eq!(c.criu, forkd_criu::Settings::default());
    assert_eq!(c.volume, forkd_volume::Settings::default());
    assert_eq!(c.overlay_lowers, None);
    assert_eq!(c.template_budget, None);
    assert_eq!(c.memory_cgroups, MemoryCgroups::Limited { said: false });
    assert_eq!(c.sandboxes_memory, SandboxesMemory::Default);
}

#[test]
fn values_are_typed() {
    let c = with(&[
        ("FORKD_DEFAULT_PIDS", "0"),
        ("FORKD_DEFAULT_MEMORY", "256m"),
        ("FORKD_TEMPLATE_MIB", "64"),
        ("FORKD_MEMCG", "each"),
        ("FORKD_SANDBOXES_MEMORY", "0"),
        ("FORKD_KSM", "on"),
        ("FORKD_KSM_BOOST_PAGES", "5000"),
        ("FORKD_OVERLAY_LOWERS", "links"),
        ("FORKD_VOLUME_SIZE", "1TiB"),
        ("FORKD_DIRTY_LIMIT", "0"),
        ("FORKD_CRIU_TIMEOUT_SECS", "30"),
        ("FORKD_CRIU_DEBUG", ""),
        ("FORKD_CERTS_DIRS", "/a:/b"),
        ("PATH", "/nix/bin:relative:/usr/bin"),
        ("FORKD_SPARE_NETNS", " 8 "),
    ])
    .unwrap();
    assert_eq!(c.default_pids, None);
    assert_eq!(c.default_memory, Some(256 << 20));
    assert_eq!(c.template_budget, Some(64 << 20));
    assert_eq!(c.memory_cgroups, MemoryCgroups::Each);
    assert_eq!(c.sandboxes_memory, SandboxesMemory::None);
    assert_eq!(c.ksm.mode, super::super::sharing::Mode::On);
    assert_eq!((c.ksm.boost_pages, c.ksm.idle_pages), (5000, 100));
    assert_eq!(c.spare_netns, 8);
    assert_eq!(c.overlay_lowers, Some(forkd_sys::mount::LowerMode::Links));
    assert_eq!((c.volume.size, c.volume.dirty), (1 << 40, 0));
    assert_eq!(c.criu.timeout, Duration::from_secs(30));
    assert!(c.criu.debug, "set, even empty");
    assert_eq!(c.certs_dirs, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
    assert_eq!(
        c.path,
        vec![PathBuf::from("/nix/bin"), PathBuf::from("/usr/bin")]
    );
}

#[test]
fn a_bad_value_names_its_variable() {
    for (name, value) in [
        ("FORKD_DEFAULT_PIDS", "many"),
        ("FORKD_DEFAULT_MEMORY", "lots"),
        ("FORKD_MAX_LAYERS", "1"),
        ("FORKD_FORK_PARALLEL", "0"),
        ("FORKD_TEMPLATES", "maybe"),
        ("FORKD_MEMCG", "some"),
        ("FORKD_EGRESS_POOL", "10.0.0.0/30"),
        ("FORKD_CRIU_ROOT", "chroot"),
        ("FORKD_SPARE_LAYERS", "17"),
        ("FORKD_SPARE_LAYERS", "two"),
        ("FORKD_SPARE_NETNS", "65"),
        ("FORKD_SPARE_NETNS", "-1"),
        ("FORKD_KSM_SLEEP_MS", "0"),
        ("FORKD_KSM", "sometimes"),
        ("FORKD_MAX_COPY_BYTES", "0"),
        ("FORKD_SANDBOXES_MEMORY", "x"),
        ("FORKD_CRIU_LOG_LEVEL", "9"),
        ("FORKD_CRIU_TIMEOUT_SECS", "0"),
        ("FORKD_VOLUME_SIZE", "big"),
        ("FORKD_HOST_RESERVE", "-1"),
        ("FORKD_VOLUME_SIZE", "0"),
        ("FORKD_CGROUP_FAVOR_DYNMODS", "yes"),
        ("FORKD_OVERLAY_LOWERS", "both"),
    ] {
        let e = with(&[(name, value)]).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{name}=")), "{name}: {e}");
    }
}

/// Every variable read is in the table, every one in the table is read, and
/// docs/SETTINGS.md shows each.
#[test]
fn the_table_and_the_docs_name_every_setting() {
    let (_, asked) = Config::read_asked(&|_| None).unwrap();
    let mut asked: Vec<&str> = asked
        .iter()
        .map(String::as_str)
        .filter(|n| n.starts_with("FORKD_"))
        .collect();
    asked.sort();
    asked.dedup();
    let mut table: Vec<&str> = SETTINGS.iter().map(|s| s.name).collect();
    table.sort();
    assert_eq!(asked, table);
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/SETTINGS.md"),
    )
    .unwrap();
    for s in SETTINGS {
        assert!(
            docs.contains(&format!("`{}`", s.name)),
            "docs/SETTINGS.md lacks {}",
            s.name
        );
    }
}
