//! The UCI "Optical Recognition of Handwritten Digits" test set as shipped by
//! scikit-learn's `load_digits`: 1,797 images of 8x8 pixels in `0..=16`, ten classes.
//! The file is compiled into the binary, so it trains anywhere (even in an image with
//! no file system to speak of). Licence and citation: `worker/data/DIGITS.md`.

use super::rng::SplitMix64;
use super::{DataError, Dataset, Split};

const CSV: &str = include_str!("../../data/digits.csv");
const PIXELS: usize = 64;
/// Examples in the fixed test split (20%, as in a common 80/20 split).
pub const TEST_EXAMPLES: usize = 360;
const SPLIT_SEED: u64 = 0x5eed_d161_7500;

/// The digits with a fixed, shuffled 1,437/360 train/test split; pixels scaled to `[0, 1]`.
///
/// # Errors
/// Only if the shipped file were damaged.
pub fn load() -> Result<Dataset, DataError> {
    let all = parse(CSV)?;
    let mut order: Vec<usize> = (0..all.len()).collect();
    SplitMix64::new(SPLIT_SEED).shuffle(&mut order);
    let (train, test) = order.split_at(all.len() - TEST_EXAMPLES);
    Ok(Dataset {
        name: "digits".into(),
        classes: 10,
        train: all.select(train),
        test: all.select(test),
    })
}

fn parse(csv: &str) -> Result<Split, DataError> {
    let malformed = |line: usize, reason: String| DataError::Malformed {
        path: "worker/data/digits.csv".into(),
        reason: format!("line {line}: {reason}"),
    };
    let mut features = Vec::with_capacity(1797 * PIXELS);
    let mut labels = Vec::with_capacity(1797);
    for (index, line) in csv
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let values: Vec<u32> = line
            .split(',')
            .map(|v| v.trim().parse::<u32>())
            .collect::<Result<_, _>>()
            .map_err(|e| malformed(index + 1, e.to_string()))?;
        let [pixels @ .., label] = values.as_slice() else {
            unreachable!("split yields at least one field")
        };
        if pixels.len() != PIXELS || *label > 9 || pixels.iter().any(|&p| p > 16) {
            return Err(malformed(
                index + 1,
                "expected 64 pixels in 0..=16 and a label in 0..=9".into(),
            ));
        }
        features.extend(pixels.iter().map(|&p| p as f32 / 16.0));
        labels.push(*label);
    }
    Ok(Split::dense(features, labels, PIXELS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn has_the_published_size_and_classes() {
        let digits = load().unwrap();
        assert_eq!(digits.train.len() + digits.test.len(), 1797);
        assert_eq!(digits.test.len(), TEST_EXAMPLES);
        assert_eq!(digits.width(), 64);
        let mut counts = [0usize; 10];
        for &label in digits.train.labels.iter().chain(&digits.test.labels) {
            counts[label as usize] += 1;
        }
        // scikit-learn documents about 180 examples per class.
        assert!(
            counts.iter().all(|&c| (174..=183).contains(&c)),
            "{counts:?}"
        );
        assert!(
            digits
                .train
                .features
                .iter()
                .all(|&p| (0.0..=1.0).contains(&p))
        );
    }

    #[test]
    fn split_is_fixed() {
        assert_eq!(load().unwrap().test.labels, load().unwrap().test.labels);
    }

    #[test]
    fn malformed_rows_are_reported_with_their_line() {
        let err = parse("1,2,3\n").unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
        let err = parse(&format!("{}x\n", "0,".repeat(64)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1"), "{err}");
    }
}
