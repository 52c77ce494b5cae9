//! COPY and ADD: the sources taken from the build context or from another stage, the
//! destination resolved in the step sandbox, `--chown` against the sandbox's own user
//! database, `--chmod`, and ADD's local archives unpacked.

use super::*;

impl Job<'_> {
    pub(super) fn copy(
        &self,
        stage: usize,
        line: usize,
        spec: &CopySpec,
        state: &mut State,
        done: &[Option<State>],
        made: &mut Made,
    ) -> Result<(&'static str, Option<LayerId>), ApiError> {
        let what = if spec.add { "ADD" } else { "COPY" };
        let vars = state.vars();
        let ex = |raw: &str| {
            words::expand(raw, &vars, ESC).map_err(|e| self.err(line, format!("{what}: {e}")))
        };
        let sources: Vec<String> = spec
            .sources
            .iter()
            .map(|s| ex(s))
            .collect::<Result<_, _>>()?;
        let dest_raw = ex(&spec.dest)?;
        let dest_abs = state.absolute(&dest_raw);
        let chmod = match &spec.chmod {
            Some(m) => Some(
                context::parse_chmod(&ex(m)?)
                    .map_err(|e| self.err(line, format!("{what}: {e}")))?,
            ),
            None => None,
        };
        let chown = spec.chown.as_deref().map(ex).transpose()?;
        let from = spec.from.as_deref().map(ex).transpose()?;
        let opts = format!(
            "{}|{}|{}",
            dest_abs,
            chown.as_deref().unwrap_or(""),
            chmod.map(|m| format!("{m:o}")).unwrap_or_default()
        );
        if let Some(from) = from {
            // Another stage (or an image): its files, read inside a sandbox of it.
            let src_layers = match self.plan.stage_named(&from, stage) {
                Some(j) => done[j]
                    .as_ref()
                    .expect("needed stages are built first")
                    .layers
                    .clone(),
                // `COPY --from=<uv image>`: an image, pulled if it is not here.
                None => {
                    self.d
                        .image_for_build(&from, self.given)
                        .map_err(|e| {
                            self.err(
                                line,
                                format!("{what} --from={from}: no such stage; {}", e.message),
                            )
                        })?
                        .layers
                }
            };
            for s in &sources {
                if context::has_glob(s) {
                    return Err(self.err(
                        line,
                        format!("{what} --from: wildcard source {s:?} is not supported"),
                    ));
                }
                if s.split('/').any(|c| c == "..") {
                    return Err(self.err(line, format!("{what} --from: source {s:?} has '..'")));
                }
            }
            let ids: Vec<String> = src_layers.iter().map(|l| l.to_string()).collect();
            state.extend_key(&[what, "from", &ids.join(","), &json(&sources), &opts]);
            let dest_is_dir = dest_raw.ends_with('/') || sources.len() > 1;
            // The source stage's files are read in a sandbox of it, made only when the
            // step runs (a cache hit needs none).
            let mut src_sb: Option<Arc<Sandbox>> = None;
            let res = self.file_step(state, made, false, |sb| {
                let owner = self.owner(sb, chown.as_deref(), line)?;
                let src_sb = src_sb.insert(self.d.step_sandbox(
                    &self.req.name,
                    &src_layers,
                    &ImageConfig::default(),
                    &self.req.limits,
                    false,
                )?);
                for s in &sources {
                    let abs = if s.starts_with('/') {
                        s.clone()
                    } else {
                        format!("/{s}")
                    };
                    let tar = self.d.copy_out(src_sb, &abs).map_err(|e| {
                        self.err(line, format!("{what} --from={from}: {}", e.message))
                    })?;
                    let (tar, is_dir) = repack(&tar, owner, chmod)
                        .map_err(|e| self.err(line, format!("{what} --from: {e}")))?;
                    if is_dir || dest_is_dir {
                        self.d.make_dirs(sb, &dest_abs)?;
                        self.d.copy_in(sb, &dest_abs, &tar)?;
                    } else {
                        self.d.make_dirs(sb, &parent(&dest_abs))?;
                        self.d.copy_in(sb, dest_abs.trim_end_matches('/'), &tar)?;
                    }
                }
                Ok(())
            });
            if let Some(sb) = src_sb {
                let _ = self.d.remove_sandbox(&sb, true);
            }
            return res;
        }
        let sel = self
            .ctx
            .select(&sources, &dest_raw)
            .map_err(|e| self.err(line, format!("{what}: {e}")))?;
        // ADD unpacks local archives; everything else is copied as is.
        let mut archives = Vec::new();
        let mut plain = Vec::new();
        for e in sel.entries {
            if spec.add {
                if let EntryKind::File { .. } = e.kind {
                    let mut head = [0u8; 512];
                    let n = read_head(&e.src, &mut head).map_err(|x| {
                        self.err(line, format!("ADD: read {}: {x}", e.src.display()))
                    })?;
                    match context::archive_kind(&head[..n]) {
                        Some(k @ ("xz" | "bzip2")) => {
                            return Err(self.err(line, format!("ADD: {} is a {k} archive, which is not supported (use gzip, zstd or plain tar)", e.src.display())))
                        }
                        Some(_) => {
                            archives.push(e);
                            continue;
                        }
                        None => {}
                    }
                }
            }
            plain.push(e);
        }
        let plain = Selection {
            entries: plain,
            dest_is_dir: sel.dest_is_dir || !archives.is_empty(),
        };
        let digest = plain
            .digest()
            .map_err(|e| self.err(line, format!("{what}: {e}")))?;
        let mut arch_digest = String::new();
        for e in &archives {
            let one = Selection {
                entries: vec![e.clone()],
                dest_is_dir: true,
            };
            arch_digest.push_str(&one.digest().map_err(|x| self.err(line, x))?);
        }
        state.extend_key(&[what, "context", &digest, &arch_digest, &opts]);
        self.file_step(state, made, false, |sb| {
            let owner = self.owner(sb, chown.as_deref(), line)?;
            if plain.dest_is_dir {
                self.d.make_dirs(sb, &dest_abs)?;
            } else {
                self.d.make_dirs(sb, &parent(&dest_abs))?;
            }
            if !plain.entries.is_empty() {
                let tar = plain
                    .tar(owner, chmod)
                    .map_err(|e| self.err(line, format!("{what}: {e}")))?;
                let at = if plain.dest_is_dir {
                    dest_abs.clone()
                } else {
                    dest_abs.trim_end_matches('/').to_string()
                };
                self.d
                    .copy_in(sb, &at, &tar)
                    .map_err(|e| self.err(line, format!("{what}: {}", e.message)))?;
            }
            for e in &archives {
                let tar = unpack(&e.src)
                    .map_err(|x| self.err(line, format!("ADD: unpack {}: {x}", e.src.display())))?;
                self.d
                    .copy_in(sb, &dest_abs, &tar)
                    .map_err(|x| self.err(line, format!("ADD: {}", x.message)))?;
            }
            Ok(())
        })
    }

    /// `--chown` resolved against the step sandbox's own `/etc/passwd` and `/etc/group`.
    pub(super) fn owner(
        &self,
        sb: &Arc<Sandbox>,
        chown: Option<&str>,
        line: usize,
    ) -> Result<(u32, u32), ApiError> {
        let Some(spec) = chown else {
            return Ok((0, 0));
        };
        let needs_db = spec.split(':').any(|p| p.parse::<u32>().is_err());
        let (passwd, group) = if needs_db {
            (
                self.read_file(sb, "/etc/passwd"),
                self.read_file(sb, "/etc/group"),
            )
        } else {
            (String::new(), String::new())
        };
        context::resolve_owner(spec, &passwd, &group).map_err(|e| self.err(line, e))
    }

    pub(super) fn read_file(&self, sb: &Arc<Sandbox>, path: &str) -> String {
        let Ok(tar) = self.d.copy_out(sb, path) else {
            return String::new();
        };
        let mut a = tar::Archive::new(&tar[..]);
        let mut out = String::new();
        if let Ok(mut entries) = a.entries() {
            if let Some(Ok(mut e)) = entries.next() {
                let _ = std::io::Read::read_to_string(&mut e, &mut out);
            }
        }
        out
    }
}

fn read_head(p: &Path, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::io::Read;
    let mut f = std::fs::File::open(p)?;
    let mut n = 0;
    while n < buf.len() {
        let k = f.read(&mut buf[n..])?;
        if k == 0 {
            break;
        }
        n += k;
    }
    Ok(n)
}

/// A local archive as a plain tar (the layer store's decompression, which sniffs gzip
/// and zstd from the first bytes).
fn unpack(p: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let (mut r, _) = forkd_layers::extract::decompress(std::fs::File::open(p)?)?;
    let mut out = Vec::new();
    r.read_to_end(&mut out)?;
    Ok(out)
}

/// A tar from `copy_out` (top entry = the source's name) made ready for the
/// destination: a directory's contents lose the top component; owner and mode set.
fn repack(tar: &[u8], owner: (u32, u32), chmod: Option<u32>) -> Result<(Vec<u8>, bool), String> {
    let mut a = tar::Archive::new(tar);
    let mut b = tar::Builder::new(Vec::new());
    let mut is_dir = false;
    for (i, e) in a.entries().map_err(|e| e.to_string())?.enumerate() {
        let mut e = e.map_err(|e| e.to_string())?;
        let path = e.path().map_err(|e| e.to_string())?.into_owned();
        if i == 0 && e.header().entry_type().is_dir() {
            is_dir = true;
        }
        let rel: PathBuf = if is_dir {
            path.components().skip(1).collect()
        } else {
            path.clone()
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        let mut h = e.header().clone();
        h.set_uid(owner.0 as u64);
        h.set_gid(owner.1 as u64);
        if let Some(m) = chmod {
            if !h.entry_type().is_symlink() {
                h.set_mode(m);
            }
        }
        if h.entry_type().is_symlink() || h.entry_type().is_hard_link() {
            let target = e
                .link_name()
                .map_err(|e| e.to_string())?
                .unwrap_or_default()
                .into_owned();
            b.append_link(&mut h, &rel, &target)
                .map_err(|e| e.to_string())?;
        } else {
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).map_err(|e| e.to_string())?;
            b.append_data(&mut h, &rel, &data[..])
                .map_err(|e| e.to_string())?;
        }
    }
    Ok((b.into_inner().map_err(|e| e.to_string())?, is_dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn repack_strips_a_directory_top_and_sets_owner() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        b.append_data(&mut h, "out", std::io::empty()).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(2);
        b.append_data(&mut h, "out/f", &b"hi"[..]).unwrap();
        let tar = b.into_inner().unwrap();
        let (t, is_dir) = repack(&tar, (3, 4), None).unwrap();
        assert!(is_dir);
        let mut a = tar::Archive::new(&t[..]);
        let e: Vec<(String, u64)> = a
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().uid().unwrap(),
                )
            })
            .collect();
        assert_eq!(e, vec![("f".to_string(), 3)]);
    }
}
