//! The computing side of [`crate::PsTrainer::backward_segments`]: runs a
//! segmented backward pass ([`crate::segmented`]) on a blocking thread,
//! copies each segment's gradients to host buffers and hands them to the
//! exchange as soon as they are ready, while the next segment is
//! differentiated; then says it is done.

use std::time::{Duration, Instant};

use bytes::Bytes;
use candle_core::{Tensor, Var};
use ps_client::ParamBytes;
use tokio::sync::mpsc::UnboundedSender;

use crate::host_copy::{CopyPlan, HostBuffers};
use crate::segmented::SegmentGrads;
use crate::trainer::TrainerError;

/// The trainer's variables, how their tensors reach the host, and a host
/// buffer for each segment, kept from step to step (a segment's bytes are
/// still being pushed while the next segment's come off the device).
pub(crate) struct SegmentFeed {
    pub(crate) vars: Vec<(String, Var)>,
    pub(crate) copy_plan: CopyPlan,
    pub(crate) buffers: Vec<HostBuffers>,
    /// The values' dtype on the wire.
    pub(crate) wire: ps_proto::codec::DType,
}

/// What the feed sends the exchange.
#[derive(Debug)]
pub(crate) enum Fed {
    /// One segment's gradients.
    Segment(Vec<ParamBytes>),
    /// The pass is done: every variable's gradient was sent.
    Done,
}

/// A segmented backward pass that ended: every variable's gradient (zeros for
/// one no segment reached), in the variables' order, where its time went, and
/// the segments' host buffers, to be used again.
pub(crate) struct FedGradients {
    pub(crate) grads: Vec<ParamBytes>,
    pub(crate) compute: Duration,
    pub(crate) gather: Duration,
    pub(crate) buffers: Vec<HostBuffers>,
}

impl SegmentFeed {
    /// Differentiates `segments` one by one, sending each segment's new
    /// gradients to `exchange`, then the zeros of the variables none reached,
    /// then [`Fed::Done`]. Carries on when the exchange has gone (it failed):
    /// the step is then repeated with the gradients returned.
    pub(crate) fn run(
        mut self,
        segments: SegmentGrads,
        exchange: &UnboundedSender<Fed>,
    ) -> Result<FedGradients, TrainerError> {
        let mut fed: Vec<Option<Bytes>> = vec![None; self.vars.len()];
        let (mut compute, mut gather) = (Duration::ZERO, Duration::ZERO);
        let mut segments = segments;
        let mut sent = 0;
        loop {
            let computing = Instant::now();
            let Some(grads) = segments.next() else { break };
            let grads = grads?;
            self.synchronize()?;
            compute += computing.elapsed();
            let gathering = Instant::now();
            let mut fresh = Vec::new();
            for (i, (name, var)) in self.vars.iter().enumerate() {
                if let Some(grad) = grads.get(var.as_tensor()) {
                    if fed[i].is_some() {
                        return Err(TrainerError::Segments(format!(
                            "{name} has a gradient in two segments of the backward pass (a parameter used on both sides of a cut): cut the model where nothing above uses a parameter below"
                        )));
                    }
                    fresh.push((i, grad.clone()));
                }
            }
            let segment = self.copy_out(sent, &fresh, &mut fed)?;
            sent += 1;
            gather += gathering.elapsed();
            let _ = exchange.send(Fed::Segment(segment));
        }
        let gathering = Instant::now();
        let unreached = fed
            .iter()
            .enumerate()
            .filter(|(_, bytes)| bytes.is_none())
            .map(|(i, _)| Ok((i, self.vars[i].1.as_tensor().zeros_like()?)))
            .collect::<candle_core::Result<Vec<_>>>()?;
        if !unreached.is_empty() {
            let zeros = self.copy_out(sent, &unreached, &mut fed)?;
            let _ = exchange.send(Fed::Segment(zeros));
        }
        gather += gathering.elapsed();
        let _ = exchange.send(Fed::Done);
        let grads = self
            .vars
            .iter()
            .zip(fed)
            .map(|((name, _), data)| ParamBytes::new(name, data.unwrap_or_default()))
            .collect();
        Ok(FedGradients {
            grads,
            compute,
            gather,
            buffers: self.buffers,
        })
    }

    /// `tensors` (variable index, gradient) as named host bytes, in host
    /// buffer `buffer`, each also kept in `fed` at its variable's index.
    fn copy_out(
        &mut self,
        buffer: usize,
        tensors: &[(usize, Tensor)],
        fed: &mut [Option<Bytes>],
    ) -> Result<Vec<ParamBytes>, TrainerError> {
        let values: Vec<Tensor> = tensors.iter().map(|(_, t)| t.clone()).collect();
        if self.buffers.len() <= buffer {
            self.buffers.resize_with(buffer + 1, HostBuffers::default);
        }
        let buffers = &mut self.buffers[buffer];
        let bytes = self.copy_plan.to_host(&values, buffers)?;
        let bytes = buffers.to_wire(bytes, self.wire);
        Ok(tensors
            .iter()
            .zip(bytes)
            .map(|((i, _), data)| {
                fed[*i] = Some(data.clone());
                ParamBytes::new(&self.vars[*i].0, data)
            })
            .collect())
    }

    /// Waits for a GPU to finish the segment's backward pass, so that its time
    /// is booked as compute and not as the copy after it.
    fn synchronize(&self) -> candle_core::Result<()> {
        match self.vars.first() {
            Some((_, var)) => var.device().synchronize(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segmented::Cuts;
    use candle_core::Device;

    fn var(values: &[f32]) -> Var {
        Var::new(values, &Device::Cpu).unwrap()
    }

    fn feed(vars: &[(&str, &Var)]) -> SegmentFeed {
        SegmentFeed {
            vars: vars
                .iter()
                .map(|(n, v)| (n.to_string(), (*v).clone()))
                .collect(),
            copy_plan: CopyPlan::PerTensor,
            buffers: Vec::new(),
            wire: ps_proto::codec::DType::F32,
        }
    }

    /// The next segment sent, or a panic naming what came instead.
    fn segment(sent: &mut tokio::sync::mpsc::UnboundedReceiver<Fed>) -> Vec<ParamBytes> {
        match sent.try_recv() {
            Ok(Fed::Segment(grads)) => grads,
            other => panic!("a segment was due, not {other:?}"),
        }
    }

    fn names(segment: &[ParamBytes]) -> Vec<&str> {
        segment.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn each_segment_is_sent_as_it_is_done_then_the_zeros_of_the_rest() {
        let (a, b, unused) = (var(&[1.0, 2.0]), var(&[3.0, 4.0]), var(&[5.0]));
        let mut cuts = Cuts::default();
        let h = cuts.cut(&(a.as_tensor() * 2.0).unwrap()).unwrap();
        let loss = (h * b.as_tensor()).unwrap().sum_all().unwrap();
        let (sender, mut sent) = tokio::sync::mpsc::unbounded_channel();
        let vars = [("a", &a), ("b", &b), ("unused", &unused)];
        let fed = feed(&vars).run(cuts.backward(&loss), &sender).unwrap();
        assert_eq!(names(&segment(&mut sent)), ["b"], "the top segment first");
        assert_eq!(names(&segment(&mut sent)), ["a"]);
        assert_eq!(names(&segment(&mut sent)), ["unused"]);
        assert!(matches!(sent.try_recv(), Ok(Fed::Done)), "then done");
        assert!(sent.try_recv().is_err(), "nothing more");
        assert_eq!(fed.buffers.len(), 3, "a host buffer kept for each segment");
        let values = |p: &ParamBytes| {
            p.data
                .chunks_exact(4)
                .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
                .collect::<Vec<f32>>()
        };
        // d/da sum(2a * b) = 2b; d/db = 2a; no gradient: zeros.
        let got: Vec<Vec<f32>> = fed.grads.iter().map(values).collect();
        assert_eq!(got, [vec![6.0, 8.0], vec![2.0, 4.0], vec![0.0]]);
        assert_eq!(
            names(&fed.grads),
            ["a", "b", "unused"],
            "the variables' order"
        );
    }

    #[test]
    fn segments_on_a_bf16_wire_are_sent_and_returned_as_bf16() {
        let (a, b) = (var(&[1.0, 2.0]), var(&[3.0, 4.0]));
        let mut cuts = Cuts::default();
        let h = cuts.cut(&(a.as_tensor() * 2.0).unwrap()).unwrap();
        let loss = (h * b.as_tensor()).unwrap().sum_all().unwrap();
        let (sender, mut sent) = tokio::sync::mpsc::unbounded_channel();
        let mut bf16 = feed(&[("a", &a), ("b", &b)]);
        bf16.wire = ps_proto::codec::DType::BF16;
        let fed = bf16.run(cuts.backward(&loss), &sender).unwrap();
        let bf16_values = |p: &ParamBytes| {
            let dtype = ps_proto::codec::DType::BF16;
            ps_proto::codec::TensorData::new(dtype, vec![p.data.len() / 2], p.data.clone())
                .expect("two bytes a value")
                .to_f32_vec()
        };
        let top = segment(&mut sent);
        assert_eq!(bf16_values(&top[0]), [2.0, 4.0], "d/db = 2a, as bf16");
        let got: Vec<Vec<f32>> = fed.grads.iter().map(bf16_values).collect();
        assert_eq!(got, [vec![6.0, 8.0], vec![2.0, 4.0]], "two bytes a value");
    }

    #[test]
    fn a_parameter_on_both_sides_of_a_cut_is_refused_by_name() {
        let tied = var(&[1.0, 2.0]);
        let mut cuts = Cuts::default();
        let h = cuts.cut(&(tied.as_tensor() * 2.0).unwrap()).unwrap();
        let loss = (h * tied.as_tensor()).unwrap().sum_all().unwrap();
        let (sender, mut sent) = tokio::sync::mpsc::unbounded_channel();
        let refused = feed(&[("tied", &tied)])
            .run(cuts.backward(&loss), &sender)
            .err()
            .expect("refused");
        assert_eq!(names(&segment(&mut sent)), ["tied"], "the top segment went");
        assert!(sent.try_recv().is_err(), "never done");
        let message = refused.to_string();
        assert!(
            matches!(refused, TrainerError::Segments(_)) && message.contains("tied"),
            "{message}"
        );
    }

    #[test]
    fn a_gone_exchange_still_gets_every_gradient_back() {
        let (a, b) = (var(&[1.0]), var(&[2.0]));
        let mut cuts = Cuts::default();
        let h = cuts.cut(&(a.as_tensor() * 3.0).unwrap()).unwrap();
        let loss = (h * b.as_tensor()).unwrap().sum_all().unwrap();
        let (sender, sent) = tokio::sync::mpsc::unbounded_channel();
        drop(sent);
        let fed = feed(&[("a", &a), ("b", &b)])
            .run(cuts.backward(&loss), &sender)
            .unwrap();
        assert_eq!(names(&fed.grads), ["a", "b"]);
        assert!(fed.grads.iter().all(|p| p.data.len() == 4));
    }
}
