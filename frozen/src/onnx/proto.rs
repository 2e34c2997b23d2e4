//! The protobuf wire format of the `onnx.proto` messages the export writes, by hand: field
//! numbers as named constants, varints, length-delimited fields.

/// Field numbers of the `onnx.proto` messages written here.
pub(super) mod field {
    pub mod model {
        pub const IR_VERSION: u32 = 1;
        pub const PRODUCER_NAME: u32 = 2;
        pub const PRODUCER_VERSION: u32 = 3;
        pub const GRAPH: u32 = 7;
        pub const OPSET_IMPORT: u32 = 8;
        pub const METADATA_PROPS: u32 = 14;
    }
    pub mod graph {
        pub const NODE: u32 = 1;
        pub const NAME: u32 = 2;
        pub const INITIALIZER: u32 = 5;
        pub const INPUT: u32 = 11;
        pub const OUTPUT: u32 = 12;
    }
    pub mod node {
        pub const INPUT: u32 = 1;
        pub const OUTPUT: u32 = 2;
        pub const NAME: u32 = 3;
        pub const OP_TYPE: u32 = 4;
        pub const ATTRIBUTE: u32 = 5;
    }
    pub mod attribute {
        pub const NAME: u32 = 1;
        pub const I: u32 = 3;
        pub const INTS: u32 = 8;
        pub const TYPE: u32 = 20;
        /// `AttributeProto.AttributeType`.
        pub const TYPE_INT: i64 = 2;
        pub const TYPE_INTS: i64 = 7;
    }
    pub mod tensor {
        pub const DIMS: u32 = 1;
        pub const DATA_TYPE: u32 = 2;
        pub const NAME: u32 = 8;
        pub const RAW_DATA: u32 = 9;
    }
    /// `ValueInfoProto`, `TypeProto`, `TypeProto.Tensor`, `TensorShapeProto` and its
    /// `Dimension`.
    pub mod value_info {
        pub const NAME: u32 = 1;
        pub const TYPE: u32 = 2;
        pub const TYPE_TENSOR: u32 = 1;
        pub const TENSOR_ELEM_TYPE: u32 = 1;
        pub const TENSOR_SHAPE: u32 = 2;
        pub const SHAPE_DIM: u32 = 1;
        pub const DIM_VALUE: u32 = 1;
        pub const DIM_PARAM: u32 = 2;
    }
    /// `OperatorSetIdProto`.
    pub mod opset {
        pub const DOMAIN: u32 = 1;
        pub const VERSION: u32 = 2;
    }
    /// `StringStringEntryProto`.
    pub mod entry {
        pub const KEY: u32 = 1;
        pub const VALUE: u32 = 2;
    }
}

// TensorProto.DataType
pub(super) const FLOAT: i64 = 1;
pub(super) const UINT8: i64 = 2;
pub(super) const INT8: i64 = 3;
pub(super) const INT32: i64 = 6;
pub(super) const INT64: i64 = 7;

/// A protobuf message being written.
#[derive(Default)]
pub(super) struct Msg(pub(super) Vec<u8>);

impl Msg {
    pub(super) fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    pub(super) fn tag(&mut self, field: u32, wire: u32) {
        self.varint(u64::from(field << 3 | wire));
    }
    pub(super) fn int(&mut self, field: u32, v: i64) -> &mut Self {
        self.tag(field, 0);
        self.varint(v as u64);
        self
    }
    pub(super) fn bytes(&mut self, field: u32, b: &[u8]) -> &mut Self {
        self.tag(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }
    pub(super) fn str(&mut self, field: u32, s: &str) -> &mut Self {
        self.bytes(field, s.as_bytes())
    }
    pub(super) fn msg(&mut self, field: u32, m: &Msg) -> &mut Self {
        self.bytes(field, &m.0)
    }
}

/// Attribute values.
pub(super) enum Attr {
    Int(i64),
    Ints(Vec<i64>),
}

pub(super) fn attribute(name: &str, a: &Attr) -> Msg {
    use field::attribute as f;
    let mut m = Msg::default();
    m.str(f::NAME, name);
    match a {
        Attr::Int(v) => {
            m.int(f::I, *v).int(f::TYPE, f::TYPE_INT);
        }
        Attr::Ints(vs) => {
            for v in vs {
                m.int(f::INTS, *v);
            }
            m.int(f::TYPE, f::TYPE_INTS);
        }
    }
    m
}

pub(super) fn tensor(name: &str, dtype: i64, dims: &[i64], raw: &[u8]) -> Msg {
    use field::tensor as f;
    let mut m = Msg::default();
    for d in dims {
        m.int(f::DIMS, *d);
    }
    m.int(f::DATA_TYPE, dtype).str(f::NAME, name).bytes(f::RAW_DATA, raw);
    m
}

pub(super) fn value_info(name: &str, dims: &[Option<i64>]) -> Msg {
    use field::value_info as f;
    let mut shape = Msg::default();
    for d in dims {
        let mut dim = Msg::default();
        match d {
            Some(v) => dim.int(f::DIM_VALUE, *v),
            None => dim.str(f::DIM_PARAM, "N"),
        };
        shape.msg(f::SHAPE_DIM, &dim);
    }
    let mut tt = Msg::default();
    tt.int(f::TENSOR_ELEM_TYPE, FLOAT).msg(f::TENSOR_SHAPE, &shape);
    let mut ty = Msg::default();
    ty.msg(f::TYPE_TENSOR, &tt);
    let mut m = Msg::default();
    m.str(f::NAME, name).msg(f::TYPE, &ty);
    m
}
