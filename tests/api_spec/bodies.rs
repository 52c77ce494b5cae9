//! The API's request and response types against their schemas: serialised samples of
//! every answer, request JSON built from the schemas read back into the types.

use forkd::api::Limits;
use forkd::api::{
    self, ArchivePath, BranchInfo, BuildRequest, BuildResult, BuildStatus, BuildStep,
    CheckpointInfo, CheckpointRequest, CopyResult, CreateSandboxRequest, DetachedExec, ExecBody,
    ExecRecord, ExecResult, ExportRequest, ExportResult, ForkMode, ForkRequest, ForkResult,
    GcResult, GrantInfo, GrantRequest, ImageConfig, ImageInfo, ImportImageRequest, OpStats,
    PullLayer, PullRequest, PullStatus, Refusal, Removed, SandboxInfo, SandboxStatus, StopRequest,
    VersionInfo,
};
use forkd_sandbox::proto::{ExecExit, ExecRequest, ExecStarted};
use serde_json::{json, Value};
use std::collections::BTreeMap;

use crate::schema::*;

fn sample_info(with_values: bool) -> SandboxInfo {
    SandboxInfo {
        id: "0123456789abcdef".into(),
        image: "alpine".into(),
        status: if with_values {
            SandboxStatus::Running
        } else {
            SandboxStatus::Stopped
        },
        created: 1_700_000_000,
        hostname: "0123456789ab".into(),
        init_pid: with_values.then_some(4242),
        limits: if with_values {
            Limits {
                memory_bytes: Some(256 << 20),
                pids: Some(128),
                cpu_millis: Some(500),
                disk_bytes: Some(10 << 30),
            }
        } else {
            Limits::default()
        },
        labels: if with_values {
            [("team".to_string(), "infra".to_string())].into()
        } else {
            BTreeMap::new()
        },
        rootfs: "/var/lib/forkd/sandboxes/0123456789abcdef/rootfs".into(),
        upper: "/var/lib/forkd/sandboxes/0123456789abcdef/layer/upper".into(),
        cgroup: "forkd/0123456789abcdef".into(),
        memory_bytes: with_values.then_some(1 << 20),
        memory_counted: with_values.then_some(api::MemoryCounted::Cgroup),
        oom_kills: Some(0),
        create_us: 12_345,
        network: with_values.then(|| api::NetworkInfo {
            mode: api::Network::allowlist(vec!["198.18.0.1".into(), "10.9.0.0/16".into()]),
            address: "10.213.0.6".into(),
            gateway: "10.213.0.5".into(),
            link: "fkd0123456789ab".into(),
            allowed: vec!["198.18.0.1/32".into(), "10.9.0.0/16".into()],
            nameservers: vec![],
            table: "forkd_0a1b2c3d".into(),
        }),
        disk_used_bytes: with_values.then_some(12 << 20),
        setuid: with_values,
        expires_at: with_values.then_some(1_700_000_300),
        cpu_usage_us: with_values.then_some(1_234_567),
        seccomp: if with_values {
            api::Seccomp::Unconfined
        } else {
            api::Seccomp::Default
        },
    }
}

/// A filesystem checkpoint of a fresh sandbox (hash pending), or a live checkpoint of a
/// branch (hash computed, with branches of its own).
fn sample_checkpoint(live: bool) -> CheckpointInfo {
    let phases: &[(&str, u64)] = if live {
        &[("dump", 84_210), ("snapshot", 912), ("total", 85_840)]
    } else {
        &[("freeze", 150), ("snapshot", 830), ("total", 1_210)]
    };
    CheckpointInfo {
        id: "89abcdef01234567".into(),
        parent: live.then(|| "76543210fedcba98".into()),
        sandbox: "0123456789abcdef".into(),
        image: "alpine:3.20".into(),
        live,
        created: 1_700_000_100,
        labels: if live {
            [("step".to_string(), "warm".to_string())].into()
        } else {
            BTreeMap::new()
        },
        layers: vec![
            "checkpoint:89abcdef01234567".into(),
            format!("layer:{}", "a".repeat(64)),
            format!("layer:{}", "b".repeat(64)),
        ],
        tree_hash: live.then(|| "c".repeat(64)),
        phases_us: phases.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        images_bytes: if live { 4 << 20 } else { 0 },
        branches: if live {
            vec!["a1b2c3d4e5f60718".into()]
        } else {
            Vec::new()
        },
    }
}

fn sample_branch(mode: ForkMode) -> BranchInfo {
    let phases: &[(&str, u64)] = if mode == ForkMode::Fresh {
        &[("prepare", 3_120), ("total", 24_800)]
    } else {
        &[
            ("prepare", 3_120),
            ("restore", 61_544),
            ("ready", 410),
            ("total", 65_202),
        ]
    };
    BranchInfo {
        id: "a1b2c3d4e5f60718".into(),
        mode,
        init_pid: Some(51_022),
        phases_us: phases.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    }
}

#[test]
fn response_types_serialise_to_their_schemas() {
    let doc = doc();
    check_serialised(&doc, "SandboxInfo", &sample_info(true));
    check_serialised(&doc, "SandboxInfo", &sample_info(false));
    for s in [
        SandboxStatus::Running,
        SandboxStatus::Stopping,
        SandboxStatus::Checkpointing,
        SandboxStatus::Removing,
        SandboxStatus::Stopped,
    ] {
        check_serialised(&doc, "SandboxStatus", &s);
    }
    check_serialised(
        &doc,
        "ImageInfo",
        &ImageInfo {
            name: "alpine:3.20".into(),
            layers: vec!["a".repeat(64), "b".repeat(64)],
            created: 1_700_000_000,
            source: "/srv/alpine.tar".into(),
            used_by: vec!["0123456789abcdef".into()],
            config: Default::default(),
            digest: None,
        },
    );
    check_serialised(
        &doc,
        "ImageInfo",
        &ImageInfo {
            name: "docker.io/library/alpine:3.20".into(),
            layers: vec!["a".repeat(64)],
            created: 1_700_000_000,
            source: "registry:docker.io/library/alpine:3.20".into(),
            used_by: Vec::new(),
            config: Default::default(),
            digest: Some(format!("sha256:{}", "c".repeat(64))),
        },
    );
    for resolved in [None, Some("docker.io/library/alpine:3.20".to_string())] {
        check_serialised(
            &doc,
            "PullStatus",
            &PullStatus {
                reference: "alpine:3.20".into(),
                resolved,
                started: 1_700_000_000,
                phase: "layers".into(),
                layers: vec![PullLayer {
                    digest: format!("sha256:{}", "d".repeat(64)),
                    size: 3_000_000,
                    done: 1_048_576,
                    state: "fetching".into(),
                }],
            },
        );
    }
    let built = ImageInfo {
        name: "task:env".into(),
        layers: vec!["a".repeat(64)],
        created: 1_700_000_000,
        source: "build:/srv/task/Dockerfile".into(),
        used_by: Vec::new(),
        digest: None,
        config: ImageConfig {
            env: vec!["PATH=/bin".into()],
            cmd: vec!["sh".into()],
            entrypoint: vec!["/start.sh".into()],
            working_dir: Some("/app".into()),
            user: Some("app".into()),
            labels: [("k".to_string(), "v".to_string())].into(),
            exposed_ports: vec!["80/tcp".into()],
            shell: vec!["/bin/bash".into(), "-c".into()],
            stop_signal: Some("SIGINT".into()),
            volumes: vec!["/data".into()],
        },
    };
    check_serialised(&doc, "ImageInfo", &built);
    let steps = vec![
        BuildStep {
            stage: 0,
            line: 1,
            instruction: "FROM debian".into(),
            cache: "config".into(),
            layer: None,
            duration_us: 3,
        },
        BuildStep {
            stage: 0,
            line: 2,
            instruction: "RUN true".into(),
            cache: "miss".into(),
            layer: Some("b".repeat(64)),
            duration_us: 40_000,
        },
    ];
    for s in &steps {
        check_serialised(&doc, "BuildStep", s);
    }
    check_serialised(
        &doc,
        "BuildResult",
        &BuildResult {
            image: built,
            steps: steps.clone(),
            duration_us: 50_000,
        },
    );
    for current in [None, Some("RUN make".to_string())] {
        check_serialised(
            &doc,
            "BuildStatus",
            &BuildStatus {
                name: "task:env".into(),
                started: 1_700_000_000,
                steps: steps.clone(),
                current,
            },
        );
    }
    for (signal, code) in [(None, 3), (Some(9), 137)] {
        let exit = ExecExit {
            exit_code: code,
            signal,
            timed_out: signal.is_some(),
            duration_us: 1500,
        };
        check_serialised(&doc, "ExecExit", &exit);
        check_serialised(
            &doc,
            "ExecResult",
            &ExecResult {
                pid: 7,
                exit,
                stdout_b64: api::b64::encode(b"out\n"),
                stderr_b64: String::new(),
                output_b64: api::b64::encode(b"out\n"),
                output_bytes: 4,
                truncated: false,
            },
        );
    }
    for pressure in [
        None,
        Some("the volume is full: 0 MiB free of 1012 MiB".to_string()),
    ] {
        let ok = pressure.is_none();
        check_serialised(
            &doc,
            "Health",
            &api::Health {
                ok,
                degraded: pressure.iter().map(|p| format!("volume: {p}")).collect(),
                volume: api::VolumeHealth {
                    path: "/var/lib/forkd/vol".into(),
                    ok: true,
                    size_bytes: 2 << 30,
                    free_bytes: 1 << 30,
                    max_bytes: 256 << 30,
                    host_free_bytes: 60 << 30,
                    host_reserve_bytes: 1 << 30,
                    pressure: pressure.clone(),
                    problems: vec![],
                },
                criu: api::ComponentHealth {
                    ok: true,
                    detail: "CRIU 4.2 (/opt/forkd/criu/bin/criu)".into(),
                },
                exit_watcher: api::ComponentHealth {
                    ok: true,
                    detail: "watching 3 processes".into(),
                },
                network: api::ComponentHealth {
                    ok: false,
                    detail: "sandboxes with egress are unavailable: nft not found".into(),
                },
                disk_limits: api::ComponentHealth {
                    ok: true,
                    detail: "btrfs simple quotas".into(),
                },
                templates: api::ComponentHealth {
                    ok: true,
                    detail: "1 held, 257 MiB of 6027 MiB (FORKD_TEMPLATE_MIB)".into(),
                },
                ceilings: vec![api::NodeCeiling {
                    name: "kernel.pid_max".into(),
                    value: 393_216,
                    used: 4_102,
                    kept: 1_024,
                    per_sandbox: 2,
                    allows: 194_045,
                    how_to_raise: "raise it with `sysctl -w kernel.pid_max=393216`".into(),
                }],
            },
        );
    }
    check_serialised(
        &doc,
        "VersionInfo",
        &VersionInfo {
            version: "0.1.0".into(),
            api: api::API_VERSION.into(),
            root: "/var/lib/forkd".into(),
            cgroup_version: 2,
        },
    );
    let stats = OpStats {
        count: 10,
        errors: 1,
        p50_us: 100,
        p90_us: 200,
        p99_us: 300,
        max_us: 400,
    };
    check_serialised(&doc, "OpStats", &stats);
    let metrics: BTreeMap<String, OpStats> = [
        ("createSandbox".to_string(), stats.clone()),
        ("exec_stream".to_string(), OpStats::default()),
    ]
    .into();
    check_serialised(&doc, "Metrics", &metrics);
    check_serialised(
        &doc,
        "Limits",
        &Limits {
            memory_bytes: Some(1),
            pids: None,
            cpu_millis: Some(1000),
            disk_bytes: None,
        },
    );
    for log_path in [None, Some("/.forkd/logs/main.log".to_string())] {
        check_serialised(&doc, "ExecStarted", &ExecStarted { pid: 1, log_path });
    }
    check_serialised(
        &doc,
        "ExecErrorFrame",
        &json!({ "message": "ls: command not found" }),
    );
    for live in [false, true] {
        check_serialised(&doc, "CheckpointInfo", &sample_checkpoint(live));
    }
    let mut branches = Vec::new();
    for mode in ForkMode::ALL {
        let b = sample_branch(mode);
        check_serialised(&doc, "BranchInfo", &b);
        branches.push(b);
    }
    let mut no_pid = sample_branch(ForkMode::Eager);
    no_pid.init_pid = None;
    check_serialised(&doc, "BranchInfo", &no_pid);
    check_serialised(
        &doc,
        "ForkResult",
        &ForkResult {
            checkpoint: "89abcdef01234567".into(),
            branches,
        },
    );
    check_serialised(
        &doc,
        "ForkResult",
        &ForkResult {
            checkpoint: "89abcdef01234567".into(),
            branches: Vec::new(),
        },
    );
    let refusal = Refusal {
        t_us: 1_718_000_012_345_678,
        method: "POST".into(),
        path: "/v1/checkpoints/89abcdef01234567/fork".into(),
        reason: "grant 0c1d2e3f40516273 allows exec, files, logs and inspect of sandbox 0123456789abcdef only, not forkCheckpoint".into(),
        budget: false,
    };
    for (max_steps, refusals) in [(Some(4), vec![refusal]), (None, Vec::new())] {
        check_serialised(
            &doc,
            "GrantInfo",
            &GrantInfo {
                id: "0c1d2e3f40516273".into(),
                sandbox: "0123456789abcdef".into(),
                socket: "/run/forkd/forkd.sock.grants/0c1d2e3f40516273.sock".into(),
                uid: 2_000_000_001,
                gid: 2_000_000_001,
                max_steps,
                steps: 3,
                refused: refusals.len() as u64,
                refusals,
                active: true,
            },
        );
    }
    for name in ["RemovedImage", "RemovedSandbox", "RemovedCheckpoint"] {
        check_serialised(&doc, name, &json!({ "removed": "x" }));
    }
}

#[test]
fn request_schemas_deserialise_into_the_request_types() {
    let doc = doc();
    check_request::<CreateSandboxRequest>(&doc, "CreateSandboxRequest");
    check_request::<BuildRequest>(&doc, "BuildRequest");
    check_request::<ExecBody>(&doc, "ExecBody");
    check_request::<ExecRequest>(&doc, "ExecRequest");
    check_request::<ImportImageRequest>(&doc, "ImportImageRequest");
    check_request::<PullRequest>(&doc, "PullRequest");
    check_request::<StopRequest>(&doc, "StopRequest");
    check_request::<Limits>(&doc, "Limits");
    check_request::<CheckpointRequest>(&doc, "CheckpointRequest");
    check_request::<ForkRequest>(&doc, "ForkRequest");
    check_request::<ArchivePath>(&doc, "ArchivePath");
    check_request::<ExportRequest>(&doc, "ExportRequest");
    check_request::<GrantRequest>(&doc, "GrantRequest");
    check_request::<forkd::api::ExpiryRequest>(&doc, "ExpiryRequest");
    check_request::<forkd::api::ResumeRequest>(&doc, "ResumeRequest");
    let g: GrantRequest = serde_json::from_value(json!({ "uid": 5 })).unwrap();
    assert!(g.gid.is_none() && g.max_steps.is_none());

    // ExecBody is ExecRequest's fields plus stdin_b64, flattened.
    let body = names(schema(&doc, "ExecBody").get("properties"));
    let mut req = names(schema(&doc, "ExecRequest").get("properties"));
    req.insert("stdin_b64".into());
    req.insert("output_limit".into());
    assert_eq!(
        body, req,
        "ExecBody = ExecRequest + stdin_b64 + output_limit"
    );
    let parsed: ExecBody = serde_json::from_value(json!({
        "argv": ["cat"], "stdin_b64": "aGk=", "timeout_ms": 5
    }))
    .unwrap();
    assert_eq!(parsed.request.argv, ["cat"]);
    assert_eq!(parsed.request.timeout_ms, Some(5));
    assert_eq!(parsed.stdin_b64.as_deref(), Some("aGk="));
    // The upgraded exec takes a plain ExecRequest: stdin_b64 is refused there.
    assert!(
        serde_json::from_value::<ExecRequest>(json!({"argv": ["cat"], "stdin_b64": "aGk="}))
            .is_err()
    );
    // Unknown properties are refused inside a create request's command too.
    assert!(serde_json::from_value::<CreateSandboxRequest>(json!({
        "image": "alpine", "command": {"argv": ["true"], "bogus": 1}
    }))
    .is_err());
    // Nullable properties accept null.
    let c: CreateSandboxRequest = serde_json::from_value(json!({
        "image": "alpine", "command": null, "hostname": null,
        "limits": {"memory_bytes": null, "pids": 5}
    }))
    .unwrap();
    assert_eq!(c.limits.pids, Some(5));
    // Every property of ExecRequest and StopRequest is optional: {} is a valid body.
    serde_json::from_value::<ExecBody>(json!({})).unwrap();
    serde_json::from_value::<StopRequest>(json!({})).unwrap();
    // The same for checkpoints and forks, with the documented defaults.
    let c: CheckpointRequest = serde_json::from_value(json!({})).unwrap();
    assert!(!c.live && !c.stop && c.labels.is_empty());
    let f: ForkRequest = serde_json::from_value(json!({ "count": null })).unwrap();
    assert!(f.count.is_none() && !f.lazy && f.labels.is_empty());
    let count = &schema(&doc, "ForkRequest")["properties"]["count"];
    assert_eq!(count["default"], json!(1), "the default branch count");
    assert_eq!(count["minimum"], json!(1));
    assert_eq!(count["maximum"], json!(10_000));
    // A count below zero is not a usize.
    assert!(serde_json::from_value::<ForkRequest>(json!({ "count": -1 })).is_err());
}

#[test]
fn answers_and_records_are_their_schemas() {
    let doc = doc();
    // Built from each schema, read into the type and written back unchanged: the type's
    // fields are the schema's properties, none missing, none extra.
    check_request::<ExportResult>(&doc, "ExportResult");
    check_request::<GcResult>(&doc, "GcResult");
    check_request::<CopyResult>(&doc, "CopyResult");
    check_request::<ExecRecord>(&doc, "ExecRecord");
    for name in ["RemovedImage", "RemovedSandbox", "RemovedCheckpoint"] {
        check_request::<Removed>(&doc, name);
    }
    check_serialised(
        &doc,
        "ExportResult",
        &ExportResult {
            path: "/srv/checkpoints/warm.forkd".into(),
            bytes: 31_457_280,
            files: 9,
            tree_hash: "c".repeat(64),
            duration_us: 812_345,
        },
    );
    check_serialised(
        &doc,
        "GcResult",
        &GcResult {
            removed_layers: vec!["a".repeat(64)],
            freed_bytes: 7_340_032,
        },
    );
    let exit = serde_json::to_value(ExecExit {
        exit_code: 3,
        signal: None,
        timed_out: false,
        duration_us: 2210,
    })
    .unwrap();
    let detached = serde_json::to_value(DetachedExec {
        pid: 14,
        log: Some("/.forkd/logs/job1.log".into()),
    })
    .unwrap();
    for (argv, shell, result) in [
        (
            Some(vec!["sh".to_string(), "-c".into(), "exit 3".into()]),
            None,
            exit,
        ),
        (None, Some("sleep 5".to_string()), detached),
        (
            Some(vec!["nope".to_string()]),
            None,
            json!({ "message": "not found" }),
        ),
        (Some(vec!["sh".to_string()]), None, Value::Null),
    ] {
        check_serialised(
            &doc,
            "ExecRecord",
            &ExecRecord {
                t_us: 1_718_000_012_345_678,
                argv,
                shell,
                cwd: None,
                user: Some("1000:1000".into()),
                tty: false,
                detach: false,
                result,
            },
        );
    }
}

#[test]
fn file_operations_are_their_schemas() {
    use forkd::api::{FsAnswer, FsEntry, FsKind, FsOp, FsRequest};
    let doc = doc();
    check_serialised(
        &doc,
        "FsAnswer",
        &FsAnswer {
            entries: vec![FsEntry {
                name: "l".into(),
                path: "/home/user/l".into(),
                kind: FsKind::Symlink,
                size: 3,
                mode: 0o120777,
                owner: "user".into(),
                group: "user".into(),
                modified_ns: 1_765_000_000_123_456_789,
                symlink_target: Some("a/b".into()),
            }],
            created: Some(true),
        },
    );
    // Every op the schema names reads, with the fields its description gives it.
    let (s, _) = resolve(&doc, &schema(&doc, "FsRequest")["properties"]["op"]);
    let ops: Vec<&str> = s["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for op in ops {
        let body = match op {
            "move" => json!({"op": op, "from": "/a", "to": "/b", "user": "user"}),
            "make_dir" => json!({"op": op, "path": "/a", "owner": "user"}),
            "list" => json!({"op": op, "path": "/a", "depth": 2}),
            _ => json!({"op": op, "path": "/a"}),
        };
        let known = names(schema(&doc, "FsRequest").get("properties"));
        for k in body.as_object().unwrap().keys() {
            assert!(
                known.contains(k),
                "{op}: {k} is not a property of FsRequest"
            );
        }
        let r: FsRequest = serde_json::from_value(body.clone()).unwrap();
        assert_eq!(serde_json::to_value(&r).unwrap(), body, "{op}");
    }
    let r: FsRequest = serde_json::from_value(json!({"op": "list", "path": "/"})).unwrap();
    assert_eq!(
        r.op,
        FsOp::List {
            path: "/".into(),
            depth: 1
        }
    );
    assert!(serde_json::from_value::<FsRequest>(json!({"op": "chmod", "path": "/"})).is_err());
}
