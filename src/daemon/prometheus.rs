//! `GET /metrics`: the daemon's state in Prometheus's text exposition format (version
//! 0.0.4), made on each scrape from what the services already hold. docs/API.md,
//! "Prometheus metrics", lists every series; a test parses the text with
//! prometheus_client's parser.

use super::metrics::BUCKETS_US;
use super::{Daemon, Lock};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Where the kernel shows KSM's counters.
const KSM: &str = "/sys/kernel/mm/ksm";

/// The text under construction: each family's HELP and TYPE, then its samples.
struct Text(String);

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape(v));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }
}

/// A label value as the format wants it: backslash, quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn seconds(us: u64) -> String {
    format!("{}", us as f64 / 1e6)
}

impl Daemon {
    /// The exposition of everything below, as one text.
    pub fn prometheus(&self) -> String {
        let mut t = Text(String::with_capacity(8192));
        self.requests(&mut t);
        self.sandboxes_and_checkpoints(&mut t);
        self.volume_and_pulls(&mut t);
        ksm(&mut t);
        t.0
    }

    fn requests(&self, t: &mut Text) {
        let mut rows = Vec::new();
        self.node
            .metrics
            .each(|op, o| rows.push((op.to_string(), o.count, o.errors, o.buckets, o.sum_us)));
        t.family(
            "forkd_requests_total",
            "counter",
            "Requests answered since the daemon started, by operation and outcome (exec_stream: upgraded execs).",
        );
        for (op, count, errors, _, _) in &rows {
            t.sample(
                "forkd_requests_total",
                &[("op", op), ("outcome", "ok")],
                count - errors,
            );
            t.sample(
                "forkd_requests_total",
                &[("op", op), ("outcome", "error")],
                errors,
            );
        }
        t.family(
            "forkd_request_duration_seconds",
            "histogram",
            "Time from a request's arrival to its answer (to the end of the relay for exec_stream), by operation.",
        );
        for (op, count, _, buckets, sum) in &rows {
            let mut below = 0;
            for (bound, n) in BUCKETS_US.iter().zip(buckets) {
                below += n;
                let le = seconds(*bound);
                t.sample(
                    "forkd_request_duration_seconds_bucket",
                    &[("op", op), ("le", &le)],
                    below,
                );
            }
            t.sample(
                "forkd_request_duration_seconds_bucket",
                &[("op", op), ("le", "+Inf")],
                count,
            );
            t.sample(
                "forkd_request_duration_seconds_sum",
                &[("op", op)],
                seconds(*sum),
            );
            t.sample("forkd_request_duration_seconds_count", &[("op", op)], count);
        }
    }

    fn sandboxes_and_checkpoints(&self, t: &mut Text) {
        let mut by_status: BTreeMap<String, u64> = [
            "running",
            "stopping",
            "checkpointing",
            "removing",
            "stopped",
        ]
        .iter()
        .map(|s| (s.to_string(), 0))
        .collect();
        let mut branches = 0u64;
        let sandboxes: Vec<_> = self
            .sandboxes
            .table
            .locked()
            .by_id()
            .values()
            .cloned()
            .collect();
        for sb in &sandboxes {
            let rec = sb.record.locked();
            *by_status.entry(rec.status.to_string()).or_default() += 1;
            if rec.parent.is_some() && rec.status == crate::api::SandboxStatus::Running {
                branches += 1;
            }
        }
        t.family(
            "forkd_sandboxes",
            "gauge",
            "Sandboxes the daemon holds, by status.",
        );
        for (status, n) in &by_status {
            t.sample("forkd_sandboxes", &[("status", status)], n);
        }
        t.family(
            "forkd_namespaces_held",
            "gauge",
            "Sandboxes whose namespaces are still held open: those running, and those ended whose tear-down (unmount, sync) is still queued.",
        );
        t.sample("forkd_namespaces_held", &[], self.sandboxes.exits.kept());
        t.family(
            "forkd_branches_running",
            "gauge",
            "Running sandboxes that were forked from a checkpoint.",
        );
        t.sample("forkd_branches_running", &[], branches);
        let checkpoints: Vec<_> = self.checkpoints.table.locked().values().cloned().collect();
        let (mut live, mut files, mut bytes) = (0u64, 0u64, 0u64);
        for c in &checkpoints {
            let rec = c.record.locked();
            if rec.live {
                live += 1;
            } else {
                files += 1;
            }
            bytes += rec.images_bytes;
        }
        t.family(
            "forkd_checkpoints",
            "gauge",
            "Checkpoints, by kind (live: with a process tree).",
        );
        t.sample("forkd_checkpoints", &[("kind", "live")], live);
        t.sample("forkd_checkpoints", &[("kind", "files")], files);
        t.family(
            "forkd_checkpoint_image_bytes",
            "gauge",
            "Bytes of the process-tree images (CRIU's) all checkpoints hold.",
        );
        t.sample("forkd_checkpoint_image_bytes", &[], bytes);
    }

    fn volume_and_pulls(&self, t: &mut Text) {
        let space = self.node.volume_watch.state.locked().space;
        t.family(
            "forkd_volume_bytes",
            "gauge",
            "The data volume: its filesystem's size, what is free in it for new data, the most it may grow to, and what it holds on the disk under it.",
        );
        t.sample("forkd_volume_bytes", &[("kind", "size")], space.fs_bytes);
        t.sample("forkd_volume_bytes", &[("kind", "free")], space.fs_free);
        t.sample("forkd_volume_bytes", &[("kind", "max")], space.max_bytes);
        t.sample(
            "forkd_volume_bytes",
            &[("kind", "backed")],
            space.backed_bytes,
        );
        let pulls = self.images.pulls.list();
        let fetched: u64 = pulls.iter().flat_map(|p| &p.layers).map(|l| l.done).sum();
        t.family("forkd_pulls_in_progress", "gauge", "Image pulls under way.");
        t.sample("forkd_pulls_in_progress", &[], pulls.len());
        t.family(
            "forkd_pull_fetched_bytes",
            "gauge",
            "Bytes the pulls under way have fetched so far.",
        );
        t.sample("forkd_pull_fetched_bytes", &[], fetched);
    }
}

/// KSM's counters, where the kernel has KSM.
fn ksm(t: &mut Text) {
    let read = |name: &str| -> Option<u64> {
        std::fs::read_to_string(format!("{KSM}/{name}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    };
    for (name, file, help) in [
        (
            "forkd_ksm_pages_shared",
            "pages_shared",
            "KSM: pages in use that other pages merged into (the host's counter).",
        ),
        (
            "forkd_ksm_pages_sharing",
            "pages_sharing",
            "KSM: pages merged into another, each a page saved (the host's counter).",
        ),
        (
            "forkd_ksm_pages_unshared",
            "pages_unshared",
            "KSM: pages scanned that are unique so far (the host's counter).",
        ),
    ] {
        if let Some(v) = read(file) {
            t.family(name, "gauge", help);
            t.sample(name, &[], v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_samples_written() {
        let mut t = Text(String::new());
        t.family("x_total", "counter", "What x counts.");
        t.sample("x_total", &[("op", "a\"b\\c\nd")], 3);
        t.sample("x_total", &[], 1);
        assert_eq!(
            t.0,
            "# HELP x_total What x counts.\n# TYPE x_total counter\nx_total{op=\"a\\\"b\\\\c\\nd\"} 3\nx_total 1\n"
        );
        assert_eq!(seconds(250), "0.00025");
        assert_eq!(seconds(60_000_000), "60");
    }
}
