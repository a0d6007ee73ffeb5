//! The validation chart of `ps-testbed plan-check`: each setup's predicted
//! step time against its measured one, a point per setup and a colour per
//! model, on log axes, with the line where they agree and the ±20 % band
//! the issue holds the model to.

use std::path::Path;

use plotters::prelude::*;
use ps_common::plot_style::{COLORS, register_font};

use crate::plan_check::Row;

/// The band drawn around agreement.
const BAND: f64 = 0.2;

/// Draws `rows` into the SVG file `path`.
///
/// # Errors
/// The font cannot be registered, or the file cannot be written.
pub fn chart(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    let fail = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    register_font().map_err(|e| fail(&e))?;
    let values = rows.iter().flat_map(|r| [r.predicted_ms, r.measured_ms]);
    let (low, high) = values.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    if low > high {
        anyhow::bail!("no setups to draw");
    }
    let range = (low * 0.7).max(1e-3)..high * 1.4;
    let root = SVGBackend::new(path, (760, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "ps-scheduler plan: predicted against measured step time",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(range.clone().log_scale(), range.clone().log_scale())
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("measured step, ms (ps-testbed)")
        .y_desc("predicted step, ms")
        .draw()
        .map_err(|e| fail(&e))?;
    let line = |factor: f64| {
        vec![
            (range.start, range.start * factor),
            (range.end, range.end * factor),
        ]
    };
    chart
        .draw_series(LineSeries::new(line(1.0), BLACK.stroke_width(1)))
        .map_err(|e| fail(&e))?
        .label("predicted = measured")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    let band = RGBColor(150, 150, 150);
    for factor in [1.0 - BAND, 1.0 + BAND] {
        let drawn = chart
            .draw_series(LineSeries::new(line(factor), band.stroke_width(1)))
            .map_err(|e| fail(&e))?;
        if factor > 1.0 {
            drawn
                .label("±20 %")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], band));
        }
    }
    let mut models: Vec<&str> = Vec::new();
    for row in rows {
        if !models.contains(&row.model.as_str()) {
            models.push(&row.model);
        }
    }
    for (i, model) in models.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points = rows
            .iter()
            .filter(|r| r.model == *model)
            .map(|r| Circle::new((r.measured_ms, r.predicted_ms), 5, color.filled()));
        chart
            .draw_series(points)
            .map_err(|e| fail(&e))?
            .label(*model)
            .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(model: &str, predicted_ms: f64, measured_ms: f64) -> Row {
        Row {
            model: model.to_string(),
            link: "1gbit".to_string(),
            servers: 1,
            colocated: false,
            pipeline: false,
            partition_bytes: 1 << 20,
            wire_bytes: 4,
            requests_per_server: 4,
            compute_ms: 10.0,
            predicted_ms,
            measured_ms,
            error: predicted_ms / measured_ms - 1.0,
        }
    }

    #[test]
    fn every_setup_is_a_point_with_its_model_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan-check.svg");
        let rows = [
            row("comm-bound", 480.0, 500.0),
            row("comm-bound", 300.0, 280.0),
            row("compute-bound", 150.0, 140.0),
        ];
        chart(&rows, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(
            svg.contains("<svg") && svg.contains("comm-bound") && svg.contains("compute-bound")
        );
        assert_eq!(
            svg.matches("<circle").count(),
            3 + 2,
            "a point per setup, a mark per model"
        );
        assert!(chart(&[], &path).is_err());
    }
}
