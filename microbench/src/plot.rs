//! SVG charts of a run: throughput against payload size with gRPC and TCP on one
//! chart, and latency CDFs, in the shared font and palette
//! (`ps_common::plot_style`).

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;
use ps_common::plot_style::{COLORS, register_font};

use crate::report::ResultRow;

/// A named line of points.
struct Series {
    label: String,
    points: Vec<(f64, f64)>,
    dashed: bool,
}

/// How a chart's axes are named, labelled and scaled.
struct Axes {
    x_desc: &'static str,
    y_desc: &'static str,
    /// How an x value is written on the axis (sizes in units, not raw numbers).
    x_label: fn(&f64) -> String,
    /// A logarithmic y axis, so that small values do not sit at zero.
    y_log: bool,
}

fn draw(path: &Path, title: &str, axes: &Axes, series: &[Series]) -> anyhow::Result<()> {
    register_font()?;
    let points = series.iter().flat_map(|s| s.points.iter());
    let (x_min, x_max) = points
        .clone()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y_min, y_max) = points.fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if x_min > x_max {
        return Ok(());
    }
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70);
    let x_range = at_least_a_decade(x_min.max(1e-9) * 0.8, x_max * 1.25).log_scale();
    if axes.y_log {
        let y_range = at_least_a_decade(y_min.max(1e-9) * 0.8, y_max.max(1e-9) * 1.25).log_scale();
        let chart = builder.build_cartesian_2d(x_range, y_range);
        finish(chart.map_err(|e| anyhow::anyhow!("{e}"))?, axes, series)?;
    } else {
        let chart = builder.build_cartesian_2d(x_range, 0.0..y_max.max(1e-9) * 1.1);
        finish(chart.map_err(|e| anyhow::anyhow!("{e}"))?, axes, series)?;
    }
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// A size on a log axis, whose ticks fall on powers of ten: in decimal units,
/// so they read `100 B`, `1 kB`, `10 MB`.
fn decimal_size(bytes: &f64) -> String {
    let (value, unit) = [(1e9, "GB"), (1e6, "MB"), (1e3, "kB")]
        .into_iter()
        .find(|(scale, _)| *bytes >= *scale)
        .map_or((*bytes, "B"), |(scale, unit)| (bytes / scale, unit));
    if (value - value.round()).abs() < 1e-6 {
        format!("{value:.0} {unit}")
    } else {
        format!("{value:.1} {unit}")
    }
}

/// `low..high`, widened around its middle to span at least 16x, so that a log
/// axis has a power of ten to put a tick on (one payload size alone would have
/// none).
fn at_least_a_decade(low: f64, high: f64) -> std::ops::Range<f64> {
    if high / low >= 16.0 {
        return low..high;
    }
    let middle = (low * high).sqrt();
    middle / 4.0..middle * 4.0
}

/// A number with three significant digits and no trailing zeros: `0.3`, `12.5`.
fn significant(value: &f64) -> String {
    let magnitude = value.abs().max(1e-12).log10().floor() as i32;
    let decimals = (2 - magnitude).max(0) as usize;
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// Draws the mesh with `axes`' names and labels, then the series.
fn finish<'a, X, Y>(
    mut chart: ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    axes: &Axes,
    series: &[Series],
) -> anyhow::Result<()>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(axes.x_desc)
        .y_desc(axes.y_desc)
        .x_label_formatter(&axes.x_label)
        .y_label_formatter(&significant)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    draw_series(&mut chart, series)
}

fn draw_series<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    series: &[Series],
) -> anyhow::Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[(i / 2) % COLORS.len()];
        let style = ShapeStyle {
            color: color.to_rgba(),
            filled: false,
            stroke_width: if s.dashed { 1 } else { 3 },
        };
        chart
            .draw_series(LineSeries::new(s.points.clone(), style))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// Throughput against payload size, gRPC (thick) and TCP (thin) for each mode and encoding.
///
/// # Errors
/// When the file cannot be written.
pub fn bandwidth_chart(rows: &[ResultRow], path: &Path) -> anyhow::Result<()> {
    let mut keys: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r.mode.clone().unwrap_or_default(), r.encoding.clone()))
        .collect();
    keys.dedup();
    let mut series = Vec::new();
    for (mode, encoding) in keys {
        let selected: Vec<&ResultRow> = rows
            .iter()
            .filter(|r| r.mode.as_deref() == Some(mode.as_str()) && r.encoding == encoding)
            .collect();
        let line = |rate: fn(&ResultRow) -> Option<f64>| {
            selected
                .iter()
                .filter_map(|r| rate(r).map(|v| (r.size_bytes as f64, v / 1e9)))
                .collect()
        };
        series.push(Series {
            label: format!("gRPC {mode} {encoding}"),
            points: line(|r| r.throughput_bytes_per_sec),
            dashed: false,
        });
        series.push(Series {
            label: format!("TCP ({mode})"),
            points: line(|r| r.tcp_throughput_bytes_per_sec),
            dashed: true,
        });
    }
    let axes = Axes {
        x_desc: "payload size",
        y_desc: "GB/s (log scale)",
        x_label: decimal_size,
        y_log: true,
    };
    draw(path, "One-way throughput: gRPC vs raw TCP", &axes, &series)
}

/// Latency CDFs: share of round trips at or below each latency, gRPC and TCP.
///
/// # Errors
/// When the file cannot be written.
pub fn latency_cdf(
    curves: &[(String, Histogram<u64>, Histogram<u64>)],
    path: &Path,
) -> anyhow::Result<()> {
    let cdf = |h: &Histogram<u64>| -> Vec<(f64, f64)> {
        h.iter_quantiles(4)
            .map(|v| {
                (
                    v.value_iterated_to().max(1) as f64,
                    v.quantile_iterated_to(),
                )
            })
            .collect()
    };
    let series: Vec<Series> = curves
        .iter()
        .flat_map(|(label, grpc, tcp)| {
            [
                Series {
                    label: format!("gRPC {label}"),
                    points: cdf(grpc),
                    dashed: false,
                },
                Series {
                    label: format!("TCP {label}"),
                    points: cdf(tcp),
                    dashed: true,
                },
            ]
        })
        .collect();
    let axes = Axes {
        x_desc: "round-trip latency",
        y_desc: "fraction of round trips",
        x_label: |micros| format!("{micros:.0} µs"),
        y_log: false,
    };
    draw(
        path,
        "Round-trip latency CDF: gRPC vs raw TCP",
        &axes,
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_numbers_have_three_significant_digits() {
        let cases = [
            (0.30000000000000004, "0.3"),
            (0.0001, "0.0001"),
            (12.5, "12.5"),
            (1.0, "1"),
            (250.0, "250"),
        ];
        for (value, label) in cases {
            assert_eq!(significant(&value), label);
        }
    }

    #[test]
    fn a_log_axis_always_spans_a_power_of_ten() {
        let range = at_least_a_decade(0.8e6, 1.25e6);
        assert!(range.end / range.start >= 16.0 - 1e-9, "{range:?}");
        assert_eq!(at_least_a_decade(64.0, 1e6), 64.0..1e6);
    }

    #[test]
    fn sizes_on_a_log_axis_read_in_decimal_units() {
        let cases = [
            (100.0, "100 B"),
            (1e3, "1 kB"),
            (1.5e4, "15 kB"),
            (1e6, "1 MB"),
            (2.5e9, "2.5 GB"),
        ];
        for (bytes, label) in cases {
            assert_eq!(decimal_size(&bytes), label);
        }
    }
}
