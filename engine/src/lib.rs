//! qdarts-engine: what the search and QAT training share. The epoch loop with the step
//! plugged in ([`epoch`]), losses and gradient utilities ([`grads`]), the config pieces both
//! experiments use ([`config`]), seeded initialisation, and checkpoint file helpers.

pub mod checkpoint;
pub mod config;
pub mod epoch;
pub mod grads;
pub mod inject;
pub mod memory;
pub mod sgd;
pub mod tensors;

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use qdarts_record::RecordError;
use thiserror::Error;

pub use checkpoint::{LoopState, note_epochs_change, start};
pub use config::{ConfigError, InjectSite, NanGuardConfig, NanPolicy, RecordConfig, RunKind};
pub use epoch::{
    EpochRows, EpochTask, Evaluation, LoopEnd, LoopPlan, Progress, StepInput, StepOutcome,
    cosine_lr, run_epochs,
};
pub use inject::NanInjection;
pub use qdarts_ops::seeded;
pub use sgd::Sgd;

/// Why a search or training run stopped.
#[derive(Debug, Error)]
pub enum RunError {
    /// Bad config.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Bad data.
    #[error(transparent)]
    Data(#[from] qdarts_data::DataError),
    /// Run folder trouble.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// A quantization spec that does not fit the network.
    #[error("quantization: {0}")]
    Quant(#[from] qdarts_ops::quant::SpecError),
    /// A genotype that cannot be derived, read or built.
    #[error(transparent)]
    Genotype(#[from] qdarts_genotypes::GenotypeError),
    /// A genotype file or name that cannot be used.
    #[error("genotype {path}: {message}")]
    GenotypeSource {
        /// The file, folder or name.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A run that cannot fit in memory, refused before it allocates.
    #[error("{0}")]
    Memory(String),
    /// A checkpoint that cannot be written or read.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A value read back from the device could not be converted.
    #[error("reading {what} back from the device: {message}")]
    ReadBack {
        /// What was read.
        what: String,
        /// What went wrong.
        message: String,
    },
    /// Too many non-finite values.
    #[error("aborted after {0} steps with non-finite values (see nan_events.csv)")]
    NanAbort(usize),
    /// The NaN guard skipped every step: nothing was trained.
    #[error("the NaN guard skipped all {0} steps: nothing was trained (see nan_events.csv)")]
    NothingTrained(usize),
}

/// Keeps the first `limit` images of `set` (0: all); a limit beyond the set is an error naming
/// `key`.
pub fn apply_limit(
    set: &mut qdarts_data::ImageSet,
    limit: usize,
    key: &str,
) -> Result<(), ConfigError> {
    if limit > set.len() {
        return Err(ConfigError::invalid(
            Path::new("config"),
            key,
            format!("is {limit}, more than the {} images of the set (0 uses them all)", set.len()),
        ));
    }
    if limit > 0 {
        set.truncate(limit);
    }
    Ok(())
}

/// A checkpoint error on `path`.
pub fn checkpoint_error(path: &Path, e: impl std::fmt::Display) -> RunError {
    RunError::Checkpoint { path: path.into(), message: e.to_string() }
}

/// The values of a tensor as `f32`, or an error naming `what` (a failed read-back must not
/// turn into an empty vector).
pub fn read_f32<const D: usize>(
    t: burn::tensor::Tensor<D>,
    what: &str,
) -> Result<Vec<f32>, RunError> {
    t.try_to_vec_as::<f32>()
        .map_err(|e| RunError::ReadBack { what: what.into(), message: format!("{e:?}") })
}

/// Saves a module as a checkpoint file.
pub fn save_module<M: Module>(module: &M, path: &Path) -> Result<(), RunError> {
    module.clone().save_file(path).map_err(|e| checkpoint_error(path, e))
}

/// Loads a checkpoint file into a module of the same structure.
pub fn load_module<M: Module>(module: M, path: &Path) -> Result<M, RunError> {
    module.try_load_file(path).map_err(|e| checkpoint_error(path, e))
}

/// Saves an optimizer's state as a checkpoint file.
pub fn save_optim(optim: &ModuleOptimizer, path: &Path) -> Result<(), RunError> {
    optim.save(path).map_err(|e| checkpoint_error(path, e))
}

/// Loads an optimizer's state from a checkpoint file.
pub fn load_optim(optim: ModuleOptimizer, path: &Path) -> Result<ModuleOptimizer, RunError> {
    optim.load(path).map_err(|e| checkpoint_error(path, e))
}
