//! The pictures of `docs/`: fault timelines (`docs/RELIABILITY.md`, written
//! by the fault suite) and benchmark plots (`docs/PERFORMANCE.md`, written by
//! `lease-bench`), drawn with `plotters` into SVG strings.
//!
//! Every function here takes plain data (milliseconds, microseconds, sample
//! vectors), so the suite and the benchmark only gather numbers, and
//! `tests.rs` renders each kind of picture from a small fixed input and
//! checks what a reader would look for (lanes, bars, markers, axes).
//!
//! No font files are needed: without plotters' `ttf` feature the SVG backend
//! writes `<text>` elements and leaves the font to the browser; text widths
//! are estimated, so labels get room to spare.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

mod charts;
mod timeline;

pub use charts::{HandoverSeries, OverheadSeries, ScalePoint, ScaleSeries};
pub use charts::{handover_svg, overhead_svg, scale_svg};
pub use timeline::{Bar, Lane, Mark, MarkKind, Timeline, timeline_svg};

/// The font family of every label: the browser's sans-serif.
const FONT: &str = "sans-serif";

/// Text of `size` px in `color`, anchored at `h`/`v`.
fn text(size: u32, color: &'static RGBColor, h: HPos, v: VPos) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font())
        .color(color)
        .pos(Pos::new(h, v))
}

/// Colours shared by the pictures (readable on white, distinct for the
/// common kinds of colour blindness: blue / orange / grey, with red only
/// for what went wrong).
mod palette {
    use plotters::style::RGBColor;

    pub(super) const INK: RGBColor = RGBColor(33, 33, 33);
    pub(super) const GRID: RGBColor = RGBColor(200, 200, 200);
    pub(super) const VALID: RGBColor = RGBColor(46, 125, 50);
    pub(super) const INVALID: RGBColor = RGBColor(239, 154, 154);
    pub(super) const FAULT: RGBColor = RGBColor(255, 183, 77);
    pub(super) const CANCEL: RGBColor = RGBColor(198, 40, 40);
    pub(super) const TAKEOVER: RGBColor = RGBColor(21, 101, 192);
    pub(super) const FLOOR: RGBColor = RGBColor(158, 158, 158);
    /// One colour per series (backend), in order.
    pub(super) const SERIES: [RGBColor; 6] = [
        RGBColor(21, 101, 192),
        RGBColor(230, 81, 0),
        RGBColor(46, 125, 50),
        RGBColor(106, 27, 154),
        RGBColor(0, 131, 143),
        RGBColor(121, 85, 72),
    ];
}

/// Draw into an SVG string of `size` pixels; `draw` gets the white canvas.
fn svg(
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String>,
) -> String {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        let drawn = root
            .fill(&WHITE)
            .map_err(|e| e.to_string())
            .and_then(|()| draw(&root))
            .and_then(|()| root.present().map_err(|e| e.to_string()));
        // Only a bug can fail here: the SVG backend writes into a string.
        drawn.expect("BUG: drawing into an SVG string failed");
    }
    out
}

/// The `q`-quantile (0..=1) of sorted `xs` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// The five numbers a box shows: 5th, 25th, 50th, 75th, 95th percentile.
fn spread(xs: &[f64]) -> [f64; 5] {
    let mut sorted: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    [0.05, 0.25, 0.5, 0.75, 0.95].map(|q| quantile(&sorted, q))
}

#[cfg(test)]
mod tests;
