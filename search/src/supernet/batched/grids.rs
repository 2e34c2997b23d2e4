//! The quantization grids of a wave's tensors laid side by side: its source states (each on
//! the grid of the quantizer that made it) as one per-channel grid, and that grid as each edge
//! reads its source.
//!
//! A held grid ([`Grid::held`], the second order's passes at `w±`) carries the values its
//! tensor had at `w`; side by side, they are laid out as the tensors are.

use burn::tensor::Tensor;
use qdarts_kernels::cat::cat;
use qdarts_ops::quant::Grid;

/// The grids of `parts`, tensors `[N, C_i, H, W]` each on a per-tensor grid (or per channel
/// along axis 1), as one grid per channel along axis 1 of their concatenation; `None` if a
/// part is float.
///
/// # Panics
/// If the grids differ in integer range or rounding (the batched cell is built only where a
/// cell's states come from quantizers of one spec).
pub fn side_by_side(parts: &[(Option<&Grid>, [usize; 4])]) -> Option<Grid> {
    let grids: Option<Vec<&Grid>> = parts.iter().map(|(g, _)| *g).collect();
    let grids = grids?;
    let first = grids[0];
    let like = |g: &&Grid| (g.qmin, g.qmax, g.round) == (first.qmin, first.qmax, first.round);
    assert!(grids.iter().all(like), "a wave's sources lie on grids of one range and rounding");
    if let [(Some(g), _)] = parts {
        return Some((*g).clone());
    }
    let param = |f: fn(&Grid) -> &Tensor<1>| {
        let each = parts.iter().zip(&grids).map(|((_, dims), g)| {
            let p = f(g).clone();
            if p.dims()[0] == dims[1] { p } else { p.expand([dims[1]]) }
        });
        cat(each.collect(), 0)
    };
    let held = grids.iter().all(|g| g.is_held()).then(|| {
        let each = parts
            .iter()
            .zip(&grids)
            .map(|((_, dims), g)| g.held.clone().expect("every grid is held").reshape(*dims));
        cat(each.collect(), 1).reshape([-1])
    });
    let mut grid = Grid::new(
        [param(|g| &g.mult), param(|g| &g.step), param(|g| &g.zero_point)],
        (first.qmin, first.qmax),
        first.round,
        Some(1),
    );
    grid.held = held;
    Some(grid)
}

/// The grid of [`super::stack_sources`]`(x, sources, per, copies)` for `x` `[N, S·C, H, W]`
/// on `grid` (per tensor, or per channel over its `S·C` channels): each source's parameters
/// and held values repeated as its channels are.
pub fn stacked_grid(
    grid: &Grid,
    dims: [usize; 4],
    sources: usize,
    per: usize,
    copies: usize,
) -> Grid {
    let sc = dims[1];
    let param = |p: &Tensor<1>| {
        let full = if p.dims()[0] == sc { p.clone() } else { p.clone().expand([sc]) };
        let x: Tensor<4> = full.reshape([1, sc, 1, 1]);
        super::stack_sources(&x, sources, per, copies).reshape([-1])
    };
    Grid {
        mult: param(&grid.mult),
        step: param(&grid.step),
        zero_point: param(&grid.zero_point),
        held: grid.held.as_ref().map(|v| {
            let x: Tensor<4> = v.clone().reshape(dims);
            super::stack_sources(&x, sources, per, copies).reshape([-1])
        }),
        axis: Some(1),
        ..grid.clone()
    }
}
