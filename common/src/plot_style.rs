//! What every candle-ps chart shares: the font shipped with the binaries
//! (DejaVu Sans, so plotting needs no system fonts) and the palette.

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

/// Registers the shipped font as `sans-serif` for plotters.
///
/// # Errors
/// When the font cannot be read (never, for the font shipped).
pub fn register_font() -> anyhow::Result<()> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow::anyhow!("the shipped font is invalid"))
}
