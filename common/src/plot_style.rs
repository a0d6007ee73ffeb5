//! What every candle-ps chart shares: the font shipped with the binaries
//! (DejaVu Sans, so plotting needs no system fonts) and the palette.

use std::path::{Path, PathBuf};

use plotters::style::{FontStyle, RGBColor};

/// DejaVu Sans (`common/assets/DejaVuSans.LICENSE`).
const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// The series colours, in order.
pub const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Why a chart or its data could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// A file or folder could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// plotters could not draw the chart.
    #[error("{path}: {reason}")]
    Draw {
        /// The chart's file.
        path: PathBuf,
        /// What plotters said.
        reason: String,
    },
    /// The shipped font did not load.
    #[error("the shipped font is invalid")]
    Font,
}

impl ChartError {
    /// A drawing failure of the chart at `path`, for `map_err`.
    pub fn draw(path: &Path) -> impl Fn(&dyn std::fmt::Display) -> Self + '_ {
        move |reason| ChartError::Draw {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }

    /// An I/O failure on `path`, for `map_err`.
    pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| ChartError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Registers the shipped font as `sans-serif` for plotters.
///
/// # Errors
/// [`ChartError::Font`] when the font cannot be read (never, for the font shipped).
pub fn register_font() -> Result<(), ChartError> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| ChartError::Font)
}
