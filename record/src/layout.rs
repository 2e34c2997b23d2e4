//! Where each file of a run folder lives. This is the one place that spells the names: the
//! search and training loops write through it, the dashboard and the commands read through it.
//!
//! ```text
//! results/<run>/
//!   config.toml  plan.json  lock  debug.log  eval.json
//!   metrics.csv  nan_events.csv  quant_error.csv  alphas.csv  genotypes.csv
//!   genotype.json  genotype.txt
//!   checkpoint/  state.json  net.bpk  alphas.bpk  w_optim.bpk  a_optim.bpk  optim.bpk
//!                checksums.json
//!   checkpoint.prev/  the checkpoint before, kept until the next one is complete
//!   frozen/      model.qdf  model.onnx  predictions.csv
//! ```

use std::path::{Path, PathBuf};

use crate::rows::Table;

const CONFIG: &str = "config.toml";
const PLAN: &str = "plan.json";
const LOCK: &str = "lock";
const DEBUG_LOG: &str = "debug.log";
const EVAL_REPORT: &str = "eval.json";
const GENOTYPE_JSON: &str = "genotype.json";
const GENOTYPE_TEXT: &str = "genotype.txt";
const CHECKPOINT: &str = "checkpoint";
const CHECKPOINT_NEW: &str = "checkpoint.tmp";
const CHECKPOINT_PREV: &str = "checkpoint.prev";
const FROZEN: &str = "frozen";
const FROZEN_MODEL: &str = "model.qdf";
const ONNX_MODEL: &str = "model.onnx";
const PREDICTIONS: &str = "predictions.csv";

/// A file inside a checkpoint folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointPart {
    /// The loop's position and counters (JSON).
    State,
    /// The network's weights, BatchNorm and observer state.
    Net,
    /// The architecture parameters (search).
    Alphas,
    /// The weight optimizer (search).
    WeightOptim,
    /// The architecture optimizer (search).
    AlphaOptim,
    /// The optimizer (training).
    Optim,
    /// The decisions of a perturbation-based selection so far (search; JSON).
    Selection,
}

impl CheckpointPart {
    /// The file name.
    pub fn file_name(self) -> &'static str {
        match self {
            CheckpointPart::State => "state.json",
            CheckpointPart::Net => "net.bpk",
            CheckpointPart::Alphas => "alphas.bpk",
            CheckpointPart::WeightOptim => "w_optim.bpk",
            CheckpointPart::AlphaOptim => "a_optim.bpk",
            CheckpointPart::Optim => "optim.bpk",
            CheckpointPart::Selection => "selection.json",
        }
    }

    /// The part's path inside the checkpoint folder `dir`.
    pub fn in_dir(self, dir: &Path) -> PathBuf {
        dir.join(self.file_name())
    }
}

/// The paths of a run folder, for readers and writers alike (no lock is taken: see
/// [`crate::RunDir`] for the writer's handle).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLayout {
    root: PathBuf,
}

impl RunLayout {
    /// The layout of the run folder `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        RunLayout { root: root.into() }
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `config.toml`: the resolved config of the run.
    pub fn config(&self) -> PathBuf {
        self.root.join(CONFIG)
    }

    /// `plan.json`: epochs and steps, for progress readers.
    pub fn plan(&self) -> PathBuf {
        self.root.join(PLAN)
    }

    /// `lock`: the pid of the process writing the run.
    pub fn lock(&self) -> PathBuf {
        self.root.join(LOCK)
    }

    /// `debug.log`: what a search under the dashboard would otherwise print.
    pub fn debug_log(&self) -> PathBuf {
        self.root.join(DEBUG_LOG)
    }

    /// `eval.json`: the report of `qdarts eval`.
    pub fn eval_report(&self) -> PathBuf {
        self.root.join(EVAL_REPORT)
    }

    /// `genotype.json`: the final genotype (search) or the trained one (training).
    pub fn genotype_json(&self) -> PathBuf {
        self.root.join(GENOTYPE_JSON)
    }

    /// `genotype.txt`: the same genotype in DARTS text.
    pub fn genotype_text(&self) -> PathBuf {
        self.root.join(GENOTYPE_TEXT)
    }

    /// One of the CSV tables.
    pub fn table<T: Table>(&self) -> PathBuf {
        self.root.join(T::FILE)
    }

    /// `checkpoint/`: the last complete checkpoint.
    pub fn checkpoint(&self) -> PathBuf {
        self.root.join(CHECKPOINT)
    }

    /// A file of the last complete checkpoint.
    pub fn checkpoint_part(&self, part: CheckpointPart) -> PathBuf {
        part.in_dir(&self.checkpoint())
    }

    /// `checkpoint.tmp/`: a checkpoint being written.
    pub fn checkpoint_new(&self) -> PathBuf {
        self.root.join(CHECKPOINT_NEW)
    }

    /// `checkpoint.prev/`: the checkpoint before the last, the fallback when the last one
    /// does not verify.
    pub fn checkpoint_prev(&self) -> PathBuf {
        self.root.join(CHECKPOINT_PREV)
    }

    /// `frozen/`: the integer model and its exports.
    pub fn frozen_dir(&self) -> PathBuf {
        self.root.join(FROZEN)
    }

    /// `frozen/model.qdf`: the integer-only model.
    pub fn frozen_model(&self) -> PathBuf {
        self.frozen_dir().join(FROZEN_MODEL)
    }

    /// `frozen/model.onnx`: its ONNX QDQ export.
    pub fn onnx_model(&self) -> PathBuf {
        self.frozen_dir().join(ONNX_MODEL)
    }

    /// `frozen/predictions.csv`: per-image predictions of `qdarts eval`.
    pub fn predictions(&self) -> PathBuf {
        self.frozen_dir().join(PREDICTIONS)
    }

    /// Whether the folder looks like a run: a config, a metrics table or a lock.
    pub fn looks_like_run(&self) -> bool {
        [self.config(), self.table::<crate::MetricsRow>(), self.lock()].iter().any(|p| p.exists())
    }
}
