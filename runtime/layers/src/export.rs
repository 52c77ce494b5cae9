//! Writing a stored tree (a layer, or a checkpoint's layer) as a tar stream in overlay
//! form, the inverse of importing with [`crate::TarFlavor::Overlay`]: whiteouts stay 0:0
//! character devices, and the xattrs that matter (`trusted.overlay.*`,
//! `security.capability`) travel as PAX `SCHILY.xattr.*` records. Entries are written
//! in sorted order with owners, modes and mtimes, never following symlinks; hard links
//! are written as separate files (the tree hash treats them as such too).

use crate::error::LayerError;
use crate::fsx::{self, XattrOf};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Writes the tree at `dir` to `out` as a tar; returns the number of entries.
pub fn export_tar<W: Write>(dir: &Path, out: W) -> Result<u64, LayerError> {
    let mut b = tar::Builder::new(out);
    b.mode(tar::HeaderMode::Complete);
    let mut count = 0;
    walk(dir, Path::new(""), &mut b, &mut count)?;
    b.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(|e| LayerError::io("finishing tar of", dir, e))?;
    Ok(count)
}

fn walk<W: Write>(
    root: &Path,
    rel: &Path,
    b: &mut tar::Builder<W>,
    count: &mut u64,
) -> Result<(), LayerError> {
    let dir = root.join(rel);
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| LayerError::io("reading directory", &dir, e))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(|e| LayerError::io("reading directory", &dir, e))?;
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for name in names {
        let rel_path = rel.join(&name);
        let path = root.join(&rel_path);
        let meta = std::fs::symlink_metadata(&path)
            .map_err(|e| LayerError::io("reading metadata of", &path, e))?;
        let ft = meta.file_type();
        let xattrs = fsx::read_xattrs(XattrOf::Path(&path), fsx::is_significant_xattr)
            .map_err(|e| LayerError::io("reading xattrs of", &path, e))?;
        if !xattrs.is_empty() {
            append_pax(b, &xattrs).map_err(|e| LayerError::io("writing xattrs of", &path, e))?;
        }
        let mut h = tar::Header::new_gnu();
        h.set_mode(meta.mode() & 0o7777);
        h.set_uid(meta.uid() as u64);
        h.set_gid(meta.gid() as u64);
        h.set_mtime(meta.mtime().max(0) as u64);
        h.set_size(0);
        let io_err = |e| LayerError::io("writing tar entry for", &path, e);
        if ft.is_dir() {
            h.set_entry_type(tar::EntryType::Directory);
            b.append_data(&mut h, &rel_path, io::empty())
                .map_err(io_err)?;
            *count += 1;
            walk(root, &rel_path, b, count)?;
            continue;
        } else if ft.is_file() {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(meta.len());
            let f = std::fs::File::open(&path).map_err(|e| LayerError::io("opening", &path, e))?;
            b.append_data(&mut h, &rel_path, f.take(meta.len()))
                .map_err(io_err)?;
        } else if ft.is_symlink() {
            h.set_entry_type(tar::EntryType::Symlink);
            let target =
                std::fs::read_link(&path).map_err(|e| LayerError::io("reading link", &path, e))?;
            b.append_link(&mut h, &rel_path, &target).map_err(io_err)?;
        } else if ft.is_char_device() || ft.is_block_device() {
            h.set_entry_type(if ft.is_char_device() {
                tar::EntryType::Char
            } else {
                tar::EntryType::Block
            });
            let rdev = meta.rdev();
            h.set_device_major(libc_major(rdev)).map_err(io_err)?;
            h.set_device_minor(libc_minor(rdev)).map_err(io_err)?;
            b.append_data(&mut h, &rel_path, io::empty())
                .map_err(io_err)?;
        } else if ft.is_fifo() {
            h.set_entry_type(tar::EntryType::Fifo);
            b.append_data(&mut h, &rel_path, io::empty())
                .map_err(io_err)?;
        } else {
            // Sockets are not content; a restored process re-creates its own.
            continue;
        }
        *count += 1;
    }
    Ok(())
}

fn libc_major(rdev: u64) -> u32 {
    (((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff)) as u32
}

fn libc_minor(rdev: u64) -> u32 {
    (((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff)) as u32
}

/// A PAX extended header carrying `SCHILY.xattr.NAME=VALUE` records.
fn append_pax<W: Write>(b: &mut tar::Builder<W>, xattrs: &[(Vec<u8>, Vec<u8>)]) -> io::Result<()> {
    let mut data = Vec::new();
    for (name, value) in xattrs {
        let mut body = b"SCHILY.xattr.".to_vec();
        body.extend_from_slice(name);
        body.push(b'=');
        body.extend_from_slice(value);
        body.push(b'\n');
        // The record length counts its own digits, the space and the body.
        let mut len = body.len() + 2;
        while len != body.len() + 1 + len.to_string().len() {
            len = body.len() + 1 + len.to_string().len();
        }
        data.extend_from_slice(format!("{len} ").as_bytes());
        data.extend_from_slice(&body);
    }
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::XHeader);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    b.append_data(&mut h, PathBuf::from("PaxHeaders/xattrs"), &data[..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_tree_imports_to_the_same_hash() {
        if !forkd_testing::require_root("exported_tree_imports_to_the_same_hash") {
            return;
        }
        let base = std::env::temp_dir().join(format!("forkd-export-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let src = base.join("src");
        std::fs::create_dir_all(src.join("d/e")).unwrap();
        std::fs::write(src.join("d/file"), b"hello").unwrap();
        std::os::unix::fs::symlink("../x", src.join("d/link")).unwrap();
        let wh = std::ffi::CString::new(src.join("gone").as_os_str().as_bytes()).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            wh.as_c_str(),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0),
            0,
        )
        .unwrap();
        fsx::write_xattr(
            XattrOf::Path(&src.join("d/e")),
            b"trusted.overlay.opaque",
            b"y",
        )
        .unwrap();
        let before = crate::tree_hash(&src).unwrap();
        let mut tar = Vec::new();
        export_tar(&src, &mut tar).unwrap();
        let store = crate::LayerStore::open(&base.join("store")).unwrap();
        let id = store
            .import_tar(&tar[..], crate::TarFlavor::Overlay, &mut |_| {})
            .unwrap();
        assert_eq!(id.tree_hash(), before);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
