//! Writing inside the destination without following symbolic links. The destination directory
//! itself (`--dest`, the mounted volume) may be reached through links the operator chose; below
//! it, every path staging creates, opens, renames or removes is relative and checked component
//! by component: a symbolic link anywhere below `--dest` is refused with an error naming it,
//! directories are created one level at a time (never through a link), and files are opened
//! with `O_NOFOLLOW`. Staging never creates links, so whatever link it finds was planted.
//! A link swapped in between a check and the `O_NOFOLLOW` open (a concurrent writer on the
//! volume) is out of scope: the volume belongs to the Job while it runs.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::error::StageError;

/// Refuses `rel` (relative to `dest`) when any existing component of it, the last included, is
/// a symbolic link; components that do not exist yet are fine. Returns `dest/rel`.
pub async fn check(dest: &Path, rel: &Path) -> Result<PathBuf, StageError> {
    let mut cur = dest.to_path_buf();
    for part in rel.components() {
        cur.push(part);
        match tokio::fs::symlink_metadata(&cur).await {
            Ok(meta) if meta.file_type().is_symlink() => return Err(StageError::Symlink { path: display(&cur) }),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(dest.join(rel)),
            Err(e) => return Err(StageError::storage(&cur, e)),
        }
    }
    Ok(cur)
}

/// Creates `dest` (following whatever links lead to it) and then every directory of `rel_dir`
/// below it, one level at a time, refusing a component that is a link or not a directory.
/// Returns `dest/rel_dir`.
pub async fn create_dirs(dest: &Path, rel_dir: &Path) -> Result<PathBuf, StageError> {
    tokio::fs::create_dir_all(dest).await.map_err(|e| StageError::storage(dest, e))?;
    let mut cur = dest.to_path_buf();
    for part in rel_dir.components() {
        cur.push(part);
        // mkdir never follows a link in its last component: an existing link is EEXIST.
        match tokio::fs::create_dir(&cur).await {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => return Err(StageError::storage(&cur, e)),
            _ => {}
        }
        let meta = tokio::fs::symlink_metadata(&cur).await.map_err(|e| StageError::storage(&cur, e))?;
        if meta.file_type().is_symlink() {
            return Err(StageError::Symlink { path: display(&cur) });
        }
        if !meta.is_dir() {
            let e = std::io::Error::new(ErrorKind::NotADirectory, "exists and is not a directory");
            return Err(StageError::storage(&cur, e));
        }
    }
    Ok(cur)
}

/// Opens `path` for writing without following a link in its last component (`O_NOFOLLOW`):
/// appending, truncating, or creating it only if it does not exist (`create_new`).
pub async fn open_write(path: &Path, mode: Mode) -> Result<tokio::fs::File, StageError> {
    let mut options = tokio::fs::OpenOptions::new();
    options.write(true);
    match mode {
        Mode::Append => options.create(true).append(true),
        Mode::Truncate => options.create(true).truncate(true),
        Mode::New => options.create_new(true),
    };
    #[cfg(unix)]
    options.custom_flags(libc::O_NOFOLLOW);
    options.open(path).await.map_err(|e| match e.raw_os_error() {
        #[cfg(unix)]
        Some(libc::ELOOP) => StageError::Symlink { path: display(path) },
        _ => StageError::storage(path, e),
    })
}

/// Opens `path` for reading without following a link in its last component.
pub fn open_read(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NOFOLLOW);
    options.open(path)
}

/// How [`open_write`] treats an existing file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Keep it and write at its end.
    Append,
    /// Empty it first.
    Truncate,
    /// Fail if it exists.
    New,
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn links_below_the_destination_are_refused_and_nothing_is_created_through_them() {
        let root = tempfile::tempdir().unwrap();
        let (dest, outside) = (root.path().join("dest"), root.path().join("outside"));
        std::fs::create_dir_all(dest.join("real")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, dest.join("link")).unwrap();

        assert_eq!(create_dirs(&dest, Path::new("real/a/b")).await.unwrap(), dest.join("real/a/b"));
        assert!(dest.join("real/a/b").is_dir());
        check(&dest, Path::new("real/a/b/not-yet")).await.unwrap();
        for rel in ["link", "link/a", "link/a/b"] {
            let e = create_dirs(&dest, Path::new(rel)).await.unwrap_err();
            assert!(matches!(&e, StageError::Symlink { path } if path.ends_with("dest/link")), "{rel}: {e}");
            let e = check(&dest, Path::new(rel)).await.unwrap_err();
            assert!(matches!(e, StageError::Symlink { .. }), "{rel}");
        }
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing was created outside");

        std::fs::write(outside.join("f"), b"keep").unwrap();
        std::os::unix::fs::symlink(outside.join("f"), dest.join("f")).unwrap();
        for mode in [Mode::Append, Mode::Truncate, Mode::New] {
            let e = open_write(&dest.join("f"), mode).await.unwrap_err();
            assert!(matches!(e, StageError::Symlink { .. } | StageError::Storage { .. }), "{mode:?}: {e}");
        }
        assert!(matches!(open_write(&dest.join("f"), Mode::Truncate).await, Err(StageError::Symlink { .. })));
        assert!(open_read(&dest.join("f")).is_err());
        assert_eq!(std::fs::read(outside.join("f")).unwrap(), b"keep");
    }
}
