//! Dataset readers on real bytes: the CIFAR-10 fixture (20 test images), the embedded
//! Fashion-MNIST subset, and clear errors on truncated or foreign files.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::{Path, PathBuf};

use burn::tensor::Device;
use qdarts_data::{
    DataError, DatasetKind, Rng, batch, darts_split, embedded, load, read_cifar_batch,
    read_idx_file,
};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cifar10/test_batch_first20.bin")
}

fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
    // A folder per file: the tests run at once, and a scratch folder is emptied when asked for.
    let p = qdarts_record::scratch::scratch(&format!("data-{name}")).join(name);
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
    p
}

#[test]
fn cifar_fixture_has_its_twenty_labels_and_pixels() {
    let set = read_cifar_batch(&fixture()).unwrap();
    // Labels as listed with the fixture (the CIFAR-10 test set's first 20).
    assert_eq!(set.labels, vec![3, 8, 8, 0, 6, 6, 1, 6, 3, 1, 0, 9, 5, 7, 9, 8, 5, 7, 8, 6]);
    assert_eq!((set.len(), set.channels, set.height, set.width), (20, 3, 32, 32));
    // Test image 0 (a cat): top-left pixel RGB (158, 112, 49), in CHW order.
    let px = |c: usize, y: usize, x: usize| set.images[(c * 32 + y) * 32 + x];
    assert_eq!((px(0, 0, 0), px(1, 0, 0), px(2, 0, 0)), (158, 112, 49));
}

#[test]
fn truncated_or_foreign_cifar_files_are_errors_naming_the_file() {
    let bytes = std::fs::read(fixture()).unwrap();
    let p = tmp("truncated.bin", &bytes[..3073 * 2 + 100]);
    let err = read_cifar_batch(&p).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("truncated.bin") && msg.contains("2 full records"), "{msg}");
    let mut bad = bytes[..3073].to_vec();
    bad[0] = 12;
    let err = read_cifar_batch(&tmp("badlabel.bin", &bad)).unwrap_err();
    assert!(err.to_string().contains("label 12"), "{err}");
    let err = read_cifar_batch(Path::new("/nonexistent/test_batch.bin")).unwrap_err();
    assert!(
        matches!(err, DataError::Io { .. })
            && err.to_string().contains("/nonexistent/test_batch.bin")
    );
}

#[test]
fn embedded_fashion_mnist_has_the_documented_subset() {
    let train = embedded(true).unwrap();
    let test = embedded(false).unwrap();
    assert_eq!((train.len(), test.len()), (10_000, 10_000));
    assert_eq!((train.channels, train.height, train.width), (1, 28, 28));
    // Class counts from data/fashion-mnist/README.md.
    let mut counts = [0usize; 10];
    for &l in &test.labels {
        counts[l as usize] += 1;
    }
    assert_eq!(counts, [1000; 10]);
    assert_eq!(load(DatasetKind::FashionMnist, None, true).unwrap(), train);
    assert!(load(DatasetKind::Cifar10, None, true).unwrap_err().to_string().contains("--data"));
}

#[test]
fn idx_errors_say_what_is_wrong() {
    let mut idx = vec![0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2];
    idx.extend([1, 2, 3, 4, 5, 6, 7]);
    let err = read_idx_file(&tmp("short-idx", &idx)).unwrap_err().to_string();
    assert!(err.contains("short-idx") && err.contains("need 8 data bytes, file has 7"), "{err}");
    let err = read_idx_file(&tmp("png", b"\x89PNG\r\n\x1a\n")).unwrap_err().to_string();
    assert!(err.contains("not an IDX file"), "{err}");
    let err = read_idx_file(&tmp("gz", &[0x1f, 0x8b, 8, 0, 1, 2])).unwrap_err().to_string();
    assert!(err.contains("corrupt gzip"), "{err}");
}

#[test]
fn the_darts_split_halves_the_training_set() {
    let (a, b) = darts_split(10, 0.5);
    assert_eq!(a, vec![0, 1, 2, 3, 4]);
    assert_eq!(b, vec![5, 6, 7, 8, 9]);
}

#[test]
fn batches_are_normalized_and_cifar_augmentation_is_a_crop_and_flip() {
    let set = read_cifar_batch(&fixture()).unwrap();
    let dev = Device::flex();
    let (x, y) = batch(&set, DatasetKind::Cifar10, &[0, 1], None, &dev);
    assert_eq!(x.dims(), [2, 3, 32, 32]);
    let v: Vec<f32> = x.into_data().convert::<f32>().try_to_vec().unwrap();
    // (158/255 − 0.49139968) / 0.24703233
    assert!((v[0] - (158.0 / 255.0 - 0.491_399_7) / 0.247_032_33).abs() < 1e-5);
    assert_eq!(y.into_data().convert::<i64>().try_to_vec::<i64>().unwrap(), vec![3, 8]);
    // Augmented batches are reproducible from the seed and differ from the plain one.
    let a = batch(&set, DatasetKind::Cifar10, &[0], Some(&mut Rng::new(3)), &dev).0;
    let b = batch(&set, DatasetKind::Cifar10, &[0], Some(&mut Rng::new(3)), &dev).0;
    let plain = batch(&set, DatasetKind::Cifar10, &[0], None, &dev).0;
    let (a, b, plain): (Vec<f32>, Vec<f32>, Vec<f32>) = (
        a.into_data().convert::<f32>().try_to_vec().unwrap(),
        b.into_data().convert::<f32>().try_to_vec().unwrap(),
        plain.into_data().convert::<f32>().try_to_vec().unwrap(),
    );
    assert_eq!(a, b);
    assert_ne!(a, plain);
}
