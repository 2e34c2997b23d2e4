//! An independent f64 reference of the DARTS op building blocks: naive loops over NCHW arrays,
//! written from PyTorch's definitions (Conv2d with groups and dilation, BatchNorm2d in train
//! mode without affine, MaxPool2d padded with −∞, AvgPool2d with count_include_pad = False).
//! It shares no code with the Burn kernels it checks.

#![allow(dead_code)]

/// A dense NCHW array.
#[derive(Debug, Clone, PartialEq)]
pub struct Nd {
    pub dims: [usize; 4],
    pub v: Vec<f64>,
}

impl Nd {
    pub fn new(dims: [usize; 4], v: Vec<f64>) -> Self {
        assert_eq!(dims.iter().product::<usize>(), v.len());
        Nd { dims, v }
    }
    pub fn zeros(dims: [usize; 4]) -> Self {
        Nd { dims, v: vec![0.0; dims.iter().product()] }
    }
    fn idx(&self, n: usize, c: usize, h: usize, w: usize) -> usize {
        let [_, cc, hh, ww] = self.dims;
        ((n * cc + c) * hh + h) * ww + w
    }
    pub fn at(&self, n: usize, c: usize, h: usize, w: usize) -> f64 {
        self.v[self.idx(n, c, h, w)]
    }
    fn set(&mut self, n: usize, c: usize, h: usize, w: usize, x: f64) {
        let i = self.idx(n, c, h, w);
        self.v[i] = x;
    }
}

pub fn relu(x: &Nd) -> Nd {
    Nd { dims: x.dims, v: x.v.iter().map(|&a| a.max(0.0)).collect() }
}

/// `torch.nn.functional.conv2d(x, w, stride, padding=(ph, pw), dilation, groups)`, no bias.
pub fn conv2d(
    x: &Nd,
    w: &Nd,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: usize,
    groups: usize,
) -> Nd {
    let [n, c_in, h, wd] = x.dims;
    let [c_out, cpg, kh, kw] = w.dims;
    assert_eq!(cpg * groups, c_in);
    let ho = (h + 2 * padding[0] - dilation * (kh - 1) - 1) / stride[0] + 1;
    let wo = (wd + 2 * padding[1] - dilation * (kw - 1) - 1) / stride[1] + 1;
    let opg = c_out / groups;
    let mut y = Nd::zeros([n, c_out, ho, wo]);
    for b in 0..n {
        for o in 0..c_out {
            let g = o / opg;
            for i in 0..ho {
                for j in 0..wo {
                    let mut acc = 0.0;
                    for ci in 0..cpg {
                        for a in 0..kh {
                            for e in 0..kw {
                                let hi =
                                    (i * stride[0] + a * dilation) as isize - padding[0] as isize;
                                let wi =
                                    (j * stride[1] + e * dilation) as isize - padding[1] as isize;
                                if hi < 0 || wi < 0 || hi >= h as isize || wi >= wd as isize {
                                    continue;
                                }
                                acc += x.at(b, g * cpg + ci, hi as usize, wi as usize)
                                    * w.at(o, ci, a, e);
                            }
                        }
                    }
                    y.set(b, o, i, j, acc);
                }
            }
        }
    }
    y
}

/// BatchNorm2d(affine = False) in train mode: batch mean, biased variance, eps 1e-5.
pub fn batch_norm(x: &Nd) -> Nd {
    let [n, c, h, w] = x.dims;
    let mut y = x.clone();
    let count = (n * h * w) as f64;
    for ch in 0..c {
        let mut s = 0.0;
        for b in 0..n {
            for i in 0..h {
                for j in 0..w {
                    s += x.at(b, ch, i, j);
                }
            }
        }
        let mean = s / count;
        let mut var = 0.0;
        for b in 0..n {
            for i in 0..h {
                for j in 0..w {
                    var += (x.at(b, ch, i, j) - mean).powi(2);
                }
            }
        }
        let inv = 1.0 / (var / count + 1e-5).sqrt();
        for b in 0..n {
            for i in 0..h {
                for j in 0..w {
                    y.set(b, ch, i, j, (x.at(b, ch, i, j) - mean) * inv);
                }
            }
        }
    }
    y
}

/// 3×3 pooling with padding 1: max (padding = −∞) or average over the in-bounds positions.
pub fn pool3(x: &Nd, stride: usize, max: bool) -> Nd {
    let [n, c, h, w] = x.dims;
    let ho = (h + 2 - 3) / stride + 1;
    let wo = (w + 2 - 3) / stride + 1;
    let mut y = Nd::zeros([n, c, ho, wo]);
    for b in 0..n {
        for ch in 0..c {
            for i in 0..ho {
                for j in 0..wo {
                    let (mut best, mut sum, mut cnt) = (f64::NEG_INFINITY, 0.0, 0.0);
                    for a in 0..3 {
                        for e in 0..3 {
                            let hi = (i * stride + a) as isize - 1;
                            let wi = (j * stride + e) as isize - 1;
                            if hi < 0 || wi < 0 || hi >= h as isize || wi >= w as isize {
                                continue;
                            }
                            let v = x.at(b, ch, hi as usize, wi as usize);
                            best = best.max(v);
                            sum += v;
                            cnt += 1.0;
                        }
                    }
                    y.set(b, ch, i, j, if max { best } else { sum / cnt });
                }
            }
        }
    }
    y
}

/// `x[:, :, 1:, 1:]`.
pub fn shift(x: &Nd) -> Nd {
    let [n, c, h, w] = x.dims;
    let mut y = Nd::zeros([n, c, h - 1, w - 1]);
    for b in 0..n {
        for ch in 0..c {
            for i in 0..h - 1 {
                for j in 0..w - 1 {
                    y.set(b, ch, i, j, x.at(b, ch, i + 1, j + 1));
                }
            }
        }
    }
    y
}

/// Concatenation along channels.
pub fn cat(a: &Nd, b: &Nd) -> Nd {
    let [n, ca, h, w] = a.dims;
    let cb = b.dims[1];
    let mut y = Nd::zeros([n, ca + cb, h, w]);
    for bb in 0..n {
        for ch in 0..ca + cb {
            for i in 0..h {
                for j in 0..w {
                    let v = if ch < ca { a.at(bb, ch, i, j) } else { b.at(bb, ch - ca, i, j) };
                    y.set(bb, ch, i, j, v);
                }
            }
        }
    }
    y
}
