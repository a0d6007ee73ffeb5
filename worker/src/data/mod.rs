//! Data sets: shipped, generated or read from local files, never downloaded.
//!
//! - [`digits`]: the UCI handwritten digits (1,797 8x8 images), shipped in the crate.
//! - [`idx`]: the IDX format of MNIST and Fashion-MNIST, plain or gzipped.
//! - [`synthetic`]: a classification task labelled by a fixed random teacher network.
//!
//! Every worker trains on its own contiguous slice of the training split, by rank.

pub mod digits;
pub mod idx;
pub use ps_common::rng;
pub mod clicks;
pub mod synthetic;

use std::path::PathBuf;

use candle_core::{Device, Tensor};

/// Why a data set could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not what it should be.
    #[error("{path} is malformed: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The data set's parameters make no sense.
    #[error("invalid data set: {0}")]
    Invalid(String),
    /// Building a tensor failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Examples of one split: `len` rows of `features` values in `[0, 1]`-ish, and labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// Row-major features, `len * features` values.
    pub features: Vec<f32>,
    /// One label per example.
    pub labels: Vec<u32>,
    /// Values per example.
    pub width: usize,
    /// Categorical features: `fields` row ids per example, in example order
    /// (empty for data sets of dense features only).
    pub ids: Vec<u64>,
    /// Row ids per example.
    pub fields: usize,
}

impl Split {
    /// A split of dense features only.
    pub fn dense(features: Vec<f32>, labels: Vec<u32>, width: usize) -> Self {
        Self {
            features,
            labels,
            width,
            ids: Vec::new(),
            fields: 0,
        }
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The examples at `indices`, in that order.
    pub fn select(&self, indices: &[usize]) -> Split {
        let mut features = Vec::with_capacity(indices.len() * self.width);
        for &i in indices {
            features.extend_from_slice(&self.features[i * self.width..(i + 1) * self.width]);
        }
        let mut ids = Vec::with_capacity(indices.len() * self.fields);
        for &i in indices {
            ids.extend_from_slice(&self.ids[i * self.fields..(i + 1) * self.fields]);
        }
        let labels = indices.iter().map(|&i| self.labels[i]).collect();
        Split {
            features,
            labels,
            width: self.width,
            ids,
            fields: self.fields,
        }
    }

    /// Worker `rank`'s contiguous share of `workers` equal shares (the remainder of an
    /// uneven division goes to the last ranks, one example each).
    pub fn shard(&self, rank: usize, workers: usize) -> Split {
        let (start, end) = shard_range(self.len(), rank, workers);
        self.select(&(start..end).collect::<Vec<_>>())
    }

    /// Consecutive batches of `size` examples; a last, partial batch is dropped.
    pub fn batches(&self, size: usize) -> impl Iterator<Item = Split> + '_ {
        let size = size.max(1);
        (0..self.len() / size)
            .map(move |b| self.select(&(b * size..(b + 1) * size).collect::<Vec<_>>()))
    }

    /// The examples as tensors: features `[len, width]` f32 and labels `[len]` u32.
    ///
    /// # Errors
    /// When the device cannot hold them.
    pub fn to_tensors(&self, device: &Device) -> Result<(Tensor, Tensor), DataError> {
        let x = Tensor::from_slice(&self.features, (self.len(), self.width), device)?;
        let y = Tensor::from_slice(&self.labels, self.len(), device)?;
        Ok((x, y))
    }
}

/// The half-open range of examples that worker `rank` of `workers` trains on.
pub fn shard_range(len: usize, rank: usize, workers: usize) -> (usize, usize) {
    let workers = workers.max(1);
    (len * rank / workers, len * (rank + 1) / workers)
}

/// A classification data set with a fixed train/test split.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Name, for logs and summaries.
    pub name: String,
    /// Number of classes; labels are `0..classes`.
    pub classes: usize,
    /// Training examples.
    pub train: Split,
    /// Held-out examples.
    pub test: Split,
}

impl Dataset {
    /// Values per example.
    pub fn width(&self) -> usize {
        self.train.width
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_disjoint_and_cover_everything() {
        for (len, workers) in [(10, 3), (1437, 2), (7, 7), (5, 1)] {
            let mut covered = Vec::new();
            for rank in 0..workers {
                let (start, end) = shard_range(len, rank, workers);
                covered.extend(start..end);
            }
            assert_eq!(
                covered,
                (0..len).collect::<Vec<_>>(),
                "{len} over {workers}"
            );
        }
    }

    #[test]
    fn batches_drop_the_remainder() {
        let split = Split::dense((0..7).map(|i| i as f32).collect(), (0..7).collect(), 1);
        let batches: Vec<Vec<u32>> = split.batches(3).map(|b| b.labels).collect();
        assert_eq!(batches, vec![vec![0, 1, 2], vec![3, 4, 5]]);
    }

    #[test]
    fn select_keeps_rows_together() {
        let split = Split::dense(vec![0.0, 0.1, 1.0, 1.1, 2.0, 2.1], vec![0, 1, 2], 2);
        let picked = split.select(&[2, 0]);
        assert_eq!(picked.features, vec![2.0, 2.1, 0.0, 0.1]);
        assert_eq!(picked.labels, vec![2, 0]);
    }
}
