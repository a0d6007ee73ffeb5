//! The optimizers' default hyper-parameters, in one place: a client fills them
//! into the messages it sends, and a server reads a 0 in a field that has a
//! default as that default (so a client written from `ps.proto` alone may
//! leave them out).

/// Adam's first-moment decay.
pub const ADAM_BETA1: f64 = 0.9;
/// Adam's second-moment decay.
pub const ADAM_BETA2: f64 = 0.999;
/// Adam's denominator term.
pub const ADAM_EPS: f64 = 1e-8;
/// The momentum factor a worker asks for with `--optimizer momentum`.
pub const MOMENTUM: f64 = 0.9;
