//! Sharded evaluator runs on a real Slurm cluster on this machine (Debian's slurmctld and
//! three slurmd, fixtures/slurm/cluster.sh): the merged results equal a one-node run's,
//! a tampered start-state archive is refused and rebuilt, and a run survives a cancelled
//! array task and a lost node.
#![forbid(unsafe_code)]

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

struct Cluster {
    dir: PathBuf,
    base: PathBuf,
}

impl Cluster {
    fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/slurm/cluster.sh")
    }

    fn start(base: &Path) -> Cluster {
        let dir = base.join("cluster");
        let out = Command::new(Self::script())
            .args(["start", dir.to_str().unwrap(), "3"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cluster start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Cluster {
            dir,
            base: base.to_path_buf(),
        }
    }

    fn conf(&self) -> PathBuf {
        self.dir.join("slurm.conf")
    }

    fn cmd(&self, prog: &str, args: &[&str]) -> String {
        let out = Command::new(prog)
            .args(args)
            .env("SLURM_CONF", self.conf())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The daemons the shards started, one per node root under the test's directory.
    fn node_daemons(&self) -> Vec<i32> {
        let want = format!("FORKD_ROOT={}", self.base.join("nodes").display());
        let mut pids = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
            if env
                .split(|b| *b == 0)
                .any(|v| String::from_utf8_lossy(v).starts_with(&want))
            {
                pids.push(pid);
            }
        }
        pids
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(Self::script())
            .args(["stop", self.dir.to_str().unwrap()])
            .status();
        let nodes = self.base.join("nodes");
        let entries: Vec<PathBuf> = std::fs::read_dir(&nodes)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        // Sandboxes the node daemons still hold (trials cut short by the faults): removed
        // through their daemons, as any test's are.
        for sock in entries
            .iter()
            .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        {
            let client = forkd::client::Client::new(sock);
            if let Ok(list) =
                client.call::<Vec<forkd::api::SandboxInfo>>("GET", "/v1/sandboxes", None)
            {
                for sb in list {
                    let _ = client.call::<serde_json::Value>(
                        "DELETE",
                        &format!("/v1/sandboxes/{}?force=true", sb.id),
                        None,
                    );
                }
            }
        }
        for pid in self.node_daemons() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        wait_until(Duration::from_secs(30), || self.node_daemons().is_empty());
        // A daemon killed with its node (the lost-node fault) leaves its sandboxes running
        // and its volume mounted: kill what is left in those sandboxes' cgroups, then
        // detach the mounts, deepest first, so that nothing outlives the test.
        for root in entries.iter().filter(|p| p.is_dir()) {
            let ids: Vec<String> = std::fs::read_dir(root.join("vol/sandboxes"))
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            for id in ids {
                kill_cgroup(&id);
            }
        }
        let mut left = mounts_under(&self.base.join("nodes"));
        left.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in left {
            let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

fn forkd(c: &Cluster, socket: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("FORKD_SOCKET", socket)
        .env("SLURM_CONF", c.conf())
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: exit {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

/// trial id -> (outcome, per-test results)
fn rows(run: &Path) -> std::collections::BTreeMap<String, (String, serde_json::Value)> {
    let text = std::fs::read_to_string(run.join("results.jsonl")).unwrap();
    let mut m = std::collections::BTreeMap::new();
    for l in text.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let id = v["trial_id"].as_str().unwrap().to_string();
        assert!(
            m.insert(
                id.clone(),
                (
                    v["outcome"].as_str().unwrap().to_string(),
                    v["tests"].clone()
                )
            )
            .is_none(),
            "trial {id} counted twice in {}",
            run.display()
        );
    }
    m
}

fn events(dir: &Path, event: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("decisions.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == event)
        .collect()
}

/// Runs `suite` (agents oracle and noop, `conditions`) on the test's daemon and then over
/// the three Slurm nodes; asserts that the merged rows equal the one-node run's (trial
/// for trial: outcome and per-test results), that the fingerprints agree and that every
/// trial is linked into the run. Returns the sharded run's directory.
fn same_on_one_node_and_sharded(
    c: &Cluster,
    d: &TestDaemon,
    label: &str,
    suite: &Path,
    conditions: &str,
    nodes: &str,
) -> PathBuf {
    let run = |out: &Path, extra: &[&str]| {
        let mut a = vec![
            "eval",
            "run",
            suite.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--conditions",
            conditions,
            "--agents",
            "oracle,noop",
        ];
        a.extend(extra);
        ok(&forkd(c, &d.socket, &a, &[]), label);
    };
    let reference = c.base.join(format!("{label}-one-node"));
    run(&reference, &[]);
    let sharded = c.base.join(format!("{label}-sharded"));
    run(&sharded, &["--slurm", "--node-root", nodes]);
    let (want, got) = (rows(&reference), rows(&sharded));
    assert!(!want.is_empty());
    assert_eq!(
        got, want,
        "{label}: sharded results equal the one-node run's"
    );
    assert_eq!(events(&sharded, "finish").len(), 1);
    for id in want.keys() {
        assert!(
            sharded
                .join("trials")
                .join(id)
                .join("attempts.jsonl")
                .exists(),
            "{label}: trial {id} linked into the run"
        );
    }
    let fp = |p: &Path| {
        serde_json::from_slice::<serde_json::Value>(
            &std::fs::read(p.join("manifest.json")).unwrap(),
        )
        .unwrap()["fingerprint"]
            .clone()
    };
    assert_eq!(
        fp(&sharded),
        fp(&reference),
        "{label}: one configuration, one fingerprint"
    );
    sharded
}

fn mini() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/suites/mini")
}

#[test]
fn sharded_runs_over_slurm_equal_one_node_and_survive_faults() {
    let name = "sharded_runs_over_slurm_equal_one_node_and_survive_faults";
    if !can_run_criu(name)
        || !require(
            name,
            Path::new("/usr/sbin/slurmctld").exists() && Path::new("/usr/bin/sbatch").exists(),
            "Slurm is not installed (fixtures/setup.sh slurm)",
        )
    {
        return;
    }
    let d = TestDaemon::start("slurm");
    let base = d.root.parent().unwrap().to_path_buf();
    let c = Cluster::start(&base);
    let nodes = format!("{}/nodes/%n", base.display());
    let suite = mini();
    let common_args = |out: &Path| -> Vec<String> {
        [
            "eval",
            "run",
            suite.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--conditions",
            "clean,residual",
        ]
        .map(String::from)
        .to_vec()
    };

    // 1. The same run on one node and over three Slurm nodes: equal row for row, for
    // both suites (the mini suite with its residual states; the bundled Debian suite).
    let sharded = same_on_one_node_and_sharded(&c, &d, "mini", &suite, "clean,residual", &nodes);
    assert_eq!(rows(&sharded).len(), 10, "the mini suite's matrix");
    if let Some(task) = fixture(name, "suite/mi-windowed-step", "suite") {
        let bundled = task.parent().unwrap().to_path_buf();
        let b = same_on_one_node_and_sharded(&c, &d, "bundled", &bundled, "clean", &nodes);
        let n_tasks = std::fs::read_dir(&bundled)
            .unwrap()
            .flatten()
            .filter(|e| e.path().join("task.toml").exists())
            .count();
        assert_eq!(rows(&b).len(), 2 * n_tasks, "the bundled suite's matrix");
    }

    // A sharded run cannot stop for human review: refused before anything is written.
    let refused_dir = base.join("review");
    let mut a = common_args(&refused_dir);
    a.extend(["--agents", "noop", "--reviewers", "1", "--slurm"].map(String::from));
    let args: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = forkd(&c, &d.socket, &args, &[]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot stop for human review"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!refused_dir.join("shards").exists(), "nothing planned");

    for state in ["add/clean", "add/add.partial", "counter/clean"] {
        let rec = sharded.join("archives").join(format!("{state}.json"));
        assert!(rec.exists(), "{} exported", rec.display());
    }

    // The same shards as a Kubernetes Indexed Job (generated only: no cluster here).
    let kube = base.join("kube");
    let file = base.join("job.json");
    let mut a = common_args(&kube);
    a.extend(["--agents", "oracle,noop", "--kube", file.to_str().unwrap()].map(String::from));
    let args: Vec<&str> = a.iter().map(String::as_str).collect();
    ok(&forkd(&c, &d.socket, &args, &[]), "kube manifest");
    let job: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(job["kind"], "Job");
    assert_eq!(job["spec"]["completionMode"], "Indexed");
    assert_eq!(job["spec"]["completions"], 2, "one pod per shard");
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["securityContext"]["privileged"], true);
    assert_eq!(pod["containers"][0]["command"][1], "eval");
    assert_eq!(pod["containers"][0]["command"][2], "shard");
    assert_eq!(pod["containers"][0]["command"][3], kube.to_str().unwrap());
    let mounts: Vec<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["hostPath"]["path"].as_str().unwrap())
        .collect();
    assert!(mounts.contains(&kube.to_str().unwrap()), "{mounts:?}");
    assert!(mounts.contains(&BIN), "{mounts:?}");
    assert!(kube.join("shards/plan.json").exists());

    // 2. A tampered archive is refused, and the state rebuilt and exported again: the
    // shard runs again on a node that holds none of its states.
    let archive = sharded.join("archives/counter/clean.forkd");
    let mut bytes = std::fs::read(&archive).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&archive, &bytes).unwrap();
    let before = std::fs::read(sharded.join("archives/counter/clean.json")).unwrap();
    ok(
        &forkd(
            &c,
            &d.socket,
            &["eval", "shard", sharded.to_str().unwrap(), "--index", "1"],
            &[("NODE_NAME", "n9")],
        ),
        "shard 1 on a fresh node",
    );
    let shard1 = sharded.join("shards/1");
    let refused = events(&shard1, "archive-refused");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["detail"]["state"], "clean");
    assert!(
        refused[0]["detail"]["reason"]
            .as_str()
            .unwrap()
            .contains("not the one exported"),
        "{refused:?}"
    );
    let after = std::fs::read(sharded.join("archives/counter/clean.json")).unwrap();
    assert_ne!(before, after, "exported again");
    let rec: serde_json::Value = serde_json::from_slice(&after).unwrap();
    let (sha, _) = forkd::eval::archives::file_sha256(&archive).unwrap();
    assert_eq!(rec["sha256"], sha.as_str());
    assert_eq!(rec["node"], "n9");
    assert!(std::fs::read_dir(sharded.join("archives/counter"))
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().contains(".refused-")));
    // The residual state came from its archive, verified: built by nobody again.
    assert!(events(&shard1, "states-forgotten").is_empty());
    // Both recorded with their cost: the clean state exported again, the residual one
    // imported (hash, the daemon's verification), by n9.
    let transfers: Vec<forkd::eval::archives::Transfer> =
        std::fs::read_to_string(shard1.join("transfers.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let on_n9: Vec<(&str, &str)> = transfers
        .iter()
        .filter(|t| t.node == "n9")
        .map(|t| (t.kind.as_str(), t.state.as_str()))
        .collect();
    assert!(on_n9.contains(&("export", "clean")), "{transfers:?}");
    assert!(
        on_n9.iter().any(|(k, s)| *k == "import" && *s != "clean"),
        "{transfers:?}"
    );
    assert!(transfers.iter().all(|t| t.bytes > 0), "{transfers:?}");
    let done: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shard1.join("done.json")).unwrap()).unwrap();
    assert_eq!(done["node"], "n9");
    assert!(done["finished_ms"].as_u64().unwrap() >= done["started_ms"].as_u64().unwrap());

    // 3. Faults: one array task cancelled, one node lost mid-run; `resume` finishes the
    // run and no trial is counted twice.
    let faulty = base.join("faulty");
    let mut a = common_args(&faulty);
    a.extend(
        [
            "--agents",
            "oracle,slow=sleep 2",
            "-k",
            "2",
            "--slurm",
            "--no-wait",
            "--node-root",
            &nodes,
        ]
        .map(String::from),
    );
    let args: Vec<&str> = a.iter().map(String::as_str).collect();
    ok(&forkd(&c, &d.socket, &args, &[]), "submit");
    let job = std::fs::read_to_string(faulty.join("slurm/jobs.jsonl")).unwrap();
    let job: serde_json::Value = serde_json::from_str(job.lines().next().unwrap()).unwrap();
    let job = job["job"].as_str().unwrap().to_string();
    let has_rows = |k: usize| {
        std::fs::read_to_string(faulty.join(format!("shards/{k}/results.jsonl")))
            .map(|t| t.lines().count())
            .unwrap_or(0)
            > 0
    };
    assert!(wait_until(Duration::from_secs(240), || has_rows(0) && has_rows(1)));
    // Cancel shard 0's array task.
    c.cmd("scancel", &[&format!("{job}_0")]);
    // Lose the node running shard 1: its slurmd and the job's processes die.
    let q = c.cmd("squeue", &["-h", "-r", "-j", &job, "-o", "%A|%K|%N"]);
    let line = q
        .lines()
        .find(|l| l.split('|').nth(1) == Some("1"))
        .unwrap_or_else(|| panic!("shard 1 not in the queue: {q}"));
    let f: Vec<&str> = line.split('|').collect();
    let (step_job, node) = (f[0].to_string(), f[2].trim().to_string());
    let pidfile = c.dir.join(format!("slurmd.{node}.pid"));
    let slurmd: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(slurmd),
        nix::sys::signal::Signal::SIGKILL,
    );
    let steps = processes_named(&format!("slurmstepd: [{step_job}."));
    assert!(!steps.is_empty(), "job {step_job} has a step on {node}");
    for p in steps {
        for q in descendants(p) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(q),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    // Resume until the run is whole (Slurm may requeue the lost node's task itself, or
    // let it end; either way resume waits for it or submits it again).
    let mut finished = false;
    for _ in 0..3 {
        let o = forkd(
            &c,
            &d.socket,
            &["eval", "resume", faulty.to_str().unwrap()],
            &[],
        );
        if o.status.success() {
            finished = true;
            break;
        }
        eprintln!("resume: {}", String::from_utf8_lossy(&o.stderr));
    }
    assert!(finished, "the run finished after resume");
    let got = rows(&faulty);
    assert_eq!(got.len(), 20, "every trial once: {:?}", got.keys());
    assert!(got.values().all(|(o, _)| o != "infra_error"), "{got:?}");
    let lost = events(&faulty, "shard-lost");
    assert!(
        lost.iter().any(|e| e["detail"]["shard"] == 0),
        "the cancelled shard is recorded: {lost:?}"
    );
    let attempts1 = events(&faulty.join("shards/1"), "attempt");
    assert!(attempts1.len() >= 2, "shard 1 ran again: {attempts1:?}");
}

/// Kills every process of sandbox `id`'s cgroups (thawed first: a frozen process does
/// not die) and removes the cgroups.
fn kill_cgroup(id: &str) {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path().join("forkd").join(id))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    let v2 = Path::new("/sys/fs/cgroup/forkd").join(id);
    if v2.is_dir() {
        dirs.push(v2);
    }
    let procs = |dirs: &[PathBuf]| -> Vec<i32> {
        dirs.iter()
            .flat_map(|d| {
                std::fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect()
    };
    for d in &dirs {
        let _ = std::fs::write(d.join("freezer.state"), "THAWED");
        let _ = std::fs::write(d.join("cgroup.freeze"), "0");
    }
    wait_until(Duration::from_secs(10), || {
        let left = procs(&dirs);
        for p in &left {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        left.is_empty()
    });
    for d in &dirs {
        let _ = std::fs::remove_dir(d);
    }
}

/// Processes whose command line starts with `prefix`.
fn processes_named(prefix: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).starts_with(prefix) {
            out.push(pid);
        }
    }
    out
}

/// Every descendant of `pid` (children first found, from /proc's parent links).
fn descendants(pid: i32) -> Vec<i32> {
    let mut parent = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        if let Some(rest) = stat.rsplit_once(") ") {
            if let Some(pp) = rest
                .1
                .split_whitespace()
                .nth(1)
                .and_then(|x| x.parse::<i32>().ok())
            {
                parent.insert(p, pp);
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for (&c, &pp) in &parent {
            if pp == p {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}
