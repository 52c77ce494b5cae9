//! Greedy neighbours and a full disk: per-sandbox disk limits (each sandbox and branch
//! charged its own writes), a volume on a small disk filled by one sandbox (the writer
//! stopped, the volume writable, the others going on, the node recovering without a
//! restart), and a memory bomb, a fork bomb and a disk filler beside 20 counters.

#![forbid(unsafe_code)]

mod common;

use common::*;
use forkd::api::SandboxInfo;
use std::path::PathBuf;

/// A small filesystem of the test's own, mounted for the daemon's state root; unmounted
/// and removed when dropped.
struct SmallDisk {
    image: PathBuf,
    mount: PathBuf,
}

impl SmallDisk {
    fn new(tag: &str, mib: u64) -> SmallDisk {
        let image = PathBuf::from(format!("/tmp/forkd-test-{tag}-{}.disk", std::process::id()));
        let mount = PathBuf::from(format!("/tmp/forkd-test-{tag}-{}.mnt", std::process::id()));
        std::fs::File::create(&image)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        let ok = |c: &mut std::process::Command| assert!(c.status().unwrap().success(), "{c:?}");
        ok(std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&image));
        std::fs::create_dir_all(&mount).unwrap();
        ok(std::process::Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount));
        SmallDisk { image, mount }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        for m in [self.mount.join("root/vol"), self.mount.clone()] {
            let _ = std::process::Command::new("umount")
                .arg(m)
                .stderr(std::process::Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir(&self.mount);
        let _ = std::fs::remove_file(&self.image);
    }
}

fn health(d: &TestDaemon) -> forkd::api::Health {
    d.client
        .call("GET", "/v1/health", None)
        .expect("GET /v1/health")
}

#[test]
fn a_full_disk_gives_the_writer_enospc_and_the_node_goes_on() {
    let name = "a_full_disk_gives_the_writer_enospc_and_the_node_goes_on";
    if !can_run_criu(name) {
        return;
    }
    // A 1.2 GB disk under a volume allowed to grow to 4 GiB.
    let disk = SmallDisk::new("full-disk", 1200);
    let root = disk.mount.join("root");
    let d = TestDaemon::start_at("full-disk", &[("FORKD_VOLUME_SIZE", "4G")], Some(&root));
    assert!(
        d.log().contains("has room for"),
        "no word of the disk's size at start: {}",
        d.log()
    );
    let h = health(&d);
    assert!(h.ok, "{:?}", h.degraded);
    assert!(h.volume.size_bytes < h.volume.max_bytes);
    let counter = d.create(serde_json::json!({
        "image": "busybox",
        "command": { "argv": ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done"] }
    }));
    let before = d.checkpoint(&counter.id, true);
    let writer = d.busybox();
    // Health is sampled while the writer fills the disk.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (stop, client) = (stop.clone(), d.client.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(h) = client.call::<forkd::api::Health>("GET", "/v1/health", None) {
                    seen.extend(h.volume.pressure);
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            seen
        })
    };
    let (code, out, err) = d.sh(
        &writer.id,
        "dd if=/dev/urandom of=/root/big bs=1M count=1500 2>&1; echo rc=$?",
    );
    assert_eq!(code, 0, "{err}");
    // The writer is told: by btrfs when the volume filled, or (where the volume has
    // quotas) by the disk limit the daemon gave it, the largest writer, once the volume
    // was down to its reserve.
    assert!(
        (out.contains("No space left on device") || out.contains("Disk quota exceeded"))
            && out.contains("rc=1"),
        "the writer was not told: {out}"
    );
    // Still full: the health endpoint says so, and a create is refused with the reason.
    let h = health(&d);
    let pressure = h.volume.pressure.clone().unwrap_or_else(|| {
        let alloc = std::process::Command::new("sh")
            .arg("-c")
            .arg("cd /sys/fs/btrfs && grep -r . */allocation/*/total_bytes */allocation/*/bytes_* */allocation/*/disk_* */allocation/global_rsv_* 2>&1; btrfs filesystem usage -b \"$0\" 2>&1")
            .arg(d.data())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        panic!(
            "no pressure while the disk is full: {:?}\n{alloc}\n{}",
            h.volume,
            d.log()
        )
    });
    assert!(
        pressure.contains("the volume is") && pressure.contains("cannot grow"),
        "{pressure}"
    );
    assert!(!h.ok && h.volume.problems.is_empty(), "{h:?}");
    let r: Result<SandboxInfo, _> = d.client.call(
        "POST",
        "/v1/sandboxes",
        Some(&serde_json::json!({ "image": "busybox" })),
    );
    let e = r.unwrap_err().to_string();
    assert!(e.contains("create refused: the volume is"), "{e}");
    if h.disk_limits.ok {
        // The writer was the one stopped, and the other sandbox's counter goes on while
        // the writer's file is still there.
        assert!(
            pressure.contains(&format!("sandbox {}, its largest writer", writer.id)),
            "{pressure}"
        );
        let n = d.read_number(&counter.id, "/tmp/n");
        assert!(
            wait_until(std::time::Duration::from_secs(10), || d
                .read_number(&counter.id, "/tmp/n")
                > n),
            "the other sandbox's counter stopped while the volume was full"
        );
        // And the stopped writer cannot take the reserve.
        let (_, out, _) = d.sh(
            &writer.id,
            "dd if=/dev/zero of=/root/more bs=1M count=64 2>&1",
        );
        assert!(out.contains("Disk quota exceeded"), "{out}");
    }
    // The volume stayed writable: no read-only remount, no device error.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let vol = root.join("vol");
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(vol.to_str().unwrap()))
        .expect("the volume's mount");
    assert!(line.split(' ').nth(5).unwrap().starts_with("rw"), "{line}");
    // Space comes back: the same daemon creates and forks again.
    let (code, _, err) = d.sh(&writer.id, "rm /root/big && sync");
    assert_eq!(code, 0, "{err}");
    assert!(
        wait_until(std::time::Duration::from_secs(15), || health(&d)
            .volume
            .pressure
            .is_none()),
        "the pressure did not clear"
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = sampler.join().unwrap();
    assert!(
        !seen.is_empty(),
        "GET /v1/health never reported the pressure while it lasted"
    );
    let n = d.read_number(&counter.id, "/tmp/n");
    assert!(
        wait_until(std::time::Duration::from_secs(10), || d
            .read_number(&counter.id, "/tmp/n")
            > n),
        "the other sandbox's counter stopped"
    );
    let fork = d.fork(&before.id, 1, false);
    let b = &fork.branches[0].id;
    let n = d.read_number(b, "/tmp/n");
    assert!(n > 0);
    assert!(
        wait_until(std::time::Duration::from_secs(10), || d
            .read_number(b, "/tmp/n")
            > n),
        "the branch of the checkpoint taken before does not count"
    );
    let again = d.busybox();
    assert_eq!(d.sh(&again.id, "echo ok").1.trim(), "ok");
    assert!(health(&d).ok);
    drop(d);
    drop(disk);
}

/// Writes `mib` MiB to `path` in `id`: Ok, or the error `dd` printed.
fn write_mib(d: &TestDaemon, id: &str, path: &str, mib: u64) -> Result<(), String> {
    let (code, out, err) = d.sh(
        id,
        &format!("dd if=/dev/urandom of={path} bs=1M count={mib} 2>&1 && sync"),
    );
    if code == 0 {
        Ok(())
    } else {
        Err(format!("{out}{err}"))
    }
}

fn disk_used(d: &TestDaemon, id: &str) -> u64 {
    let info: SandboxInfo = d
        .client
        .call("GET", &format!("/v1/sandboxes/{id}"), None)
        .unwrap();
    info.disk_used_bytes.expect("disk_used_bytes in inspect")
}

const MIB: u64 = 1 << 20;

#[test]
fn disk_limits_charge_each_sandbox_and_branch_its_own_writes() {
    let name = "disk_limits_charge_each_sandbox_and_branch_its_own_writes";
    if !can_run_criu(name) {
        return;
    }
    let d = TestDaemon::start("walls-disk");
    let h = health(&d);
    if !h.disk_limits.ok {
        // A kernel without btrfs simple quotas refuses a disk limit by name.
        let r: Result<SandboxInfo, _> = d.client.call(
            "POST",
            "/v1/sandboxes",
            Some(&serde_json::json!({ "image": "busybox", "limits": { "disk_bytes": 64 * MIB } })),
        );
        let e = r.unwrap_err().to_string();
        assert!(e.contains("disk limits need Linux 6.7"), "{e}");
        return;
    }
    let limited = d.create(serde_json::json!({
        "image": "busybox",
        "limits": { "disk_bytes": 64 * MIB },
        "command": { "argv": ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done"] }
    }));
    assert_eq!(limited.limits.disk_bytes, Some(64 * MIB));
    let neighbour = d.busybox();
    write_mib(&d, &limited.id, "/root/a", 40).unwrap();
    let e = write_mib(&d, &limited.id, "/root/b", 40).unwrap_err();
    assert!(e.contains("Disk quota exceeded"), "past the limit: {e}");
    let used = disk_used(&d, &limited.id);
    assert!(used > 60 * MIB && used <= 64 * MIB, "charged {used}");
    // The neighbour, without a limit, writes on.
    write_mib(&d, &neighbour.id, "/root/big", 100).unwrap();
    assert!(disk_used(&d, &neighbour.id) >= 100 * MIB);
    // The image's layers cost nothing: a large file of the image rewritten in place is
    // a copy-up, charged; reading it is not.
    let (code, _, _) = d.sh(&limited.id, "cat /bin/busybox > /dev/null");
    assert_eq!(code, 0);
    // Room again once the file is gone (no checkpoint holds it yet).
    let (code, _, err) = d.sh(&limited.id, "rm -f /root/b && sync");
    assert_eq!(code, 0, "{err}");
    assert!(
        wait_until(std::time::Duration::from_secs(10), || disk_used(
            &d,
            &limited.id
        ) < 48 * MIB),
        "the removed file is still charged: {}",
        disk_used(&d, &limited.id)
    );
    // Branches of a live checkpoint: each is charged only what it writes itself, under
    // the checkpoint's limit, or the one the fork asks for.
    let ck = d.checkpoint(&limited.id, true);
    let fork = d.fork(&ck.id, 2, false);
    for b in &fork.branches {
        assert!(
            disk_used(&d, &b.id) < 4 * MIB,
            "a fresh branch is charged its parent's data"
        );
        write_mib(&d, &b.id, "/root/own", 50).unwrap();
        let e = write_mib(&d, &b.id, "/root/more", 30).unwrap_err();
        assert!(e.contains("Disk quota exceeded"), "{e}");
        // It still reads what it inherited; once it frees what went past its limit, its
        // counter (whose writes the full quota refused meanwhile) goes on.
        let (code, _, _) = d.sh(&b.id, "test -s /root/a && rm -f /root/more && sync");
        assert_eq!(code, 0);
        let n = d.read_number(&b.id, "/tmp/n");
        assert!(wait_until(std::time::Duration::from_secs(10), || d
            .read_number(&b.id, "/tmp/n")
            > n));
    }
    let small: forkd::api::ForkResult = d
        .client
        .call(
            "POST",
            &format!("/v1/checkpoints/{}/fork", ck.id),
            Some(&serde_json::json!({ "count": 1, "disk_bytes": 8 * MIB })),
        )
        .unwrap();
    let b = &small.branches[0].id;
    let e = write_mib(&d, b, "/root/x", 16).unwrap_err();
    assert!(e.contains("Disk quota exceeded"), "{e}");
    // The CLI's spelling, and a limit too small refused by name.
    let out = d.cli(&["run", "-d", "--disk", "32m", "busybox"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(write_mib(&d, &id, "/root/x", 40).is_err());
    let r: Result<SandboxInfo, _> = d.client.call(
        "POST",
        "/v1/sandboxes",
        Some(&serde_json::json!({ "image": "busybox", "limits": { "disk_bytes": 1000 } })),
    );
    let e = r.unwrap_err().to_string();
    assert!(e.contains("disk_bytes 1000 is too small"), "{e}");
}

#[test]
fn a_memory_bomb_a_fork_bomb_and_a_disk_filler_leave_the_node_and_its_neighbours_running() {
    let name =
        "a_memory_bomb_a_fork_bomb_and_a_disk_filler_leave_the_node_and_its_neighbours_running";
    if !can_run_criu(name) {
        return;
    }
    // The operator's defaults bound what a request leaves unset: tasks (2048 without
    // being told), memory and disk. The disk is small, so a filler without its limit
    // would fill it.
    let disk = SmallDisk::new("greedy", 1500);
    let root = disk.mount.join("root");
    let d = TestDaemon::start_at(
        "greedy",
        &[
            ("FORKD_DEFAULT_MEMORY", "256m"),
            ("FORKD_DEFAULT_DISK", "256m"),
        ],
        Some(&root),
    );
    let quotas = health(&d).disk_limits.ok;
    // All sandboxes together are bounded below the machine's memory.
    let total_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    let bound = [
        "/sys/fs/cgroup/memory/forkd/memory.limit_in_bytes",
        "/sys/fs/cgroup/forkd/memory.max",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .expect("the forkd cgroup's memory bound");
    let bound: u64 = bound.trim().parse().expect("a bound, not max");
    assert!(
        bound < total_kib << 10,
        "sandboxes may use {bound} of {} bytes",
        total_kib << 10
    );
    assert!(
        d.log().contains("all sandboxes together may use"),
        "{}",
        d.log()
    );
    const COUNT: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done";
    let counters: Vec<SandboxInfo> = (0..20)
        .map(|_| d.create(serde_json::json!({ "image": "busybox", "command": { "shell": COUNT } })))
        .collect();
    assert_eq!(counters[0].limits.pids, Some(2048));
    assert_eq!(counters[0].limits.memory_bytes, Some(256 << 20));
    let ck = d.checkpoint(&counters[0].id, true);
    let before: Vec<u64> = counters
        .iter()
        .map(|c| d.read_number(&c.id, "/tmp/n"))
        .collect();
    // The three at once.
    let bombs = [
        ("memory", "x=0123456789abcdef; while true; do x=$x$x; done"),
        ("fork", "b() { b | b & }; b"),
        (
            "disk",
            "while true; do dd if=/dev/zero of=/root/fill.$$ bs=1M count=4096; sleep 0.2; done",
        ),
    ];
    let bomb_ids: Vec<(String, &str)> = bombs
        .iter()
        .map(|(what, line)| {
            let sb =
                d.create(serde_json::json!({ "image": "busybox", "command": { "shell": line } }));
            (sb.id, *what)
        })
        .collect();
    // The daemon answers throughout.
    let start = std::time::Instant::now();
    let mut answered = 0;
    while start.elapsed() < std::time::Duration::from_secs(15) {
        let r: Result<serde_json::Value, _> = d.client.call("GET", "/v1/sandboxes", None);
        r.expect("the daemon stopped answering");
        answered += 1;
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(answered > 10);
    // Each bomb met its bound: the memory bomb its limit (killed in its own cgroup),
    // the fork bomb its task limit, the filler its disk limit.
    let info = |id: &str| -> SandboxInfo {
        d.client
            .call("GET", &format!("/v1/sandboxes/{id}"), None)
            .unwrap()
    };
    let (mem, fork, fill) = (&bomb_ids[0].0, &bomb_ids[1].0, &bomb_ids[2].0);
    let m = info(mem);
    assert!(
        m.oom_kills.unwrap_or(0) > 0 || m.memory_bytes.unwrap_or(0) <= 256 << 20,
        "{m:?}"
    );
    let f = info(fork);
    assert_eq!(f.limits.pids, Some(2048));
    if quotas {
        let used = info(fill).disk_used_bytes.unwrap();
        assert!(used <= 256 << 20, "the filler holds {used} bytes");
    }
    // Every counter went on, the volume is writable, health is good.
    let after: Vec<u64> = counters
        .iter()
        .map(|c| d.read_number(&c.id, "/tmp/n"))
        .collect();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert!(a > b, "counter {i} stopped: {b} then {a}");
    }
    for (id, _) in &bomb_ids {
        let _: serde_json::Value = d
            .client
            .call("DELETE", &format!("/v1/sandboxes/{id}?force=true"), None)
            .expect("remove a bomb");
    }
    let h = health(&d);
    assert!(h.ok, "{:?}", h.degraded);
    // The checkpoint taken before still forks, and its branch counts on.
    let fork = d.fork(&ck.id, 1, false);
    let b = &fork.branches[0].id;
    let n = d.read_number(b, "/tmp/n");
    assert!(wait_until(std::time::Duration::from_secs(10), || d
        .read_number(b, "/tmp/n")
        > n));
    drop(d);
    drop(disk);
}
