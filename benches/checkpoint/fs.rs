//! Part 1: filesystem checkpoints against the size of the sandbox's writable layer,
//! next to the tar + zstd peer (benches/peers/tar_zstd.rs), and part 1b: what the
//! volume's dirty bound costs writers and saves checkpoints. Also [`wait_tree_hash`],
//! which every part uses to keep a checkpoint's background hash out of the next sample.

use crate::common::{self, fmt_kib, fmt_ms, fmt_us, sample, Check, DaemonGuard, Summary, Table};
use crate::config::{size_label, BUSYBOX, FS_CHECKPOINT_GOAL_MS};
use crate::peers::tar_zstd;
use crate::{Ctx, Out};
use anyhow::{bail, Context, Result};
use forkd::api::CheckpointInfo;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub fn fs_checkpoints(ctx: &Ctx, out: &mut Out) -> Result<()> {
    let (d, n) = (ctx.d, ctx.cfg.samples);
    eprintln!("[1/4] filesystem checkpoints against the size of the writable layer");
    let mut table = Table {
        title: "Part 1: filesystem checkpoint against the size of the writable layer (p50 ms; goal < 20 ms whatever the size)".into(),
        header: [
            "written",
            "upper",
            "synced: API p50",
            "API p99",
            "snapshot or copy p50",
            "unsynced: API p50",
            "API p99",
            "freeze p50",
            "snapshot or copy p50",
            "tree hash ready p50",
            "tar+zstd p50",
            "tar+zstd / checkpoint (synced)",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    let mut archives = Vec::new();
    for &size in &ctx.cfg.sizes {
        common::check_interrupted()?;
        let label = size_label(size);
        let sb = d.create(BUSYBOX)?;
        out.created.push(sb.id.clone());
        let id = sb.id.clone();
        let upper = PathBuf::from(&sb.upper);
        let t = Instant::now();
        d.sh_ok(
            &id,
            &format!("mkdir -p /data && head -c {size} /dev/urandom > /data/blob && sync"),
        )?;
        let upper_bytes = tree_bytes(&upper);
        eprintln!(
            "  {label}: written and synced in {}; upper {} holds {}",
            fmt_us(t.elapsed().as_micros() as u64),
            upper.display(),
            fmt_kib(upper_bytes as f64 / 1024.0)
        );

        let synced = fs_checkpoint_series(
            ctx,
            out,
            &id,
            &format!("fs checkpoint, {label} synced"),
            None,
        )?;
        // Rewritten before each sample and not synced: the snapshot has to flush it.
        let rewrite = format!("head -c {size} /dev/urandom > /data/blob");
        let unsynced = fs_checkpoint_series(
            ctx,
            out,
            &id,
            &format!("fs checkpoint, {label} unsynced (rewritten just before)"),
            Some(&rewrite),
        )?;
        d.sh_ok(&id, "sync")?;

        let archive = ctx.scratch.join("upper.tar.zst");
        let mut archive_bytes = 0;
        let tar_row = format!("tar + zstd -T0 -3 of the upper dir, {label} (peer)");
        let tar = sample(&tar_row, 1, n, || {
            let us = common::time_command(&mut tar_zstd::pack_command(&upper, &archive))?;
            archive_bytes = std::fs::metadata(&archive).map(|m| m.len()).unwrap_or(0);
            std::fs::remove_file(&archive)
                .with_context(|| format!("remove {}", archive.display()))?;
            Ok(us)
        })?;
        let tar = out.report.row(&tar_row, tar);
        archives.push(
            json!({ "written": size, "upper_bytes": upper_bytes, "archive_bytes": archive_bytes }),
        );
        d.remove(&id)?;

        let p50 = |s: Option<&Summary>| s.map(|s| fmt_ms(s.p50 as f64)).unwrap_or("-".into());
        table.rows.push(vec![
            label.clone(),
            fmt_kib(upper_bytes as f64 / 1024.0),
            fmt_ms(synced.api.p50 as f64),
            fmt_ms(synced.api.p99 as f64),
            p50(layer_phase(&synced.phases)),
            fmt_ms(unsynced.api.p50 as f64),
            fmt_ms(unsynced.api.p99 as f64),
            p50(unsynced.phases.get("freeze")),
            p50(layer_phase(&unsynced.phases)),
            p50(Some(&synced.hash_ready)),
            fmt_ms(tar.p50 as f64),
            format!("{:.0}x", tar.p50 as f64 / synced.api.p50.max(1) as f64),
        ]);
        for (case, s) in [("synced", &synced.api), ("unsynced", &unsynced.api)] {
            let ms = s.p50 as f64 / 1000.0;
            out.report.checks.push(Check {
                name: format!("fs checkpoint p50 (API), {label} {case}"),
                value: Some(ms),
                shown: format!("{ms:.2} ms"),
                goal: format!("< {FS_CHECKPOINT_GOAL_MS} ms"),
                met: Some(ms < FS_CHECKPOINT_GOAL_MS),
            });
        }
    }
    out.report.tables.push(table);
    out.report
        .extra
        .insert("fs_checkpoint_archives".into(), Value::Array(archives));
    dirty_bound_tradeoff(ctx, out)?;
    out.report.notes.push(
        "part 1: `synced` checkpoints a layer whose data is on disk; `unsynced` rewrites the \
         blob (not synced) right before each sample, so the btrfs snapshot has to write the \
         dirty data out; `tree hash ready` is the time from the checkpoint's answer until \
         its background tree hash appears (the next sample waits for it)"
            .into(),
    );
    Ok(())
}

/// The volume's dirty bound (`FORKD_DIRTY_LIMIT`), which a sample can lift: the
/// sysfs directory of the volume's writeback device, when the daemon set a bound.
pub struct DirtyBound {
    bdi: PathBuf,
}

impl DirtyBound {
    pub fn of(ctx: &Ctx) -> Option<DirtyBound> {
        let bdi = forkd_volume::bdi_of_mount(&ctx.data)?;
        let strict = std::fs::read_to_string(bdi.join("strict_limit")).ok()?;
        (strict.trim() == "1").then_some(DirtyBound { bdi })
    }

    pub fn bytes(&self) -> u64 {
        std::fs::read_to_string(self.bdi.join("max_bytes"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Runs `f` with the bound lifted (`strict_limit` 0), then sets it again.
    pub fn lifted<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let strict = self.bdi.join("strict_limit");
        let set = |v: &str| {
            std::fs::write(&strict, v).with_context(|| format!("write {}", strict.display()))
        };
        set("0")?;
        let r = f();
        set("1")?;
        r
    }
}

/// What the volume's dirty bound (`FORKD_DIRTY_LIMIT`) costs writers and saves
/// checkpoints: the largest size written (from a copy in the page cache, so the source
/// is not what is measured) and then checkpointed, with the bound on and, by turning
/// off its `strict_limit` for the sample, off; interleaved, same sandbox.
fn dirty_bound_tradeoff(ctx: &Ctx, out: &mut Out) -> Result<()> {
    let Some(&size) = ctx.cfg.sizes.iter().max() else {
        return Ok(());
    };
    let Some(bound) = DirtyBound::of(ctx) else {
        out.report.notes.push(
            "part 1b skipped: the volume has no dirty bound (not a loop mount made by forkd, \
             or FORKD_DIRTY_LIMIT=0)"
                .into(),
        );
        return Ok(());
    };
    let d = ctx.d;
    let label = size_label(size);
    let sb = d.create(BUSYBOX)?;
    out.created.push(sb.id.clone());
    d.sh_ok(
        &sb.id,
        &format!("mkdir -p /data && head -c {size} /dev/urandom > /data/src && sync"),
    )?;
    let samples = ctx.cfg.samples.clamp(1, 3);
    let mut rows: BTreeMap<(bool, &str), Vec<u64>> = BTreeMap::new();
    for i in 0..samples * 2 {
        common::check_interrupted()?;
        let on = i % 2 == 0;
        let write_then_checkpoint = || {
            let t = Instant::now();
            d.sh_ok(&sb.id, "cat /data/src > /data/blob")?;
            let write_us = t.elapsed().as_micros() as u64;
            let t = Instant::now();
            let c = d.checkpoint(&sb.id, false, false)?;
            Ok((write_us, t.elapsed().as_micros() as u64, c))
        };
        let (write_us, ck_us, c) = if on {
            write_then_checkpoint()?
        } else {
            bound.lifted(write_then_checkpoint)?
        };
        d.remove_checkpoint(&c.id)?;
        d.sh_ok(&sb.id, "rm /data/blob && sync")?;
        rows.entry((on, "write")).or_default().push(write_us);
        rows.entry((on, "checkpoint")).or_default().push(ck_us);
        rows.entry((on, "total"))
            .or_default()
            .push(write_us + ck_us);
        eprintln!(
            "  write {label} then checkpoint, bound {}: write {}, checkpoint {}",
            if on { "on" } else { "off" },
            fmt_us(write_us),
            fmt_us(ck_us)
        );
    }
    d.remove(&sb.id)?;
    let mut table = Table {
        title: format!(
            "Writing {label} then checkpointing: the dirty bound ({} MiB) on and off",
            bound.bytes() >> 20
        ),
        header: [
            "bound",
            "write p50",
            "checkpoint p50",
            "write + checkpoint p50",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    for on in [true, false] {
        let name = if on { "on" } else { "off" };
        let mut cells = vec![name.to_string()];
        for part in ["write", "checkpoint", "total"] {
            let v = rows.remove(&(on, part)).unwrap_or_default();
            let s = out.report.row(
                &format!("write {label} then checkpoint, bound {name}: {part}"),
                v,
            );
            cells.push(fmt_ms(s.p50 as f64));
        }
        table.rows.push(cells);
    }
    out.report.tables.push(table);
    Ok(())
}

struct FsSeries {
    api: Summary,
    phases: BTreeMap<String, Summary>,
    hash_ready: Summary,
}

/// Checkpoints sandbox `id` (filesystem only) once to warm up and then `samples` times,
/// a fresh checkpoint per sample; `before` runs in the sandbox before each, untimed.
/// Each checkpoint is removed once its background tree hash is done, so that hashing
/// does not overlap the next sample.
fn fs_checkpoint_series(
    ctx: &Ctx,
    out: &mut Out,
    id: &str,
    name: &str,
    before: Option<&str>,
) -> Result<FsSeries> {
    let d = ctx.d;
    let warmup = 1;
    let mut phases: Vec<BTreeMap<String, u64>> = Vec::new();
    let mut hash_ready = Vec::new();
    let api_row = format!("{name}: API");
    let api = sample(&api_row, warmup, ctx.cfg.samples, || {
        if let Some(line) = before {
            d.sh_ok(id, line)?;
        }
        let t = Instant::now();
        let c = d.checkpoint(id, false, false)?;
        let us = t.elapsed().as_micros() as u64;
        let answered = Instant::now();
        phases.push(c.phases_us.clone());
        hash_ready.push(wait_tree_hash(d, &c.id, answered)?);
        d.remove_checkpoint(&c.id)?;
        Ok(us)
    })?;
    phases.drain(..warmup.min(phases.len()));
    hash_ready.drain(..warmup.min(hash_ready.len()));
    let api = out.report.row(&api_row, api);
    let keys: BTreeSet<String> = phases.iter().flat_map(|p| p.keys().cloned()).collect();
    let mut by_phase = BTreeMap::new();
    for k in keys {
        let v: Vec<u64> = phases.iter().filter_map(|p| p.get(&k).copied()).collect();
        by_phase.insert(k.clone(), out.report.row(&format!("{name}: daemon {k}"), v));
    }
    let hash_ready = out.report.row(
        &format!("{name}: tree hash ready after the answer"),
        hash_ready,
    );
    Ok(FsSeries {
        api,
        phases: by_phase,
        hash_ready,
    })
}

/// One sample of a live checkpoint through the API: a fresh checkpoint of `sandbox`,
/// its API time in microseconds returned and its phases pushed to `phases`; then, so
/// that samples do not overlap, its background tree hash awaited and the checkpoint
/// removed.
pub fn live_checkpoint_sample(
    d: &DaemonGuard,
    sandbox: &str,
    phases: &mut Vec<BTreeMap<String, u64>>,
) -> Result<u64> {
    let t = Instant::now();
    let c = d.checkpoint(sandbox, true, false)?;
    let us = t.elapsed().as_micros() as u64;
    phases.push(c.phases_us.clone());
    wait_tree_hash(d, &c.id, Instant::now())?;
    d.remove_checkpoint(&c.id)?;
    Ok(us)
}

/// Polls a checkpoint until its tree hash is computed; returns microseconds since `from`.
pub fn wait_tree_hash(d: &DaemonGuard, id: &str, from: Instant) -> Result<u64> {
    let deadline = from + Duration::from_secs(300);
    loop {
        let c: CheckpointInfo = d
            .client()
            .call("GET", &format!("/v1/checkpoints/{id}"), None)
            .with_context(|| format!("inspect checkpoint {id}"))?;
        if c.tree_hash.is_some() {
            return Ok(from.elapsed().as_micros() as u64);
        }
        if Instant::now() > deadline {
            bail!("checkpoint {id}: no tree hash after 300 s");
        }
        common::check_interrupted()?;
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Bytes of the regular files below `dir`.
fn tree_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => tree_bytes(&e.path()),
                    Ok(m) if m.is_file() => m.len(),
                    _ => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The phase in which a checkpoint took the layer: a snapshot, or for a small layer a
/// copy (the API reports one or the other).
fn layer_phase(phases: &BTreeMap<String, Summary>) -> Option<&Summary> {
    phases.get("snapshot").or_else(|| phases.get("copy"))
}
