//! qdarts-train: what happens to a genotype after the search. Its evaluation network (pt.darts'
//! `AugmentCNN`, fake-quantized: [`network`]), quantization-aware training of it as a step of
//! the shared epoch loop ([`run`]), freezing the trained network into an integer-only model
//! ([`freeze`]), and the report that checks the two agree ([`eval`]).

pub mod config;
pub mod eval;
pub mod freeze;
pub mod memory;
pub mod network;
pub mod run;

pub use config::TrainConfig;
pub use run::{
    PreparedTrain, TrainedRun, eval_shape, evaluate, open_trained, prepare_train, resolve_genotype,
    run_train_in, run_train_prepared, test_set,
};
