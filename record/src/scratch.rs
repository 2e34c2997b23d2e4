//! Scratch folders for the workspace's tests, which write run folders, checkpoints and sweeps
//! to disk: `<temp>/qdarts-tests/<pid>/<label>`.
//!
//! A test that fails leaves its folder for a look; one that passes may leave it too (many hand
//! a folder to the binary and never see it again). So the first scratch folder a process asks
//! for removes the folders of earlier test processes that have ended, and a run of the tests
//! leaves at most its own behind, not every run's.

use std::path::{Path, PathBuf};
use std::sync::Once;

use crate::run_dir::alive;

/// Where every test process keeps its scratch folders, one folder per process id.
pub fn scratch_root() -> PathBuf {
    std::env::temp_dir().join("qdarts-tests")
}

/// An empty folder `<temp>/qdarts-tests/<pid>/<label>` (emptied if it was there, so a label
/// belongs to one test: tests run at once). The first call in a process removes the folders of
/// test processes that have ended (Linux, where `/proc` tells; elsewhere nothing is removed).
///
/// # Panics
/// When the folder cannot be made: a test cannot go on without it.
pub fn scratch(label: &str) -> PathBuf {
    let d = scratch_path(label);
    std::fs::create_dir_all(&d).expect("a scratch folder under the temp dir");
    d
}

/// [`scratch`]'s path with nothing there yet, for a test that checks what makes it.
pub fn scratch_path(label: &str) -> PathBuf {
    static SWEEP: Once = Once::new();
    let root = scratch_root();
    SWEEP.call_once(|| sweep_ended(&root));
    let d = root.join(std::process::id().to_string()).join(label);
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Removes `root/<pid>` for every pid that no longer runs.
fn sweep_ended(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if pid != std::process::id() && cfg!(target_os = "linux") && !alive(pid) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A test that needs a tool it did not find (Python with a package, graphviz, a tmpfs): a note
/// on standard error where the tool may be missing, and a panic under `CI=true`, where
/// `.ci/run` installs every tool, so that a check never passes there by not running.
///
/// # Panics
/// Under `CI=true`.
pub fn tool_missing(what: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true, but {what}: .ci/run installs it, so this check must run");
    }
    eprintln!("note: {what}; the check is skipped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_process_s_folder_goes_and_a_running_one_s_stays() {
        let root =
            std::env::temp_dir().join(format!("qdarts-scratch-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        // pid 1 always runs; a pid above Linux's limit (2^22) never does.
        for pid in ["1", "4194305", "not-a-pid"] {
            std::fs::create_dir_all(root.join(pid).join("run")).unwrap();
        }
        sweep_ended(&root);
        assert!(root.join("1/run").is_dir());
        assert!(root.join("not-a-pid/run").is_dir());
        assert_eq!(root.join("4194305").exists(), !cfg!(target_os = "linux"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_scratch_folder_is_empty_and_the_process_s_own() {
        let d = scratch("scratch-self");
        std::fs::write(d.join("f"), "x").unwrap();
        let again = scratch("scratch-self");
        assert_eq!(d, again);
        assert_eq!(std::fs::read_dir(&again).unwrap().count(), 0);
        assert!(d.starts_with(scratch_root().join(std::process::id().to_string())));
        std::fs::remove_dir_all(d).unwrap();
    }
}
