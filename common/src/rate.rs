//! A link rate as `tc` and people write it: `1gbit`, `2.5gbit`, `500mbit`.

use std::fmt;
use std::str::FromStr;

/// Bits per second, a whole number of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LinkRate(u64);

/// The slowest link the testbed shapes: slower ones make even a digits step
/// take minutes.
const MIN_BITS_PER_SEC: u64 = 1_000_000;

impl LinkRate {
    /// The rate in bits per second.
    pub fn bits_per_sec(self) -> u64 {
        self.0
    }

    /// The rate in bytes per second.
    pub fn bytes_per_sec(self) -> f64 {
        self.0 as f64 / 8.0
    }

    /// The rate as `tc` takes it.
    pub fn tc_arg(self) -> String {
        format!("{}bit", self.0)
    }
}

impl FromStr for LinkRate {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let lower = text.trim().to_ascii_lowercase();
        let units = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)];
        let (number, scale) = units
            .iter()
            .find_map(|(unit, scale)| lower.strip_suffix(unit).map(|n| (n, *scale)))
            .ok_or_else(|| {
                format!("link rate {text:?} needs a unit: kbit, mbit or gbit (for example 1gbit)")
            })?;
        let value: f64 = number
            .trim()
            .parse()
            .map_err(|_| format!("link rate {text:?}: {number:?} is not a number"))?;
        let bits = value * scale;
        if !bits.is_finite() || bits < MIN_BITS_PER_SEC as f64 || bits > 1e12 {
            return Err(format!("link rate {text:?} is outside 1mbit..1000gbit"));
        }
        Ok(Self(bits.round() as u64))
    }
}

impl fmt::Display for LinkRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits = self.0 as f64;
        if bits >= 1e9 {
            write!(f, "{}gbit", bits / 1e9)
        } else if bits >= 1e6 {
            write!(f, "{}mbit", bits / 1e6)
        } else {
            write!(f, "{}kbit", bits / 1e3)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_tc_writes_them() {
        let rate = |t: &str| t.parse::<LinkRate>().map(LinkRate::bits_per_sec);
        assert_eq!(rate("1gbit"), Ok(1_000_000_000));
        assert_eq!(rate("2.5gbit"), Ok(2_500_000_000));
        assert_eq!(rate("500Mbit"), Ok(500_000_000));
        assert_eq!(rate("1500kbit"), Ok(1_500_000));
        let shown: LinkRate = "2.5gbit".parse().unwrap();
        assert_eq!(shown.to_string(), "2.5gbit");
        assert_eq!(shown.tc_arg(), "2500000000bit");
    }

    #[test]
    fn bad_rates_say_what_is_wrong() {
        let error = |t: &str| t.parse::<LinkRate>().unwrap_err();
        assert!(error("1").contains("needs a unit"));
        assert!(error("fastgbit").contains("not a number"));
        assert!(error("10kbit").contains("outside"));
        assert!(error("-1gbit").contains("outside"));
    }
}
