//! Live checkpoints of the workloads that terminal tasks run: a QEMU guest (TCG) and a
//! tmux server, both in the Debian image. Each is checkpointed while running and forked;
//! every branch must go on from the checkpointed instant and then live on its own.

#![forbid(unsafe_code)]

mod common;
#[path = "../benches/common/guest_serial.rs"]
mod guest_serial;

use common::*;
use forkd::api::{BranchInfo, CheckpointInfo, ForkResult, ImageInfo, SandboxInfo};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn debian_tar() -> PathBuf {
    cache_dir().join("images/debian.tar.zst")
}

fn debian_dir() -> PathBuf {
    cache_dir().join("images/debian")
}

fn guest_files() -> [PathBuf; 2] {
    let q = cache_dir().join("qemu");
    [q.join("vmlinuz"), q.join("initrd.gz")]
}

/// Like [`can_run_criu`], and also needs the Debian image (with QEMU when `qemu`) and,
/// when `qemu`, the guest fixture.
fn can_run_guest(name: &str, qemu: bool) -> bool {
    if !can_run_criu(name) {
        return false;
    }
    let mut reason = None;
    if !debian_tar().exists() {
        reason = Some(format!(
            "fixture {} missing (run fixtures/setup.sh debian)",
            debian_tar().display()
        ));
    } else if !debian_dir().join("usr/bin/tmux").exists() {
        reason = Some(format!(
            "the Debian image at {} has no tmux (run fixtures/setup.sh debian)",
            debian_dir().display()
        ));
    } else if qemu {
        if !debian_dir().join("usr/bin/qemu-system-x86_64").exists() {
            reason = Some(format!(
                "the Debian image at {} has no qemu-system-x86_64 (rebuild it: fixtures/setup.sh debian)",
                debian_dir().display()
            ));
        } else if let Some(f) = guest_files().iter().find(|f| !f.exists()) {
            reason = Some(format!(
                "fixture {} missing (run fixtures/setup.sh qemu)",
                f.display()
            ));
        }
    }
    match reason {
        None => true,
        Some(r) => require(name, false, &r),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn us(v: Option<&u64>) -> String {
    v.map(|v| format!("{:.0} ms", *v as f64 / 1000.0))
        .unwrap_or_else(|| "-".into())
}

/// Polls `f` every 100 ms until it returns Some, for at most `limit`.
fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

trait GuestDaemon {
    fn import_debian(&self) -> Duration;
    fn debian(&self) -> SandboxInfo;
    fn run(&self, id: &str, argv: &[&str], env: &[&str]) -> (i32, String, String);
    fn run_ok(&self, id: &str, argv: &[&str], env: &[&str]) -> String;
    fn detach(&self, id: &str, argv: &[&str], env: &[&str], log: &str) -> i32;
    fn log_of(&self, id: &str, name: &str) -> String;
    fn put_files(&self, id: &str, dir: &str, files: &[&Path]) -> Duration;
    fn checkpoint_timed(&self, id: &str) -> (CheckpointInfo, Duration);
    fn fork_timed(&self, checkpoint: &str, count: usize) -> (Vec<BranchInfo>, Duration);
}

impl GuestDaemon for TestDaemon {
    /// Imports the Debian fixture as `debian`; returns how long it took.
    fn import_debian(&self) -> Duration {
        let t = Instant::now();
        let body = serde_json::json!({ "source": debian_tar(), "name": "debian" });
        let _: ImageInfo = self
            .client
            .call("POST", "/v1/images", Some(&body))
            .expect("import debian");
        t.elapsed()
    }

    fn debian(&self) -> SandboxInfo {
        self.create(serde_json::json!({ "image": "debian" }))
    }

    /// Runs argv to completion; returns (exit code, stdout, stderr).
    fn run(&self, id: &str, argv: &[&str], env: &[&str]) -> (i32, String, String) {
        let r = self
            .exec(id, serde_json::json!({ "argv": argv, "env": env }))
            .unwrap_or_else(|e| panic!("exec {argv:?} in {id}: {e}"));
        (
            r.exit.exit_code,
            String::from_utf8_lossy(&decode(&r.stdout_b64)).into(),
            String::from_utf8_lossy(&decode(&r.stderr_b64)).into(),
        )
    }

    fn run_ok(&self, id: &str, argv: &[&str], env: &[&str]) -> String {
        let (code, out, err) = self.run(id, argv, env);
        assert_eq!(code, 0, "{argv:?} in {id} exited {code}: {err}{out}");
        out
    }

    /// Starts argv in the background (output in the sandbox log `log`); returns its pid.
    fn detach(&self, id: &str, argv: &[&str], env: &[&str], log: &str) -> i32 {
        self.exec(
            id,
            serde_json::json!({ "argv": argv, "env": env, "detach": true, "log": log }),
        )
        .unwrap_or_else(|e| panic!("detached exec {argv:?} in {id}: {e}"))
        .pid
    }

    fn log_of(&self, id: &str, name: &str) -> String {
        match self
            .client
            .raw("GET", &format!("/v1/sandboxes/{id}/logs?name={name}"), b"")
        {
            Ok(r) => String::from_utf8_lossy(&r.body).into(),
            Err(e) => format!("(log {name} unreadable: {e})"),
        }
    }

    /// Copies host files into directory `dir` of the sandbox (a tar through the files API).
    fn put_files(&self, id: &str, dir: &str, files: &[&Path]) -> Duration {
        let t = Instant::now();
        self.run_ok(id, &["mkdir", "-p", dir], &[]);
        let mut tar = tar::Builder::new(Vec::new());
        for f in files {
            let name = f.file_name().unwrap();
            tar.append_path_with_name(f, name)
                .unwrap_or_else(|e| panic!("tar {}: {e}", f.display()));
        }
        let body = tar.into_inner().unwrap();
        let resp = self
            .client
            .raw(
                "PUT",
                &format!("/v1/sandboxes/{id}/files?path={dir}"),
                &body,
            )
            .expect("PUT files");
        assert_eq!(
            resp.status,
            200,
            "PUT files: {}",
            String::from_utf8_lossy(&resp.body)
        );
        t.elapsed()
    }

    fn checkpoint_timed(&self, id: &str) -> (CheckpointInfo, Duration) {
        let t = Instant::now();
        let c = self.checkpoint(id, true);
        (c, t.elapsed())
    }

    fn fork_timed(&self, checkpoint: &str, count: usize) -> (Vec<BranchInfo>, Duration) {
        let t = Instant::now();
        let r: ForkResult = self
            .client
            .call(
                "POST",
                &format!("/v1/checkpoints/{checkpoint}/fork"),
                Some(&serde_json::json!({ "count": count, "lazy": false })),
            )
            .unwrap_or_else(|e| {
                panic!(
                    "fork of {count} eager branches from live checkpoint {checkpoint} failed: {e}\n\
                     (daemon log and CRIU logs kept under {:?})",
                    self.root.parent().unwrap()
                )
            });
        let took = t.elapsed();
        assert_eq!(r.branches.len(), count);
        (r.branches, took)
    }
}

fn print_checkpoint(test: &str, c: &CheckpointInfo, took: Duration) {
    println!(
        "{test}: live checkpoint {} in {} (API round trip); phases {:?} (us); CRIU images {:.1} MB",
        c.id,
        ms(took),
        c.phases_us,
        c.images_bytes as f64 / 1e6
    );
}

fn print_branches(test: &str, branches: &[BranchInfo], took: Duration) {
    println!(
        "{test}: fork of {} eager branches in {} (API round trip, {} per branch)",
        branches.len(),
        ms(took),
        ms(took / branches.len() as u32)
    );
    for b in branches {
        println!(
            "{test}:   branch {} mode {}: restore {}, total {}; phases {:?} (us)",
            b.id,
            b.mode,
            us(b.phases_us.get("restore")),
            us(b.phases_us.get("total")),
            b.phases_us
        );
    }
}

// ---- QEMU ---------------------------------------------------------------------------

const SERIAL: &str = "/guest/serial.log";

/// What a guest's serial log says (`benches/common/guest_serial.rs`, shared with the
/// benches).
use guest_serial::GuestSerial as Serial;

/// The checks a test makes of a serial log.
trait OneRun {
    fn check_one_run(&self, what: &str, text: &str);
}

impl OneRun for Serial {
    /// Counter lines must run 1, 2, 3, ... with no restart and no gap, one secret.
    fn check_one_run(&self, what: &str, text: &str) {
        let secret = self.counters.first().map_or("", |c| c.1.as_str());
        if let Some(why) = self.not_one_run_of(secret) {
            panic!("{what}: {why}:\n{text}");
        }
    }
}

impl TestDaemon {
    fn serial(&self, id: &str) -> (Serial, String) {
        let text = self.run_ok(id, &["tail", "-c", "+1", SERIAL], &[]);
        (Serial::parse(&text), text)
    }

    /// Like `serial`, but an empty log while QEMU has not opened it yet.
    fn serial_if_any(&self, id: &str) -> Serial {
        let (code, text, _) = self.run(id, &["tail", "-c", "+1", SERIAL], &[]);
        if code == 0 {
            Serial::parse(&text)
        } else {
            Serial::default()
        }
    }
}

#[test]
fn qemu_guest_resumes_in_every_branch() {
    const NAME: &str = "qemu_guest_resumes_in_every_branch";
    if !can_run_guest(NAME, true) {
        return;
    }
    let t0 = Instant::now();
    // A memory cgroup for every branch: what each is charged is what it wrote.
    let d = TestDaemon::start_with_env("qemu", &[("FORKD_MEMCG", "each")]);
    println!("{NAME}: daemon logs in {:?}", d.root.parent().unwrap());
    let imported = d.import_debian();
    let src = d.debian();
    let [kernel, initrd] = guest_files();
    let copied = d.put_files(&src.id, "/guest", &[&kernel, &initrd]);
    println!(
        "{NAME}: debian import {}, sandbox create {} us, guest files copied in {}",
        ms(imported),
        src.create_us,
        ms(copied)
    );

    // The guest of the benches (one argument a line), with 512 MiB.
    let mut qemu_argv: Vec<&str> = include_str!("../fixtures/qemu/sandbox-argv")
        .lines()
        .collect();
    let m = qemu_argv.iter().position(|a| *a == "-m").unwrap() + 1;
    qemu_argv[m] = "512";
    let booted = Instant::now();
    let qemu_pid = d.detach(&src.id, &qemu_argv, &[], "qemu");
    // Boot under TCG takes a few seconds; wait for a handful of counter lines.
    let before = wait_for(Duration::from_secs(30), || {
        let s = d.serial_if_any(&src.id);
        (s.last() >= 5).then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "the guest printed no counter within 30 s\nserial:\n{}\nqemu log:\n{}",
            d.run(&src.id, &["cat", SERIAL], &[]).1,
            d.log_of(&src.id, "qemu")
        )
    });
    println!(
        "{NAME}: guest (QEMU pid {qemu_pid} in the sandbox) counting after {}",
        ms(booted.elapsed())
    );
    let secret = before.counters[0].1.clone();
    let at_least = before.last();

    let (c, dump_took) = d.checkpoint_timed(&src.id);
    assert!(c.live && c.images_bytes > 0, "{c:?}");
    print_checkpoint(NAME, &c, dump_took);
    let (after, _) = d.serial(&src.id);
    let at_most = after.last();

    let available = || -> u64 {
        std::fs::read_to_string("/proc/meminfo")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    };
    let before_fork = available();
    let (branches, fork_took) = d.fork_timed(&c.id, 8);
    print_branches(NAME, &branches, fork_took);
    // Eight branches of the guest share its memory: together they are charged less than
    // one copy of the checkpoint's pages (each would be charged all of it, were its pages
    // read into it).
    std::thread::sleep(Duration::from_secs(1));
    let charged: Vec<u64> = branches.iter().map(|b| memory_charge(&b.id)).collect();
    let total: u64 = charged.iter().sum();
    println!(
        "{NAME}: 8 branches of a {} MiB state: charged {:?} MiB ({} MiB in all); the host's MemAvailable {} MiB lower",
        c.images_bytes >> 20,
        charged.iter().map(|c| c >> 20).collect::<Vec<_>>(),
        total >> 20,
        (before_fork as i64 - available() as i64) / 1024
    );
    assert!(
        total < c.images_bytes,
        "8 branches charged {total} bytes, one copy of the state is {}",
        c.images_bytes
    );

    // Every branch: the same guest (one boot, the boot-time secret) counting on from
    // the checkpointed value. Waits until each has written past the checkpoint (or 60 s,
    // after which the assertions below say what was seen).
    for b in &branches {
        wait_for(Duration::from_secs(60), || {
            (d.serial(&b.id).0.last() > at_least).then_some(())
        });
    }
    let mut lasts = Vec::new();
    for b in &branches {
        assert_eq!(b.mode, forkd::api::ForkMode::Eager);
        let (s, text) = d.serial(&b.id);
        let what = format!("branch {}", b.id);
        s.check_one_run(&what, &text);
        assert_eq!(s.counters[0].1, secret, "{what}: another guest's secret");
        // The log holds the lines up to the checkpoint (from the snapshot) and the lines
        // the restored guest wrote since: it must have gone past the checkpoint.
        assert!(
            s.last() > at_least,
            "{what}: counter {} not past {at_least}, seen before the checkpoint:\n{text}",
            s.last()
        );
        // Its lines up to the checkpoint are the source's.
        let shared = before.counters.len();
        assert_eq!(&s.counters[..shared], &before.counters[..], "{what}");
        lasts.push(s.last());
        println!(
            "{NAME}:   branch {}: secret {secret}, counter {} (checkpoint between {at_least} and {at_most})",
            b.id,
            s.last()
        );
    }
    // The source is untouched by the forks and goes on.
    let (s, text) = d.serial(&src.id);
    s.check_one_run("source", &text);
    assert!(s.last() >= at_most);

    // Branches diverge: QEMU killed in the first stops its log; the others count on.
    let first = &branches[0].id;
    let (code, out, err) = d.run(first, &["pkill", "-KILL", "-x", "qemu-system-x86"], &[]);
    assert_eq!(code, 0, "pkill in {first}: {out}{err}");
    let gone = wait_for(Duration::from_secs(5), || {
        (d.run(first, &["pgrep", "-x", "qemu-system-x86"], &[]).0 != 0).then_some(())
    });
    assert!(gone.is_some(), "QEMU still running in {first}");
    let frozen = d.serial(first).0.last();
    let others: Vec<u64> = branches[1..]
        .iter()
        .map(|b| d.serial(&b.id).0.last())
        .collect();
    // The others' progress is the clock: once each has written a line more, the killed
    // branch would have too, had QEMU still run there.
    for (b, was) in branches[1..].iter().zip(&others) {
        wait_for(Duration::from_secs(60), || {
            (d.serial(&b.id).0.last() > *was).then_some(())
        });
    }
    assert_eq!(
        d.serial(first).0.last(),
        frozen,
        "the killed branch's log grew"
    );
    for (b, was) in branches[1..].iter().zip(others) {
        let (s, text) = d.serial(&b.id);
        s.check_one_run(&format!("branch {}", b.id), &text);
        assert!(
            s.last() > was,
            "branch {} stopped counting at {was} after QEMU was killed in {first}",
            b.id
        );
    }
    assert!(d.serial(&src.id).0.last() > at_most, "the source stopped");
    println!("{NAME}: passed in {}", ms(t0.elapsed()));
}

/// The memory charge of sandbox `id`'s own memory cgroup (v1 or v2).
fn memory_charge(id: &str) -> u64 {
    let v1 = format!("/sys/fs/cgroup/memory/forkd/{id}/memory.usage_in_bytes");
    let v2 = format!("/sys/fs/cgroup/forkd/{id}/memory.current");
    std::fs::read_to_string(&v1)
        .or_else(|_| std::fs::read_to_string(&v2))
        .unwrap_or_else(|e| panic!("no memory cgroup of {id} ({v1}, {v2}): {e}"))
        .trim()
        .parse()
        .unwrap()
}

// ---- tmux ---------------------------------------------------------------------------

const TERM: &[&str] = &["TERM=xterm"];

/// Prints `tick N` every 200 ms in its pane.
const TICKER: &str =
    "import itertools, time\nfor i in itertools.count(1):\n    print('tick', i, flush=True)\n    time.sleep(0.2)\n";

impl TestDaemon {
    fn tmux(&self, id: &str, args: &[&str]) -> String {
        let mut argv = vec!["tmux"];
        argv.extend_from_slice(args);
        self.run_ok(id, &argv, TERM)
    }

    /// The pane's visible text plus its history.
    fn capture(&self, id: &str, target: &str) -> String {
        self.tmux(id, &["capture-pane", "-p", "-S", "-2000", "-t", target])
    }

    /// The last `tick N` the ticker pane shows; the pane (with its history) must show
    /// one run, 1, 2, 3, ..., never starting over.
    fn last_tick(&self, id: &str) -> u64 {
        let text = self.capture(id, "main:ticker");
        let ticks: Vec<u64> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("tick "))
            .filter_map(|n| n.trim().parse().ok())
            .collect();
        assert!(
            !ticks.is_empty(),
            "no tick in the ticker pane of {id}:\n{text}"
        );
        for (i, n) in ticks.iter().enumerate() {
            assert_eq!(
                *n,
                i as u64 + 1,
                "ticker pane of {id} started over:\n{text}"
            );
        }
        *ticks.last().unwrap()
    }
}

#[test]
fn tmux_session_resumes_in_every_branch() {
    const NAME: &str = "tmux_session_resumes_in_every_branch";
    if !can_run_guest(NAME, false) {
        return;
    }
    let t0 = Instant::now();
    let d = TestDaemon::start("tmux");
    println!("{NAME}: daemon logs in {:?}", d.root.parent().unwrap());
    let imported = d.import_debian();
    let src = d.debian();
    println!(
        "{NAME}: debian import {}, sandbox create {} us",
        ms(imported),
        src.create_us
    );

    // The server is started from a detached exec: the client exits once the server runs,
    // and the server, orphaned, stays below the exec's waiter, in the init's tree.
    d.detach(
        &src.id,
        &[
            "tmux",
            "new-session",
            "-d",
            "-s",
            "main",
            "-n",
            "shell",
            "-x",
            "120",
            "-y",
            "40",
            "bash --norc --noprofile",
        ],
        TERM,
        "tmux",
    );
    let up = wait_for(Duration::from_secs(10), || {
        (d.run(&src.id, &["tmux", "has-session", "-t", "main"], TERM)
            .0
            == 0)
            .then_some(())
    });
    assert!(
        up.is_some(),
        "no tmux session: {}",
        d.log_of(&src.id, "tmux")
    );
    d.tmux(
        &src.id,
        &[
            "new-window",
            "-d",
            "-t",
            "main",
            "-n",
            "ticker",
            &format!("python3 -u -c \"{TICKER}\""),
        ],
    );
    // The server is a descendant of the sandbox's init (pid 1).
    let ps = d.run_ok(&src.id, &["ps", "-eo", "pid,ppid,comm"], &[]);
    let parent_of = |pid: &str| -> Option<String> {
        ps.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && f[0] == pid).then(|| f[1].to_string())
        })
    };
    let server = ps
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && f[2].starts_with("tmux")).then(|| f[0].to_string())
        })
        .unwrap_or_else(|| panic!("no tmux server in:\n{ps}"));
    let mut p = server.clone();
    for _ in 0..20 {
        if p == "1" {
            break;
        }
        p = parent_of(&p).unwrap_or_else(|| panic!("pid {p} has no parent in:\n{ps}"));
    }
    assert_eq!(p, "1", "tmux server {server} is not below the init:\n{ps}");

    // State in the shell's memory, made before the checkpoint.
    let secret = format!("{:08x}", std::process::id() ^ 0x5eed_cafe);
    d.tmux(
        &src.id,
        &[
            "send-keys",
            "-t",
            "main:shell",
            &format!("S={secret}"),
            "Enter",
        ],
    );
    let ticking = wait_for(Duration::from_secs(10), || {
        let t = d
            .capture(&src.id, "main:ticker")
            .lines()
            .any(|l| l.trim() == "tick 5");
        t.then_some(())
    });
    assert!(
        ticking.is_some(),
        "ticker did not start:\n{}",
        d.capture(&src.id, "main:ticker")
    );
    let ticker_pid = d
        .tmux(
            &src.id,
            &["display", "-p", "-t", "main:ticker", "#{pane_pid}"],
        )
        .trim()
        .to_string();
    assert_eq!(
        d.tmux(&src.id, &["display", "-p", "#{pid}"]).trim(),
        server,
        "the tmux server is not the process found in ps"
    );

    let at_least = d.last_tick(&src.id);
    let (c, dump_took) = d.checkpoint_timed(&src.id);
    print_checkpoint(NAME, &c, dump_took);
    let at_most = d.last_tick(&src.id);

    let (branches, fork_took) = d.fork_timed(&c.id, 3);
    print_branches(NAME, &branches, fork_took);

    for b in &branches {
        assert_eq!(b.mode, forkd::api::ForkMode::Eager);
        let what = format!("branch {}", b.id);
        // Same server, same session, same ticker process, counting on from where it was.
        d.run_ok(&b.id, &["tmux", "has-session", "-t", "main"], TERM);
        assert_eq!(
            d.tmux(&b.id, &["display", "-p", "#{pid}"]).trim(),
            server,
            "{what}: another tmux server"
        );
        assert_eq!(
            d.tmux(
                &b.id,
                &["display", "-p", "-t", "main:ticker", "#{pane_pid}"]
            )
            .trim(),
            ticker_pid,
            "{what}: another ticker"
        );
        let n1 = d.last_tick(&b.id);
        assert!(
            n1 >= at_least,
            "{what}: tick {n1} < {at_least} (restarted?)"
        );
        let n2 = wait_for(Duration::from_secs(5), || {
            let n = d.last_tick(&b.id);
            (n > n1 + 2).then_some(n)
        })
        .unwrap_or_else(|| {
            panic!(
                "{what}: the ticker stopped at {n1}:\n{}",
                d.capture(&b.id, "main:ticker")
            )
        });
        println!(
            "{NAME}:   branch {}: ticker pid {ticker_pid}, tick {n1} -> {n2} (checkpoint between {at_least} and {at_most})",
            b.id
        );
    }
    // Keys typed into one branch's shell run there only, with the shell's state from
    // before the checkpoint.
    for (i, b) in branches.iter().enumerate() {
        d.tmux(
            &b.id,
            &[
                "send-keys",
                "-t",
                "main:shell",
                &format!("echo branch-{i}-$S"),
                "Enter",
            ],
        );
    }
    let line = |i: usize| format!("branch-{i}-{secret}");
    for (i, b) in branches.iter().enumerate() {
        let text = wait_for(Duration::from_secs(5), || {
            let t = d.capture(&b.id, "main:shell");
            t.lines().any(|l| l.trim() == line(i)).then_some(t)
        })
        .unwrap_or_else(|| {
            panic!(
                "branch {}: no {} in its shell pane:\n{}",
                b.id,
                line(i),
                d.capture(&b.id, "main:shell")
            )
        });
        for j in (0..branches.len()).filter(|&j| j != i) {
            assert!(
                !text.contains(&format!("branch-{j}-")),
                "branch {} shows branch {j}'s command:\n{text}",
                b.id
            );
        }
    }
    let text = d.capture(&src.id, "main:shell");
    assert!(!text.contains("branch-"), "the source got keys:\n{text}");
    assert!(d.last_tick(&src.id) > at_most, "the source stopped");
    println!("{NAME}: passed in {}", ms(t0.elapsed()));
}
