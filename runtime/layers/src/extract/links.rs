//! Entries that refer to others: hard links (within the layer only), and overlay
//! whiteouts and opaque directories.

use super::*;

impl Extractor {
    pub(super) fn hardlink(
        &mut self,
        parent_comps: &[&[u8]],
        name: &CString,
        rel: &[u8],
        target_raw: &[u8],
        raw: &[u8],
    ) -> Result<(), LayerError> {
        let tcomps = normalize(target_raw)
            .map_err(|r| LayerError::entry(raw, format!("hard link target: {r}")))?;
        if tcomps.is_empty() {
            return Err(LayerError::entry(raw, "hard link to the root directory"));
        }
        if join(&tcomps) == rel {
            return Err(LayerError::entry(raw, "hard link to itself"));
        }
        let (tparent, tname) = tcomps.split_at(tcomps.len() - 1);
        let tname =
            fsx::cstr(tname[0]).map_err(|_| LayerError::entry(raw, "NUL in hard link target"))?;
        let not_yet = || {
            LayerError::entry(
                raw,
                format!(
                    "hard link target {:?} is not an entry extracted earlier",
                    String::from_utf8_lossy(target_raw)
                ),
            )
        };
        let tdir = self.link_target_dir(tparent, raw)?.ok_or_else(not_yet)?;
        let st = match fsx::lstat_at(tdir.as_fd(), &tname) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Err(not_yet()),
            Err(e) => return Err(self.io("inspecting", &join(&tcomps), e)),
        };
        match fsx::file_type(&st) {
            FileType::RegularFile | FileType::Symlink | FileType::Fifo => {}
            _ => {
                return Err(LayerError::entry(
                    raw,
                    "hard link target is not a regular file, symlink or fifo",
                ))
            }
        }
        let dir = self.parent(parent_comps, true, raw)?;
        self.prepare(&dir, name, rel, false)?;
        // The target's parent may have been replaced by `prepare`: resolve again.
        let tdir = self.link_target_dir(tparent, raw)?.ok_or_else(not_yet)?;
        let dir = self.parent(parent_comps, true, raw)?;
        rfs::linkat(&*tdir, &tname, &*dir, name, AtFlags::empty()).map_err(|e| match e {
            Errno::NOENT => not_yet(),
            e => self.io("creating hard link", rel, e),
        })
    }

    pub(super) fn link_target_dir(
        &mut self,
        comps: &[&[u8]],
        raw: &[u8],
    ) -> Result<Option<Rc<OwnedFd>>, LayerError> {
        self.existing(comps, raw).map_err(|e| match e {
            LayerError::BadEntry { entry, reason } => LayerError::BadEntry {
                entry,
                reason: format!("hard link target: {reason}"),
            },
            e => e,
        })
    }

    /// Makes `comps` a whiteout unless this layer already has an entry there.
    pub(super) fn whiteout(
        &mut self,
        comps: &[&[u8]],
        raw: &[u8],
        meta: Option<&Meta>,
    ) -> Result<(), LayerError> {
        let (parent, name) = comps.split_at(comps.len() - 1);
        let rel = join(comps);
        let name =
            fsx::cstr(name[0]).map_err(|_| LayerError::entry(raw, "path contains a NUL byte"))?;
        let dir = self.parent(parent, true, raw)?;
        match fsx::lstat_at(dir.as_fd(), &name) {
            Ok(_) if self.flavor == TarFlavor::OciLayer => return Ok(()),
            Ok(_) => {
                self.prepare(&dir, &name, &rel, false)?;
            }
            Err(Errno::NOENT) => {}
            Err(e) => return Err(self.io("inspecting", &rel, e)),
        }
        rfs::mknodat(
            &*dir,
            &name,
            FileType::CharacterDevice,
            Mode::empty(),
            rfs::makedev(0, 0),
        )
        .map_err(|e| self.io("creating whiteout", &rel, e))?;
        // OCI whiteouts look like the kernel's (mode 0, root-owned); an
        // overlay-form archive says exactly what it had, so it round-trips.
        let (mode, uid, gid) = meta.map_or((0, 0, 0), |m| (m.mode, m.uid, m.gid));
        rfs::chownat(
            &*dir,
            &name,
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| self.io("changing owner of", &rel, e))?;
        if mode != 0 {
            rfs::chmodat(&*dir, &name, Mode::from_raw_mode(mode), AtFlags::empty())
                .map_err(|e| self.io("setting mode of", &rel, e))?;
        }
        Ok(())
    }

    /// Marks the directory `comps` opaque (creating it if needed).
    pub(super) fn opaque(&mut self, comps: &[&[u8]], raw: &[u8]) -> Result<(), LayerError> {
        let dir = self.parent(comps, true, raw)?;
        fsx::write_xattr(XattrOf::Fd(dir.as_fd()), OPAQUE_XATTR, b"y")
            .map_err(|e| self.io("marking opaque", &join(comps), e))
    }
}
