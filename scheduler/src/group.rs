//! [`GroupSize`]: how many workers form the group — a fixed number (`--workers 4`)
//! or an elastic range (`--workers 1:8`) whose size is settled once registrations
//! stop arriving for a join window, the way `docker compose up --scale worker=N`
//! starts N identical workers that no flag could count in advance.

use std::fmt;
use std::str::FromStr;

/// The number of workers in a group: exactly `min` when `min == max`, else settled
/// between them when registrations go quiet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupSize {
    /// Fewest workers the group may form with.
    pub min: u32,
    /// Most workers the group may form with; reaching it forms the group at once.
    pub max: u32,
}

impl GroupSize {
    /// A group of exactly `n` workers.
    pub fn fixed(n: u32) -> Self {
        Self { min: n, max: n }
    }

    /// True when the size is known before anyone registers.
    pub fn is_fixed(&self) -> bool {
        self.min == self.max
    }
}

impl From<u32> for GroupSize {
    fn from(n: u32) -> Self {
        Self::fixed(n)
    }
}

impl fmt::Display for GroupSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_fixed() {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}:{}", self.min, self.max)
        }
    }
}

impl FromStr for GroupSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let number = |part: &str| {
            part.trim().parse::<u32>().map_err(|_| {
                format!("`{s}` is not a worker count: use N or MIN:MAX, for example 2 or 1:8")
            })
        };
        let size = match s.split_once(':') {
            Some((min, max)) => Self {
                min: number(min)?,
                max: number(max)?,
            },
            None => Self::fixed(number(s)?),
        };
        if size.min == 0 || size.min > size.max {
            return Err(format!(
                "`{s}`: a worker group needs 1 <= MIN <= MAX workers"
            ));
        }
        Ok(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_and_elastic_sizes_parse_and_print_back() {
        for (text, min, max) in [("4", 4, 4), ("1:8", 1, 8), ("2:2", 2, 2)] {
            let size: GroupSize = text.parse().unwrap();
            assert_eq!((size.min, size.max), (min, max), "{text}");
            assert_eq!(size.to_string().parse::<GroupSize>(), Ok(size));
        }
    }

    #[test]
    fn nonsense_sizes_are_refused_with_the_accepted_forms() {
        for text in ["0", "3:2", "x", "1:", ":4", "0:3"] {
            let error = text.parse::<GroupSize>().unwrap_err();
            assert!(
                error.contains("MIN") || error.contains("N or"),
                "{text}: {error}"
            );
        }
    }
}
