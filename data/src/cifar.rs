//! CIFAR-10 in the `cifar-10-batches-bin` layout: records of 1 label byte and 3072 pixel bytes
//! (1024 red, 1024 green, 1024 blue, each 32×32 row-major).

use std::path::Path;

use crate::ImageSet;
use crate::error::DataError;

const RECORD: usize = 1 + 3 * 32 * 32;

/// Reads one batch file (`data_batch_N.bin`, `test_batch.bin`).
pub fn read_cifar_batch(path: &Path) -> Result<ImageSet, DataError> {
    let bytes = std::fs::read(path).map_err(|cause| DataError::Io { path: path.into(), cause })?;
    if bytes.is_empty() {
        return Err(DataError::format(path, "empty file: not a CIFAR-10 batch"));
    }
    if bytes.len() % RECORD != 0 {
        return Err(DataError::format(
            path,
            format!(
                "truncated or not CIFAR-10: {} bytes is not a whole number of {RECORD}-byte records ({} full records and {} bytes over)",
                bytes.len(),
                bytes.len() / RECORD,
                bytes.len() % RECORD
            ),
        ));
    }
    let n = bytes.len() / RECORD;
    let mut labels = Vec::with_capacity(n);
    let mut images = Vec::with_capacity(n * (RECORD - 1));
    for (i, rec) in bytes.chunks(RECORD).enumerate() {
        if rec[0] > 9 {
            return Err(DataError::format(
                path,
                format!("record {i} has label {} (CIFAR-10 labels are 0..9)", rec[0]),
            ));
        }
        labels.push(rec[0]);
        images.extend_from_slice(&rec[1..]);
    }
    Ok(ImageSet { images, labels, channels: 3, height: 32, width: 32, classes: 10 })
}

/// Reads the training (`data_batch_1..5.bin`) or test (`test_batch.bin`) set of a
/// `cifar-10-batches-bin` folder.
pub fn read_cifar10(dir: &Path, train: bool) -> Result<ImageSet, DataError> {
    let names: Vec<String> = if train {
        (1..=5).map(|i| format!("data_batch_{i}.bin")).collect()
    } else {
        vec!["test_batch.bin".into()]
    };
    let mut all: Option<ImageSet> = None;
    for name in names {
        let part = read_cifar_batch(&dir.join(name))?;
        all = Some(match all {
            None => part,
            Some(mut a) => {
                a.images.extend(part.images);
                a.labels.extend(part.labels);
                a
            }
        });
    }
    all.ok_or_else(|| DataError::format(dir, "no CIFAR-10 batch files"))
}
