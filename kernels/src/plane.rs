//! The flat, zero-padded plane layout shared by the depthwise-convolution and pooling kernels.

/// The geometry of one per-plane window operation (a depthwise convolution or a pooling), per
/// axis `[h, w]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaneGeom {
    /// Input plane size.
    pub input: [usize; 2],
    /// Kernel (window) size.
    pub kernel: [usize; 2],
    /// Stride.
    pub stride: [usize; 2],
    /// Padding, both sides.
    pub padding: [usize; 2],
    /// Dilation.
    pub dilation: [usize; 2],
}

/// A plane laid out flat with its padding, so that every tap of a stride-1 window operation is
/// one contiguous run.
///
/// The padded input is `hp × wp`. The stride-1 output, `oh1 × ow1`, is stored with the padded
/// row length `wp` (columns `ow1..wp` of each row are unused), and its first `len` entries
/// cover it. Tap `(i, j)` of output entry `k` then reads padded entry `k + i·dh·wp + j·dw`, for
/// every `k < len` at once. A strided operation is the stride-1 one at every `s`-th row and
/// column.
pub(crate) struct Flat {
    pub(crate) g: PlaneGeom,
    pub(crate) wp: usize,
    pub(crate) hp: usize,
    /// Stride-1 output size.
    pub(crate) oh1: usize,
    pub(crate) ow1: usize,
    /// Entries of the flat stride-1 output (`(oh1 − 1)·wp + ow1`, 0 when empty).
    pub(crate) len: usize,
    /// Offset of each tap, row-major over `(i, j)`.
    pub(crate) offsets: Vec<usize>,
}

impl Flat {
    pub(crate) fn new(g: PlaneGeom) -> Self {
        let (hp, wp) = (g.input[0] + 2 * g.padding[0], g.input[1] + 2 * g.padding[1]);
        let span = |a: usize| g.dilation[a] * (g.kernel[a] - 1) + 1;
        let (oh1, ow1) = ((hp + 1).saturating_sub(span(0)), (wp + 1).saturating_sub(span(1)));
        let len = if oh1 == 0 || ow1 == 0 { 0 } else { (oh1 - 1) * wp + ow1 };
        let offsets = (0..g.kernel[0])
            .flat_map(|i| (0..g.kernel[1]).map(move |j| (i, j)))
            .map(|(i, j)| i * g.dilation[0] * wp + j * g.dilation[1])
            .collect();
        Flat { g, wp, hp, oh1, ow1, len, offsets }
    }

    /// The strided output's `(rows, cols)`.
    pub(crate) fn output(&self) -> [usize; 2] {
        let [sh, sw] = self.g.stride;
        [
            if self.oh1 == 0 { 0 } else { (self.oh1 - 1) / sh + 1 },
            if self.ow1 == 0 { 0 } else { (self.ow1 - 1) / sw + 1 },
        ]
    }

    /// The padded plane's size, `hp·wp`.
    pub(crate) fn padded(&self) -> usize {
        self.hp * self.wp
    }

    /// Writes the input plane `x` `[H, W]` into `xp` (`hp·wp`) with a zero border.
    #[inline(always)]
    pub(crate) fn pad(&self, x: &[f32], xp: &mut [f32]) {
        self.pad_with(x, xp, 0.0);
    }

    /// Writes the input plane `x` `[H, W]` into `xp` (`hp·wp`) with a border of `fill`.
    #[inline(always)]
    pub(crate) fn pad_with(&self, x: &[f32], xp: &mut [f32], fill: f32) {
        let ([h, w], [ph, pw]) = (self.g.input, self.g.padding);
        xp.fill(fill);
        for r in 0..h {
            xp[(r + ph) * self.wp + pw..][..w].copy_from_slice(&x[r * w..][..w]);
        }
    }

    /// Copies the interior of a padded plane `xp` (`hp·wp`) into `x` `[H, W]`.
    #[inline(always)]
    pub(crate) fn unpad(&self, xp: &[f32], x: &mut [f32]) {
        let ([h, w], [ph, pw]) = (self.g.input, self.g.padding);
        for r in 0..h {
            x[r * w..][..w].copy_from_slice(&xp[(r + ph) * self.wp + pw..][..w]);
        }
    }

    /// Writes `f(r, c, dy[r, c])` for the strided output `dy` `[H', W']` into the flat stride-1
    /// layout `dy1` (`len`), zero everywhere else (unused columns and the rows and columns a
    /// stride skips).
    #[inline(always)]
    pub(crate) fn spread_with(
        &self,
        dy: &[f32],
        dy1: &mut [f32],
        f: impl Fn(usize, usize, f32) -> f32,
    ) {
        let ([oh, ow], [sh, sw]) = (self.output(), self.g.stride);
        dy1.fill(0.0);
        for r in 0..oh {
            let row = &mut dy1[r * sh * self.wp..];
            for (c, &v) in dy[r * ow..][..ow].iter().enumerate() {
                row[c * sw] = f(r, c, v);
            }
        }
    }

    /// [`Flat::spread_with`] of the values themselves (row copies when the columns are not
    /// strided).
    #[inline(always)]
    pub(crate) fn spread(&self, dy: &[f32], dy1: &mut [f32]) {
        let ([oh, ow], [sh, sw]) = (self.output(), self.g.stride);
        if sw != 1 {
            return self.spread_with(dy, dy1, |_, _, v| v);
        }
        dy1.fill(0.0);
        for r in 0..oh {
            dy1[r * sh * self.wp..][..ow].copy_from_slice(&dy[r * ow..][..ow]);
        }
    }

    /// [`Flat::gather_with`] of the values themselves (row copies when the columns are not
    /// strided).
    #[inline(always)]
    pub(crate) fn gather(&self, acc: &[f32], y: &mut [f32]) {
        let ([oh, ow], [sh, sw]) = (self.output(), self.g.stride);
        if sw != 1 {
            return self.gather_with(acc, y, |_, _, v| v);
        }
        for r in 0..oh {
            y[r * ow..][..ow].copy_from_slice(&acc[r * sh * self.wp..][..ow]);
        }
    }

    /// Writes `f(r, c, acc[..])` at the strided positions of the flat stride-1 result `acc`
    /// into `y` `[H', W']`.
    #[inline(always)]
    pub(crate) fn gather_with(
        &self,
        acc: &[f32],
        y: &mut [f32],
        f: impl Fn(usize, usize, f32) -> f32,
    ) {
        let ([oh, ow], [sh, sw]) = (self.output(), self.g.stride);
        for r in 0..oh {
            let row = &acc[r * sh * self.wp..];
            for (c, v) in y[r * ow..][..ow].iter_mut().enumerate() {
                *v = f(r, c, row[c * sw]);
            }
        }
    }
}
