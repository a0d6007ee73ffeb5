//! Moving a step's tensors between the model's device and the host buffers the
//! client sends and receives.
//!
//! On the CPU each tensor is copied once into its own buffer, which is already
//! the least copying there is, and pulled values are written into an `f32`
//! variable's own storage in one copy (`WriteValues`). On a GPU every copy
//! between device and host is a transfer with a fixed cost of its own, so a
//! step's gradients are first joined on the device and come off it in **one**
//! transfer, and the pulled values of
//! the small variables go onto it in one transfer and are split there
//! ([`CopyPlan::Joined`]); a variable of 1 MiB or more goes on in a transfer
//! of its own, straight from its pulled buffer. The gradients come off into a
//! [`HostBuffers`] kept from step to step.

use std::sync::Arc;

use bytes::Bytes;
use candle_core::{DType, Device, Tensor, Var};
use ps_proto::codec;

/// How a step's tensors cross between device and host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPlan {
    /// One copy per tensor (the CPU: the host is the device).
    PerTensor,
    /// All tensors joined on the device and moved in one transfer.
    Joined,
}

impl CopyPlan {
    /// [`CopyPlan::PerTensor`] on the CPU, [`CopyPlan::Joined`] on any other device.
    pub fn for_device(device: &Device) -> Self {
        if device.is_cpu() {
            Self::PerTensor
        } else {
            Self::Joined
        }
    }

    /// Each tensor's elements as little-endian `f32` bytes, in order, copied
    /// into `buffers` (see [`HostBuffers`]).
    ///
    /// # Errors
    /// candle's, when a tensor cannot be read.
    pub fn to_host(
        self,
        tensors: &[Tensor],
        buffers: &mut HostBuffers,
    ) -> candle_core::Result<Vec<Bytes>> {
        match self {
            Self::PerTensor => per_tensor_to_host(tensors, buffers),
            Self::Joined => joined_to_host(tensors, buffers),
        }
    }

    /// Writes `values[i]` (row-major `f32`) into `vars[i]`, on the variable's
    /// device and in its dtype. `staging` is the host buffer the joined plan
    /// gathers the values in; it is kept by the caller and reused every step.
    ///
    /// # Errors
    /// candle's, when a length does not match a variable's shape.
    pub fn to_vars(
        self,
        vars: &[&Var],
        values: &[&[f32]],
        staging: &mut Vec<f32>,
    ) -> candle_core::Result<()> {
        match (self, vars.first()) {
            (Self::Joined, Some(first)) => joined_to_vars(first.device(), vars, values, staging),
            _ => vars
                .iter()
                .zip(values)
                .try_for_each(|(var, values)| write_var(var, values)),
        }
    }
}

/// Writes `values` into `var`: an `f32` variable on the CPU in place, in one
/// copy ([`WriteValues`]); any other through a new tensor and `Var::set`.
fn write_var(var: &Var, values: &[f32]) -> candle_core::Result<()> {
    if var.device().is_cpu() && var.dtype() == DType::F32 && var.is_contiguous() {
        if values.len() != var.elem_count() {
            return Err(candle_core::Error::Msg(format!(
                "{} pulled values for a variable of shape {:?}",
                values.len(),
                var.shape()
            )));
        }
        return var.as_tensor().inplace_op1(&WriteValues(values));
    }
    let tensor = Tensor::from_slice(values, var.shape(), var.device())?;
    var.set(&tensor.to_dtype(var.dtype())?)
}

/// Pulled values written straight into a CPU variable's storage: one copy.
/// `Tensor::from_slice` then `Var::set` made two, and the new tensor's pages
/// were faulted in and zeroed afresh every step (docs/benchmarks.md: 46 ms a
/// step for 84 MB). A variable shares its storage with the model's uses of
/// it, as `Var::set` does, so they see the new values.
struct WriteValues<'a>(&'a [f32]);

impl candle_core::InplaceOp1 for WriteValues<'_> {
    fn name(&self) -> &'static str {
        "write-pulled-values"
    }

    fn cpu_fwd(
        &self,
        storage: &mut candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        let candle_core::CpuStorage::F32(data) = storage else {
            return Err(candle_core::Error::Msg(
                "pulled f32 values for a variable of another dtype".into(),
            ));
        };
        let target = layout
            .contiguous_offsets()
            .and_then(|(start, end)| data.get_mut(start..end))
            .filter(|target| target.len() == self.0.len())
            .ok_or_else(|| {
                candle_core::Error::Msg(format!(
                    "{} pulled values do not fit the variable's layout {layout:?}",
                    self.0.len()
                ))
            })?;
        target.copy_from_slice(self.0);
        Ok(())
    }
}

/// The host buffers a step's tensors are copied into, one per slot (per
/// tensor, or one for a joined copy), each reused from one step to the next
/// once nothing holds the last step's bytes (a push is over before the next
/// step's gradients exist). A fresh buffer each time costs more than the copy:
/// its pages are faulted in and zeroed every time, and candle's `to_vec1` on a
/// GPU fills two (docs/gpu.md: 84 MB came off an H100 in 125 ms that way,
/// where PyTorch moves it into a warm pageable buffer in 5.5).
///
/// The same goes for the bf16 or f16 copies a narrower wire sends
/// ([`HostBuffers::to_wire`]): a fresh one each step faulted in 42 MB of pages
/// for 84 MB of gradients.
#[derive(Debug, Default)]
pub struct HostBuffers {
    kept: Vec<Option<Arc<Vec<f32>>>>,
    wire: Vec<Option<Arc<Vec<u16>>>>,
}

/// Slot `slot`'s last buffer in `kept` when nothing else holds it any more,
/// or a new one.
fn take_kept<T: Default>(kept: &mut [Option<Arc<T>>], slot: usize) -> T {
    kept.get_mut(slot)
        .and_then(Option::take)
        .and_then(|last| Arc::try_unwrap(last).ok())
        .unwrap_or_default()
}

/// `value`, shared, and kept in `kept[slot]` to be taken again next time.
fn keep<T>(kept: &mut Vec<Option<Arc<T>>>, slot: usize, value: T) -> Arc<T> {
    if kept.len() <= slot {
        kept.resize_with(slot + 1, || None);
    }
    let shared = Arc::new(value);
    kept[slot] = Some(Arc::clone(&shared));
    shared
}

impl HostBuffers {
    /// `values` as bytes, kept in slot `slot` to be taken again next time.
    fn share(&mut self, slot: usize, values: Vec<f32>) -> Bytes {
        let shared = keep(&mut self.kept, slot, values);
        if cfg!(target_endian = "little") {
            Bytes::from_owner(SharedF32(shared))
        } else {
            codec::encode_f32(codec::DType::F32, &shared)
        }
    }

    /// `tensor`'s elements copied into slot `slot`'s buffer, as bytes.
    fn copy(&mut self, slot: usize, tensor: &Tensor) -> candle_core::Result<Bytes> {
        let mut host = take_kept(&mut self.kept, slot);
        copy_to_host(tensor, &mut host)?;
        Ok(self.share(slot, host))
    }

    /// `bytes` (little-endian `f32`, as [`CopyPlan::to_host`] gives them) as
    /// `wire` puts them on the wire: as they are for `f32`, each value
    /// rounded to `wire` otherwise (bf16 or f16: half the bytes to send),
    /// into this one's kept wire buffers.
    pub fn to_wire(&mut self, bytes: Vec<Bytes>, wire: codec::DType) -> Vec<Bytes> {
        if wire == codec::DType::F32 {
            return bytes;
        }
        bytes
            .iter()
            .enumerate()
            .map(|(slot, f32_le)| {
                let mut narrowed = take_kept(&mut self.wire, slot);
                codec::narrow_into(wire, f32_le, &mut narrowed);
                Bytes::from_owner(SharedU16(keep(&mut self.wire, slot, narrowed)))
            })
            .collect()
    }
}

/// Each tensor copied into its own kept buffer.
fn per_tensor_to_host(
    tensors: &[Tensor],
    buffers: &mut HostBuffers,
) -> candle_core::Result<Vec<Bytes>> {
    tensors
        .iter()
        .enumerate()
        .map(|(slot, tensor)| buffers.copy(slot, tensor))
        .collect()
}

/// One `f32` copy of every tensor joined on its device, then one transfer into
/// the buffer of slot 0; the buffers handed back are slices of it.
fn joined_to_host(
    tensors: &[Tensor],
    buffers: &mut HostBuffers,
) -> candle_core::Result<Vec<Bytes>> {
    let flat = tensors
        .iter()
        .map(|t| t.flatten_all()?.to_dtype(DType::F32))
        .collect::<candle_core::Result<Vec<_>>>()?;
    if flat.is_empty() {
        return Ok(Vec::new());
    }
    let all = buffers.copy(0, &Tensor::cat(&flat, 0)?)?;
    let mut start = 0;
    Ok(flat
        .iter()
        .map(|t| {
            let end = start + t.elem_count() * 4;
            let bytes = all.slice(start..end);
            start = end;
            bytes
        })
        .collect())
}

/// `tensor`'s elements as `f32` into `host`: straight from its memory when it
/// is a contiguous `f32` tensor on the CPU or a CUDA device, otherwise
/// through candle's `to_vec1`.
fn copy_to_host(tensor: &Tensor, host: &mut Vec<f32>) -> candle_core::Result<()> {
    #[cfg(feature = "cuda")]
    if cuda_to_host(tensor, host)? {
        return Ok(());
    }
    if cpu_to_host(tensor, host) {
        return Ok(());
    }
    host.clear();
    host.extend_from_slice(
        &tensor
            .flatten_all()?
            .to_dtype(DType::F32)?
            .to_vec1::<f32>()?,
    );
    Ok(())
}

/// A contiguous `f32` CPU tensor copied into `host`, whose capacity is kept;
/// false for any other.
fn cpu_to_host(tensor: &Tensor, host: &mut Vec<f32>) -> bool {
    let (storage, layout) = tensor.storage_and_layout();
    let (candle_core::Storage::Cpu(cpu), Some((start, end))) =
        (&*storage, layout.contiguous_offsets())
    else {
        return false;
    };
    let Ok(values) = cpu.as_slice::<f32>() else {
        return false;
    };
    host.clear();
    host.extend_from_slice(&values[start..end]);
    true
}

/// A contiguous CUDA tensor copied into `host` (resized to fit, so a buffer of
/// last step's size is written in place) in one transfer; false for any other.
#[cfg(feature = "cuda")]
fn cuda_to_host(tensor: &Tensor, host: &mut Vec<f32>) -> candle_core::Result<bool> {
    use candle_core::backend::BackendDevice;
    let (storage, layout) = tensor.storage_and_layout();
    let (candle_core::Storage::Cuda(cuda), Some((start, end))) =
        (&*storage, layout.contiguous_offsets())
    else {
        return Ok(false);
    };
    host.resize(end - start, 0.0);
    let view = cuda.as_cuda_slice::<f32>()?.slice(start..end);
    cuda.device.memcpy_dtoh(&view, host)?;
    // The copy is queued on the device's stream: wait for it before reading.
    cuda.device.synchronize()?;
    Ok(true)
}

/// A variable at least this large goes onto the device in a transfer of its
/// own, straight from its pulled buffer: gathering it into the staging buffer
/// first would cost a host copy of all its bytes, far more than one
/// transfer's fixed cost.
const OWN_TRANSFER_BYTES: usize = 1 << 20;

/// Each large variable's values in a transfer of its own; the small ones
/// gathered into `staging`, one transfer onto `device`, then each variable's
/// part narrowed and written on the device.
fn joined_to_vars(
    device: &Device,
    vars: &[&Var],
    values: &[&[f32]],
    staging: &mut Vec<f32>,
) -> candle_core::Result<()> {
    let (large, small): (Vec<usize>, Vec<usize>) =
        (0..vars.len()).partition(|&i| std::mem::size_of_val(values[i]) >= OWN_TRANSFER_BYTES);
    for i in large {
        let tensor = Tensor::from_slice(values[i], vars[i].shape(), device)?;
        vars[i].set(&tensor.to_dtype(vars[i].dtype())?)?;
    }
    staging.clear();
    for &i in &small {
        staging.extend_from_slice(values[i]);
    }
    if staging.is_empty() {
        return Ok(());
    }
    let all = Tensor::from_slice(staging, staging.len(), device)?;
    let mut start = 0;
    for i in small {
        let part = all
            .narrow(0, start, values[i].len())?
            .reshape(vars[i].shape())?;
        vars[i].set(&part.to_dtype(vars[i].dtype())?)?;
        start += values[i].len();
    }
    Ok(())
}

struct SharedF32(Arc<Vec<f32>>);

impl AsRef<[u8]> for SharedF32 {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(self.0.as_slice())
    }
}

/// 16-bit values stored little-endian (`codec::narrow_into`'s), as their bytes.
struct SharedU16(Arc<Vec<u16>>);

impl AsRef<[u8]> for SharedU16 {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(self.0.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensors() -> Vec<Tensor> {
        let a = Tensor::arange(0f32, 6.0, &Device::Cpu)
            .unwrap()
            .reshape((2, 3))
            .unwrap();
        let b = Tensor::new(&[-1.5f32, 2.25], &Device::Cpu).unwrap();
        let c = Tensor::new(&[[7f64]], &Device::Cpu).unwrap();
        vec![a, b, c]
    }

    #[test]
    fn the_joined_plan_hands_back_what_one_copy_per_tensor_does() {
        let mut buffer = HostBuffers::default();
        let per_tensor = CopyPlan::PerTensor
            .to_host(&tensors(), &mut buffer)
            .unwrap();
        let joined = CopyPlan::Joined.to_host(&tensors(), &mut buffer).unwrap();
        assert_eq!(per_tensor, joined);
        let second: Vec<f32> = joined[1]
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(second, [-1.5, 2.25]);
        assert_eq!(joined[2].len(), 4, "the f64 tensor goes out as one f32");
        assert!(
            CopyPlan::Joined
                .to_host(&[], &mut buffer)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn the_host_buffers_are_reused_once_nothing_holds_them() {
        for plan in [CopyPlan::PerTensor, CopyPlan::Joined] {
            let mut buffers = HostBuffers::default();
            let first = plan.to_host(&tensors(), &mut buffers).unwrap();
            let held = first[0].as_ptr();
            let second = plan.to_host(&tensors(), &mut buffers).unwrap();
            assert_ne!(
                second[0].as_ptr(),
                held,
                "{plan:?}: the first step's bytes are still held"
            );
            assert_eq!(first, second);
            drop(first);
            let reused = second[0].as_ptr();
            drop(second);
            let third = plan.to_host(&tensors(), &mut buffers).unwrap();
            assert_eq!(
                third[0].as_ptr(),
                reused,
                "{plan:?}: the buffer nothing holds is taken again"
            );
        }
    }

    #[test]
    fn the_wire_buffers_are_reused_once_nothing_holds_them() {
        use codec::DType::{BF16, F16};
        let f32_le = |t: &Tensor| {
            let values = t.flatten_all().unwrap().to_dtype(DType::F32).unwrap();
            let values = values.to_vec1::<f32>().unwrap();
            Bytes::copy_from_slice(bytemuck::cast_slice(&values))
        };
        let host: Vec<Bytes> = tensors().iter().map(f32_le).collect();
        for wire in [BF16, F16] {
            let mut buffers = HostBuffers::default();
            let first = buffers.to_wire(host.clone(), wire);
            let expected: Vec<Bytes> = host.iter().map(|b| codec::encode_f32_le(wire, b)).collect();
            assert_eq!(first, expected, "{wire:?}: the values the wire takes");
            let held = first[1].as_ptr();
            let second = buffers.to_wire(host.clone(), wire);
            assert_ne!(second[1].as_ptr(), held, "{wire:?}: still held");
            drop((first, second.clone()));
            let reused = second[1].as_ptr();
            drop(second);
            let third = buffers.to_wire(host.clone(), wire);
            assert_eq!(third[1].as_ptr(), reused, "{wire:?}: taken again");
            assert_eq!(third, expected);
        }
        let mut buffers = HostBuffers::default();
        let f32_wire = buffers.to_wire(host.clone(), codec::DType::F32);
        assert_eq!(f32_wire[0].as_ptr(), host[0].as_ptr(), "f32 goes as it is");
    }

    #[test]
    fn both_plans_write_each_variable_its_own_values() {
        for plan in [CopyPlan::PerTensor, CopyPlan::Joined] {
            let a = Var::zeros((2, 2), DType::F32, &Device::Cpu).unwrap();
            let b = Var::zeros(3, DType::F64, &Device::Cpu).unwrap();
            let mut staging = vec![9.0; 100];
            plan.to_vars(
                &[&a, &b],
                &[&[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0]],
                &mut staging,
            )
            .unwrap();
            assert_eq!(
                a.as_tensor().to_vec2::<f32>().unwrap(),
                [[1.0, 2.0], [3.0, 4.0]]
            );
            assert_eq!(b.as_tensor().to_vec1::<f64>().unwrap(), [5.0, 6.0, 7.0]);
            assert_eq!(b.dtype(), DType::F64);
        }
    }

    #[test]
    fn a_large_variable_goes_on_its_own_and_the_small_ones_joined() {
        let large_len = OWN_TRANSFER_BYTES / 4;
        let large = Var::zeros(large_len, DType::F32, &Device::Cpu).unwrap();
        let (a, b) = (
            Var::zeros(2, DType::F32, &Device::Cpu).unwrap(),
            Var::zeros(1, DType::F32, &Device::Cpu).unwrap(),
        );
        let large_values: Vec<f32> = (0..large_len).map(|i| i as f32).collect();
        let mut staging = Vec::new();
        CopyPlan::Joined
            .to_vars(
                &[&a, &large, &b],
                &[&[1.0, 2.0], &large_values, &[3.0]],
                &mut staging,
            )
            .unwrap();
        assert_eq!(a.as_tensor().to_vec1::<f32>().unwrap(), [1.0, 2.0]);
        assert_eq!(b.as_tensor().to_vec1::<f32>().unwrap(), [3.0]);
        assert_eq!(large.as_tensor().to_vec1::<f32>().unwrap(), large_values);
        assert_eq!(
            staging,
            [1.0, 2.0, 3.0],
            "only the small ones were gathered"
        );
    }

    #[test]
    fn a_length_that_does_not_fit_the_variable_is_an_error() {
        for plan in [CopyPlan::PerTensor, CopyPlan::Joined] {
            let a = Var::zeros((2, 2), DType::F32, &Device::Cpu).unwrap();
            assert!(
                plan.to_vars(&[&a], &[&[1.0, 2.0]], &mut Vec::new())
                    .is_err()
            );
        }
    }

    #[test]
    fn a_cpu_variable_is_written_in_place_where_the_model_sees_it() {
        let var = Var::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        // What a layer holds: the variable's tensor, sharing its storage.
        let held = var.as_tensor().clone();
        let values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        CopyPlan::PerTensor
            .to_vars(&[&var], &[&values], &mut Vec::new())
            .unwrap();
        assert_eq!(
            held.to_vec2::<f32>().unwrap(),
            [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
        );
        assert!(
            CopyPlan::PerTensor
                .to_vars(&[&var], &[&values[..5]], &mut Vec::new())
                .is_err()
        );
        assert_eq!(
            held.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            values,
            "a refused write changes nothing"
        );
    }

    #[test]
    fn the_cpu_copies_per_tensor() {
        assert_eq!(CopyPlan::for_device(&Device::Cpu), CopyPlan::PerTensor);
    }
}
