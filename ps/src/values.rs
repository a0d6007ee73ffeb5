//! [`Values`]: a key's `f32` values, shared copy-on-write with the pulls that are
//! sending them. A pull in `f32` on a little-endian machine sends the stored
//! values themselves, with no snapshot copy; an update copies them only while a
//! pull still holds the version it replaces.

use std::sync::Arc;

use bytes::Bytes;
use ps_proto::codec::DType;

/// A key's values, cheap to share with pulls.
#[derive(Debug, Clone, PartialEq)]
pub struct Values(Arc<Vec<f32>>);

impl Values {
    /// Values holding `values`.
    pub fn new(values: Vec<f32>) -> Self {
        Self(Arc::new(values))
    }

    /// The values.
    pub fn as_slice(&self) -> &[f32] {
        &self.0
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The values to update in place: copied first only when a pull still holds them.
    pub fn make_mut(&mut self) -> &mut [f32] {
        Arc::make_mut(&mut self.0).as_mut_slice()
    }

    /// The values as `dtype` wire bytes that share this memory, when that encoding
    /// is the memory itself (`f32` on a little-endian machine); `None` otherwise.
    pub fn share_as(&self, dtype: DType) -> Option<Bytes> {
        let same_bytes = dtype == DType::F32 && cfg!(target_endian = "little");
        same_bytes.then(|| Bytes::from_owner(LittleEndianF32(Arc::clone(&self.0))))
    }
}

/// Shared `f32` values seen as their little-endian bytes.
struct LittleEndianF32(Arc<Vec<f32>>);

impl AsRef<[u8]> for LittleEndianF32 {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_wire_bytes_are_the_values_themselves() {
        let values = Values::new(vec![1.0, -2.5]);
        let wire = values.share_as(DType::F32).unwrap();
        assert_eq!(wire.as_ptr(), values.as_slice().as_ptr().cast::<u8>());
        let expected: Vec<u8> = [1.0f32, -2.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(wire.as_ref(), expected.as_slice());
        assert!(
            values.share_as(DType::F16).is_none(),
            "half precision is encoded"
        );
    }

    #[test]
    fn an_update_copies_only_while_a_pull_holds_the_values() {
        let mut values = Values::new(vec![1.0; 4]);
        let alone = values.as_slice().as_ptr();
        values.make_mut()[0] = 2.0;
        assert_eq!(
            values.as_slice().as_ptr(),
            alone,
            "no pull held them: no copy"
        );

        let pulled = values.share_as(DType::F32).unwrap();
        values.make_mut()[0] = 3.0;
        assert_ne!(
            values.as_slice().as_ptr(),
            alone,
            "a pull held them: copied"
        );
        assert_eq!(
            &pulled[..4],
            2.0f32.to_le_bytes(),
            "the pull keeps its version"
        );
        assert_eq!(values.as_slice()[0], 3.0);
    }
}
