//! The cgroup pool against the machine's real cgroup hierarchy (root only): a cgroup
//! given back is renamed for the next sandbox with that sandbox's limits; one that ran
//! into a limit, or one over the pool's capacity, is removed.

use forkd_cgroups::{Cgroup, Hierarchy, Limits, Pool};
use forkd_testing::skip;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

/// The hierarchy, or why the test cannot run.
fn v1() -> Result<Hierarchy, &'static str> {
    if std::fs::metadata("/proc/self").map(|m| m.uid()).ok() != Some(0) {
        return Err("needs root");
    }
    match Hierarchy::detect() {
        Ok(h @ Hierarchy::V1 { .. }) => Ok(h),
        Ok(Hierarchy::V2 { .. }) => Err("cgroup v2 renames nothing: the pool keeps nothing there"),
        Err(_) => Err("no usable cgroup hierarchy"),
    }
}

/// A parent of the test's own, removed (with what is left in it) when dropped.
struct Parent {
    h: Hierarchy,
    name: String,
}

impl Parent {
    fn new(h: &Hierarchy, tag: &str) -> Parent {
        Parent {
            h: h.clone(),
            name: format!("forkd-test-pool-{tag}-{}", std::process::id()),
        }
    }
    fn child(&self, name: &str) -> String {
        format!("{}/{name}", self.name)
    }
    /// The names of its sub-cgroups in the memory hierarchy.
    fn children(&self) -> Vec<String> {
        self.children_in("memory")
    }
    fn children_in(&self, controller: &str) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(self.dir(controller))
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        out.sort();
        out
    }
    fn dir(&self, controller: &str) -> PathBuf {
        match &self.h {
            Hierarchy::V1 { root, .. } => root.join(controller).join(&self.name),
            Hierarchy::V2 { root, .. } => root.join(&self.name),
        }
    }
}

impl Drop for Parent {
    fn drop(&mut self) {
        // A cgroup sharing memory has no directory of its own in the memory hierarchy.
        let mut all = self.children();
        all.extend(self.children_in("pids"));
        all.sort();
        all.dedup();
        for c in all {
            let cg = Cgroup::new(&self.h, &self.child(&c));
            let _ = cg.kill_all(Duration::from_secs(5));
            let _ = cg.remove();
        }
        let _ = Cgroup::new(&self.h, &self.name).remove();
    }
}

fn read(cg: &Cgroup, controller: &str, file: &str) -> String {
    let Hierarchy::V1 { root, .. } = cg.hierarchy() else {
        unreachable!()
    };
    std::fs::read_to_string(root.join(controller).join(cg.name()).join(file))
        .unwrap()
        .trim()
        .to_string()
}

/// Runs `sh -c script` inside `cg` and waits for it.
fn run_in(cg: &Cgroup, script: &str) -> Child {
    // The shell waits on stdin until it is in the cgroup.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("read go; {script}"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    cg.add_pid(child.id() as i32).unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    child
}

#[test]
fn a_cgroup_given_back_serves_the_next_sandbox_with_its_limits() {
    let name = "a_cgroup_given_back_serves_the_next_sandbox_with_its_limits";
    let h = match v1() {
        Ok(h) => h,
        Err(why) => return skip(name, why),
    };
    let parent = Parent::new(&h, "reuse");
    let pool = Pool::new(&h, &parent.name, "t1", 4);
    assert_eq!(pool.capacity(), 4);
    let first = Limits {
        memory_bytes: Some(64 << 20),
        pids: Some(50),
        cpu_millis: Some(500),
    };
    let a = pool.take(&parent.child("a"), None, &first).unwrap();
    assert!(a.exists());
    assert_eq!(
        read(&a, "memory", "memory.limit_in_bytes"),
        (64u64 << 20).to_string()
    );
    // Something ran in it and charged memory (a 12 MiB buffer), then ended.
    let mut p = run_in(
        &a,
        "dd if=/dev/zero of=/dev/null bs=12M count=1 2>/dev/null",
    );
    assert!(p.wait().unwrap().success());
    a.kill_all(Duration::from_secs(5)).unwrap();
    let peak: u64 = read(&a, "memory", "memory.max_usage_in_bytes")
        .parse()
        .unwrap();
    assert!(peak >= 12 << 20, "peak {peak}");

    pool.give_back(&a).unwrap();
    assert!(!a.exists(), "the sandbox's name is gone");
    assert_eq!(pool.len(), 1);
    let kept = parent.children();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].starts_with("free-"), "{kept:?}");

    // The next sandbox gets that cgroup under its own name, with its own limits: a
    // limit it does not set is unlimited again, the peak is cleared.
    let second = Limits {
        memory_bytes: None,
        pids: Some(7),
        cpu_millis: None,
    };
    let b = pool.take(&parent.child("b"), None, &second).unwrap();
    assert_eq!(pool.len(), 0);
    assert_eq!(
        parent.children(),
        vec!["b".to_string()],
        "renamed, not made"
    );
    let unlimited = read(&b, "memory", "memory.limit_in_bytes");
    assert!(unlimited.parse::<u64>().unwrap() > 1 << 50, "{unlimited}");
    let peak: u64 = read(&b, "memory", "memory.max_usage_in_bytes")
        .parse()
        .unwrap();
    assert!(
        peak <= forkd_cgroups::pool::KEEP_BYTES,
        "peak {peak} kept from the first sandbox"
    );
    assert_eq!(read(&b, "pids", "pids.max"), "7");
    if let Hierarchy::V1 { controllers, .. } = &h {
        if controllers.iter().any(|c| c == "cpu") {
            assert_eq!(read(&b, "cpu", "cpu.cfs_quota_us"), "-1");
        }
    }
    // And it works as a cgroup: a process runs in it.
    let mut p = run_in(&b, "exit 3");
    assert_eq!(p.wait().unwrap().code(), Some(3));
    b.kill_all(Duration::from_secs(5)).unwrap();

    // With the pool empty, a take makes a new one.
    let c = pool
        .take(&parent.child("c"), None, &Limits::default())
        .unwrap();
    assert!(c.exists());
    assert_eq!(parent.children(), vec!["b".to_string(), "c".to_string()]);
}

#[test]
fn a_cgroup_that_hit_a_limit_or_finds_the_pool_full_is_removed() {
    let name = "a_cgroup_that_hit_a_limit_or_finds_the_pool_full_is_removed";
    let h = match v1() {
        Ok(h) => h,
        Err(why) => return skip(name, why),
    };
    let parent = Parent::new(&h, "limits");
    let pool = Pool::new(&h, &parent.name, "t1", 1);

    // The kernel's OOM killer ended a process in it: its counter would follow the
    // cgroup to the next sandbox, so it goes.
    let oom = pool
        .take(
            &parent.child("oom"),
            None,
            &Limits {
                memory_bytes: Some(16 << 20),
                ..Limits::default()
            },
        )
        .unwrap();
    // `tail` keeps a line it never finishes: it grows until it is killed.
    let mut p = run_in(&oom, "exec tail /dev/zero");
    assert!(!p.wait().unwrap().success());
    assert!(oom.oom_kills().unwrap() > 0, "the OOM killer did not fire");
    oom.kill_all(Duration::from_secs(5)).unwrap();
    pool.give_back(&oom).unwrap();
    assert!(!oom.exists());
    assert_eq!(pool.len(), 0);
    assert!(parent.children().is_empty(), "{:?}", parent.children());

    // A fork was refused at its task limit.
    let pids = pool
        .take(
            &parent.child("pids"),
            None,
            &Limits {
                pids: Some(1),
                ..Limits::default()
            },
        )
        .unwrap();
    let mut p = run_in(&pids, "/bin/true");
    let _ = p.wait();
    assert!(pids.pids_refusals() > 0, "no fork was refused");
    pids.kill_all(Duration::from_secs(5)).unwrap();
    pool.give_back(&pids).unwrap();
    assert!(parent.children().is_empty(), "{:?}", parent.children());

    // Two clean ones, room for one.
    let x = pool
        .take(&parent.child("x"), None, &Limits::default())
        .unwrap();
    let y = pool
        .take(&parent.child("y"), None, &Limits::default())
        .unwrap();
    pool.give_back(&x).unwrap();
    pool.give_back(&y).unwrap();
    assert_eq!(pool.len(), 1);
    let left = parent.children();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].starts_with("free-"));

    // Another owner's sweep leaves them alone; the start of the next owner with the
    // same tag removes them.
    let other = Pool::new(&h, &parent.name, "t2", 1);
    assert_eq!(other.sweep(), 0);
    assert_eq!(parent.children(), left);
    let next = Pool::new(&h, &parent.name, "t1", 1);
    assert_eq!(next.sweep(), 1);
    assert!(parent.children().is_empty());
    // The first pool's free cgroup is gone under it: its next take makes one.
    let z = pool
        .take(&parent.child("z"), None, &Limits::default())
        .unwrap();
    assert!(z.exists());
    assert_eq!(parent.children(), vec!["z".to_string()]);
}

#[test]
fn a_limit_below_what_a_kept_cgroup_charges_is_still_set() {
    let name = "a_limit_below_what_a_kept_cgroup_charges_is_still_set";
    let h = match v1() {
        Ok(h) => h,
        Err(why) => return skip(name, why),
    };
    let parent = Parent::new(&h, "below");
    let pool = Pool::new(&h, &parent.name, "t1", 4);
    let a = pool
        .take(&parent.child("a"), None, &Limits::default())
        .unwrap();
    // 6 MiB of a file's pages, cached and charged to the cgroup after its process ends.
    let file = std::env::temp_dir().join(format!("forkd-pool-below-{}", std::process::id()));
    let mut p = run_in(
        &a,
        &format!(
            "dd if=/dev/zero of={} bs=1M count=6 2>/dev/null",
            file.display()
        ),
    );
    assert!(p.wait().unwrap().success());
    a.kill_all(Duration::from_secs(5)).unwrap();
    let charged = a.memory_current().unwrap();
    assert!(charged >= 6 << 20, "charged {charged}");
    pool.give_back(&a).unwrap();
    assert_eq!(
        pool.len(),
        1,
        "a cgroup charging {charged} bytes was not kept"
    );

    // The next sandbox asks for 2 MiB: it gets them, from the kept cgroup once the
    // kernel reclaimed the cached pages, or from a new one.
    let b = pool
        .take(
            &parent.child("b"),
            None,
            &Limits {
                memory_bytes: Some(2 << 20),
                ..Limits::default()
            },
        )
        .unwrap();
    assert_eq!(
        read(&b, "memory", "memory.limit_in_bytes"),
        (2u64 << 20).to_string()
    );
    assert!(b.memory_current().unwrap() <= 2 << 20);
    assert_eq!(pool.len(), 0);
    assert_eq!(parent.children(), vec!["b".to_string()]);
    let mut p = run_in(&b, "exit 0");
    assert!(p.wait().unwrap().success());
    let _ = std::fs::remove_file(&file);
}

/// Whether `child` of `parent` has a memory cgroup of its own.
fn memcg_exists(parent: &Parent, child: &str) -> bool {
    parent.dir("memory").join(child).exists()
}

/// The line of `/proc/<pid>/cgroup` for `controller`: the cgroup's path.
fn cgroup_of(pid: u32, controller: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            ctrls
                .split(',')
                .any(|c| c == controller)
                .then(|| path.to_string())
        })
        .unwrap()
}

#[test]
fn sandboxes_without_a_memory_limit_share_one_memory_cgroup() {
    let name = "sandboxes_without_a_memory_limit_share_one_memory_cgroup";
    let h = match v1() {
        Ok(h) => h,
        Err(why) => return skip(name, why),
    };
    let parent = Parent::new(&h, "shared");
    let pool = Pool::new(&h, &parent.name, "t1", 4).sharing_memory();
    let limited = Limits {
        memory_bytes: Some(64 << 20),
        ..Limits::default()
    };
    assert_eq!(pool.shared_memory_for(&limited), None);
    let shared = pool.shared_memory_for(&Limits::default()).unwrap();
    assert_eq!(shared, parent.child("shared-t1"));
    let unlimited = Limits {
        pids: Some(20),
        ..Limits::default()
    };
    let a = pool
        .take(&parent.child("a"), Some(&shared), &unlimited)
        .unwrap();
    let b = pool
        .take(&parent.child("b"), Some(&shared), &unlimited)
        .unwrap();
    let c = pool.take(&parent.child("c"), None, &limited).unwrap();
    assert_eq!(a.shared_memory(), Some(shared.as_str()));
    assert_eq!(c.shared_memory(), None);

    let mut procs: Vec<Child> = [&a, &b, &c]
        .iter()
        .map(|cg| run_in(cg, "sleep 60"))
        .collect();
    for (p, cg) in procs.iter().zip([&a, &b]) {
        assert_eq!(cgroup_of(p.id(), "memory"), format!("/{shared}"));
        assert_eq!(cgroup_of(p.id(), "pids"), format!("/{}", cg.name()));
    }
    assert_eq!(cgroup_of(procs[2].id(), "memory"), format!("/{}", c.name()));
    assert_eq!(read(&a, "pids", "pids.max"), "20");
    assert_eq!(
        read(&c, "memory", "memory.limit_in_bytes"),
        (64u64 << 20).to_string()
    );
    // What the shared cgroup charges or suffers is no single sandbox's.
    assert_eq!(a.memory_current(), None);
    assert_eq!(a.oom_kills(), None);
    // What it has not written yet is bounded by what all of them have not.
    assert!(a.unwritten_bytes().is_some());
    assert!(c.memory_current().is_some());
    assert_eq!(c.oom_kills(), Some(0));
    // A restore lands the tree in the shared memory cgroup and its own others.
    let roots = a.roots();
    assert!(
        roots.contains(&("memory".into(), format!("/{shared}"))),
        "{roots:?}"
    );
    assert!(
        roots.contains(&("pids".into(), format!("/{}", a.name()))),
        "{roots:?}"
    );
    // The other sandboxes' limit is not one sandbox's to set.
    let e = a.set_limits(&limited).unwrap_err();
    let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(
        chain.contains("is shared") && chain.contains(&shared),
        "{chain}"
    );
    assert_eq!(
        std::fs::read_to_string(parent.dir("memory").join("shared-t1/memory.limit_in_bytes"))
            .unwrap()
            .trim(),
        read(
            &Cgroup::new(&h, &parent.name),
            "memory",
            "memory.limit_in_bytes"
        )
    );

    // Ending one leaves the shared cgroup to the other, and its own directories are
    // kept for the next sandbox that shares it, not for one with a memory limit.
    a.kill_all(Duration::from_secs(5)).unwrap();
    let pids_ino = |cg: &Cgroup| {
        std::fs::metadata(
            parent
                .dir("pids")
                .join(cg.name().rsplit('/').next().unwrap()),
        )
        .unwrap()
        .ino()
    };
    let ino = pids_ino(&a);
    pool.give_back(&a).unwrap();
    assert!(!a.exists());
    assert_eq!(pool.len(), 1);
    assert!(b.exists());
    assert!(parent.children().contains(&"shared-t1".to_string()));
    let own = pool.take(&parent.child("own"), None, &limited).unwrap();
    assert_eq!(
        pool.len(),
        1,
        "a sharing cgroup served one with a memory limit"
    );
    assert_eq!(
        read(&own, "memory", "memory.limit_in_bytes"),
        (64u64 << 20).to_string()
    );
    own.remove().unwrap();
    let d = pool
        .take(&parent.child("d"), Some(&shared), &Limits::default())
        .unwrap();
    assert_eq!(pool.len(), 0);
    assert_eq!(pids_ino(&d), ino, "the free cgroup was not reused");
    assert_eq!(read(&d, "pids", "pids.max"), "max", "a's limit stayed");
    assert!(!memcg_exists(&parent, "d"));
    d.remove().unwrap();
    // A sweep leaves a shared cgroup with processes in it, and removes it once empty.
    pool.sweep();
    assert!(parent.children().contains(&"shared-t1".to_string()));
    for cg in [&b, &c] {
        cg.kill_all(Duration::from_secs(5)).unwrap();
        pool.give_back(cg).unwrap();
    }
    for p in &mut procs {
        let _ = p.wait();
    }
    pool.sweep();
    assert_eq!(
        parent.children(),
        Vec::<String>::new(),
        "c was kept by the pool?"
    );
}
