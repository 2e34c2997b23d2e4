//! The fused fake quantization on flex: blocks of the tensor in parallel, each through the CPU
//! loops.

use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::{DType, Shape, TensorData};

use super::cpu::{Chan, backward, for_each_run, forward};
use super::{FakeQuantBackend, FusedLayout};

/// The values of a grid tensor (mult, step, zero point: f32 by construction).
///
/// # Panics
/// If it is not f32, as [`contiguous_f32`].
fn host(t: &FlexTensor) -> Vec<f32> {
    let (_, t) = contiguous_f32(t.clone());
    t.as_slice::<f32>().expect("a contiguous f32 tensor has a slice").to_vec()
}

fn chans(
    mult: &FlexTensor,
    step: Option<&FlexTensor>,
    zp: &FlexTensor,
    l: &FusedLayout,
) -> Vec<Chan> {
    let (m, z) = (host(mult), host(zp));
    let s = step.map(host).unwrap_or_else(|| vec![0.0; m.len()]);
    let pick = |v: &[f32], c: usize| if v.len() == 1 { v[0] } else { v[c] };
    (0..l.channels).map(|c| Chan::new(pick(&m, c), pick(&s, c), pick(&z, c), l)).collect()
}

/// The shape of `x` and a contiguous view of it.
///
/// # Panics
/// If `x` is not f32 (the dispatching wrapper only calls the kernel for f32).
fn contiguous_f32(x: FlexTensor) -> (Shape, FlexTensor) {
    assert_eq!(x.dtype(), DType::F32, "fused fake quant: expected f32");
    (x.layout().shape().clone(), x.to_contiguous())
}

fn finish(out: Vec<f32>, shape: Shape) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(out, shape))
}

/// A writable f32 buffer with a tensor's values: the tensor itself when it is contiguous,
/// covers its whole buffer and has no other owner, else a copy.
enum Owned {
    InPlace(FlexTensor),
    Copy(Vec<f32>),
}

impl Owned {
    fn as_mut_slice(&mut self) -> &mut [f32] {
        match self {
            Owned::InPlace(t) => t.storage_mut::<f32>(),
            Owned::Copy(v) => v,
        }
    }

    fn into_tensor(self, shape: Shape) -> FlexTensor {
        match self {
            Owned::InPlace(t) => t,
            Owned::Copy(v) => finish(v, shape),
        }
    }
}

fn owned_f32(t: FlexTensor) -> Owned {
    let n = t.layout().num_elements();
    let whole =
        t.layout().contiguous_offsets() == Some((0, n)) && t.bytes().len() == n * size_of::<f32>();
    if whole && t.is_unique() && t.dtype() == DType::F32 {
        Owned::InPlace(t)
    } else {
        let c = t.to_contiguous();
        Owned::Copy(c.as_slice::<f32>().map(<[f32]>::to_vec).unwrap_or_else(|| {
            panic!("fused fake quant backward: expected an f32 gradient, got {:?}", t.dtype())
        }))
    }
}

impl FakeQuantBackend for Flex {
    fn fake_quant_fused(
        x: FlexTensor,
        mult: FlexTensor,
        step: FlexTensor,
        zero_point: FlexTensor,
        layout: FusedLayout,
    ) -> FlexTensor {
        let (shape, x) = contiguous_f32(x);
        let xs = x.as_slice::<f32>().expect("a contiguous f32 tensor has a slice");
        let chans = chans(&mult, Some(&step), &zero_point, &layout);
        let mut out = vec![0.0f32; xs.len()];
        let (qmin, qmax, away) = (layout.qmin as f32, layout.qmax as f32, layout.ties_away);
        for_each_run(
            xs.len(),
            &chans,
            &layout,
            &mut out,
            #[inline(always)]
            |c, i, dst| {
                let src = &xs[i..i + dst.len()];
                match away {
                    true => forward::<true>(c, src, dst, qmin, qmax),
                    false => forward::<false>(c, src, dst, qmin, qmax),
                }
            },
        );
        finish(out, shape)
    }

    fn fake_quant_fused_backward(
        x: FlexTensor,
        grad: FlexTensor,
        mult: FlexTensor,
        zero_point: FlexTensor,
        layout: FusedLayout,
    ) -> FlexTensor {
        let (shape, x) = contiguous_f32(x);
        let xs = x.as_slice::<f32>().expect("a contiguous f32 tensor has a slice");
        let chans = chans(&mult, None, &zero_point, &layout);
        // The upstream gradient is usually owned here: mask it in place.
        let mut out = owned_f32(grad);
        let (qmin, qmax, away) = (layout.qmin as f32, layout.qmax as f32, layout.ties_away);
        for_each_run(
            xs.len(),
            &chans,
            &layout,
            out.as_mut_slice(),
            #[inline(always)]
            |c, i, dst| {
                let src = &xs[i..i + dst.len()];
                match away {
                    true => backward::<true>(c, src, dst, qmin, qmax),
                    false => backward::<false>(c, src, dst, qmin, qmax),
                }
            },
        );
        out.into_tensor(shape)
    }
}
