//! The hardware cost a bit-width search charges, differentiably: the expected BitOPs and the
//! expected weight bytes of a cell's mixed ops under the softmax of their architecture and
//! bit-width parameters, and the penalty that adds it to the loss.
//!
//! Per edge `e` and candidate op `k` with `M_ek` multiply-accumulates and `P_ek` weights per
//! image: `E[BitOPs] = Σ_e Σ_k p_ek · M_ek · E[b_w]_ek · E[b_a]_ek` and
//! `E[bits of weights] = Σ_e Σ_k p_ek · P_ek · E[b_w]_ek` (÷ 8 for bytes), where `p_ek` is the op's softmax weight on
//! its edge and `E[b]` the expected bit width under the op's own bit softmax (EdMIPS charges
//! the expected cost the same way: the op and bit choices are independent softmaxes).

use burn::tensor::Tensor;

/// The expected cost of one cell's edges.
///
/// # Shapes
/// - op_probs: `[E, K]` (softmax over each edge's ops); per_op: `[E, K]` MACs (for BitOPs) or
///   weights (for size) of each candidate op; w_bits, a_bits: `[E, K]` expected bit widths of
///   each op's weights and activations (ops without weights: any value, per_op is 0 for size);
///   output: `[1]`.
pub fn expected_cost(
    op_probs: Tensor<2>,
    per_op: Tensor<2>,
    w_bits: Tensor<2>,
    a_bits: Option<Tensor<2>>,
) -> Tensor<1> {
    let c = op_probs.mul(per_op).mul(w_bits);
    let c = match a_bits {
        Some(a) => c.mul(a),
        None => c,
    };
    c.sum()
}

/// How the cost enters the loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Penalty {
    /// `λ·max(0, cost/target − 1)`: nothing below the target, linear above it; the search is
    /// free to use the budget, and pays in proportion to an overrun (the form FBNet-style
    /// searches use with a target).
    Hinge {
        /// The budget.
        target: f64,
        /// λ.
        weight: f64,
    },
    /// `λ·ln(cost)`: always pushes down, by the same relative amount at every scale (FBNet's
    /// latency term); no target.
    Log {
        /// λ.
        weight: f64,
    },
}

impl Penalty {
    /// The penalty of a cost `[1]`.
    pub fn of(&self, cost: Tensor<1>) -> Tensor<1> {
        match *self {
            Penalty::Hinge { target, weight } => {
                cost.div_scalar(target).sub_scalar(1.0).clamp_min(0.0).mul_scalar(weight)
            }
            Penalty::Log { weight } => cost.log().mul_scalar(weight),
        }
    }
}
