//! [`to_text_format`]: OpenMetrics exposition rewritten in Prometheus's
//! classic text format (version 0.0.4), for scrapers that do not ask for
//! OpenMetrics: `curl`, `promtool check metrics`, older agents. Prometheus
//! itself asks for OpenMetrics and gets it unchanged.
//!
//! The two formats share their sample lines; they differ in the metadata:
//! OpenMetrics names a counter family without `_total` and has an `info` type,
//! `# UNIT` lines and a closing `# EOF`, none of which the classic format knows.

/// The content type of the classic text format.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `openmetrics` in the classic text format: counter families named with
/// `_total`, `info` families as gauges named with `_info`, `unknown` as
/// `untyped`, and no `# UNIT` or `# EOF` lines. Samples are kept as they are.
pub fn to_text_format(openmetrics: &str) -> String {
    let mut text = String::with_capacity(openmetrics.len());
    // A family's HELP comes before its TYPE, which decides the family's name.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = classic_family(family, kind);
            if let Some((_, said)) = help.take().filter(|(named, _)| *named == family) {
                text.push_str(&format!("# HELP {name} {said}\n"));
            }
            text.push_str(&format!("# TYPE {name} {kind}\n"));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        } else {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

/// A family's name and type as the classic format writes them.
fn classic_family(family: &str, kind: &str) -> (String, &'static str) {
    match kind {
        "counter" => (format!("{family}_total"), "counter"),
        "info" => (format!("{family}_info"), "gauge"),
        "gauge" => (family.to_string(), "gauge"),
        "histogram" => (family.to_string(), "histogram"),
        "summary" => (family.to_string(), "summary"),
        _ => (family.to_string(), "untyped"),
    }
}

/// Whether an HTTP `Accept` header asks for OpenMetrics.
pub fn accepts_openmetrics(accept: &str) -> bool {
    accept.contains("application/openmetrics-text")
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENMETRICS: &str = "\
# HELP candle_ps_build The program.
# TYPE candle_ps_build info
candle_ps_build_info{program=\"ps-server\"} 1
# HELP candle_ps_server_requests Requests answered.
# TYPE candle_ps_server_requests counter
candle_ps_server_requests_total{rpc=\"Push\",code=\"OK\"} 3
# HELP candle_ps_server_held_bytes Bytes held.
# TYPE candle_ps_server_held_bytes gauge
# UNIT candle_ps_server_held_bytes bytes
candle_ps_server_held_bytes 16
# HELP candle_ps_wait_seconds A wait.
# TYPE candle_ps_wait_seconds histogram
candle_ps_wait_seconds_sum 0.5
candle_ps_wait_seconds_count 1
candle_ps_wait_seconds_bucket{le=\"+Inf\"} 1
# EOF
";

    #[test]
    fn counters_and_info_are_renamed_and_openmetrics_only_lines_dropped() {
        let text = to_text_format(OPENMETRICS);
        for line in [
            "# HELP candle_ps_build_info The program.",
            "# TYPE candle_ps_build_info gauge",
            "candle_ps_build_info{program=\"ps-server\"} 1",
            "# HELP candle_ps_server_requests_total Requests answered.",
            "# TYPE candle_ps_server_requests_total counter",
            "candle_ps_server_requests_total{rpc=\"Push\",code=\"OK\"} 3",
            "# TYPE candle_ps_server_held_bytes gauge",
            "candle_ps_server_held_bytes 16",
            "# TYPE candle_ps_wait_seconds histogram",
            "candle_ps_wait_seconds_bucket{le=\"+Inf\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert_eq!(text.lines().filter(|l| !l.starts_with('#')).count(), 6);
    }

    #[test]
    fn openmetrics_is_chosen_only_when_asked_for() {
        let prometheus =
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
        assert!(accepts_openmetrics(prometheus));
        assert!(!accepts_openmetrics("*/*"));
        assert!(!accepts_openmetrics("text/plain"));
    }
}
