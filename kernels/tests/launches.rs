//! The launch counter: every kernel a piece of work issues on a CubeCL backend, nothing on
//! the others.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::{Device, Tensor};
use qdarts_kernels::devices::compiled as devices;
use qdarts_kernels::launches::counted;

fn on_cube(name: &str) -> bool {
    matches!(name, "wgpu" | "cuda")
}

#[test]
fn launches_are_counted_on_the_cubecl_backends_only() {
    for (name, d) in devices() {
        let x = Tensor::<1>::ones([64], &d);
        // Two elementwise operations and a readback: at least two launches.
        let (v, two) = counted(&d, || x.clone().mul_scalar(3.0).add_scalar(1.0).into_data());
        assert_eq!(v.try_to_vec::<f32>().unwrap()[0], 4.0, "{name}");
        let (_, none) = counted(&d, || ());
        if on_cube(name) {
            let two = two.unwrap_or_else(|| panic!("{name}: no count on a CubeCL backend"));
            assert!(two >= 2, "{name}: {two} launches for two operations");
            assert_eq!(none, Some(0), "{name}: work without kernels");
        } else {
            assert_eq!((two, none), (None, None), "{name}: counted off CubeCL");
        }
    }
    // flex is always compiled: never counted.
    assert_eq!(counted(&Device::flex(), || 1).1, None);
}
