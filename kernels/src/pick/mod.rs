//! Several vectors picked from one at constant positions, in one launch each way.
//!
//! A wave of the batched cell weights its columns by coefficients picked from the cell's
//! mixing weights (`[edges · K]` and a zero). Burn's `select` is one launch forward and two
//! backward (a zero fill, then the picked gradients added in), per wave. [`pick`] gives every
//! wave's coefficients as the outputs of one step: one launch writes them all (each a view of
//! its buffer, see `support::cube::packed`), and under autodiff one launch sums the parts'
//! gradients onto the positions they were picked from (in the parts' order, a part the loss
//! does not reach adding nothing). The values are `select`'s; so are the gradients, bit for
//! bit where no position is picked twice (otherwise the sums' order may differ).
//!
//! It runs on the CubeCL backends ([`pick_available`]); elsewhere each part is Burn's
//! `select`.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};

/// Whether [`pick`] runs this module's kernels for tensors on `device` with this dtype (f32
/// on a CubeCL backend).
pub fn pick_available(device: &Device, dtype: DType) -> bool {
    crate::support::on_cube(device) && dtype == DType::F32
}

/// For each of `index`, the elements of `x` at its positions: part `t` is
/// `[x[index[t][0]], x[index[t][1]], …]`. Where [`pick_available`],
/// [`ARITY`](crate::cat::ARITY) parts a launch, and their gradients onto `x` in one launch
/// more (see the module docs).
///
/// # Panics
/// If a position is not below `x`'s length, or a part is empty.
pub fn pick(x: Tensor<1>, index: &[Vec<usize>]) -> Vec<Tensor<1>> {
    let n = x.dims()[0];
    for part in index {
        assert!(!part.is_empty(), "pick: an empty part");
        assert!(part.iter().all(|&i| i < n), "pick: a position past {n}");
    }
    if !pick_available(&x.device(), x.dtype()) {
        let device = x.device();
        return index
            .iter()
            .map(|part| {
                let at: Vec<i64> = part.iter().map(|&i| i as i64).collect();
                let at = Tensor::<1, Int>::from_data(TensorData::new(at, [part.len()]), &device);
                x.clone().select(0, at)
            })
            .collect();
    }
    #[cfg(feature = "cube")]
    {
        index
            .chunks(crate::cat::ARITY)
            .flat_map(|chunk| {
                <burn::backend::Dispatch as PickBackend>::pick_parts(
                    x.clone().into_dispatch(),
                    chunk.to_vec(),
                )
            })
            .map(Tensor::from_dispatch)
            .collect()
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("pick_available is false without the CubeCL backends")
}

/// The pick and its gradient (see the module docs); CubeCL only.
#[cfg(feature = "cube")]
#[burn::backend::backend_extension(Cube, Autodiff)]
pub trait PickBackend: burn::backend::Backend {
    /// `x`'s (rank 1) elements at each of `index` (1 to [`ARITY`](crate::cat::ARITY) parts).
    fn pick_parts(
        x: burn::backend::tensor::FloatTensor<Self>,
        index: Vec<Vec<usize>>,
    ) -> Vec<burn::backend::tensor::FloatTensor<Self>>;

    /// The gradient `[n]` of a pick's input from its first `count` parts' gradients
    /// (`index[t]` the positions part `t` was picked from): element `j` is the sum, part
    /// after part, of `g_t[i]` over the `i` with `index[t][i] = j`, 0 where none. The slots
    /// past `count` are not read.
    #[allow(clippy::too_many_arguments, reason = "a backend extension's tensors are arguments")]
    fn pick_grad(
        g0: burn::backend::tensor::FloatTensor<Self>,
        g1: burn::backend::tensor::FloatTensor<Self>,
        g2: burn::backend::tensor::FloatTensor<Self>,
        g3: burn::backend::tensor::FloatTensor<Self>,
        g4: burn::backend::tensor::FloatTensor<Self>,
        g5: burn::backend::tensor::FloatTensor<Self>,
        g6: burn::backend::tensor::FloatTensor<Self>,
        g7: burn::backend::tensor::FloatTensor<Self>,
        count: usize,
        index: Vec<Vec<usize>>,
        n: usize,
    ) -> burn::backend::tensor::FloatTensor<Self>;
}

#[cfg(feature = "cube")]
mod autodiff;
#[cfg(feature = "cube")]
mod cube;
