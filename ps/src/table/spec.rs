//! [`TableSpec`]: an embedding table as a server holds it (row width, how rows
//! start, how row gradients update them, which ids exist, how many buckets),
//! checked from its `ps.v1` form.

use std::fmt;

use ps_proto::codec::DType;
use ps_proto::rows::{MAX_BUCKETS, MAX_WIDTH};
use ps_proto::v1;

use crate::optimizer::{InvalidOptimizer, OptimizerSpec};

/// How a table's rows start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowInit {
    /// All zeros.
    Zeros,
    /// Uniform in `[low, high)`.
    Uniform {
        /// Lower bound.
        low: f64,
        /// Upper bound.
        high: f64,
    },
    /// Normal with mean 0.
    Normal {
        /// Standard deviation.
        std: f64,
    },
}

/// How row gradients update a table's rows; each touches only the rows present.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowOptimizer {
    /// `w -= lr * (g + weight_decay * w)`.
    Sgd {
        /// Learning rate.
        lr: f64,
        /// L2 penalty.
        weight_decay: f64,
    },
    /// `s += g^2`, `w -= lr * g / (sqrt(s) + eps)`.
    Adagrad {
        /// Learning rate.
        lr: f64,
        /// The starting value of `s`.
        initial_accumulator: f64,
        /// Denominator term.
        eps: f64,
    },
    /// Adam(W) for the rows present, their moments untouched otherwise.
    LazyAdam {
        /// Learning rate.
        lr: f64,
        /// First-moment decay.
        beta1: f64,
        /// Second-moment decay.
        beta2: f64,
        /// Denominator term.
        eps: f64,
        /// Decoupled weight decay.
        weight_decay: f64,
    },
}

/// Adagrad's default denominator term (PyTorch's).
pub const ADAGRAD_EPS: f64 = 1e-10;

impl RowOptimizer {
    /// `f32` state values kept per row element.
    pub fn state_per_element(&self) -> usize {
        match self {
            RowOptimizer::Sgd { .. } => 0,
            RowOptimizer::Adagrad { .. } => 1,
            RowOptimizer::LazyAdam { .. } => 2,
        }
    }

    /// The wire form.
    pub fn to_proto(&self) -> v1::RowOptimizer {
        use v1::row_optimizer::Kind;
        let kind = match *self {
            RowOptimizer::Sgd { lr, weight_decay } => Kind::Sgd(v1::Sgd { lr, weight_decay }),
            RowOptimizer::Adagrad {
                lr,
                initial_accumulator,
                eps,
            } => Kind::Adagrad(v1::Adagrad {
                lr,
                initial_accumulator,
                eps,
            }),
            RowOptimizer::LazyAdam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => Kind::LazyAdam(v1::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            }),
        };
        v1::RowOptimizer { kind: Some(kind) }
    }

    /// Checks a row optimizer from the wire, filling documented defaults; SGD
    /// and Adam are checked as the dense ones are.
    ///
    /// # Errors
    /// What is missing or out of range.
    pub fn from_proto(optimizer: Option<&v1::RowOptimizer>) -> Result<Self, String> {
        use v1::row_optimizer::Kind;
        let dense = |kind| OptimizerSpec::from_proto(Some(&v1::Optimizer { kind: Some(kind) }));
        let kind = optimizer.and_then(|o| o.kind.as_ref()).ok_or(
            "no row optimizer given; set exactly one of optimizer.sgd, optimizer.adagrad, optimizer.lazy_adam",
        )?;
        let checked = match kind {
            Kind::Sgd(sgd) => match dense(v1::optimizer::Kind::Sgd(*sgd)) {
                Ok(OptimizerSpec::Sgd { lr, weight_decay }) => {
                    Ok(RowOptimizer::Sgd { lr, weight_decay })
                }
                Ok(_) => unreachable!("an SGD message checks as SGD"),
                Err(e) => Err(e),
            },
            Kind::LazyAdam(adam) => match dense(v1::optimizer::Kind::Adam(*adam)) {
                Ok(OptimizerSpec::Adam {
                    lr,
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                }) => Ok(RowOptimizer::LazyAdam {
                    lr,
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                }),
                Ok(_) => unreachable!("an Adam message checks as Adam"),
                Err(e) => Err(e),
            },
            Kind::Adagrad(adagrad) => adagrad_from(adagrad),
        };
        checked.map_err(|e| e.to_string())
    }
}

fn adagrad_from(adagrad: &v1::Adagrad) -> Result<RowOptimizer, InvalidOptimizer> {
    let out_of_range = |name, range, value| InvalidOptimizer::OutOfRange { name, range, value };
    let eps = if adagrad.eps == 0.0 {
        ADAGRAD_EPS
    } else {
        adagrad.eps
    };
    if !(adagrad.lr.is_finite() && adagrad.lr > 0.0) {
        return Err(out_of_range("learning rate", "finite and > 0", adagrad.lr));
    }
    let initial = adagrad.initial_accumulator;
    if !(initial.is_finite() && initial >= 0.0) {
        return Err(out_of_range(
            "initial_accumulator",
            "finite and >= 0",
            initial,
        ));
    }
    if !(eps.is_finite() && eps > 0.0) {
        return Err(out_of_range("eps", "finite and > 0", eps));
    }
    Ok(RowOptimizer::Adagrad {
        lr: adagrad.lr,
        initial_accumulator: initial,
        eps,
    })
}

/// An embedding table, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    /// Table name.
    pub name: String,
    /// Elements per row.
    pub width: usize,
    /// How rows start.
    pub init: RowInit,
    /// Mixed into every row's generator.
    pub seed: u64,
    /// How row gradients update the rows.
    pub optimizer: RowOptimizer,
    /// Ids are below this; `None`: any 64-bit id.
    pub max_rows: Option<u64>,
    /// Buckets the rows are spread over.
    pub buckets: u32,
}

impl TableSpec {
    /// Checks a table from the wire.
    ///
    /// # Errors
    /// What is wrong, in words a person can act on.
    pub fn from_proto(table: &v1::TableSpec) -> Result<Self, String> {
        if table.name.is_empty() {
            return Err("the table has no name".into());
        }
        if table.width == 0 || table.width > MAX_WIDTH {
            return Err(format!(
                "width must be 1 to {MAX_WIDTH}, got {}",
                table.width
            ));
        }
        if table.buckets == 0 || table.buckets > MAX_BUCKETS {
            return Err(format!(
                "buckets must be 1 to {MAX_BUCKETS}, got {}",
                table.buckets
            ));
        }
        match DType::from_proto(table.dtype) {
            Ok(DType::F32) => {}
            _ => {
                return Err(format!(
                    "rows are DTYPE_F32 only for now, got dtype {}",
                    table.dtype
                ));
            }
        }
        let init = table.init.as_ref();
        Ok(Self {
            name: table.name.clone(),
            width: table.width as usize,
            init: row_init(init)?,
            seed: init.map_or(0, |i| i.seed),
            optimizer: RowOptimizer::from_proto(table.optimizer.as_ref())
                .map_err(|e| format!("optimizer: {e}"))?,
            max_rows: (table.max_rows > 0).then_some(table.max_rows),
            buckets: table.buckets,
        })
    }

    /// The wire form.
    pub fn to_proto(&self) -> v1::TableSpec {
        use v1::row_init::Kind;
        let kind = match self.init {
            RowInit::Zeros => None,
            RowInit::Uniform { low, high } => Some(Kind::Uniform(v1::RowUniform { low, high })),
            RowInit::Normal { std } => Some(Kind::Normal(v1::RowNormal { std })),
        };
        v1::TableSpec {
            name: self.name.clone(),
            width: self.width as u32,
            dtype: DType::F32.to_proto(),
            init: Some(v1::RowInit {
                kind,
                seed: self.seed,
            }),
            optimizer: Some(self.optimizer.to_proto()),
            max_rows: self.max_rows.unwrap_or(0),
            buckets: self.buckets,
        }
    }

    /// Bytes one stored row takes: values and optimizer state, and its slot in
    /// the bucket's index and id list.
    pub fn row_bytes(&self) -> usize {
        self.width * 4 * (1 + self.optimizer.state_per_element()) + ROW_INDEX_BYTES
    }
}

/// Bytes of a row's index entry and id: a hash-map slot (id and slot number,
/// at a load factor of about 7/8) and the id list's entry.
pub const ROW_INDEX_BYTES: usize = 24;

fn row_init(init: Option<&v1::RowInit>) -> Result<RowInit, String> {
    use v1::row_init::Kind;
    match init.and_then(|i| i.kind.as_ref()) {
        None => Ok(RowInit::Zeros),
        Some(Kind::Uniform(u)) => {
            if u.low.is_finite() && u.high.is_finite() && u.low <= u.high {
                Ok(RowInit::Uniform {
                    low: u.low,
                    high: u.high,
                })
            } else {
                Err(format!(
                    "init.uniform needs finite bounds with low <= high, got [{}, {})",
                    u.low, u.high
                ))
            }
        }
        Some(Kind::Normal(n)) => {
            if n.std.is_finite() && n.std >= 0.0 {
                Ok(RowInit::Normal { std: n.std })
            } else {
                Err(format!(
                    "init.normal.std must be finite and >= 0, got {}",
                    n.std
                ))
            }
        }
    }
}

impl fmt::Display for TableSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "table `{}` (width {}, {} buckets, init {:?} seed {}, {:?}, ",
            self.name, self.width, self.buckets, self.init, self.seed, self.optimizer
        )?;
        match self.max_rows {
            Some(rows) => write!(f, "ids below {rows})"),
            None => write!(f, "any id)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire() -> v1::TableSpec {
        v1::TableSpec {
            name: "emb".into(),
            width: 8,
            dtype: DType::F32.to_proto(),
            init: Some(v1::RowInit {
                kind: Some(v1::row_init::Kind::Uniform(v1::RowUniform {
                    low: -0.1,
                    high: 0.1,
                })),
                seed: 7,
            }),
            optimizer: Some(
                RowOptimizer::Adagrad {
                    lr: 0.1,
                    initial_accumulator: 0.1,
                    eps: 1e-10,
                }
                .to_proto(),
            ),
            max_rows: 1000,
            buckets: 4,
        }
    }

    #[test]
    fn a_table_round_trips_through_the_wire() {
        let spec = TableSpec::from_proto(&wire()).unwrap();
        assert_eq!(TableSpec::from_proto(&spec.to_proto()).unwrap(), spec);
        assert_eq!(spec.row_bytes(), 8 * 4 * 2 + ROW_INDEX_BYTES);
    }

    #[test]
    fn bad_tables_are_named() {
        type Spoil = fn(&mut v1::TableSpec);
        let cases: [(Spoil, &str); 7] = [
            (|t| t.name.clear(), "no name"),
            (|t| t.width = 0, "width"),
            (|t| t.buckets = MAX_BUCKETS + 1, "buckets"),
            (|t| t.dtype = DType::F16.to_proto(), "DTYPE_F32"),
            (|t| t.optimizer = None, "no row optimizer"),
            (
                |t| {
                    t.init.as_mut().unwrap().kind =
                        Some(v1::row_init::Kind::Normal(v1::RowNormal { std: f64::NAN }))
                },
                "init.normal.std",
            ),
            (
                |t| {
                    t.optimizer = Some(v1::RowOptimizer {
                        kind: Some(v1::row_optimizer::Kind::Adagrad(v1::Adagrad {
                            lr: 0.1,
                            initial_accumulator: -1.0,
                            eps: 0.0,
                        })),
                    })
                },
                "initial_accumulator",
            ),
        ];
        for (spoil, expected) in cases {
            let mut table = wire();
            spoil(&mut table);
            let error = TableSpec::from_proto(&table).unwrap_err();
            assert!(error.contains(expected), "{error}");
        }
    }
}
