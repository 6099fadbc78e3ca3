//! The benchmark's plots: spreads of samples against a baseline, and
//! cost against the number of leases.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use super::palette::{FLOOR, GRID, INK, SERIES};
use super::{FONT, spread, svg, text};

/// One backend's `with_lease` cycles against its floor (the same
/// statements sent directly), in µs per cycle.
#[derive(Debug, Clone, PartialEq)]
pub struct OverheadSeries {
    /// The backend (`PgTable`).
    pub label: String,
    /// Every floor sample, µs.
    pub floor: Vec<f64>,
    /// Every `with_lease` sample, µs.
    pub with_lease: Vec<f64>,
}

/// One backend's hand-over latencies (from a release to the next holder's
/// acquisition) with the backend's push, against polling, in ms.
#[derive(Debug, Clone, PartialEq)]
pub struct HandoverSeries {
    /// The backend.
    pub label: String,
    /// Hand-over latencies with push, ms.
    pub push: Vec<f64>,
    /// Hand-over latencies when waiting by polling alone (the baseline), ms.
    pub poll: Vec<f64>,
}

/// One backend's cost of renewing many leases, batched or not.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleSeries {
    /// The backend.
    pub label: String,
    /// `renew_many` (true) or one `renew` per lease (the baseline).
    pub batched: bool,
    /// One point per number of leases.
    pub points: Vec<ScalePoint>,
}

/// The cost of one renewal window (ttl/3) for a number of leases.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScalePoint {
    /// Leases held.
    pub leases: f64,
    /// Requests the server counted in the window (`None`: not counted).
    pub requests: Option<f64>,
    /// CPU time of the process in the window, ms.
    pub cpu_ms: f64,
}

const WIDTH: u32 = 960;

/// Per backend, the spread of the `with_lease` cycles next to that of the
/// floor: boxes from the 25th to the 75th percentile, whiskers from the 5th
/// to the 95th, the median as a line, and the ratio of the medians above.
/// Log scale.
pub fn overhead_svg(series: &[OverheadSeries]) -> String {
    let boxes = series
        .iter()
        .map(|s| {
            [
                (FLOOR, "floor", spread(&s.floor)),
                (SERIES[0], "with_lease", spread(&s.with_lease)),
            ]
        })
        .collect::<Vec<_>>();
    spreads(
        "Overhead of a with_lease cycle over its floor",
        "µs per cycle (log scale)",
        series.iter().map(|s| s.label.as_str()).collect(),
        &boxes,
        &[
            (FLOOR, "floor: the same statements sent directly"),
            (SERIES[0], "with_lease, empty job"),
        ],
    )
}

/// Per backend, the spread of hand-over latencies with push next to that of
/// polling (as [`overhead_svg`], in ms).
pub fn handover_svg(series: &[HandoverSeries]) -> String {
    let boxes = series
        .iter()
        .map(|s| {
            [
                (FLOOR, "polling", spread(&s.poll)),
                (SERIES[0], "push", spread(&s.push)),
            ]
        })
        .collect::<Vec<_>>();
    spreads(
        "Hand-over latency: release to the next holder's acquisition",
        "ms (log scale)",
        series.iter().map(|s| s.label.as_str()).collect(),
        &boxes,
        &[(FLOOR, "polling (baseline)"), (SERIES[0], "push")],
    )
}

type Spread = (RGBColor, &'static str, [f64; 5]);

/// Two boxes per group (baseline, subject), with the ratio of their medians.
fn spreads(
    title: &str,
    unit: &str,
    groups: Vec<&str>,
    boxes: &[[Spread; 2]],
    key: &[(RGBColor, &str)],
) -> String {
    let values = boxes
        .iter()
        .flatten()
        .flat_map(|(_, _, q)| q.iter().copied())
        .filter(|x| x.is_finite() && *x > 0.0);
    let lo = values.clone().fold(f64::INFINITY, f64::min);
    let hi = values.fold(0.0, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > 0.0 {
        (lo / 1.5, hi * 2.0)
    } else {
        (1.0, 10.0)
    };
    let n = groups.len().max(1) as f64;
    svg((WIDTH, 460), |root| {
        let (top, bottom) = root.split_vertically(406);
        let mut chart = ChartBuilder::on(&top)
            .caption(title, (FONT, 20).into_font().color(&INK))
            .margin(10)
            .margin_right(24)
            .x_label_area_size(34)
            .y_label_area_size(70)
            .build_cartesian_2d(
                0.0..n,
                (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
            )
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_labels(8)
            .light_line_style(GRID.mix(0.3))
            .bold_line_style(GRID.mix(0.7))
            .y_label_formatter(&|y| number(*y))
            .y_desc(unit)
            .axis_desc_style((FONT, 14).into_font().color(&INK))
            .label_style((FONT, 12).into_font().color(&INK))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (name, pair)) in groups.iter().zip(boxes).enumerate() {
            let x = i as f64;
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((x + 0.5, lo))
                        + Text::new(
                            name.to_string(),
                            (0, 8),
                            text(14, &INK, HPos::Center, VPos::Top),
                        ),
                ))
                .map_err(|e| e.to_string())?;
            for (k, (colour, _, q)) in pair.iter().enumerate() {
                if q.iter().any(|v| !v.is_finite()) || q[2] <= 0.0 {
                    continue;
                }
                // A log scale has no 0: a quantile of 0 (a hand-over done
                // before `release()` returned) is drawn at the axis' foot.
                let q = &q.map(|v| if v > 0.0 { v } else { lo });
                let c = x + 0.3 + 0.4 * k as f64;
                let w = 0.12;
                let [p5, p25, p50, p75, p95] = *q;
                let whisker = colour.stroke_width(2);
                chart
                    .draw_series([
                        PathElement::new(vec![(c, p5), (c, p25)], whisker),
                        PathElement::new(vec![(c, p75), (c, p95)], whisker),
                        PathElement::new(vec![(c - w / 2.0, p5), (c + w / 2.0, p5)], whisker),
                        PathElement::new(vec![(c - w / 2.0, p95), (c + w / 2.0, p95)], whisker),
                    ])
                    .map_err(|e| e.to_string())?;
                chart
                    .draw_series([
                        Rectangle::new([(c - w, p25), (c + w, p75)], colour.mix(0.35).filled()),
                        Rectangle::new([(c - w, p25), (c + w, p75)], colour.stroke_width(2)),
                    ])
                    .map_err(|e| e.to_string())?;
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(c - w, p50), (c + w, p50)],
                        INK.stroke_width(3),
                    )))
                    .map_err(|e| e.to_string())?;
                chart
                    .draw_series(std::iter::once(
                        EmptyElement::at((c + w, p50))
                            + Text::new(
                                number(p50),
                                (4, 0),
                                text(11, &INK, HPos::Left, VPos::Center),
                            ),
                    ))
                    .map_err(|e| e.to_string())?;
            }
            let (base, subject) = (pair[0].2[2], pair[1].2[2]);
            if base > 0.0 && subject > 0.0 {
                let top_of = pair[0].2[4].max(pair[1].2[4]);
                chart
                    .draw_series(std::iter::once(
                        EmptyElement::at((x + 0.5, top_of))
                            + Text::new(
                                ratio_label(subject / base),
                                (0, -6),
                                text(14, &INK, HPos::Center, VPos::Bottom),
                            ),
                    ))
                    .map_err(|e| e.to_string())?;
            }
        }
        let mut x = 20;
        for (colour, label) in key {
            bottom
                .draw(&Rectangle::new(
                    [(x, 8), (x + 16, 20)],
                    colour.mix(0.35).filled(),
                ))
                .map_err(|e| e.to_string())?;
            bottom
                .draw(&Rectangle::new(
                    [(x, 8), (x + 16, 20)],
                    colour.stroke_width(2),
                ))
                .map_err(|e| e.to_string())?;
            bottom
                .draw(&Text::new(
                    label.to_string(),
                    (x + 22, 14),
                    text(13, &INK, HPos::Left, VPos::Center),
                ))
                .map_err(|e| e.to_string())?;
            x += 30 + 8 * label.len() as i32;
        }
        bottom
            .draw(&Text::new(
                "box: 25th–75th percentile, line: median, whiskers: 5th–95th; ×, ÷: ratio of the medians"
                    .to_owned(),
                (20, 40),
                text(12, &INK, HPos::Left, VPos::Center),
            ))
            .map_err(|e| e.to_string())?;
        Ok(())
    })
}

/// Ticks for a log axis from `lo` to `hi`: 1, 2, 5 per decade, or only
/// the decades where those would be too many.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let x = decade * m;
            if (lo..=hi).contains(&x) {
                ticks.push(x);
            }
        }
        decade *= 10.0;
    }
    if ticks.len() > 9 {
        ticks.retain(|x| (x.log10() - x.log10().round()).abs() < 1e-9);
    }
    ticks
}

/// A number for an axis or a label: no more digits than it needs.
fn number(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}").trim_end_matches(".0").to_owned()
    } else {
        format!("{x:.2}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_owned()
    }
}

/// Renewal requests per window (left) and CPU per window (right) against
/// the number of leases, both log scale: one colour per backend, solid
/// lines batched (`renew_many`), dashed unbatched (one `renew` per lease).
pub fn scale_svg(series: &[ScaleSeries]) -> String {
    svg((WIDTH, 420), |root| {
        let (left, right) = root.split_horizontally(WIDTH / 2);
        panel(
            &left,
            series,
            "Server requests per renewal window",
            "requests per ttl/3 (log)",
            |p| p.requests,
            false,
        )?;
        panel(
            &right,
            series,
            "CPU of the process per renewal window",
            "CPU ms per ttl/3 (log)",
            |p| Some(p.cpu_ms),
            true,
        )
    })
}

fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    series: &[ScaleSeries],
    title: &str,
    unit: &str,
    value: impl Fn(&ScalePoint) -> Option<f64>,
    key: bool,
) -> Result<(), String> {
    let points = || {
        series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter_map(|p| Some((p.leases, value(p)?)))
            .filter(|(x, y)| *x > 0.0 && *y > 0.0)
    };
    let (x_lo, x_hi) = points().fold((f64::INFINITY, 0.0f64), |(a, b), (x, _)| {
        (a.min(x), b.max(x))
    });
    let (y_lo, y_hi) = points().fold((f64::INFINITY, 0.0f64), |(a, b), (_, y)| {
        (a.min(y), b.max(y))
    });
    let (x_lo, x_hi) = if x_lo.is_finite() {
        (x_lo / 2.0, x_hi * 2.0)
    } else {
        (1.0, 10.0)
    };
    let (y_lo, y_hi) = if y_lo.is_finite() {
        (y_lo / 3.0, y_hi * 3.0)
    } else {
        (1.0, 10.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 16).into_font().color(&INK))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (x_lo..x_hi)
                .log_scale()
                .with_key_points(log_ticks(x_lo, x_hi)),
            (y_lo..y_hi)
                .log_scale()
                .with_key_points(log_ticks(y_lo, y_hi)),
        )
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .light_line_style(GRID.mix(0.3))
        .bold_line_style(GRID.mix(0.7))
        .x_label_formatter(&|x| number(*x))
        .y_label_formatter(&|y| number(*y))
        .x_desc("leases held (log)")
        .y_desc(unit)
        .axis_desc_style((FONT, 13).into_font().color(&INK))
        .label_style((FONT, 11).into_font().color(&INK))
        .draw()
        .map_err(|e| e.to_string())?;
    let mut labels: Vec<&str> = Vec::new();
    for s in series {
        if !labels.contains(&s.label.as_str()) {
            labels.push(&s.label);
        }
    }
    for s in series {
        let i = labels.iter().position(|l| *l == s.label).unwrap_or(0);
        let colour = SERIES[i % SERIES.len()];
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter_map(|p| Some((p.leases, value(p)?)))
            .filter(|(x, y)| *x > 0.0 && *y > 0.0)
            .collect();
        if pts.is_empty() {
            continue;
        }
        let style = colour.stroke_width(2);
        let name = format!(
            "{} {}",
            s.label,
            if s.batched { "batched" } else { "unbatched" }
        );
        let drawn = if s.batched {
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(|e| e.to_string())?
        } else {
            chart
                .draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style))
                .map_err(|e| e.to_string())?
        };
        let batched = s.batched;
        drawn.label(name).legend(move |(x, y)| {
            let style = colour.stroke_width(2);
            if batched {
                PathElement::new(vec![(x, y), (x + 18, y)], style)
            } else {
                PathElement::new(vec![(x, y), (x + 7, y)], style)
            }
        });
        chart
            .draw_series(pts.iter().map(|&p| {
                if batched {
                    Circle::new(p, 4, colour.filled())
                } else {
                    Circle::new(p, 4, colour.stroke_width(2))
                }
            }))
            .map_err(|e| e.to_string())?;
    }
    if key {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(GRID)
            .label_font((FONT, 11).into_font().color(&INK))
            .draw()
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The ratio of two medians as a label: `×1.07` near one, `÷270` far below
/// it (where two decimals would read `×0.00`).
fn ratio_label(ratio: f64) -> String {
    if ratio < 0.1 {
        format!("÷{:.0}", 1.0 / ratio)
    } else {
        format!("×{ratio:.2}")
    }
}
