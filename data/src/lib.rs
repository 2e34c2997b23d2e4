//! qdarts-data: the datasets of a search or training run. Readers for IDX (MNIST,
//! Fashion-MNIST) and CIFAR-10 binary files, the embedded Fashion-MNIST subset, the DARTS
//! train/validation split, normalized and augmented batches, and the seeded generator whose
//! state a checkpoint carries.

mod cifar;
mod error;
mod idx;
mod rng;

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

pub use cifar::{read_cifar_batch, read_cifar10};
pub use error::DataError;
pub use idx::{IdxArray, parse_idx, read_idx_file};

pub use rng::Rng;

/// Images as bytes, `[N, C, H, W]` row-major, with their labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSet {
    /// Pixel bytes.
    pub images: Vec<u8>,
    /// Class labels.
    pub labels: Vec<u8>,
    /// Channels.
    pub channels: usize,
    /// Height.
    pub height: usize,
    /// Width.
    pub width: usize,
    /// Number of classes.
    pub classes: usize,
}

impl ImageSet {
    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no images.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Bytes per image.
    pub fn image_size(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// Checks that both sides are multiples of `2^reductions`, as a network whose reduction
    /// cells halve the resolution that many times needs (an odd side would give two states of
    /// different sizes to add or concatenate); `source` names the dataset in the error.
    pub fn check_reducible(&self, source: &str, reductions: u32) -> Result<(), DataError> {
        let m = 1usize << reductions;
        let (h, w) = (self.height, self.width);
        if h == 0 || w == 0 || !h.is_multiple_of(m) || !w.is_multiple_of(m) {
            return Err(DataError::Shape {
                dataset: source.into(),
                message: format!(
                    "images of {h}×{w}: the network halves the resolution {reductions} times, so \
                     height and width must be multiples of {m} (crop or pad the images)"
                ),
            });
        }
        Ok(())
    }

    /// Checks that `other` (a test set) has this set's image shape.
    pub fn check_same_shape(&self, other: &ImageSet, source: &str) -> Result<(), DataError> {
        let a = (self.channels, self.height, self.width);
        let b = (other.channels, other.height, other.width);
        if a != b {
            return Err(DataError::Shape {
                dataset: source.into(),
                message: format!(
                    "training images are {}×{}×{} but test images are {}×{}×{}",
                    a.0, a.1, a.2, b.0, b.1, b.2
                ),
            });
        }
        Ok(())
    }

    /// Keeps the first `n` images.
    pub fn truncate(&mut self, n: usize) {
        let n = n.min(self.len());
        self.labels.truncate(n);
        self.images.truncate(n * self.image_size());
    }
}

/// A dataset the search knows how to read and normalize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DatasetKind {
    /// Fashion-MNIST (IDX); without a folder, the embedded subset.
    FashionMnist,
    /// MNIST (IDX).
    Mnist,
    /// CIFAR-10 (`cifar-10-batches-bin`).
    Cifar10,
}

impl DatasetKind {
    /// Per-channel mean and standard deviation of the training set (pt.darts' constants).
    pub fn normalization(self) -> (&'static [f32], &'static [f32]) {
        match self {
            DatasetKind::FashionMnist => (&[0.28604063], &[0.35302424]),
            DatasetKind::Mnist => (&[0.130_660_5], &[0.308_107_8]),
            DatasetKind::Cifar10 => {
                (&[0.49139968, 0.48215827, 0.44653124], &[0.24703233, 0.24348505, 0.26158768])
            }
        }
    }

    /// Whether training batches get DARTS' CIFAR augmentation (random crop with 4-pixel zero
    /// padding, horizontal flip). Digits and garments are not flipped.
    pub fn augments(self) -> bool {
        matches!(self, DatasetKind::Cifar10)
    }
}

const EMBEDDED_TRAIN_IMAGES: &[u8] = include_bytes!("../fashion-mnist/train-images-idx3-ubyte.gz");
const EMBEDDED_TRAIN_LABELS: &[u8] = include_bytes!("../fashion-mnist/train-labels-idx1-ubyte.gz");
const EMBEDDED_TEST_IMAGES: &[u8] = include_bytes!("../fashion-mnist/t10k-images-idx3-ubyte.gz");
const EMBEDDED_TEST_LABELS: &[u8] = include_bytes!("../fashion-mnist/t10k-labels-idx1-ubyte.gz");

fn idx_set(
    images: IdxArray,
    labels: IdxArray,
    ipath: &Path,
    lpath: &Path,
) -> Result<ImageSet, DataError> {
    if images.dims.len() != 3 {
        return Err(DataError::format(
            ipath,
            format!("expected [N, H, W] images, dimensions are {:?}", images.dims),
        ));
    }
    if labels.dims.len() != 1 {
        return Err(DataError::format(
            lpath,
            format!("expected [N] labels, dimensions are {:?}", labels.dims),
        ));
    }
    if images.dims[0] != labels.dims[0] {
        return Err(DataError::Mismatch {
            images: ipath.into(),
            n_images: images.dims[0],
            labels: lpath.into(),
            n_labels: labels.dims[0],
        });
    }
    if let Some(i) = labels.data.iter().position(|&l| l > 9) {
        return Err(DataError::format(
            lpath,
            format!("label {} of record {i} is not in 0..9", labels.data[i]),
        ));
    }
    Ok(ImageSet {
        images: images.data,
        labels: labels.data,
        channels: 1,
        height: images.dims[1],
        width: images.dims[2],
        classes: 10,
    })
}

/// The embedded Fashion-MNIST data: the first 10 000 training images and the whole test split
/// (10 000 images).
pub fn embedded(train: bool) -> Result<ImageSet, DataError> {
    let (img, lab, iname, lname) = if train {
        (
            EMBEDDED_TRAIN_IMAGES,
            EMBEDDED_TRAIN_LABELS,
            "train-images-idx3-ubyte.gz",
            "train-labels-idx1-ubyte.gz",
        )
    } else {
        (
            EMBEDDED_TEST_IMAGES,
            EMBEDDED_TEST_LABELS,
            "t10k-images-idx3-ubyte.gz",
            "t10k-labels-idx1-ubyte.gz",
        )
    };
    let (ip, lp) =
        (PathBuf::from("<embedded>").join(iname), PathBuf::from("<embedded>").join(lname));
    idx_set(parse_idx(img, &ip)?, parse_idx(lab, &lp)?, &ip, &lp)
}

fn find(dir: &Path, stem: &str) -> Result<PathBuf, DataError> {
    for name in [format!("{stem}.gz"), stem.to_string()] {
        let p = dir.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(DataError::Io {
        path: dir.join(stem),
        cause: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("neither {stem} nor {stem}.gz exists"),
        ),
    })
}

/// How errors name a dataset: its folder, or the embedded subset.
pub fn source_name(kind: DatasetKind, dir: Option<&Path>) -> String {
    match dir {
        Some(d) => format!("{} ({kind:?})", d.display()),
        None => "the embedded Fashion-MNIST subset".into(),
    }
}

/// Reads the training or test split of a dataset from `dir` (IDX files named as distributed,
/// raw or `.gz`; CIFAR-10 `*.bin` batches), or the embedded subset for Fashion-MNIST when `dir`
/// is `None`.
pub fn load(kind: DatasetKind, dir: Option<&Path>, train: bool) -> Result<ImageSet, DataError> {
    match (kind, dir) {
        (DatasetKind::FashionMnist, None) => embedded(train),
        (_, None) => Err(DataError::format(
            "<no --data>",
            format!("{kind:?} is not embedded: give the folder that holds its files with --data"),
        )),
        (DatasetKind::Cifar10, Some(d)) => read_cifar10(d, train),
        (_, Some(d)) => {
            let prefix = if train { "train" } else { "t10k" };
            let ip = find(d, &format!("{prefix}-images-idx3-ubyte"))?;
            let lp = find(d, &format!("{prefix}-labels-idx1-ubyte"))?;
            idx_set(read_idx_file(&ip)?, read_idx_file(&lp)?, &ip, &lp)
        }
    }
}

/// DARTS' search split: the first half of the training set trains the weights, the second
/// half the architecture (pt.darts `indices[:split]`, `indices[split:]`).
pub fn darts_split(n: usize, train_portion: f64) -> (Vec<usize>, Vec<usize>) {
    let split = ((n as f64) * train_portion).floor() as usize;
    ((0..split).collect(), (split..n).collect())
}

/// Assembles a normalized batch `[B, C, H, W]` and its labels, with augmentation when `rng` is
/// given and the dataset augments.
pub fn batch(
    set: &ImageSet,
    kind: DatasetKind,
    indices: &[usize],
    rng: Option<&mut Rng>,
    device: &Device,
) -> (Tensor<4>, Tensor<1, Int>) {
    batch_cutout(set, kind, indices, rng, 0, device)
}

/// [`batch`], plus DARTS' cutout on augmented batches: a `cutout`×`cutout` square (clipped at
/// the border) centred on a random pixel is set to 0 after normalization (0: off).
pub fn batch_cutout(
    set: &ImageSet,
    kind: DatasetKind,
    indices: &[usize],
    mut rng: Option<&mut Rng>,
    cutout: usize,
    device: &Device,
) -> (Tensor<4>, Tensor<1, Int>) {
    let (c, h, w) = (set.channels, set.height, set.width);
    let size = set.image_size();
    let (mean, std) = kind.normalization();
    let mut out = vec![0f32; indices.len() * size];
    let mut labels = Vec::with_capacity(indices.len());
    for (b, &i) in indices.iter().enumerate() {
        labels.push(set.labels[i] as i64);
        let img = &set.images[i * size..(i + 1) * size];
        // Random crop with 4 pixels of zero padding, then a horizontal flip (pt.darts).
        let (dy, dx, flip) = match rng.as_deref_mut() {
            Some(r) if kind.augments() => {
                (r.below(9) as isize - 4, r.below(9) as isize - 4, r.coin())
            }
            _ => (0, 0, false),
        };
        for ch in 0..c {
            let (m, s) = (mean[ch.min(mean.len() - 1)], std[ch.min(std.len() - 1)]);
            for y in 0..h {
                for x in 0..w {
                    let sx = if flip { w - 1 - x } else { x } as isize + dx;
                    let sy = y as isize + dy;
                    let v = if sy < 0 || sx < 0 || sy >= h as isize || sx >= w as isize {
                        0.0
                    } else {
                        img[(ch * h + sy as usize) * w + sx as usize] as f32 / 255.0
                    };
                    out[b * size + (ch * h + y) * w + x] = (v - m) / s;
                }
            }
        }
        if let Some(r) = rng.as_deref_mut()
            && cutout > 0
            && kind.augments()
        {
            let (cy, cx) = (r.below(h) as isize, r.below(w) as isize);
            let half = (cutout / 2) as isize;
            let (y0, y1) = ((cy - half).max(0) as usize, ((cy + half) as usize).min(h));
            let (x0, x1) = ((cx - half).max(0) as usize, ((cx + half) as usize).min(w));
            for ch in 0..c {
                for y in y0..y1 {
                    out[b * size + (ch * h + y) * w + x0..b * size + (ch * h + y) * w + x1]
                        .fill(0.0);
                }
            }
        }
    }
    let n = indices.len();
    (
        Tensor::from_data(TensorData::new(out, [n, c, h, w]), device),
        Tensor::from_data(TensorData::new(labels, [n]), device),
    )
}
