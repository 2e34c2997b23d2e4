//! The flex kernels' per-plane layouts held to each other, bitwise.

use super::cpu::{Phases, PlaneConv};
use super::{Flat, PlaneGeom};
use crate::support::lanes::tests::{bits, values};

fn scratch<const K: usize>(sizes: [usize; K]) -> [Vec<f32>; K] {
    sizes.map(|n| vec![f32::NAN; n])
}

/// One plane through `conv`: output, input gradient, and both gradients at once.
fn plane(conv: &impl PlaneConv, x: &[f32], dy: &[f32], w: &[f32]) -> [Vec<f32>; 4] {
    let f = conv.flat();
    let ([h, wd], [oh, ow], taps) = (f.g.input, f.output(), f.offsets.len());
    let mut y = vec![0.0; oh * ow];
    conv.forward(x, &conv.forward_taps(w), &mut y, &mut scratch(conv.forward_scratch()));
    let back = conv.backward_taps(w);
    let mut dx = vec![0.0; h * wd];
    conv.x_backward(dy, &back, &mut dx, &mut scratch(conv.x_scratch()));
    let (mut dx2, mut dw) = (vec![0.0; h * wd], vec![0.0; taps]);
    conv.backward([x, dy], &back, [&mut dx2, &mut dw], &mut scratch(conv.backward_scratch()));
    [y, dx, dx2, dw]
}

#[test]
fn the_phase_layout_is_the_stride_1_layout_strided_bitwise() {
    let mut seed = 0;
    for stride in [[2, 2], [3, 3], [2, 1], [1, 3]] {
        for (kernel, dilation) in
            [([3, 3], 1), ([5, 5], 1), ([3, 3], 2), ([5, 5], 2), ([1, 1], 1), ([2, 4], 3)]
        {
            for (input, padding) in
                [([8, 8], [1, 1]), ([7, 9], [2, 0]), ([16, 16], [4, 4]), ([3, 2], [0, 3])]
            {
                let g = PlaneGeom { input, kernel, stride, padding, dilation: [dilation; 2] };
                let flat = Flat::new(g);
                if flat.len == 0 {
                    continue;
                }
                seed += 1;
                let [oh, ow] = flat.output();
                let x = values(input[0] * input[1], seed);
                let dy = values(oh * ow, seed + 1000);
                let w = values(kernel[0] * kernel[1], seed + 2000);
                let want = plane(&flat, &x, &dy, &w);
                let got = plane(&Phases::new(g), &x, &dy, &w);
                for (what, (a, b)) in
                    ["y", "dx", "dx (both)", "dw (both)"].iter().zip(got.iter().zip(&want))
                {
                    assert_eq!(bits(a), bits(b), "{g:?}: {what}");
                }
            }
        }
    }
}
