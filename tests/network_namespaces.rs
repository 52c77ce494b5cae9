//! Every sandbox and every branch has a network namespace of its own, with loopback up and
//! nothing else, whether it took one the daemon made ahead (`src/daemon/spare_netns.rs`)
//! or, none being ready, one made for it in place.

#![forbid(unsafe_code)]

mod common;

use common::*;
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;

const LOOP: &str = "mkfifo /tmp/tick; exec 3<>/tmp/tick; i=0; while :; do i=$((i+1)); echo $i > /tmp/count; read -t 10 x <&3; done";

fn netns(pid: impl std::fmt::Display) -> u64 {
    std::fs::metadata(format!("/proc/{pid}/ns/net"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/ns/net: {e}"))
        .ino()
}

#[test]
fn each_sandbox_and_branch_has_a_network_namespace_of_its_own() {
    let name = "each_sandbox_and_branch_has_a_network_namespace_of_its_own";
    if !can_run_criu(name) {
        return;
    }
    // Two kept ready: five creates back to back take both and make the others in place,
    // and a fork of three does the same.
    let d = TestDaemon::start_with_env("netns", &[("FORKD_SPARE_NETNS", "2")]);
    let daemon_pid = d.pid().expect("the daemon's pid");
    let mut sandboxes: Vec<(String, i32)> = (0..5)
        .map(|_| {
            let sb =
                d.create(serde_json::json!({ "image": "busybox", "command": { "shell": LOOP } }));
            (sb.id, sb.init_pid.expect("a running sandbox has an init"))
        })
        .collect();
    let ck = d.checkpoint(&sandboxes[0].0, true);
    for b in d.fork(&ck.id, 3, false).branches {
        sandboxes.push((b.id, b.init_pid.expect("a branch has an init")));
    }
    let host = [netns("self"), netns(daemon_pid)];
    let mut seen = HashSet::new();
    for (id, pid) in &sandboxes {
        let ns = netns(pid);
        assert!(
            !host.contains(&ns),
            "sandbox {id} is in the host's network namespace"
        );
        assert!(
            seen.insert(ns),
            "sandbox {id} shares network namespace {ns} with another sandbox"
        );
        // Only loopback, and up: its addresses are in the local routes only once it is.
        let (code, out, err) = d.sh(
            id,
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; grep -c 'host LOCAL' /proc/net/fib_trie",
        );
        assert_eq!(code, 0, "sandbox {id}: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.first(), Some(&"lo"), "sandbox {id}: {out:?}");
        assert_eq!(
            lines.len(),
            2,
            "sandbox {id} has more than loopback: {out:?}"
        );
        assert!(
            lines[1].parse::<u32>().is_ok_and(|n| n > 0),
            "sandbox {id}: loopback is down: {out:?}"
        );
    }
    // A namespace outlives nothing it was given to: one sandbox's listener is not reachable
    // over another's loopback.
    let (a, b) = (&sandboxes[1].0, &sandboxes[6].0);
    let (code, _, err) = d.sh(a, "nc -l -p 7000 -e true >/dev/null 2>&1 & sleep 0.2");
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = d.sh(
        b,
        "echo x | nc -w 1 127.0.0.1 7000 && echo reached || echo refused",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        "refused",
        "sandbox {b} reached sandbox {a}'s loopback"
    );
    let (code, out, _) = d.sh(
        a,
        "echo x | nc -w 1 127.0.0.1 7000 && echo reached || echo refused",
    );
    assert_eq!(code, 0);
    assert_eq!(
        out.trim(),
        "reached",
        "the listener in sandbox {a} is not up"
    );
}
