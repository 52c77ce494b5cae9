//! Branches of a live checkpoint share its memory copy-on-write (restore templates,
//! docs/DESIGN.md, "Memory shared between branches"), with the semantics of private
//! anonymous memory as a program sees them. A Python process in the Debian fixture holds
//! 64 MiB of patterned private memory and answers commands on a Unix socket; every check
//! runs in branches of its live checkpoint:
//! - a fresh branch maps the checkpoint's pages shared, and its writes are its own
//!   (8 branches and the source); gc, and the end of the checkpoint's template, leave
//!   every branch's memory as it was, and the next fork shares through a new template;
//! - after MADV_DONTNEED, after MADV_FREE of a page it wrote (once reclaimed), after
//!   munmap and mmap again, the memory reads as zeros (MADV_FREE of a page still shared
//!   succeeds and leaves its own bytes, as after any fork()); glibc's calloc in a
//!   non-main arena after a trim returns zeros;
//! - fork() inside a branch copies on write as anywhere;
//! - a branch checkpointed and forked three levels deep keeps each level's memory, and
//!   the third level's archive imports and forks on a second daemon.

#![forbid(unsafe_code)]

mod common;

use common::*;

/// The memory holder. Commands, one per connection on /run/mem.sock, answered with one
/// line: `digest`, `write N` (page N..N+16 overwritten), `dontneed P`, `free P` (page P
/// written, then it and P+1 given MADV_FREE and MADV_PAGEOUT, which reclaims what it
/// can), `remap` (munmap and mmap of a patterned area:
/// zeros?), `calloc` (a trimmed non-main arena's calloc: zeros?), `fork` (a child writes:
/// the parent's memory unchanged?), `shared` (kB of its private mappings' pages shared
/// with another process, from smaps).
const HOLDER: &str = r#"
import ctypes, hashlib, mmap, os, queue, socket, threading

libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.calloc.restype = ctypes.c_void_p
libc.calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
PAGE, SIZE = 4096, 64 << 20
PROT_RW, MAP_PRIVATE, MAP_ANON, MAP_FIXED = 3, 0x02, 0x20, 0x10
MADV_DONTNEED, MADV_FREE, MADV_PAGEOUT = 4, 8, 21

A = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for p in range(SIZE // PAGE):
    A[p * PAGE:(p + 1) * PAGE] = (p.to_bytes(8, "little") + b"\xa5" * 8) * (PAGE // 16)
base = ctypes.addressof(ctypes.c_char.from_buffer(A))
B_LEN = 16 * PAGE
B = libc.mmap(None, B_LEN, PROT_RW, MAP_PRIVATE | MAP_ANON, -1, 0)
ctypes.memset(B, 0x5a, B_LEN)

# A thread whose arena (not the main one) holds 24 MiB of 0xab, freed and calloc'd on
# request; allocations stay in the arena (mmap threshold raised).
libc.mallopt(-3, 32 << 20)   # M_MMAP_THRESHOLD
libc.mallopt(-1, 128 << 10)  # M_TRIM_THRESHOLD
jobs, done = queue.Queue(), queue.Queue()
def arena():
    blocks = [libc.malloc(1 << 20) for _ in range(24)]
    for b in blocks:
        ctypes.memset(b, 0xab, 1 << 20)
    done.put("ready")
    while True:
        jobs.get()
        for b in blocks:
            libc.free(b)
        libc.malloc_trim(0)
        fresh = [libc.calloc(1, 1 << 20) for _ in range(24)]
        zero = all(ctypes.string_at(b, 1 << 20) == bytes(1 << 20) for b in fresh)
        for b in fresh:
            libc.free(b)
        blocks = []
        done.put("zeros" if zero else "DIRTY")
threading.Thread(target=arena, daemon=True).start()
done.get()

def zeros(addr, n):
    return ctypes.string_at(addr, n) == bytes(n)

def handle(cmd):
    w = cmd.split()
    if w[0] == "digest":
        return hashlib.sha256(A).hexdigest()
    if w[0] == "write":
        n = int(w[1])
        for p in range(n, n + 16):
            A[p * PAGE:(p + 1) * PAGE] = ((b"branch-%d " % n) * PAGE)[:PAGE]
        return "ok"
    if w[0] == "dontneed":
        p = int(w[1])
        if A[p * PAGE:(p + 1) * PAGE] == bytes(PAGE):
            return "already zero"
        libc.madvise(base + p * PAGE, PAGE, MADV_DONTNEED)
        return "zeros" if zeros(base + p * PAGE, PAGE) else "DIRTY"
    if w[0] == "free":
        # A page of its own (written), lazily freed and then reclaimed: zeros. One still
        # shared (as after any fork()) may keep its bytes: they are its own, or zeros.
        p = int(w[1])
        before = A[(p + 1) * PAGE:(p + 2) * PAGE]
        A[p * PAGE:(p + 1) * PAGE] = b"x" * PAGE
        if libc.madvise(base + p * PAGE, 2 * PAGE, MADV_FREE) != 0:
            return "MADV_FREE failed: errno %d" % ctypes.get_errno()
        libc.madvise(base + p * PAGE, 2 * PAGE, MADV_PAGEOUT)
        after = A[(p + 1) * PAGE:(p + 2) * PAGE]
        if not zeros(base + p * PAGE, PAGE):
            return "DIRTY"
        return "zeros" if after in (before, bytes(PAGE)) else "SHARED PAGE CHANGED"
    if w[0] == "remap":
        if zeros(B, B_LEN):
            return "already zero"
        libc.munmap(B, B_LEN)
        if libc.mmap(B, B_LEN, PROT_RW, MAP_PRIVATE | MAP_ANON | MAP_FIXED, -1, 0) != B:
            return "mmap failed"
        return "zeros" if zeros(B, B_LEN) else "DIRTY"
    if w[0] == "calloc":
        jobs.put(1)
        return done.get()
    if w[0] == "fork":
        before = hashlib.sha256(A).hexdigest()
        r, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            A[0:PAGE] = b"c" * PAGE
            os.write(wr, hashlib.sha256(A).hexdigest().encode())
            os._exit(0)
        os.waitpid(pid, 0)
        child = os.read(r, 64).decode()
        os.close(r); os.close(wr)
        return "ok" if child != before and hashlib.sha256(A).hexdigest() == before else "BROKEN"
    if w[0] == "shared":
        kb = 0
        for line in open("/proc/self/smaps"):
            if line.startswith("Shared_Dirty:"):
                kb += int(line.split()[1])
        return str(kb)
    return "unknown command"

s = socket.socket(socket.AF_UNIX)
s.bind("/run/mem.sock")
s.listen(8)
open("/run/mem.ready", "w").write("ok")
while True:
    c, _ = s.accept()
    cmd = c.makefile().readline()
    try:
        answer = handle(cmd)
    except Exception as e:
        answer = "error: %r" % e
    c.sendall((answer + "\n").encode())
    c.close()
"#;

/// The daemon's restore templates: its children running `criu ... template`.
fn templates_of(daemon: u32) -> Vec<i32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(daemon) && cmdline.split(|b| *b == 0).any(|w| w == b"template") {
            found.push(pid);
        }
    }
    found
}

/// Asks the holder in sandbox `id`.
fn ask(d: &TestDaemon, id: &str, cmd: &str) -> String {
    let line = format!(
        "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"/run/mem.sock\"); \
         s.sendall(b\"{cmd}\\n\"); print(s.makefile().readline().strip())'"
    );
    let (code, out, err) = d.sh(id, &line);
    assert_eq!(code, 0, "{cmd} in {id}: {err}");
    out.trim().to_string()
}

#[test]
fn branches_share_a_checkpoints_memory_with_private_anonymous_semantics() {
    let name = "branches_share_a_checkpoints_memory_with_private_anonymous_semantics";
    if !can_run_criu(name) {
        return;
    }
    let Some(debian) = fixture(name, "images/debian.tar.zst", "debian") else {
        return;
    };
    let d = TestDaemon::start("cow");
    d.import(&debian, "debian");
    let src = d.create(
        serde_json::json!({ "image": "debian", "command": { "argv": ["sleep", "infinity"] } }),
    );
    d.put_file(&src.id, "/root/holder.py", HOLDER.as_bytes());
    let _ = d
        .exec(
            &src.id,
            serde_json::json!({ "argv": ["python3", "/root/holder.py"], "detach": true }),
        )
        .expect("start the holder");
    d.wait_for(&src.id, "cat /run/mem.ready", "ok");
    let original = ask(&d, &src.id, "digest");
    let c1 = d.checkpoint(&src.id, true);

    // Eight branches: each starts with the checkpoint's pages, shared, and writes alone.
    let branches: Vec<String> = d
        .fork(&c1.id, 8, false)
        .branches
        .into_iter()
        .map(|b| b.id)
        .collect();
    let shared: u64 = ask(&d, &branches[0], "shared").parse().unwrap();
    assert!(
        shared >= 60 << 10,
        "a fresh branch shares the checkpoint's 64 MiB: {shared} kB shared"
    );
    let mut digests = std::collections::BTreeSet::new();
    let mut own = Vec::new();
    for (i, b) in branches.iter().enumerate() {
        assert_eq!(
            ask(&d, b, "digest"),
            original,
            "branch {i} starts as the checkpoint"
        );
        assert_eq!(ask(&d, b, &format!("write {}", 100 * (i + 1))), "ok");
        own.push(ask(&d, b, "digest"));
        digests.insert(own[i].clone());
    }
    assert_eq!(digests.len(), 8, "each branch's writes are its own");
    assert!(!digests.contains(&original));
    assert_eq!(
        ask(&d, &src.id, "digest"),
        original,
        "the source is untouched"
    );
    for (i, b) in branches.iter().enumerate() {
        assert!(
            !ask(&d, b, "digest").is_empty() && digests.contains(&ask(&d, b, "digest")),
            "branch {i} kept its own writes"
        );
    }

    // gc with the branches alive, then their template ended (killed): their memory is
    // theirs, and the next fork starts another template.
    let _: serde_json::Value = d
        .client
        .call("POST", "/v1/gc", Some(&serde_json::json!({})))
        .expect("gc");
    let templates = templates_of(d.pid().unwrap());
    assert_eq!(
        templates.len(),
        1,
        "one template for the checkpoint: {templates:?}"
    );
    for pid in &templates {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    }
    for (i, b) in branches.iter().enumerate() {
        assert_eq!(
            ask(&d, b, "digest"),
            own[i],
            "branch {i} after gc and its template's end"
        );
    }
    // A fork of one branch that finds no template reads its pages while a new template
    // starts beside it; the next one shares through that template.
    let read = d.fork(&c1.id, 1, false).branches[0].id.clone();
    assert_eq!(ask(&d, &read, "digest"), original);
    let health = |d: &TestDaemon| -> forkd::api::Health {
        d.client.call("GET", "/v1/health", None).unwrap()
    };
    assert!(
        wait_until(std::time::Duration::from_secs(60), || health(&d)
            .templates
            .detail
            .starts_with("1 held")),
        "a new template starts: {:?}",
        health(&d).templates
    );
    let again = d.fork(&c1.id, 1, false).branches[0].id.clone();
    assert_eq!(ask(&d, &again, "digest"), original);
    let shared: u64 = ask(&d, &again, "shared").parse().unwrap();
    assert!(
        shared >= 60 << 10,
        "a new template shares again: {shared} kB"
    );
    assert_eq!(templates_of(d.pid().unwrap()).len(), 1);
    d.remove(&again);
    d.remove(&read);
    // The daemon says so; the killed template's log is kept apart from its successor's.
    assert!(health(&d).templates.ok);
    let logs = d.data().join("logs");
    for log in [
        format!("template-{}.log", c1.id),
        format!("template-{}.ended.log", c1.id),
    ] {
        assert!(logs.join(&log).is_file(), "{log} in {}", logs.display());
    }

    // Discards read back as zeros, not as the checkpoint's bytes.
    let b = &branches[1];
    assert_eq!(ask(&d, b, "dontneed 7"), "zeros");
    assert_eq!(ask(&d, b, "free 9"), "zeros");
    assert_eq!(ask(&d, b, "remap"), "zeros");
    assert_eq!(ask(&d, b, "calloc"), "zeros");
    assert_eq!(ask(&d, b, "fork"), "ok");
    // ... and in the other branches, the pages are still the checkpoint's.
    assert_ne!(ask(&d, &branches[2], "dontneed 7"), "already zero");

    // Three levels: a branch checkpointed and forked, twice more.
    let mut level = branches[3].clone();
    let mut last = None;
    for n in 2..=3 {
        let want = ask(&d, &level, "digest");
        let c = d.checkpoint(&level, true);
        // Two branches: a request for more than one waits for the template.
        let two = d.fork(&c.id, 2, false).branches;
        let next = two[0].id.clone();
        for b in &two {
            assert_eq!(
                ask(&d, &b.id, "digest"),
                want,
                "level {n} starts as level {}",
                n - 1
            );
        }
        let shared: u64 = ask(&d, &two[1].id, "shared").parse().unwrap();
        assert!(
            shared >= 60 << 10,
            "level {n} shares its template: {shared} kB"
        );
        d.remove(&two[1].id);
        assert_eq!(ask(&d, &next, "write 1000"), "ok");
        assert_eq!(ask(&d, &next, &format!("dontneed {}", 2000 + n)), "zeros");
        level = next;
        last = Some(c);
    }
    let want = ask(&d, &level, "digest");
    let c3 = d.checkpoint(&level, true);
    let archive = d.root.parent().unwrap().join("level3.forkd");
    let out = d.cli(&["checkpoint", "export", &c3.id, archive.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(last);

    // The level-3 archive is whole: another daemon imports and forks it.
    let d2 = TestDaemon::start("cow-import");
    let imported: forkd::api::CheckpointInfo = d2
        .client
        .call(
            "POST",
            "/v1/checkpoints/import",
            Some(&serde_json::json!({ "path": archive })),
        )
        .expect("import");
    let b2 = d2.fork(&imported.id, 2, false).branches;
    for b in &b2 {
        assert_eq!(ask(&d2, &b.id, "digest"), want, "the imported level 3");
    }
    assert_eq!(ask(&d2, &b2[0].id, "write 3000"), "ok");
    assert_eq!(
        ask(&d2, &b2[1].id, "digest"),
        want,
        "its branches are apart too"
    );
    // Removing the checkpoint stops its template and removes its log.
    let log = d2.data().join(format!("logs/template-{}.log", imported.id));
    assert!(log.is_file(), "{}", log.display());
    let daemon2 = d2.pid().unwrap();
    assert_eq!(templates_of(daemon2).len(), 1);
    for b in &b2 {
        d2.remove(&b.id);
    }
    let _: serde_json::Value = d2
        .client
        .call("DELETE", &format!("/v1/checkpoints/{}", imported.id), None)
        .expect("remove the imported checkpoint");
    assert!(!log.exists(), "{} is left", log.display());
    assert!(
        wait_until(std::time::Duration::from_secs(5), || templates_of(daemon2)
            .is_empty()),
        "the template of a removed checkpoint stops"
    );
}
