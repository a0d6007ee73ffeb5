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

use crate::host_copy::CopyPlan;
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
        let bytes = self.copy_plan.to_host(&values)?;
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
