//! Embedding tables as a worker declares them: [`table`] builds a `ps.v1`
//! table spec, [`RowOptimizerChoice`] names the row optimizers (with Adagrad's
//! and Adam's defaults filled in), [`uniform_rows`] and [`normal_rows`] the
//! initialisers.

use std::fmt;
use std::str::FromStr;

use ps_proto::codec::DType;
use ps_proto::hyper;
use ps_proto::v1;

/// Adagrad's starting accumulator, as TensorFlow's: keeps the first steps of
/// a row from being huge.
pub const ADAGRAD_INITIAL_ACCUMULATOR: f64 = 0.1;

/// A server-side row optimizer, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOptimizerChoice {
    /// Plain SGD.
    Sgd,
    /// Adagrad, initial accumulator 0.1.
    Adagrad,
    /// Lazy Adam (beta1 0.9, beta2 0.999, eps 1e-8).
    LazyAdam,
}

impl RowOptimizerChoice {
    /// The wire form with learning rate `lr`.
    pub fn with_lr(self, lr: f64) -> v1::RowOptimizer {
        use v1::row_optimizer::Kind;
        let kind = match self {
            RowOptimizerChoice::Sgd => Kind::Sgd(v1::Sgd {
                lr,
                weight_decay: 0.0,
            }),
            RowOptimizerChoice::Adagrad => Kind::Adagrad(v1::Adagrad {
                lr,
                initial_accumulator: ADAGRAD_INITIAL_ACCUMULATOR,
                eps: 0.0,
            }),
            RowOptimizerChoice::LazyAdam => Kind::LazyAdam(v1::Adam {
                lr,
                beta1: hyper::ADAM_BETA1,
                beta2: hyper::ADAM_BETA2,
                eps: hyper::ADAM_EPS,
                weight_decay: 0.0,
            }),
        };
        v1::RowOptimizer { kind: Some(kind) }
    }
}

impl FromStr for RowOptimizerChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sgd" => Ok(RowOptimizerChoice::Sgd),
            "adagrad" => Ok(RowOptimizerChoice::Adagrad),
            "lazy-adam" => Ok(RowOptimizerChoice::LazyAdam),
            other => Err(format!(
                "unknown row optimizer {other:?}; choose sgd, adagrad or lazy-adam"
            )),
        }
    }
}

impl fmt::Display for RowOptimizerChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RowOptimizerChoice::Sgd => "sgd",
            RowOptimizerChoice::Adagrad => "adagrad",
            RowOptimizerChoice::LazyAdam => "lazy-adam",
        })
    }
}

/// Rows that start uniform in `[-bound, bound)`, drawn with `seed`.
pub fn uniform_rows(bound: f64, seed: u64) -> v1::RowInit {
    v1::RowInit {
        kind: Some(v1::row_init::Kind::Uniform(v1::RowUniform {
            low: -bound,
            high: bound,
        })),
        seed,
    }
}

/// Rows that start normal with mean 0 and deviation `std`, drawn with `seed`.
pub fn normal_rows(std: f64, seed: u64) -> v1::RowInit {
    v1::RowInit {
        kind: Some(v1::row_init::Kind::Normal(v1::RowNormal { std })),
        seed,
    }
}

/// An `f32` table `name` of rows `width` wide, any 64-bit id, the default
/// bucket count.
pub fn table(
    name: &str,
    width: u32,
    init: v1::RowInit,
    optimizer: v1::RowOptimizer,
) -> v1::TableSpec {
    v1::TableSpec {
        name: name.to_string(),
        width,
        dtype: DType::F32.to_proto(),
        init: Some(init),
        optimizer: Some(optimizer),
        max_rows: 0,
        buckets: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_optimizers_parse_by_name_and_print_back() {
        for choice in [
            RowOptimizerChoice::Sgd,
            RowOptimizerChoice::Adagrad,
            RowOptimizerChoice::LazyAdam,
        ] {
            assert_eq!(choice.to_string().parse::<RowOptimizerChoice>(), Ok(choice));
        }
        assert!(
            "adam"
                .parse::<RowOptimizerChoice>()
                .unwrap_err()
                .contains("lazy-adam")
        );
    }
}
