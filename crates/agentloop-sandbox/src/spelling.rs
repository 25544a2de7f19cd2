//! The other spellings of a writable root on a file system that ignores case through FUSE
//! (FAT in `fusefat`, sshfs or rclone over such a disk, ...). There the kernel does not fold
//! case itself: each spelling of a name is a dentry and an inode of its own, so a mount put over
//! the root as written (the read-only view's copy) and a Landlock rule on it cover that spelling
//! alone. A program that walks its folder finds the root under the name the folder lists (`Work`
//! for a root written `work`) and, through it, would land on the read-only view. So the root is
//! also granted under the spellings a listing shows; any other spelling stays refused, which
//! refuses more, never less. A file system that folds case in the kernel (ext4's and tmpfs's
//! `casefold`) has one dentry for every spelling and needs none of this.

use std::ffi::{OsStr, OsString};
use std::path::{Component, Path, PathBuf};

/// The most components spelled otherwise than listed whose spellings are combined (2^N paths);
/// past it only the path as listed is added.
const MOST_COMBINED: usize = 3;

/// The spellings of `root` (a canonical path) other than its own that lead to the same folder:
/// each of its components as written or as its folder lists it, in every combination (the
/// agent's folder as written with the root as listed, the whole path as listed, ...). Empty on
/// a file system that tells case apart, where every component is listed as written.
pub(crate) fn other_spellings(root: &Path) -> Vec<PathBuf> {
    let mut choices: Vec<(OsString, Option<OsString>)> = Vec::new();
    let mut walked = PathBuf::new();
    for component in root.components() {
        match component {
            Component::RootDir => walked.push(component),
            Component::Normal(name) => {
                choices.push((name.to_os_string(), listed_name(&walked, name)));
                walked.push(name);
            }
            // Not a canonical path: nothing to add.
            _ => return Vec::new(),
        }
    }
    let differing = choices
        .iter()
        .filter(|(_, listed)| listed.is_some())
        .count();
    let combinations: Vec<u32> = match differing {
        0 => Vec::new(),
        n if n <= MOST_COMBINED => (1..1u32 << n).collect(),
        n => vec![(1u32 << n.min(31)) - 1],
    };
    combinations
        .into_iter()
        .map(|mask| {
            let mut path = PathBuf::from("/");
            let mut nth = 0;
            for (given, listed) in &choices {
                match listed {
                    Some(listed) => {
                        path.push(if mask & (1 << nth) != 0 {
                            listed
                        } else {
                            given
                        });
                        nth += 1;
                    }
                    None => path.push(given),
                }
            }
            path
        })
        // The same folder, reached without a link: a name that now leads elsewhere is left.
        .filter(|path| path.is_dir() && std::fs::canonicalize(path).is_ok_and(|c| c == *path))
        .collect()
}

/// How the folder `parent` lists `name` when it does not list it as written but the file system
/// found it: the one entry equal to it but for case. `None` where it is listed as written, where
/// no other spelling of it is found at all (a file system that tells case apart: one lookup, no
/// listing read), and where two entries would fit (then the file system tells them apart).
fn listed_name(parent: &Path, name: &OsStr) -> Option<OsString> {
    let given = name.to_str()?;
    let swapped = swapped_case(given)?;
    if std::fs::symlink_metadata(parent.join(&swapped)).is_err() {
        return None;
    }
    let folded = given.to_lowercase();
    let mut found = None;
    for entry in std::fs::read_dir(parent).ok()? {
        let entry = entry.ok()?.file_name();
        if entry == name {
            return None;
        }
        if entry.to_str().is_some_and(|e| e.to_lowercase() == folded) {
            if found.is_some() {
                return None;
            }
            found = Some(entry);
        }
    }
    found
}

/// The other spelling that shows the file system ignores case at `path`: `path`'s name with
/// each letter's case swapped (`AGENT.TOML` for `agent.toml`), when a look-up finds it though
/// the folder lists no entry of that name. `None` where the file system tells case apart (the
/// look-up fails, or finds another file the folder lists), where the name has no letter with
/// another case, and where the folder cannot be read (nothing can be told there).
///
/// A kernel that folds case itself (ext4's and tmpfs's `casefold`) answers as FUSE does: which
/// of them binds every spelling at once cannot be seen from here, so a caller that needs every
/// spelling kept refuses both.
///
/// ```
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("agent.toml"), "")?;
/// // The temporary folder's file system tells case apart on Linux.
/// # #[cfg(target_os = "linux")]
/// assert_eq!(agentloop_sandbox::case_ignored_at(&dir.path().join("agent.toml")), None);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn case_ignored_at(path: &Path) -> Option<OsString> {
    let (folder, name) = (path.parent()?, path.file_name()?.to_str()?);
    let swapped = swapped_case(name)?;
    std::fs::symlink_metadata(folder.join(&swapped)).ok()?;
    let mut entries = std::fs::read_dir(folder).ok()?;
    let listed = entries.any(|e| e.is_ok_and(|e| e.file_name() == swapped.as_str()));
    (!listed).then(|| swapped.into())
}

/// `name` with each letter's case swapped, or `None` when that changes nothing (no letter with
/// another case).
fn swapped_case(name: &str) -> Option<String> {
    let swapped: String = name
        .chars()
        .map(|c| {
            if c.is_uppercase() {
                c.to_lowercase().to_string()
            } else {
                c.to_uppercase().to_string()
            }
        })
        .collect();
    (swapped != name).then_some(swapped)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_file_system_that_tells_case_apart_gives_no_other_spelling() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap().join("Work");
        std::fs::create_dir(&root).unwrap();
        // Another folder under the swapped spelling is another folder, not the root's name.
        std::fs::create_dir(root.with_file_name("wORK")).unwrap();
        assert!(other_spellings(&root).is_empty());
        assert!(other_spellings(Path::new("/")).is_empty());
    }
}
