//! Where an entry goes: the directories below the root resolved one component at a
//! time (never through a symlink), and the slot an entry takes prepared.

use super::*;

impl Extractor {
    /// Resolves (and with `create`, makes) the directory `comps` below the
    /// root, one component at a time, refusing symlinks and non-directories.
    pub(super) fn parent(
        &mut self,
        comps: &[&[u8]],
        create: bool,
        raw: &[u8],
    ) -> Result<Rc<OwnedFd>, LayerError> {
        match self.resolve(comps, create, raw)? {
            Some(fd) => Ok(fd),
            None => Err(LayerError::entry(raw, "parent directory does not exist")),
        }
    }

    /// Like [`Self::parent`] without creating anything; `None` when a
    /// component does not exist.
    pub(super) fn existing(
        &mut self,
        comps: &[&[u8]],
        raw: &[u8],
    ) -> Result<Option<Rc<OwnedFd>>, LayerError> {
        self.resolve(comps, false, raw)
    }

    pub(super) fn resolve(
        &mut self,
        comps: &[&[u8]],
        create: bool,
        raw: &[u8],
    ) -> Result<Option<Rc<OwnedFd>>, LayerError> {
        let key = join(comps);
        if let Some((k, fd)) = &self.cache {
            if *k == key {
                return Ok(Some(fd.clone()));
            }
        }
        let mut cur: Option<OwnedFd> = None;
        for (i, c) in comps.iter().enumerate() {
            let at = cur.as_ref().map(|f| f.as_fd()).unwrap_or(self.root.as_fd());
            let name =
                fsx::cstr(c).map_err(|_| LayerError::entry(raw, "path contains a NUL byte"))?;
            let next = match fsx::open_dir_at(at, &name) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if create => {
                    rfs::mkdirat(at, &name, Mode::from_raw_mode(0o755))
                        .map_err(|e| self.io("creating directory", &join(&comps[..=i]), e))?;
                    // mkdirat applies the umask; implicit parents are 0755.
                    let fd = fsx::open_dir_at(at, &name)
                        .map_err(|e| self.io("opening directory", &join(&comps[..=i]), e))?;
                    rfs::fchmod(&fd, Mode::from_raw_mode(0o755))
                        .map_err(|e| self.io("setting mode of", &join(&comps[..=i]), e))?;
                    fd
                }
                Err(Errno::NOENT) => return Ok(None),
                Err(Errno::LOOP | Errno::NOTDIR) => {
                    let prefix = String::from_utf8_lossy(&join(&comps[..=i])).into_owned();
                    let is_link = fsx::lstat_at(at, &name)
                        .map(|st| fsx::file_type(&st) == FileType::Symlink)
                        .unwrap_or(false);
                    return Err(LayerError::entry(
                        raw,
                        if is_link {
                            format!("path goes through the symlink {prefix:?}")
                        } else {
                            format!("path goes through the non-directory {prefix:?}")
                        },
                    ));
                }
                Err(e) => return Err(self.io("opening directory", &join(&comps[..=i]), e)),
            };
            cur = Some(next);
        }
        let fd = Rc::new(match cur {
            Some(fd) => fd,
            None => self
                .root
                .try_clone()
                .map_err(|e| self.io("duplicating", b"", e))?,
        });
        self.cache = Some((key, fd.clone()));
        Ok(Some(fd))
    }

    /// Makes room for a new entry at `dir/name`.
    pub(super) fn prepare(
        &mut self,
        dir: &OwnedFd,
        name: &CString,
        rel: &[u8],
        new_is_dir: bool,
    ) -> Result<Slot, LayerError> {
        let st = match fsx::lstat_at(dir.as_fd(), name) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(Slot::Empty),
            Err(e) => return Err(self.io("inspecting", rel, e)),
        };
        let is_dir = fsx::file_type(&st) == FileType::Directory;
        if is_dir && new_is_dir {
            return Ok(Slot::ExistingDir);
        }
        if is_dir {
            // The cached parent may live below the directory being removed.
            self.cache = None;
        }
        fsx::remove_at(dir.as_fd(), name).map_err(|e| self.io("replacing", rel, e))?;
        Ok(Slot::Empty)
    }
}
