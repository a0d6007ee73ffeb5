//! A synthetic classification task for scale tests: inputs drawn from a standard
//! normal, labelled by a fixed random teacher network (`argmax(W2 tanh(W1 x))`), so
//! the task is learnable and the same for a given seed everywhere.

use super::rng::SplitMix64;
use super::{DataError, Dataset, Split};

/// Dimensions and size of a synthetic data set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyntheticSpec {
    /// Values per example.
    pub features: usize,
    /// Number of classes.
    pub classes: usize,
    /// Hidden units of the teacher network.
    pub teacher_hidden: usize,
    /// Training examples.
    pub train: usize,
    /// Test examples.
    pub test: usize,
    /// Seed of the teacher and of the inputs.
    pub seed: u64,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        Self {
            features: 32,
            classes: 4,
            teacher_hidden: 16,
            train: 8_000,
            test: 2_000,
            seed: 42,
        }
    }
}

struct Teacher {
    w1: Vec<f32>,
    w2: Vec<f32>,
    spec: SyntheticSpec,
}

impl Teacher {
    fn new(spec: SyntheticSpec, rng: &mut SplitMix64) -> Self {
        let scale1 = 1.0 / (spec.features as f32).sqrt();
        let scale2 = 1.0 / (spec.teacher_hidden as f32).sqrt();
        let w1 = (0..spec.features * spec.teacher_hidden)
            .map(|_| rng.normal() * scale1)
            .collect();
        let w2 = (0..spec.teacher_hidden * spec.classes)
            .map(|_| rng.normal() * scale2)
            .collect();
        Self { w1, w2, spec }
    }

    fn label(&self, x: &[f32]) -> u32 {
        let SyntheticSpec {
            features,
            teacher_hidden: hidden,
            classes,
            ..
        } = self.spec;
        let h: Vec<f32> = (0..hidden)
            .map(|j| {
                (0..features)
                    .map(|i| x[i] * self.w1[i * hidden + j])
                    .sum::<f32>()
                    .tanh()
            })
            .collect();
        let logits = (0..classes).map(|c| {
            (0..hidden)
                .map(|j| h[j] * self.w2[j * classes + c])
                .sum::<f32>()
        });
        logits
            .enumerate()
            .fold(
                (0, f32::MIN),
                |best, (c, v)| if v > best.1 { (c, v) } else { best },
            )
            .0 as u32
    }
}

fn sample(teacher: &Teacher, rng: &mut SplitMix64, n: usize) -> Split {
    let width = teacher.spec.features;
    let features: Vec<f32> = (0..n * width).map(|_| rng.normal()).collect();
    let labels = features
        .chunks_exact(width)
        .map(|x| teacher.label(x))
        .collect();
    Split::dense(features, labels, width)
}

/// Generates the data set `spec` describes.
///
/// # Errors
/// [`DataError::Invalid`] for zero features, fewer than two classes, or no examples.
pub fn generate(spec: SyntheticSpec) -> Result<Dataset, DataError> {
    if spec.features == 0
        || spec.classes < 2
        || spec.teacher_hidden == 0
        || spec.train == 0
        || spec.test == 0
    {
        return Err(DataError::Invalid(format!(
            "synthetic data needs features, teacher units, train and test examples > 0 and at least 2 classes; got {spec:?}"
        )));
    }
    let mut rng = SplitMix64::new(spec.seed);
    let teacher = Teacher::new(spec, &mut rng);
    let train = sample(&teacher, &mut rng, spec.train);
    let test = sample(&teacher, &mut rng, spec.test);
    Ok(Dataset {
        name: "synthetic".into(),
        classes: spec.classes,
        train,
        test,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_data_and_every_class_occurs() {
        let spec = SyntheticSpec {
            train: 2000,
            test: 100,
            ..SyntheticSpec::default()
        };
        let a = generate(spec).unwrap();
        assert_eq!(a.train, generate(spec).unwrap().train);
        let mut counts = vec![0usize; spec.classes];
        a.train.labels.iter().for_each(|&l| counts[l as usize] += 1);
        assert!(counts.iter().all(|&c| c > 100), "{counts:?}");
    }

    #[test]
    fn nonsense_dimensions_are_refused() {
        let spec = SyntheticSpec {
            classes: 1,
            ..SyntheticSpec::default()
        };
        assert!(
            generate(spec)
                .unwrap_err()
                .to_string()
                .contains("at least 2 classes")
        );
    }
}
