//! Part 1's peer: podman containers restored from one export, one after another, until
//! the time or count budget.

use super::*;

/// podman: containers restored from one export, one after another, until the budget.
pub fn podman_peer(p: &Podman, report: &mut Report) -> Result<()> {
    let budget = Duration::from_secs(common::env_usize("FORKD_DENSITY_PODMAN_SECS", 300)? as u64);
    let max = common::env_usize("FORKD_DENSITY_PODMAN_MAX", 1000)?;
    eprintln!(
        "[1p] podman restores for up to {} s or {max} containers",
        budget.as_secs()
    );
    p.import(&common::fixture_image("busybox.tar"), PODMAN_IMAGE)?;
    let scratch = common::unique_temp_dir("forkd-bench-density")?;
    let export = scratch.join("loop.tar");
    let src = PodmanContainer::start(p, "forkd-density-src", PODMAN_IMAGE, &["sh", "-c", LOOP])?;
    std::thread::sleep(Duration::from_millis(300));
    common::run_checked(&mut p.checkpoint_export(&[], &export, &src.name))?;
    drop(src);
    let base_avail = common::mem_available_kib()?;
    let started = Instant::now();
    let mut names = Vec::new();
    let mut times = Vec::new();
    while names.len() < max && started.elapsed() < budget {
        common::check_interrupted()?;
        let name = format!("forkd-density-{}", names.len());
        let t = Instant::now();
        common::run_checked(p.restore_import(&[], &export).args(["--name", &name]))?;
        times.push(us(t));
        names.push(name);
    }
    let per_kib =
        base_avail.saturating_sub(common::mem_available_kib()?) as f64 / names.len().max(1) as f64;
    let first: Vec<u64> = times.iter().take(10).copied().collect();
    let last: Vec<u64> = times.iter().rev().take(10).copied().collect();
    report.row("podman: restore --import, first 10", first);
    report.row(
        &format!("podman: restore --import, last 10 (N={})", names.len()),
        last,
    );
    let t = Instant::now();
    for chunk in names.chunks(50) {
        let _ = p
            .command()
            .args(["rm", "-f", "-t", "0"])
            .args(chunk)
            .output();
    }
    report.sections.push((
        "podman".into(),
        vec![
            (
                "containers restored within the budget".into(),
                names.len().to_string(),
            ),
            (
                "host memory a container".into(),
                format!("{per_kib:.0} KiB"),
            ),
            (
                "remove all (podman rm -f, 50 a call)".into(),
                common::fmt_us(us(t)),
            ),
        ],
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}
