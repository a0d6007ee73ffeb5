//! A synthetic click-through data set, as DLRM's synthetic generator makes
//! one: each example has `fields` categorical features, each an id drawn from
//! a Zipf law over its field's ids, and a label from a fixed random teacher.
//! Every id has a hidden vector and every field a weight vector; an example is
//! a click when the sum over its fields of weight · hidden vector is positive
//! (about half are). The ids of field `f` are `f * ids_per_field + k`, so all
//! fields share one embedding table. Generated from a seed, never downloaded.

use ps_common::rng::SplitMix64;
use ps_common::zipf::Zipf;
use ps_proto::rows::mix;

use super::{DataError, Dataset, Split};

/// The shape of a click data set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClickSpec {
    /// Categorical features per example.
    pub fields: usize,
    /// Ids of each field.
    pub ids_per_field: u64,
    /// Exponent of the Zipf law ids follow.
    pub zipf: f64,
    /// Width of the teacher's hidden vectors.
    pub teacher_width: usize,
    /// Training examples.
    pub train: usize,
    /// Test examples.
    pub test: usize,
    /// Seed of the teacher and the examples.
    pub seed: u64,
}

impl Default for ClickSpec {
    fn default() -> Self {
        Self {
            fields: 8,
            ids_per_field: 10_000,
            zipf: 1.05,
            teacher_width: 4,
            train: 64_000,
            test: 8_000,
            seed: 17,
        }
    }
}

impl ClickSpec {
    /// Rows the table of this data set needs: every field's ids.
    pub fn rows(&self) -> u64 {
        self.fields as u64 * self.ids_per_field
    }
}

/// The teacher: a hidden vector per id (drawn from the id, never stored) and
/// a weight vector per field.
struct Teacher {
    spec: ClickSpec,
    weights: Vec<f32>,
}

impl Teacher {
    fn new(spec: ClickSpec) -> Self {
        let mut rng = SplitMix64::new(spec.seed);
        let weights = (0..spec.fields * spec.teacher_width)
            .map(|_| rng.normal())
            .collect();
        Self { spec, weights }
    }

    /// The contribution of `id` in field `field` to an example's score.
    fn share(&self, field: usize, id: u64) -> f32 {
        let mut rng = SplitMix64::new(mix(self.spec.seed ^ mix(id)));
        let width = self.spec.teacher_width;
        let weights = &self.weights[field * width..(field + 1) * width];
        weights.iter().map(|w| w * rng.normal()).sum()
    }
}

fn sample(teacher: &Teacher, zipf: &Zipf, rng: &mut SplitMix64, n: usize) -> Split {
    let spec = teacher.spec;
    let mut ids = Vec::with_capacity(n * spec.fields);
    let labels = (0..n)
        .map(|_| {
            let mut score = 0.0;
            for field in 0..spec.fields {
                let id = field as u64 * spec.ids_per_field + zipf.sample(rng) - 1;
                score += teacher.share(field, id);
                ids.push(id);
            }
            u32::from(score > 0.0)
        })
        .collect();
    Split {
        features: Vec::new(),
        labels,
        width: 0,
        ids,
        fields: spec.fields,
    }
}

/// Generates the data set.
///
/// # Errors
/// [`DataError::Invalid`] for a spec with no fields, ids or examples.
pub fn generate(spec: ClickSpec) -> Result<Dataset, DataError> {
    if spec.fields == 0 || spec.ids_per_field == 0 || spec.train == 0 || spec.test == 0 {
        return Err(DataError::Invalid(format!(
            "a click data set needs fields, ids and examples: {spec:?}"
        )));
    }
    if !(spec.zipf.is_finite() && spec.zipf > 0.0) {
        return Err(DataError::Invalid(format!(
            "the Zipf exponent must be above 0, got {}",
            spec.zipf
        )));
    }
    let teacher = Teacher::new(spec);
    let zipf = Zipf::new(spec.ids_per_field, spec.zipf);
    let mut rng = SplitMix64::new(spec.seed.wrapping_add(1));
    let train = sample(&teacher, &zipf, &mut rng, spec.train);
    let test = sample(&teacher, &zipf, &mut rng, spec.test);
    Ok(Dataset {
        name: "clicks".into(),
        classes: 2,
        train,
        test,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clicks_are_balanced_deterministic_and_in_their_fields() {
        let spec = ClickSpec {
            train: 4000,
            test: 100,
            ..ClickSpec::default()
        };
        let data = generate(spec).unwrap();
        assert_eq!(data.train.ids.len(), 4000 * spec.fields);
        let clicks = data.train.labels.iter().filter(|l| **l == 1).count();
        assert!((1600..2400).contains(&clicks), "{clicks} clicks of 4000");
        for example in data.train.ids.chunks_exact(spec.fields) {
            for (field, id) in example.iter().enumerate() {
                assert_eq!(*id / spec.ids_per_field, field as u64);
            }
        }
        assert_eq!(generate(spec).unwrap().train, data.train);
        let shard = data.train.shard(1, 2);
        assert_eq!(
            shard.ids[..spec.fields],
            data.train.ids[2000 * spec.fields..2001 * spec.fields]
        );
    }
}
