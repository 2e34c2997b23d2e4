//! Checkpoint checksums: every checkpoint folder carries `checksums.json`, the size and
//! SHA-256 of each of its files as read back from disk, written after the files, and checked
//! before a resume loads the folder (and before a swap keeps the one it replaces). A checkpoint that does not
//! verify (a file cut short by a full disk, a copy interrupted, a flipped byte) is never
//! loaded; `--resume` falls back to the one before it ([`choose_checkpoint`]).

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::layout::{CheckpointPart, RunLayout};
use crate::{RecordError, io_err, write_atomic};

/// The checksum file inside a checkpoint folder.
pub const CHECKSUMS: &str = "checksums.json";

/// One file of a checkpoint as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FileSum {
    name: String,
    bytes: u64,
    sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Checksums {
    files: Vec<FileSum>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `checksums.json` for every file of the checkpoint folder `dir`.
pub fn write_checksums(dir: &Path) -> Result<(), RecordError> {
    let mut names: Vec<String> = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != CHECKSUMS && entry.file_type().map_err(io_err(dir))?.is_file() {
            names.push(name);
        }
    }
    names.sort();
    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let path = dir.join(&name);
        let data = fs::read(&path).map_err(io_err(&path))?;
        files.push(FileSum { name, bytes: data.len() as u64, sha256: sha256_hex(&data) });
    }
    let path = dir.join(CHECKSUMS);
    let json = serde_json::to_vec_pretty(&Checksums { files })
        .map_err(|e| RecordError::Encode { path: path.clone(), message: e.to_string() })?;
    write_atomic(&path, &json)
}

/// How a checkpoint folder checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// Every file has its recorded size and checksum.
    Ok,
    /// A checkpoint written before checksums existed: nothing to check it against.
    Unchecked,
}

/// Checks every file of the checkpoint folder `dir` against its `checksums.json`. The error
/// says which file is wrong and how.
pub fn verify_checkpoint(dir: &Path) -> Result<Verified, String> {
    if !dir.is_dir() {
        return Err("missing".into());
    }
    let path = dir.join(CHECKSUMS);
    let sums: Checksums = match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| format!("{CHECKSUMS} does not parse: {e}"))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Only a checkpoint that has its state can be an old, unchecked one.
            return if CheckpointPart::State.in_dir(dir).is_file() {
                Ok(Verified::Unchecked)
            } else {
                Err(format!("has neither {CHECKSUMS} nor state.json"))
            };
        }
        Err(e) => return Err(format!("{CHECKSUMS}: {e}")),
    };
    if !sums.files.iter().any(|f| f.name == CheckpointPart::State.file_name()) {
        return Err(format!("{CHECKSUMS} lists no state.json"));
    }
    for f in &sums.files {
        let p = dir.join(&f.name);
        let data = fs::read(&p).map_err(|e| format!("{}: {e}", f.name))?;
        if data.len() as u64 != f.bytes {
            return Err(format!("{} has {} bytes, {} were written", f.name, data.len(), f.bytes));
        }
        if sha256_hex(&data) != f.sha256 {
            return Err(format!("{} does not match its checksum", f.name));
        }
    }
    Ok(Verified::Ok)
}

/// A damaged checkpoint passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damaged {
    /// The folder.
    pub dir: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

/// The checkpoint a resume loads, and the newer ones it passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointChoice {
    /// The folder to load (`None`: the run has no usable checkpoint).
    pub dir: Option<PathBuf>,
    /// Newer checkpoints that did not verify, newest first.
    pub damaged: Vec<Damaged>,
}

/// The newest checkpoint of a run that verifies: `checkpoint/`, else `checkpoint.prev/`. A
/// `checkpoint.tmp/` counts only when `checkpoint/` is missing (a process killed between the
/// two renames of a swap) and it verifies with its own checksums. A missing `checkpoint/` is
/// listed as damaged only when `checkpoint.prev/` is used instead.
pub fn choose_checkpoint(run: &RunLayout) -> CheckpointChoice {
    let mut damaged = Vec::new();
    let last = run.checkpoint();
    let mut candidates = Vec::new();
    if !last.exists() {
        let tmp = run.checkpoint_new();
        if verify_checkpoint(&tmp) == Ok(Verified::Ok) {
            candidates.push(tmp);
        }
    }
    candidates.push(last);
    candidates.push(run.checkpoint_prev());
    for dir in candidates {
        if !dir.exists() {
            // A missing last checkpoint is worth a note when an older one is used instead.
            if dir == run.checkpoint() && run.checkpoint_prev().exists() {
                damaged.push(Damaged { dir, reason: "missing".into() });
            }
            continue;
        }
        match verify_checkpoint(&dir) {
            Ok(_) => return CheckpointChoice { dir: Some(dir), damaged },
            Err(reason) => damaged.push(Damaged { dir, reason }),
        }
    }
    CheckpointChoice { dir: None, damaged }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        crate::scratch::scratch(&format!("checksum-{name}"))
    }

    fn checkpoint(dir: &Path, state: &str, net: &[u8]) {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
        fs::write(dir.join("state.json"), state).unwrap_or_else(|e| panic!("{e}"));
        fs::write(dir.join("net.bpk"), net).unwrap_or_else(|e| panic!("{e}"));
        write_checksums(dir).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn every_kind_of_damage_is_named_and_the_previous_checkpoint_is_chosen() {
        let root = scratch("checksums");
        let run = RunLayout::new(&root);
        assert_eq!(choose_checkpoint(&run), CheckpointChoice { dir: None, damaged: vec![] });
        checkpoint(&run.checkpoint_prev(), "{\"step\": 4}", b"older weights");
        checkpoint(&run.checkpoint(), "{\"step\": 7}", b"newer weights");
        assert_eq!(verify_checkpoint(&run.checkpoint()), Ok(Verified::Ok));
        assert_eq!(choose_checkpoint(&run).dir, Some(run.checkpoint()));

        let net = run.checkpoint().join("net.bpk");
        let cases: [(&[u8], &str); 3] = [
            (b"newer", "net.bpk has 5 bytes, 13 were written"),
            (b"newer weighTs", "net.bpk does not match its checksum"),
            (b"newer weights", ""),
        ];
        for (bytes, want) in cases {
            fs::write(&net, bytes).unwrap_or_else(|e| panic!("{e}"));
            let choice = choose_checkpoint(&run);
            if want.is_empty() {
                assert_eq!(choice.dir, Some(run.checkpoint()));
            } else {
                assert_eq!(choice.dir, Some(run.checkpoint_prev()), "{want}");
                assert_eq!(choice.damaged.len(), 1);
                assert!(choice.damaged[0].reason.contains(want), "{:?}", choice.damaged);
            }
        }
        fs::remove_file(&net).unwrap_or_else(|e| panic!("{e}"));
        assert!(verify_checkpoint(&run.checkpoint()).unwrap_err().starts_with("net.bpk: "));
        fs::write(run.checkpoint().join(CHECKSUMS), "{").unwrap_or_else(|e| panic!("{e}"));
        assert!(verify_checkpoint(&run.checkpoint()).unwrap_err().contains("does not parse"));

        // A checkpoint from before checksums: accepted unchecked; a folder with neither file
        // is damaged.
        fs::remove_file(run.checkpoint().join(CHECKSUMS)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(verify_checkpoint(&run.checkpoint()), Ok(Verified::Unchecked));
        fs::remove_file(run.checkpoint().join("state.json")).unwrap_or_else(|e| panic!("{e}"));
        assert!(verify_checkpoint(&run.checkpoint()).is_err());

        // Killed between the two renames of a swap: a complete `checkpoint.tmp` is the newest.
        fs::remove_dir_all(run.checkpoint()).unwrap_or_else(|e| panic!("{e}"));
        checkpoint(&run.checkpoint_new(), "{\"step\": 8}", b"newest weights");
        assert_eq!(choose_checkpoint(&run).dir, Some(run.checkpoint_new()));
        // ... but not one cut short before its checksums were written.
        fs::remove_file(run.checkpoint_new().join(CHECKSUMS)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(choose_checkpoint(&run).dir, Some(run.checkpoint_prev()));
        let _ = fs::remove_dir_all(&root);
    }
}
