//! The permission store's file: the "always" answers a person gave, kept as JSON
//! (`{"rules": [...]}`) so that later runs ask nobody again. The core's store decides; this file
//! only remembers. A save writes a temporary file of its own and renames it over the store, so a
//! crash never leaves a half-written file and two processes saving at once never mix their bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agentloop::{Permission, PermissionRule, PermissionStore, PermissionStoreError, SaveRules};
use serde::{Deserialize, Serialize};

#[derive(Debug, Default, Serialize, Deserialize)]
struct SavedRules {
    rules: Vec<PermissionRule>,
}

/// Saves a store's rules to its file.
#[derive(Debug)]
pub struct RulesFile {
    path: PathBuf,
}

/// Opens the store kept in `path` (empty when the file does not exist yet).
pub fn open(
    path: impl AsRef<Path>,
    fallback: Permission,
) -> Result<PermissionStore, PermissionStoreError> {
    let path = path.as_ref().to_path_buf();
    let rules = match std::fs::read_to_string(&path) {
        Ok(text) => {
            serde_json::from_str::<SavedRules>(&text)
                .map_err(|e| error(&path, e.to_string()))?
                .rules
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(error(&path, e.to_string())),
    };
    Ok(PermissionStore::with_saved(
        rules,
        fallback,
        Arc::new(RulesFile { path }),
    ))
}

fn error(path: &Path, message: String) -> PermissionStoreError {
    PermissionStoreError {
        path: path.display().to_string(),
        message,
    }
}

impl SaveRules for RulesFile {
    fn save(&self, rules: &[PermissionRule]) -> Result<(), PermissionStoreError> {
        static SAVES: AtomicU64 = AtomicU64::new(0);
        let path = &self.path;
        let text = serde_json::to_string_pretty(&SavedRules {
            rules: rules.to_vec(),
        })
        .map_err(|e| error(path, e.to_string()))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| error(path, e.to_string()))?;
        }
        // A temporary name of this process and this save only: concurrent savers never write
        // into each other's file, and the rename replaces the store whole.
        let n = SAVES.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp.{}.{n}", std::process::id()));
        std::fs::write(&tmp, text).map_err(|e| error(path, e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            error(path, e.to_string())
        })
    }
}
