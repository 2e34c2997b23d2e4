//! `Primitive`: the candidate operations of the DARTS search space, under the names that
//! pt.darts and the original DARTS code print (`sep_conv_3x3`, `skip_connect`, ...).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A candidate operation on an edge of a DARTS cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Primitive {
    /// Zero: the edge is absent.
    None,
    /// 3×3 max pooling.
    MaxPool3x3,
    /// 3×3 average pooling (padding not counted).
    AvgPool3x3,
    /// Identity, or FactorizedReduce at stride 2.
    SkipConnect,
    /// Two stacked separable 3×3 convolutions.
    SepConv3x3,
    /// Two stacked separable 5×5 convolutions.
    SepConv5x5,
    /// Dilated (2) separable 3×3 convolution.
    DilConv3x3,
    /// Dilated (2) separable 5×5 convolution.
    DilConv5x5,
    /// Two stacked separable 7×7 convolutions (in DARTS' OPS, not in its search space).
    SepConv7x7,
    /// Factorized 7×1 – 1×7 convolution (in DARTS' OPS, not in its search space).
    Conv7x1_1x7,
}

impl Primitive {
    /// The DARTS search space, in the order of `PRIMITIVES` in pt.darts and DARTS.
    pub const DARTS: [Primitive; 8] = [
        Primitive::None,
        Primitive::MaxPool3x3,
        Primitive::AvgPool3x3,
        Primitive::SkipConnect,
        Primitive::SepConv3x3,
        Primitive::SepConv5x5,
        Primitive::DilConv3x3,
        Primitive::DilConv5x5,
    ];

    /// Every primitive qdarts knows: the DARTS space plus the other ops of DARTS' `OPS` table.
    pub const ALL: [Primitive; 10] = [
        Primitive::None,
        Primitive::MaxPool3x3,
        Primitive::AvgPool3x3,
        Primitive::SkipConnect,
        Primitive::SepConv3x3,
        Primitive::SepConv5x5,
        Primitive::DilConv3x3,
        Primitive::DilConv5x5,
        Primitive::SepConv7x7,
        Primitive::Conv7x1_1x7,
    ];

    /// Whether the op has weights of its own (convolutions); pooling, skip_connect and none
    /// have none. (At stride 2, skip_connect is a FactorizedReduce, which has weights; a
    /// cell's parameter-free share is asked of the normal cell, where it is an identity.)
    pub fn has_weights(&self) -> bool {
        !matches!(
            self,
            Primitive::None
                | Primitive::MaxPool3x3
                | Primitive::AvgPool3x3
                | Primitive::SkipConnect
        )
    }

    /// The name DARTS uses.
    pub fn name(&self) -> &'static str {
        match self {
            Primitive::None => "none",
            Primitive::MaxPool3x3 => "max_pool_3x3",
            Primitive::AvgPool3x3 => "avg_pool_3x3",
            Primitive::SkipConnect => "skip_connect",
            Primitive::SepConv3x3 => "sep_conv_3x3",
            Primitive::SepConv5x5 => "sep_conv_5x5",
            Primitive::DilConv3x3 => "dil_conv_3x3",
            Primitive::DilConv5x5 => "dil_conv_5x5",
            Primitive::SepConv7x7 => "sep_conv_7x7",
            Primitive::Conv7x1_1x7 => "conv_7x1_1x7",
        }
    }
}

impl fmt::Display for Primitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a DARTS primitive.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "unknown primitive `{0}`: expected one of none, max_pool_3x3, avg_pool_3x3, skip_connect, sep_conv_3x3, sep_conv_5x5, dil_conv_3x3, dil_conv_5x5, sep_conv_7x7, conv_7x1_1x7"
)]
pub struct ParsePrimitiveError(pub String);

impl TryFrom<String> for Primitive {
    type Error = ParsePrimitiveError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Primitive> for String {
    fn from(p: Primitive) -> String {
        p.name().to_string()
    }
}

impl FromStr for Primitive {
    type Err = ParsePrimitiveError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Primitive::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| ParsePrimitiveError(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_darts_order() {
        // PRIMITIVES in pt.darts genotypes.py and DARTS cnn/genotypes.py.
        let darts = [
            "none",
            "max_pool_3x3",
            "avg_pool_3x3",
            "skip_connect",
            "sep_conv_3x3",
            "sep_conv_5x5",
            "dil_conv_3x3",
            "dil_conv_5x5",
        ];
        for (p, name) in Primitive::DARTS.iter().zip(darts) {
            assert_eq!(p.name(), name);
            assert_eq!(name.parse::<Primitive>().unwrap(), *p);
            assert_eq!(serde_json::to_string(p).unwrap(), format!("\"{name}\""));
            let back: Primitive = serde_json::from_str(&format!("\"{name}\"")).unwrap();
            assert_eq!(back, *p);
        }
    }

    #[test]
    fn unknown_names_are_errors_that_list_the_choices() {
        assert_eq!("conv_7x1_1x7".parse::<Primitive>().unwrap(), Primitive::Conv7x1_1x7);
        // The error lists exactly the names that parse.
        let err = "foo".parse::<Primitive>().unwrap_err().to_string();
        let listed = err.rsplit_once("expected one of ").unwrap().1;
        let all: Vec<&str> = Primitive::ALL.iter().map(Primitive::name).collect();
        assert_eq!(listed, all.join(", "));
        let err = "conv_3x3".parse::<Primitive>().unwrap_err();
        assert!(err.to_string().contains("conv_3x3"));
        assert!(err.to_string().contains("sep_conv_3x3"));
    }
}
