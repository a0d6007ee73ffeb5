//! CPU time (user + system) of this process, for CPU-seconds-per-GB figures.

/// CPU seconds this process has used so far.
pub fn process_cpu_seconds() -> f64 {
    cpu_time::ProcessTime::try_now().map_or(0.0, |t| t.as_duration().as_secs_f64())
}
