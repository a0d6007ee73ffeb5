//! [`PrometheusApi`]: the HTTP API of the compose cluster's Prometheus, as the
//! end-to-end test asks it: which targets are up, and what a PromQL query
//! answers. Blocking, like the rest of the compose helpers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A Prometheus server's HTTP API at `addr` (`HOST:PORT`).
pub struct PrometheusApi {
    addr: String,
}

/// One scrape target as `/api/v1/targets` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The scrape job (`scheduler`, `server`, `worker`, `prometheus`).
    pub job: String,
    /// The address scraped.
    pub instance: String,
    /// `up`, `down` or `unknown` (not scraped yet).
    pub health: String,
}

/// One sample of a query's answer: its labels and value.
pub type Sample = (BTreeMap<String, String>, f64);

impl PrometheusApi {
    /// The API at `addr`.
    pub fn new(addr: impl Into<String>) -> Self {
        Self { addr: addr.into() }
    }

    /// `GET path` as JSON, or why not (the server may still be starting).
    fn get(&self, path: &str) -> Result<serde_json::Value, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let (status, body) = runtime
            .block_on(ps_common::metrics::http_get(&self.addr, path))
            .map_err(|e| format!("GET {path} from {}: {e}", self.addr))?;
        if !status.contains(" 200 ") {
            return Err(format!("{status}\n{body}"));
        }
        serde_json::from_str(&body).map_err(|e| format!("not JSON ({e}): {body}"))
    }

    /// Every active target.
    ///
    /// # Errors
    /// When Prometheus does not answer (yet).
    pub fn targets(&self) -> Result<Vec<Target>, String> {
        let answer = self.get("/api/v1/targets?state=active")?;
        let listed = answer["data"]["activeTargets"]
            .as_array()
            .ok_or_else(|| format!("no activeTargets in {answer}"))?;
        Ok(listed
            .iter()
            .map(|t| Target {
                job: t["labels"]["job"].as_str().unwrap_or_default().to_string(),
                instance: t["labels"]["instance"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                health: t["health"].as_str().unwrap_or_default().to_string(),
            })
            .collect())
    }

    /// The instant answer to `promql`.
    ///
    /// # Errors
    /// When Prometheus does not answer or refuses the query.
    pub fn query(&self, promql: &str) -> Result<Vec<Sample>, String> {
        let answer = self.get(&format!("/api/v1/query?query={}", url_encoded(promql)))?;
        let results = answer["data"]["result"]
            .as_array()
            .ok_or_else(|| format!("no result in {answer}"))?;
        Ok(results
            .iter()
            .map(|r| {
                let labels = r["metric"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                            .collect()
                    })
                    .unwrap_or_default();
                let value = r["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN);
                (labels, value)
            })
            .collect())
    }

    /// Waits until the targets of each `(job, count)` are up, exactly `count`
    /// of each, within `limit`; returns them.
    ///
    /// # Panics
    /// At the deadline, with what Prometheus last said.
    pub fn wait_up(&self, jobs: &[(&str, usize)], limit: Duration) -> Vec<Target> {
        let deadline = Instant::now() + limit;
        loop {
            let said = self.targets();
            if let Ok(targets) = &said {
                let all_up = jobs.iter().all(|&(job, count)| {
                    let of_job: Vec<&Target> = targets.iter().filter(|t| t.job == job).collect();
                    of_job.len() == count && of_job.iter().all(|t| t.health == "up")
                });
                if all_up {
                    return targets.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "not every target of {jobs:?} was up within {limit:?}: {said:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// `text` for a URL's query string: everything but unreserved characters
/// percent-encoded.
fn url_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            url_encoded(r#"max_over_time(x{a="b"}[1h]) > 0"#),
            "max_over_time%28x%7Ba%3D%22b%22%7D%5B1h%5D%29%20%3E%200"
        );
    }
}
