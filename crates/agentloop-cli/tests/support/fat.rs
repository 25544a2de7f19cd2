//! A file system that ignores case, as macOS's and Windows' do, of a test's own: a FAT image
//! mounted with Debian's `fusefat` (FUSE, from a file in a temporary folder; no loop device),
//! which `scripts/fat/install.sh` installs with `mkfs.vfat`. There `AGENT.TOML` opens
//! `agent.toml`, with an inode number of its own; FAT keeps no permissions. fusefat does not
//! truncate a file opened to be written over (`std::fs::write` of a shorter text leaves the old
//! tail): a test removes a file before writing it anew.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A FAT image mounted with `fusefat` in a temporary folder, unmounted when dropped.
pub(crate) struct FatMount {
    dir: tempfile::TempDir,
}

impl FatMount {
    /// The mount, or why this machine cannot make one (the test is then skipped).
    pub(crate) fn new() -> Result<FatMount, String> {
        let uid = Command::new("id")
            .arg("-u")
            .output()
            .map_err(|e| e.to_string())?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            return Err("not root (fusefat mounts as root here)".into());
        }
        if !Path::new("/dev/fuse").exists() {
            return Err("no /dev/fuse".into());
        }
        let fusefat = program("fusefat").ok_or("no fusefat (scripts/fat/install.sh)")?;
        let mkfs = program("mkfs.vfat").ok_or("no mkfs.vfat (scripts/fat/install.sh)")?;
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fat.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        run(Command::new(mkfs).arg(&image));
        let mount = dir.path().join("mnt");
        let out = Command::new(fusefat)
            .args(["-o", "rw+"])
            .arg(&image)
            .arg(&mount)
            .output()
            .map_err(|e| format!("fusefat: {e}"))?;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if !mounts.contains(&format!(" {} ", mount.display())) {
            // No FUSE mount allowed here (a container without the capability, say).
            return Err(format!("fusefat could not mount: {out:?}"));
        }
        Ok(FatMount { dir })
    }

    /// A folder beside the mount, on the machine's own file system.
    pub(crate) fn stores(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// The mounted folder.
    pub(crate) fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for FatMount {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(self.path())
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            // Still busy (a process of the test's agent not yet gone): detached now, unmounted
            // when it lets go.
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
    }
}

/// The program `name` on `PATH` or in the system's `sbin` folders.
fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Runs `command`, which must succeed.
fn run(command: &mut Command) {
    let out = command.output().unwrap();
    assert!(out.status.success(), "{command:?}: {out:?}");
}
