//! A row's initial values: drawn from a generator seeded by the table's name,
//! the row's id and the table's seed, so that every server, every restart and
//! every pull of a row never pushed makes the same row.

use ps_common::rng::SplitMix64;
use ps_proto::rows::{mix, name_hash};

use super::spec::{RowInit, TableSpec};

/// Writes the initial values of row `id` of `table` into `out` (`width` elements).
pub fn initial_row(table: &TableSpec, id: u64, out: &mut [f32]) {
    let seed = mix(name_hash(table.name.as_bytes()) ^ mix(id)) ^ table.seed;
    let mut rng = SplitMix64::new(seed);
    match table.init {
        RowInit::Zeros => out.fill(0.0),
        RowInit::Uniform { low, high } => {
            for value in out {
                *value = (low + (high - low) * rng.next_f64()) as f32;
            }
        }
        RowInit::Normal { std } => {
            for value in out {
                *value = (f64::from(rng.normal()) * std) as f32;
            }
        }
    }
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
