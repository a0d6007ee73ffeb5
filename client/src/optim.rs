//! [`OptimizerChoice`]: the server-side optimizers a worker can ask for by name,
//! sent with every hyper-parameter filled in (defaults from `ps_proto::hyper`).

use std::fmt;
use std::str::FromStr;

use ps_proto::hyper;
use ps_proto::v1;

/// A server-side optimizer, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerChoice {
    /// Plain SGD.
    Sgd,
    /// SGD with momentum 0.9.
    Momentum,
    /// Adam (beta1 0.9, beta2 0.999, eps 1e-8).
    Adam,
}

impl OptimizerChoice {
    /// The wire form with learning rate `lr`.
    pub fn with_lr(self, lr: f64) -> v1::Optimizer {
        use v1::optimizer::Kind;
        let kind = match self {
            OptimizerChoice::Sgd => Kind::Sgd(v1::Sgd {
                lr,
                weight_decay: 0.0,
            }),
            OptimizerChoice::Momentum => Kind::Momentum(v1::Momentum {
                lr,
                momentum: hyper::MOMENTUM,
                weight_decay: 0.0,
                nesterov: false,
            }),
            OptimizerChoice::Adam => Kind::Adam(v1::Adam {
                lr,
                beta1: hyper::ADAM_BETA1,
                beta2: hyper::ADAM_BETA2,
                eps: hyper::ADAM_EPS,
                weight_decay: 0.0,
            }),
        };
        v1::Optimizer { kind: Some(kind) }
    }
}

/// SGD with learning rate `lr`.
pub fn sgd(lr: f64) -> v1::Optimizer {
    OptimizerChoice::Sgd.with_lr(lr)
}

/// SGD with momentum 0.9 and learning rate `lr`.
pub fn momentum(lr: f64) -> v1::Optimizer {
    OptimizerChoice::Momentum.with_lr(lr)
}

/// Adam with learning rate `lr` and the usual betas.
pub fn adam(lr: f64) -> v1::Optimizer {
    OptimizerChoice::Adam.with_lr(lr)
}

impl FromStr for OptimizerChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "sgd" => Ok(OptimizerChoice::Sgd),
            "momentum" => Ok(OptimizerChoice::Momentum),
            "adam" => Ok(OptimizerChoice::Adam),
            _ => Err(format!(
                "unknown optimizer `{s}`; use sgd, momentum or adam"
            )),
        }
    }
}

impl fmt::Display for OptimizerChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OptimizerChoice::Sgd => "sgd",
            OptimizerChoice::Momentum => "momentum",
            OptimizerChoice::Adam => "adam",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adam_goes_out_with_the_defaults_it_promises() {
        let Some(v1::optimizer::Kind::Adam(adam)) = adam(0.01).kind else {
            panic!("adam(..) is not Adam");
        };
        assert_eq!(
            (adam.lr, adam.beta1, adam.beta2, adam.eps),
            (0.01, 0.9, 0.999, 1e-8)
        );
        let Some(v1::optimizer::Kind::Momentum(m)) = momentum(0.1).kind else {
            panic!("momentum(..) is not momentum");
        };
        assert_eq!((m.lr, m.momentum, m.nesterov), (0.1, 0.9, false));
    }
}
