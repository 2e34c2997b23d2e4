//! Errors of the dataset readers: each names the file and what is wrong with it.

use std::path::PathBuf;

use thiserror::Error;

/// A dataset file that cannot be used.
#[derive(Debug, Error)]
pub enum DataError {
    /// The file could not be read.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// The file is not in the expected format.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Images of a size the network cannot take.
    #[error("{dataset}: {message}")]
    Shape {
        /// The dataset (its folder, or the embedded subset).
        dataset: String,
        /// What is wrong.
        message: String,
    },
    /// Images and labels disagree.
    #[error("{images} has {n_images} images but {labels} has {n_labels} labels")]
    Mismatch {
        /// Image file.
        images: PathBuf,
        /// Number of images.
        n_images: usize,
        /// Label file.
        labels: PathBuf,
        /// Number of labels.
        n_labels: usize,
    },
}

impl DataError {
    pub(crate) fn format(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        DataError::Format { path: path.into(), message: message.into() }
    }
}
