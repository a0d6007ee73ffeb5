//! A row's initial values: drawn from a generator seeded by the table's name,
//! the row's id and the table's seed, so that every server, every restart and
//! every pull of a row never pushed makes the same row.

use ps_common::rng::SplitMix64;
use ps_proto::rows::{mix, name_hash};

use super::spec::{RowInit, TableSpec};

/// How one table's rows start, with the table's part of every row's seed
/// worked out once.
#[derive(Debug, Clone, Copy)]
pub struct RowStarts {
    init: RowInit,
    table_seed: u64,
    seed: u64,
}

impl RowStarts {
    /// The starts of `table`'s rows.
    pub fn of(table: &TableSpec) -> Self {
        Self {
            init: table.init,
            table_seed: name_hash(table.name.as_bytes()),
            seed: table.seed,
        }
    }

    /// Writes the initial values of row `id` into `out` (one row).
    pub fn fill(&self, id: u64, out: &mut [f32]) {
        let mut rng = SplitMix64::new(mix(self.table_seed ^ mix(id)) ^ self.seed);
        match self.init {
            RowInit::Zeros => out.fill(0.0),
            RowInit::Uniform { low, high } => {
                // Two 24-bit uniforms per draw: a row of 64 costs 32 draws.
                let (low, span) = (low as f32, (high - low) as f32);
                let unit = |bits: u64| (bits & 0xff_ffff) as i32 as f32 * (1.0 / 16_777_216.0);
                let mut pairs = out.chunks_exact_mut(2);
                for pair in &mut pairs {
                    let bits = rng.next_u64();
                    pair[0] = low + span * unit(bits >> 40);
                    pair[1] = low + span * unit(bits >> 8);
                }
                if let [last] = pairs.into_remainder() {
                    *last = low + span * unit(rng.next_u64() >> 40);
                }
            }
            RowInit::Normal { std } => {
                for value in out {
                    *value = (f64::from(rng.normal()) * std) as f32;
                }
            }
        }
    }
}

/// Writes the initial values of row `id` of `table` into `out` (`width` elements).
pub fn initial_row(table: &TableSpec, id: u64, out: &mut [f32]) {
    RowStarts::of(table).fill(id, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::spec::RowOptimizer;

    fn table(init: RowInit, seed: u64) -> TableSpec {
        TableSpec {
            name: "emb".into(),
            width: 16,
            init,
            seed,
            optimizer: RowOptimizer::Sgd {
                lr: 0.1,
                weight_decay: 0.0,
            },
            max_rows: None,
            buckets: 4,
        }
    }

    fn row(table: &TableSpec, id: u64) -> Vec<f32> {
        let mut out = vec![f32::NAN; table.width];
        initial_row(table, id, &mut out);
        out
    }

    #[test]
    fn rows_are_deterministic_distinct_and_in_range() {
        let uniform = table(
            RowInit::Uniform {
                low: -0.5,
                high: 0.5,
            },
            1,
        );
        assert_eq!(row(&uniform, 3), row(&uniform, 3));
        assert_ne!(row(&uniform, 3), row(&uniform, 4));
        assert_ne!(row(&uniform, 3), row(&table(uniform.init, 2), 3));
        assert!(row(&uniform, 9).iter().all(|v| (-0.5..0.5).contains(v)));
        assert!(row(&table(RowInit::Zeros, 0), 5).iter().all(|v| *v == 0.0));
        let normal = table(RowInit::Normal { std: 0.01 }, 0);
        let values: Vec<f32> = (0..200).flat_map(|id| row(&normal, id)).collect();
        let var = values.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / values.len() as f64;
        assert!((var.sqrt() - 0.01).abs() < 0.001, "std {}", var.sqrt());
    }
}
