//! [`TensorHeader`]: the one description of a stored tensor on the wire — its
//! key, element type and shape. Every message that carries tensor bytes repeats
//! it (`Tensor`, `TensorChunk`, `ParameterSpec`), and every type on either side
//! that describes a tensor holds one: the server's `ParamSpec` and `Pulled`, the
//! client's parts as it routes them, and the chunk cursor that checks a stream.

use bytes::Bytes;

use crate::chunk::ChunkError;
use crate::codec::{DType, checked_shape, element_count, wire_shape};
use crate::key::ParamKey;
use crate::v1;

/// A tensor's key, element type and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorHeader {
    /// The tensor's key.
    pub key: ParamKey,
    /// Element type on the wire.
    pub dtype: DType,
    /// Shape of the whole tensor.
    pub shape: Vec<usize>,
}

impl TensorHeader {
    /// The header of the tensor `key`, of `dtype` elements in `shape`.
    pub fn new(key: ParamKey, dtype: DType, shape: Vec<usize>) -> Self {
        Self { key, dtype, shape }
    }

    /// Validates the header fields of a wire message.
    ///
    /// # Errors
    /// [`ChunkError::Codec`] for a bad dtype or a shape whose size overflows.
    pub fn from_wire(name: &str, part: u32, dtype: i32, shape: &[u64]) -> Result<Self, ChunkError> {
        let key = ParamKey::new(name, part);
        let checked = DType::from_proto(dtype).and_then(|d| Ok((d, checked_shape(shape, d)?)));
        match checked {
            Ok((dtype, shape)) => Ok(Self { key, dtype, shape }),
            Err(source) => Err(ChunkError::Codec { key, source }),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        element_count(&self.shape)
    }

    /// True for a tensor with no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the whole tensor on the wire.
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype.size()
    }

    /// The shape as the wire writes it.
    pub fn wire_shape(&self) -> Vec<u64> {
        wire_shape(&self.shape)
    }

    /// `"dtype [shape]"`, for error messages.
    pub fn describe(&self) -> String {
        format!("{} {:?}", self.dtype, self.shape)
    }

    /// The tensor message carrying `data` under this header.
    pub fn into_tensor(self, data: Bytes) -> v1::Tensor {
        v1::Tensor {
            shape: self.wire_shape(),
            name: self.key.name,
            part: self.key.part,
            dtype: self.dtype.to_proto(),
            data,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_survives_the_wire_and_a_bad_one_is_refused_by_key() {
        let header = TensorHeader::new(ParamKey::new("w", 2), DType::F16, vec![3, 4]);
        assert_eq!((header.len(), header.byte_len()), (12, 24));
        let tensor = header.clone().into_tensor(Bytes::from(vec![0u8; 24]));
        let back = TensorHeader::from_wire(&tensor.name, tensor.part, tensor.dtype, &tensor.shape);
        assert_eq!(back.unwrap(), header);

        let refused = TensorHeader::from_wire("w", 2, 99, &[3]).unwrap_err();
        assert!(refused.to_string().contains("`w`#2"), "{refused}");
        let overflow = TensorHeader::from_wire("w", 0, tensor.dtype, &[u64::MAX, 2]);
        assert!(matches!(overflow, Err(ChunkError::Codec { .. })));
    }
}
