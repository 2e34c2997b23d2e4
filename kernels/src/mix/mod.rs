//! Coefficients times columns laid side by side, without laying them side by side: a wave's
//! node sums in one launch forward and two backward.
//!
//! A wave of the batched cell gives the terms of the nodes it feeds as one product: every
//! candidate's output is a block of columns `[N, c_p, L]`, and the terms are the coefficients
//! `[1, R, C]` (`C = Σ c_p`) times the blocks side by side, `[N, C, L]`. As Burn expressions
//! that is a concatenation (a copy of every candidate's output) and a batched matmul forward,
//! and backward two matmuls and the concatenation's cut (a second copy). Here a thread per
//! `(n, l)` reads each column's value once, through its block's strides, and adds it into
//! every row's term (column after column); backward, a thread per `(n, l)` reads its rows of
//! `∂out` once and writes every column's gradient (`Σ_r coef[r, c] · ∂out[n, r, l]`, into one
//! buffer that the blocks' gradients are views of), and a cube per column sums its
//! coefficients' gradients (`Σ_{n, l} ∂out[n, r, l] · x[n, c, l]`, every row in one tree of
//! `reduce_units` threads). The values are the product's within float rounding: the sums run
//! in another order than the matmul's.
//!
//! It runs on the CubeCL backends for f32 ([`mix_available`]), up to
//! [`ARITY`](crate::cat::ARITY) blocks and [`MAX_ROWS`] rows; elsewhere, and past those, it is
//! the concatenation and Burn's matmul.

use burn::tensor::{DType, Device, Tensor};

#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "cube")]
mod extension;

#[cfg(feature = "cube")]
pub use extension::MixBackend;

/// The most rows the kernels take: each thread keeps a sum (forward) or a gradient (backward)
/// per row, the count compiled into the kernel.
pub const MAX_ROWS: usize = 16;

/// Whether [`mix`] runs this module's kernels for tensors on `device` with this dtype (f32 on
/// a CubeCL backend).
pub fn mix_available(device: &Device, dtype: DType) -> bool {
    crate::support::on_cube(device) && dtype == DType::F32
}

/// `coefficients` `[1, R, C]` times `blocks` `[N, c_p, L]` side by side along their second
/// dimension (`Σ c_p = C`): `coefficients.matmul(cat(blocks, 1))`, `[N, R, L]`, as this
/// module's kernels where [`mix_available`] (see the module docs).
///
/// # Panics
/// If `blocks` is empty, the blocks differ in `N` or `L`, their columns do not add up to `C`,
/// or the coefficients' first dimension is not 1.
pub fn mix(coefficients: Tensor<3>, blocks: Vec<Tensor<3>>) -> Tensor<3> {
    assert!(!blocks.is_empty(), "mix: no blocks");
    let [one, rows, columns] = coefficients.dims();
    assert_eq!(one, 1, "mix: coefficients {:?} are not [1, R, C]", coefficients.dims());
    let [n, _, l] = blocks[0].dims();
    for b in &blocks {
        let [bn, _, bl] = b.dims();
        assert!(bn == n && bl == l, "mix: blocks {:?} and {:?} differ", b.dims(), blocks[0].dims());
    }
    let total: usize = blocks.iter().map(|b| b.dims()[1]).sum();
    assert_eq!(total, columns, "mix: {total} columns in the blocks, {columns} coefficients");
    let fits = blocks.len() <= crate::cat::ARITY && rows <= MAX_ROWS;
    if !fits || !mix_available(&coefficients.device(), coefficients.dtype()) {
        return coefficients.matmul(crate::cat::cat(blocks, 1));
    }
    #[cfg(feature = "cube")]
    {
        let count = blocks.len();
        let blocks = blocks.into_iter().map(Tensor::into_dispatch).collect();
        let [p0, p1, p2, p3, p4, p5, p6, p7] = crate::cat::slots(blocks);
        Tensor::from_dispatch(<burn::backend::Dispatch as MixBackend>::mix_blocks(
            coefficients.into_dispatch(),
            p0,
            p1,
            p2,
            p3,
            p4,
            p5,
            p6,
            p7,
            count,
        ))
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("mix_available is false without the CubeCL backends")
}
