//! The computing side of [`crate::PsTrainer::backward_segments`]: runs a
//! segmented backward pass ([`crate::segmented`]) on a blocking thread,
//! copies each segment's gradients to host buffers and hands them to the
//! exchange as soon as they are ready, while the next segment is
//! differentiated.

use std::time::{Duration, Instant};

use bytes::Bytes;
use candle_core::{Tensor, Var};
use ps_client::ParamBytes;
use tokio::sync::mpsc::UnboundedSender;

use crate::host_copy::{CopyPlan, HostBuffer};
use crate::segmented::SegmentGrads;
use crate::trainer::TrainerError;

/// The trainer's variables and how their tensors reach the host.
pub(crate) struct SegmentFeed {
    pub(crate) vars: Vec<(String, Var)>,
    pub(crate) copy_plan: CopyPlan,
}

/// A segmented backward pass that ended: every variable's gradient (zeros for
/// one no segment reached), in the variables' order, and where its time went.
pub(crate) struct FedGradients {
    pub(crate) grads: Vec<ParamBytes>,
    pub(crate) compute: Duration,
    pub(crate) gather: Duration,
}

impl SegmentFeed {
    /// Differentiates `segments` one by one, sending each segment's new
    /// gradients to `exchange`, then the zeros of the variables none reached.
    /// Carries on when the exchange has gone (it failed): the step is then
    /// repeated with the gradients returned.
    pub(crate) fn run(
        self,
        segments: SegmentGrads,
        exchange: &UnboundedSender<Vec<ParamBytes>>,
    ) -> Result<FedGradients, TrainerError> {
        let mut fed: Vec<Option<Bytes>> = vec![None; self.vars.len()];
        let (mut compute, mut gather) = (Duration::ZERO, Duration::ZERO);
        let mut segments = segments;
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
            let segment = self.to_host(&fresh, &mut fed)?;
            gather += gathering.elapsed();
            let _ = exchange.send(segment);
        }
        let gathering = Instant::now();
        let unreached = fed
            .iter()
            .enumerate()
            .filter(|(_, bytes)| bytes.is_none())
            .map(|(i, _)| Ok((i, self.vars[i].1.as_tensor().zeros_like()?)))
            .collect::<candle_core::Result<Vec<_>>>()?;
        if !unreached.is_empty() {
            let zeros = self.to_host(&unreached, &mut fed)?;
            let _ = exchange.send(zeros);
        }
        gather += gathering.elapsed();
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
        })
    }

    /// `tensors` (variable index, gradient) as named host bytes, each also
    /// kept in `fed` at its variable's index.
    fn to_host(
        &self,
        tensors: &[(usize, Tensor)],
        fed: &mut [Option<Bytes>],
    ) -> Result<Vec<ParamBytes>, TrainerError> {
        let values: Vec<Tensor> = tensors.iter().map(|(_, t)| t.clone()).collect();
        // A buffer of its own: a segment's bytes are still being pushed while
        // the next segment's come off the device.
        let bytes = self
            .copy_plan
            .to_host(&values, &mut HostBuffer::default())?;
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
        assert_eq!(
            names(&sent.try_recv().unwrap()),
            ["b"],
            "the top segment first"
        );
        assert_eq!(names(&sent.try_recv().unwrap()), ["a"]);
        assert_eq!(names(&sent.try_recv().unwrap()), ["unused"]);
        assert!(sent.try_recv().is_err(), "nothing more");
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
    fn a_parameter_on_both_sides_of_a_cut_is_refused_by_name() {
        let tied = var(&[1.0, 2.0]);
        let mut cuts = Cuts::default();
        let h = cuts.cut(&(tied.as_tensor() * 2.0).unwrap()).unwrap();
        let loss = (h * tied.as_tensor()).unwrap().sum_all().unwrap();
        let (sender, _sent) = tokio::sync::mpsc::unbounded_channel();
        let refused = feed(&[("tied", &tied)])
            .run(cuts.backward(&loss), &sender)
            .err()
            .expect("refused");
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
