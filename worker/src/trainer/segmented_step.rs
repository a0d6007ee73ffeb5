//! [`PsTrainer::backward_segments`]: a training step whose backward pass runs
//! one segment at a time ([`crate::segmented`]) on a blocking thread, each
//! segment's gradients pushed while the segments below are differentiated.

use std::time::Instant;

use candle_core::Tensor;
use futures::Stream;
use ps_client::ParamBytes;
use tokio::sync::mpsc::{self, UnboundedReceiver};

use super::segment_feed::{Fed, FedGradients, SegmentFeed};
use super::{PsTrainer, TrainerError};
use crate::segmented::Cuts;

impl PsTrainer {
    /// [`PsTrainer::backward_step`] for a forward pass cut into segments
    /// (`cuts`, see [`crate::segmented`]): the backward pass runs one segment
    /// at a time, the top first, on a blocking thread, and each segment's
    /// gradients are pushed as soon as they are ready, while the segments
    /// below are still being differentiated; each key group is pulled as soon
    /// as its push is answered. The gradients are those of `backward_step`,
    /// and so are the values after the step.
    ///
    /// Compute is booked in full. Push, wait and pull are booked only for the
    /// time the exchange ran on after the backward pass (the rest was
    /// overlapped), so a wait that began during the pass may be booked as
    /// wait in place of push or pull; an attempt that failed and is repeated
    /// is booked as compute and gather only.
    ///
    /// # Errors
    /// [`TrainerError`] from candle or the servers, and
    /// [`TrainerError::Segments`] when a parameter has gradients in two
    /// segments. Either ends the step with part of it pushed: the worker must
    /// stop (a push of the same step again would be taken as a repeat).
    pub async fn backward_segments(
        &mut self,
        loss: &Tensor,
        cuts: Cuts,
    ) -> Result<(), TrainerError> {
        if self.client.newer_map().is_some() {
            let copy = self.local_copy()?;
            self.client.follow_newer_map(&copy).await?;
        }
        let (sender, fed) = mpsc::unbounded_channel();
        let feed = SegmentFeed {
            vars: self.vars.clone(),
            copy_plan: self.copy_plan,
            buffers: std::mem::take(&mut self.segment_buffers),
            wire: self.wire,
        };
        let grads = cuts.backward(loss);
        let backward = tokio::task::spawn_blocking(move || feed.run(grads, &sender));
        let exchanging = Instant::now();
        let (fed, exchanged) = self.exchange_beside(backward, until_done(fed)).await?;
        self.segment_buffers = fed.buffers;
        self.times.compute += fed.compute;
        self.times.gather += fed.gather;
        match exchanged {
            Ok((_, waited)) => {
                let after_backward = exchanging
                    .elapsed()
                    .saturating_sub(fed.compute + fed.gather);
                self.times.exchanged(after_backward, waited);
                self.apply_pulled()?;
                self.step = self.step.next();
                Ok(())
            }
            Err(error) => self.exchange(&fed.grads, Some(error)).await,
        }
    }

    /// Runs the exchange of `segments` beside `backward`, the pass producing
    /// them: the pass's gradients and the exchange's outcome. The exchange
    /// ends once the pass is done, or earlier on its own error (the pass then
    /// runs to its end, for the step to be repeated with all its gradients);
    /// a pass that fails drops the exchange, pushes and pulls in flight.
    async fn exchange_beside(
        &mut self,
        mut backward: tokio::task::JoinHandle<Result<FedGradients, TrainerError>>,
        segments: impl Stream<Item = Vec<ParamBytes>>,
    ) -> Result<
        (
            FedGradients,
            Result<(usize, std::time::Duration), ps_client::ClientError>,
        ),
        TrainerError,
    > {
        let wait_for = self.group.consistency.version_after(self.step);
        let exchange = self.client.push_then_pull_streamed(
            (self.group.rank, self.step),
            segments,
            wait_for,
            &mut self.pulled,
        );
        let mut exchange = std::pin::pin!(exchange);
        let mut ended = None;
        let fed = tokio::select! {
            fed = &mut backward => fed,
            exchanged = &mut exchange => {
                ended = Some(exchanged);
                (&mut backward).await
            }
        };
        let fed = fed.map_err(|e| {
            candle_core::Error::Msg(format!("the backward pass ended abnormally: {e}"))
        })??;
        let exchanged = match ended {
            Some(exchanged) => exchanged,
            None => exchange.await,
        };
        Ok((fed, exchanged))
    }
}

/// The segments the feed sends, ending where it says the pass is done. A
/// pass that fails closes the channel without saying so, and then the
/// stream never ends: nothing is pulled for keys it never pushed (under BSP
/// such a pull would wait for this worker's own push).
fn until_done(fed: UnboundedReceiver<Fed>) -> impl Stream<Item = Vec<ParamBytes>> {
    futures::stream::unfold(fed, |mut fed| async move {
        match fed.recv().await {
            Some(Fed::Segment(grads)) => Some((grads, fed)),
            Some(Fed::Done) => None,
            None => std::future::pending().await,
        }
    })
}
