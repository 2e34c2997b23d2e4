//! The depthwise convolution under autodiff: forward on the inner backend, both gradients in one
//! backward step.

use super::*;

impl<B: Backend + DepthwiseBackend, C: CheckpointStrategy> DepthwiseBackend for Autodiff<B, C> {
    fn depthwise_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct DepthwiseStep;

        impl<B: Backend + DepthwiseBackend> Backward<B, 2> for DepthwiseStep {
            type State = (FloatTensor<B>, FloatTensor<B>, PlaneGeom);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let (x, weight, geom) = ops.state;
                if let [Some(node_x), Some(node_w)] = &ops.parents {
                    let grad = grads.consume::<B>(&ops.node);
                    let (dx, dw) = B::depthwise_conv2d_backward(x, grad, weight, geom);
                    grads.register::<B>(node_x.id, dx);
                    grads.register::<B>(node_w.id, dw);
                    return;
                }
                binary::<B, _, _>(
                    ops.parents,
                    ops.node,
                    grads,
                    |grad| B::depthwise_conv2d_x_backward(grad, weight, geom),
                    |grad| B::depthwise_conv2d_weight_backward(x, grad, geom),
                );
            }
        }

        match DepthwiseStep.prepare::<C>([x.node(), weight.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (xp, wp) = (x.primitive().clone(), weight.primitive().clone());
                let out = B::depthwise_conv2d(xp.clone(), wp.clone(), geom);
                prep.finish((xp, wp, geom), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::depthwise_conv2d(x.into_primitive(), weight.into_primitive(), geom))
            }
        }
    }

    fn depthwise_conv2d_x_backward(
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::depthwise_conv2d_x_backward(
            grad.into_primitive(),
            weight.into_primitive(),
            geom,
        ))
    }

    fn depthwise_conv2d_weight_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::depthwise_conv2d_weight_backward(
            x.into_primitive(),
            grad.into_primitive(),
            geom,
        ))
    }

    fn depthwise_conv2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dw) = B::depthwise_conv2d_backward(
            x.into_primitive(),
            grad.into_primitive(),
            weight.into_primitive(),
            geom,
        );
        (Self::from_inner(dx), Self::from_inner(dw))
    }
}
