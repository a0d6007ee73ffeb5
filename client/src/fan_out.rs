//! Requests to several servers at once: [`all_or_first_error`] returns every
//! answer in the order asked, or the first error the moment it happens.
//!
//! `futures::future::try_join_all` is not that for an iterator of unknown
//! length (a `flat_map` over servers and their request groups): it then
//! collects through `FuturesOrdered`, which hands out results in order, so an
//! error from the second server waits behind the first server's answer. A BSP
//! pull held by a healthy server (for a push that the failed server's restart
//! lost) would then hide the failure until the pull timed out, and the repair
//! that would let the step finish never ran.

use std::future::Future;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};

/// Runs `requests` concurrently: their results in the order given, or the
/// first error to happen (the other requests are dropped).
///
/// Not an `async fn`: the future it returns holds the requests only, not the
/// iterator that made them (whose closures would make it `Send` only for some
/// lifetimes).
///
/// # Errors
/// The first error any request returns.
pub(crate) fn all_or_first_error<T, E, F>(
    requests: impl IntoIterator<Item = F>,
) -> impl Future<Output = Result<Vec<T>, E>>
where
    F: Future<Output = Result<T, E>>,
{
    let mut pending: FuturesUnordered<_> = requests
        .into_iter()
        .enumerate()
        .map(|(index, request)| request.map(move |answer| (index, answer)))
        .collect();
    async move {
        let mut answers = Vec::with_capacity(pending.len());
        while let Some((index, answer)) = pending.next().await {
            answers.push((index, answer?));
        }
        answers.sort_unstable_by_key(|(index, _)| *index);
        Ok(answers.into_iter().map(|(_, answer)| answer).collect())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    /// A request that answers `value` after `after`.
    async fn answer(value: u32, after: Duration) -> Result<u32, String> {
        tokio::time::sleep(after).await;
        Ok(value)
    }

    async fn failure(after: Duration) -> Result<u32, String> {
        tokio::time::sleep(after).await;
        Err("refused".into())
    }

    #[tokio::test(start_paused = true)]
    async fn answers_come_back_in_the_order_asked() {
        let requests = [3, 1, 2].map(|s| answer(s, Duration::from_secs(u64::from(s))));
        assert_eq!(all_or_first_error(requests).await, Ok(vec![3, 1, 2]));
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_ends_the_wait_at_once_whatever_its_place() {
        let started = Instant::now();
        // An iterator of unknown length, as the flat_map over servers and
        // their request groups makes.
        let requests = (0..2).flat_map(|server| {
            let request = match server {
                0 => futures::future::Either::Left(answer(0, Duration::from_secs(3600))),
                _ => futures::future::Either::Right(failure(Duration::from_millis(5))),
            };
            vec![request]
        });
        assert_eq!(requests.size_hint().1, None);
        assert_eq!(all_or_first_error(requests).await, Err("refused".into()));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
}
