//! `ps-worker --out DIR`: what a training run leaves for a person to look at.
//!
//! - `epochs.csv`: per epoch, the mean training loss and the test accuracy
//!   after it;
//! - `steps.csv`: per step, the seconds of compute, push, wait, pull and apply;
//! - `training.svg`: the training curve, loss and accuracy against the epoch;
//! - `time_split.svg`: per epoch, the mean step time as a bar stacked by phase.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use ps_common::plot_style::{COLORS, ChartError, register_font};

use crate::step_time::{PHASES, StepTimes};

/// One epoch's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochRecord {
    /// The epoch, from 0.
    pub epoch: u64,
    /// Mean training loss over the epoch's steps on this worker.
    pub train_loss: f64,
    /// Accuracy on the test split after the epoch.
    pub test_accuracy: f64,
}

/// One step's time split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRecord {
    /// The step.
    pub step: u64,
    /// The epoch it belongs to.
    pub epoch: u64,
    /// Its phases.
    pub times: StepTimes,
}

/// What a run recorded, epoch by epoch and step by step.
#[derive(Debug, Clone, Default)]
pub struct RunRecord {
    /// Every epoch finished.
    pub epochs: Vec<EpochRecord>,
    /// Every step taken.
    pub steps: Vec<StepRecord>,
}

/// An epoch on an axis: a whole number.
fn whole(x: &f64) -> String {
    format!("{x:.0}")
}

/// How many phases a step is split into.
const PHASE_COUNT: usize = PHASES.len();

fn phases(times: &StepTimes) -> [f64; PHASE_COUNT] {
    times.phases().map(|d| d.as_secs_f64())
}

impl RunRecord {
    /// Writes the CSV files and the charts into `dir` (made when missing);
    /// the paths written.
    ///
    /// # Errors
    /// [`ChartError`] naming the file that could not be written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>, ChartError> {
        std::fs::create_dir_all(dir).map_err(ChartError::io(dir))?;
        let files = [
            ("epochs.csv", self.epochs_csv()),
            ("steps.csv", self.steps_csv()),
        ];
        let mut written = Vec::new();
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(ChartError::io(&path))?;
            written.push(path);
        }
        register_font()?;
        let curve = dir.join("training.svg");
        self.training_chart(&curve)?;
        let split = dir.join("time_split.svg");
        self.time_split_chart(&split)?;
        written.extend([curve, split]);
        Ok(written)
    }

    fn epochs_csv(&self) -> String {
        let mut text = String::from("epoch,train_loss,test_accuracy\n");
        for e in &self.epochs {
            let _ = writeln!(text, "{},{},{}", e.epoch, e.train_loss, e.test_accuracy);
        }
        text
    }

    fn steps_csv(&self) -> String {
        let mut text = format!(
            "step,epoch,{}\n",
            PHASES.map(|p| format!("{p}_seconds")).join(",")
        );
        for s in &self.steps {
            let seconds = phases(&s.times).map(|v| v.to_string());
            let _ = writeln!(text, "{},{},{}", s.step, s.epoch, seconds.join(","));
        }
        text
    }

    /// The mean step time of each phase, per epoch: `(epoch, [seconds; PHASE_COUNT])`.
    fn mean_split_by_epoch(&self) -> Vec<(u64, [f64; PHASE_COUNT])> {
        let mut by_epoch: std::collections::BTreeMap<u64, ([f64; PHASE_COUNT], usize)> =
            std::collections::BTreeMap::new();
        for s in &self.steps {
            let (sums, count) = by_epoch.entry(s.epoch).or_insert(([0.0; PHASE_COUNT], 0));
            for (sum, value) in sums.iter_mut().zip(phases(&s.times)) {
                *sum += value;
            }
            *count += 1;
        }
        by_epoch
            .into_iter()
            .map(|(epoch, (sums, count))| (epoch, sums.map(|s| s / count.max(1) as f64)))
            .collect()
    }

    fn training_chart(&self, path: &Path) -> Result<(), ChartError> {
        let fail = ChartError::draw(path);
        let root = SVGBackend::new(path, (1000, 440)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let (left, right) = root.split_horizontally(500);
        let last = self.epochs.last().map_or(1, |e| e.epoch.max(1)) as f64;
        let loss: Vec<(f64, f64)> = self
            .epochs
            .iter()
            .map(|e| (e.epoch as f64, e.train_loss))
            .collect();
        let accuracy: Vec<(f64, f64)> = self
            .epochs
            .iter()
            .map(|e| (e.epoch as f64, e.test_accuracy))
            .collect();
        let top = loss.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-6) * 1.1;
        for (area, title, points, y_max, color) in [
            (&left, "training loss", loss, top, COLORS[0]),
            (&right, "test accuracy", accuracy, 1.0, COLORS[2]),
        ] {
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 20))
                .margin(14)
                .x_label_area_size(40)
                .y_label_area_size(56)
                .build_cartesian_2d(0.0..last, 0.0..y_max)
                .map_err(|e| fail(&e))?;
            chart
                .configure_mesh()
                .x_desc("epoch")
                .x_label_formatter(&whole)
                .draw()
                .map_err(|e| fail(&e))?;
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(3)))
                .map_err(|e| fail(&e))?;
        }
        root.present().map_err(|e| fail(&e))
    }

    fn time_split_chart(&self, path: &Path) -> Result<(), ChartError> {
        let fail = ChartError::draw(path);
        let bars = self.mean_split_by_epoch();
        let tallest = bars
            .iter()
            .map(|(_, split)| split.iter().sum::<f64>())
            .fold(0.0, f64::max)
            .max(1e-9)
            * 1e3
            // Room above the bars for the legend.
            * 1.5;
        let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let epochs = bars.len().max(1) as f64;
        let mut chart = ChartBuilder::on(&root)
            .caption("mean step time by phase", ("sans-serif", 20))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(-0.5..epochs - 0.5, 0.0..tallest)
            .map_err(|e| fail(&e))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("epoch")
            .x_label_formatter(&whole)
            .y_desc("milliseconds per step")
            .draw()
            .map_err(|e| fail(&e))?;
        for (phase_index, phase) in PHASES.iter().enumerate() {
            let color = COLORS[phase_index % COLORS.len()];
            let rectangles = bars.iter().enumerate().map(|(i, (_, split))| {
                let below: f64 = split[..phase_index].iter().sum::<f64>() * 1e3;
                let top = below + split[phase_index] * 1e3;
                let x = i as f64;
                Rectangle::new([(x - 0.4, below), (x + 0.4, top)], color.filled())
            });
            chart
                .draw_series(rectangles)
                .map_err(|e| fail(&e))?
                .label(*phase)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| fail(&e))?;
        root.present().map_err(|e| fail(&e))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn record() -> RunRecord {
        let ms = Duration::from_millis;
        let steps = (0..4)
            .map(|step| StepRecord {
                step,
                epoch: step / 2,
                times: StepTimes {
                    compute: ms(2),
                    gather: ms(1),
                    push: ms(1),
                    wait: ms(3 + step),
                    pull: ms(1),
                    apply: ms(0),
                },
            })
            .collect();
        let epochs = vec![
            EpochRecord {
                epoch: 0,
                train_loss: 1.5,
                test_accuracy: 0.6,
            },
            EpochRecord {
                epoch: 1,
                train_loss: 0.5,
                test_accuracy: 0.9,
            },
        ];
        RunRecord { epochs, steps }
    }

    #[test]
    fn the_files_hold_every_epoch_and_step_and_the_charts_are_svg() {
        let dir = tempfile::tempdir().unwrap();
        let written = record().write(dir.path()).unwrap();
        assert_eq!(written.len(), 4);
        let epochs = std::fs::read_to_string(dir.path().join("epochs.csv")).unwrap();
        assert_eq!(
            epochs,
            "epoch,train_loss,test_accuracy\n0,1.5,0.6\n1,0.5,0.9\n"
        );
        let steps = std::fs::read_to_string(dir.path().join("steps.csv")).unwrap();
        let lines: Vec<&str> = steps.lines().collect();
        assert_eq!(
            lines[0],
            "step,epoch,compute_seconds,gather_seconds,push_seconds,wait_seconds,pull_seconds,apply_seconds"
        );
        assert_eq!(lines[4], "3,1,0.002,0.001,0.001,0.006,0.001,0");
        for chart in ["training.svg", "time_split.svg"] {
            let svg = std::fs::read_to_string(dir.path().join(chart)).unwrap();
            assert!(
                svg.starts_with("<svg"),
                "{chart}: {}",
                &svg[..40.min(svg.len())]
            );
            assert!(svg.contains("epoch"), "{chart} names its axis");
        }
    }

    #[test]
    fn each_epoch_bar_is_the_mean_step_of_that_epoch() {
        let bars = record().mean_split_by_epoch();
        assert_eq!(bars.len(), 2);
        // Steps 2 and 3 waited 5 and 6 ms (wait is the fourth phase).
        assert!((bars[1].1[3] - 0.0055).abs() < 1e-12, "{bars:?}");
        assert!((bars[0].1[0] - 0.002).abs() < 1e-12, "{bars:?}");
    }
}
