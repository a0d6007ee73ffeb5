//! Payloads modelled on TF-gRPC-Bench (Biswas, Lu, Panda, 2018): a payload is a
//! list of buffers whose sizes are drawn from three categories, small (default 10 B,
//! range 1 B-1 KiB), medium (10 KiB, 1 KiB-1 MiB) and large (1 MiB, 1-10 MiB), under
//! three schemes: `uniform` (every buffer the same category), `random` (each buffer a
//! random category and size within its range) and `skew` (60% large, 30% medium, 10%
//! small). Buffers travel as raw `bytes` or as packed `repeated float`.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use ps_common::rng::SplitMix64;
use ps_proto::v1;

/// How buffers are put on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// `repeated bytes`: read in place on the receiving side.
    Bytes,
    /// `repeated float` (packed): decoded element by element.
    Floats,
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Encoding::Bytes => "bytes",
            Encoding::Floats => "floats",
        })
    }
}

/// A buffer-size category.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// 1 B to 1 KiB.
    Small,
    /// 1 KiB to 1 MiB.
    Medium,
    /// 1 MiB to 10 MiB.
    Large,
}

impl Category {
    fn range(self) -> (usize, usize) {
        match self {
            Category::Small => (1, 1 << 10),
            Category::Medium => (1 << 10, 1 << 20),
            Category::Large => (1 << 20, 10 << 20),
        }
    }
}

/// Default sizes of each category, as in TF-gRPC-Bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CategorySizes {
    /// Small buffer size.
    pub small: usize,
    /// Medium buffer size.
    pub medium: usize,
    /// Large buffer size.
    pub large: usize,
}

impl Default for CategorySizes {
    fn default() -> Self {
        Self {
            small: 10,
            medium: 10 << 10,
            large: 1 << 20,
        }
    }
}

impl CategorySizes {
    fn of(&self, category: Category) -> usize {
        match category {
            Category::Small => self.small,
            Category::Medium => self.medium,
            Category::Large => self.large,
        }
    }
}

/// How a payload's buffer sizes are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Every buffer of one category, at its default size.
    Uniform(Category),
    /// Each buffer of a random category, at a random size within its range.
    Random,
    /// 60% large, 30% medium, 10% small, at the default sizes.
    Skew,
}

impl FromStr for Scheme {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "uniform" | "uniform:large" => Ok(Scheme::Uniform(Category::Large)),
            "uniform:medium" => Ok(Scheme::Uniform(Category::Medium)),
            "uniform:small" => Ok(Scheme::Uniform(Category::Small)),
            "random" => Ok(Scheme::Random),
            "skew" => Ok(Scheme::Skew),
            _ => Err(format!(
                "unknown scheme `{s}`; use uniform[:small|:medium|:large], random or skew"
            )),
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scheme::Uniform(Category::Small) => f.write_str("uniform:small"),
            Scheme::Uniform(Category::Medium) => f.write_str("uniform:medium"),
            Scheme::Uniform(Category::Large) => f.write_str("uniform:large"),
            Scheme::Random => f.write_str("random"),
            Scheme::Skew => f.write_str("skew"),
        }
    }
}

impl Scheme {
    /// The buffer sizes of one payload of `buffers` buffers.
    pub fn buffer_sizes(self, buffers: usize, sizes: CategorySizes, seed: u64) -> Vec<usize> {
        let mut rng = SplitMix64::new(seed);
        (0..buffers)
            .map(|i| match self {
                Scheme::Uniform(category) => sizes.of(category),
                Scheme::Skew => sizes.of(skew_category(i, buffers)),
                Scheme::Random => {
                    let category =
                        [Category::Small, Category::Medium, Category::Large][rng.below(3)];
                    let (low, high) = category.range();
                    low + rng.below(high - low + 1)
                }
            })
            .collect()
    }
}

/// The category of buffer `i` of `n` under the skew mix: the first 60% large, the
/// next 30% medium, the rest small.
fn skew_category(i: usize, n: usize) -> Category {
    let large = (n * 6).div_ceil(10);
    let medium = (n * 9).div_ceil(10);
    if i < large {
        Category::Large
    } else if i < medium {
        Category::Medium
    } else {
        Category::Small
    }
}

/// Builds a payload of buffers of `sizes` in `encoding`. Float buffers hold
/// `size / 4` values (at least one), so both encodings carry about the same bytes.
pub fn build(sizes: &[usize], encoding: Encoding) -> v1::BenchPayload {
    match encoding {
        Encoding::Bytes => v1::BenchPayload {
            buffers: sizes
                .iter()
                .map(|&n| Bytes::from(vec![0x5au8; n]))
                .collect(),
            float_buffers: Vec::new(),
        },
        Encoding::Floats => v1::BenchPayload {
            buffers: Vec::new(),
            float_buffers: sizes
                .iter()
                .map(|&n| v1::FloatBuffer {
                    values: vec![0.5f32; (n / 4).max(1)],
                })
                .collect(),
        },
    }
}

/// Payload bytes a message carries (bytes of `buffers` plus 4 per float).
pub fn payload_bytes(payload: &v1::BenchPayload) -> usize {
    payload.buffers.iter().map(Bytes::len).sum::<usize>()
        + payload
            .float_buffers
            .iter()
            .map(|b| b.values.len() * 4)
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skew_is_60_30_10() {
        let sizes = Scheme::Skew.buffer_sizes(10, CategorySizes::default(), 1);
        assert_eq!(sizes.iter().filter(|&&s| s == 1 << 20).count(), 6);
        assert_eq!(sizes.iter().filter(|&&s| s == 10 << 10).count(), 3);
        assert_eq!(sizes.iter().filter(|&&s| s == 10).count(), 1);
    }

    #[test]
    fn random_sizes_stay_in_their_ranges_and_repeat_per_seed() {
        let a = Scheme::Random.buffer_sizes(100, CategorySizes::default(), 9);
        assert_eq!(
            a,
            Scheme::Random.buffer_sizes(100, CategorySizes::default(), 9)
        );
        assert!(a.iter().all(|&s| (1..=10 << 20).contains(&s)));
    }

    #[test]
    fn both_encodings_carry_the_same_bytes() {
        let sizes = [4096, 1 << 20];
        assert_eq!(
            payload_bytes(&build(&sizes, Encoding::Bytes)),
            payload_bytes(&build(&sizes, Encoding::Floats))
        );
    }

    #[test]
    fn schemes_parse() {
        assert_eq!("skew".parse::<Scheme>(), Ok(Scheme::Skew));
        assert_eq!(
            "uniform:small".parse::<Scheme>(),
            Ok(Scheme::Uniform(Category::Small))
        );
        assert!("zipf".parse::<Scheme>().is_err());
    }
}
