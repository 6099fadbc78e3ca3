//! A fault timeline: one lane per contender process, its critical sections
//! as bars, the fault and what followed it marked.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use super::palette::{CANCEL, FAULT, GRID, INK, INVALID, TAKEOVER, VALID};
use super::{svg, text};

/// One injection of a fault, as seen by every contender. Times are in ms
/// after the fault was injected.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// The caption (`PgTable · kill`).
    pub title: String,
    /// What the fault was, written on its band (`SIGKILL of w0`).
    pub fault: String,
    /// When the fault was lifted, and what that was (`server up again`);
    /// `None`: it was instantaneous, or never lifted.
    pub lifted: Option<(f64, String)>,
    /// The lease's ttl.
    pub ttl_ms: f64,
    /// The window drawn.
    pub from_ms: f64,
    /// The end of the window drawn.
    pub to_ms: f64,
    /// One lane per contender process, top to bottom.
    pub lanes: Vec<Lane>,
    /// The takeover: the lane of the next holder and when it acquired
    /// (drawn as an arrow from the fault, with its length).
    pub takeover: Option<(usize, f64)>,
}

/// One contender process.
#[derive(Debug, Clone, PartialEq)]
pub struct Lane {
    /// Its name (`w0 #1`: slot and process).
    pub name: String,
    /// Its critical sections.
    pub bars: Vec<Bar>,
    /// What happened to it.
    pub marks: Vec<Mark>,
}

/// One critical section.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// When the lease was granted.
    pub start_ms: f64,
    /// The last instant at which its holder found it valid (`start_ms`
    /// or earlier: never).
    pub valid_until_ms: f64,
    /// When the section ended (or its process was killed).
    pub end_ms: f64,
    /// The fencing token (`None`: the backend has none).
    pub fence: Option<i64>,
}

/// Something that happened to a contender.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    /// When.
    pub at_ms: f64,
    /// What.
    pub kind: MarkKind,
}

/// The kinds of [`Mark`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkKind {
    /// The holder's token was cancelled.
    Cancelled,
    /// The process was killed.
    Killed,
    /// The process woke up (`SIGCONT`).
    Woke,
}

impl MarkKind {
    fn label(self) -> &'static str {
        match self {
            MarkKind::Cancelled => "token cancelled",
            MarkKind::Killed => "killed",
            MarkKind::Woke => "woke",
        }
    }
}

const LANE_PX: u32 = 48;
const WIDTH: u32 = 960;

/// The timeline as an SVG document.
pub fn timeline_svg(t: &Timeline) -> String {
    let lanes = t.lanes.len().max(1);
    let chart_h = 60 + LANE_PX * lanes as u32 + 40 + 48;
    let height = chart_h + 34;
    svg((WIDTH, height), |root| {
        let (top, bottom) = root.split_vertically(chart_h);
        draw_chart(&top, t).map_err(|e| e.to_string())?;
        legend(&bottom).map_err(|e| e.to_string())
    })
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type Failed<'a> = DrawingAreaErrorKind<<SVGBackend<'a> as DrawingBackend>::ErrorType>;

/// Height of the strip above the lanes where the fault is labelled, in lanes.
const HEADER: f64 = 0.8;

fn draw_chart<'a>(area: &Area<'a>, t: &Timeline) -> Result<(), Failed<'a>> {
    let n = t.lanes.len().max(1) as f64;
    let (x0, x1) = (t.from_ms, t.to_ms.max(t.from_ms + 1.0));
    let mut chart = ChartBuilder::on(area)
        .caption(&t.title, (super::FONT, 20).into_font().color(&INK))
        .margin(10)
        .margin_right(24)
        .x_label_area_size(44)
        .y_label_area_size(110)
        .build_cartesian_2d(x0..x1, 0.0..n + HEADER)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_labels(12)
        .max_light_lines(1)
        .light_line_style(GRID.mix(0.3))
        .bold_line_style(GRID.mix(0.8))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .x_desc(format!(
            "ms after the fault was injected (ttl {:.0} ms)",
            t.ttl_ms
        ))
        .axis_desc_style((super::FONT, 14).into_font().color(&INK))
        .label_style((super::FONT, 12).into_font().color(&INK))
        .draw()?;
    // Lane i (from the top) spans y in [n-1-i, n-i]; the header is above n.
    let middle = |i: usize| n - i as f64 - 0.5;
    let clip = |x: f64| x.clamp(x0, x1);
    let top = n + HEADER;

    // The fault: a band while it lasts, a line where it starts, both
    // labelled in the header.
    let lifted = t.lifted.as_ref().filter(|(l, _)| *l > 0.0);
    if let Some(&(end, _)) = lifted {
        chart.draw_series(std::iter::once(Rectangle::new(
            [(clip(0.0), 0.0), (clip(end), top)],
            FAULT.mix(0.25).filled(),
        )))?;
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(clip(0.0), 0.0), (clip(0.0), top)],
        FAULT.stroke_width(3),
    )))?;
    chart.draw_series(std::iter::once(
        EmptyElement::at((clip(0.0), top))
            + Text::new(
                format!("fault: {}", t.fault),
                (5, 4),
                text(13, &INK, HPos::Left, VPos::Top),
            ),
    ))?;
    if let Some((end, what)) = lifted {
        let end = *end;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(clip(end), 0.0), (clip(end), top)],
            FAULT.stroke_width(2),
        )))?;
        // On the second row of the header: the first may reach this far.
        chart.draw_series(std::iter::once(
            EmptyElement::at((clip(end), top))
                + Text::new(what.clone(), (5, 20), text(13, &INK, HPos::Left, VPos::Top)),
        ))?;
    }

    // Where two holders believed they held at once (a revocation): a red
    // band behind the bars, its length in the header.
    for (a, b) in overlaps(&t.lanes) {
        let (a, b) = (clip(a), clip(b));
        if b <= a {
            continue;
        }
        chart.draw_series(std::iter::once(Rectangle::new(
            [(a, 0.0), (b, n)],
            CANCEL.mix(0.18).filled(),
        )))?;
        chart.draw_series(std::iter::once(
            EmptyElement::at((a, top))
                + Text::new(
                    format!("two valid holders: {:.0} ms", b - a),
                    (5, 20),
                    text(13, &CANCEL, HPos::Left, VPos::Top),
                ),
        ))?;
    }

    for (i, lane) in t.lanes.iter().enumerate() {
        let y = middle(i);
        // The lane's name, left of the axis.
        chart.draw_series(std::iter::once(
            EmptyElement::at((x0, y))
                + Text::new(
                    lane.name.clone(),
                    (-8, 0),
                    text(13, &INK, HPos::Right, VPos::Center),
                ),
        ))?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x0, y), (x1, y)],
            GRID.mix(0.5).stroke_width(1),
        )))?;
        for bar in &lane.bars {
            if bar.end_ms < x0 || bar.start_ms > x1 {
                continue;
            }
            let (a, b) = (clip(bar.start_ms), clip(bar.end_ms));
            let v = clip(bar.valid_until_ms.max(bar.start_ms));
            if v > a {
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(a, y - 0.2), (v, y + 0.24)],
                    VALID.filled(),
                )))?;
            }
            if b > v {
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(v, y - 0.2), (b, y + 0.24)],
                    INVALID.filled(),
                )))?;
            }
            if let Some(fence) = bar.fence {
                let px = |x: f64| chart.backend_coord(&(x, y)).0;
                let label = if px(b) - px(a) >= 70 {
                    format!("fence {fence}")
                } else {
                    format!("{fence}")
                };
                // On the valid part if it has room, else on the whole bar.
                let (from, to, colour) = if px(v) - px(a) >= 70 {
                    (a, v, &WHITE)
                } else {
                    (a, b, &INK)
                };
                if px(to) - px(from) >= 14 {
                    chart.draw_series(std::iter::once(
                        EmptyElement::at(((from + to) / 2.0, y))
                            + Text::new(
                                label,
                                (0, 0),
                                text(12, colour, HPos::Center, VPos::Center),
                            ),
                    ))?;
                }
            }
        }
        // Marks: a red tick and a label above the bar; marks within a few
        // pixels of each other share one label.
        let mut marks: Vec<&Mark> = lane
            .marks
            .iter()
            .filter(|m| (x0..=x1).contains(&m.at_ms))
            .collect();
        marks.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms));
        let mut groups: Vec<(f64, Vec<MarkKind>)> = Vec::new();
        for m in marks {
            let px = chart.backend_coord(&(m.at_ms, y)).0;
            match groups.last_mut() {
                Some((at, kinds)) if px - chart.backend_coord(&(*at, y)).0 < 40 => {
                    kinds.push(m.kind);
                }
                _ => groups.push((m.at_ms, vec![m.kind])),
            }
        }
        for (at, kinds) in groups {
            let colour: &'static RGBColor = if kinds.iter().all(|k| *k == MarkKind::Woke) {
                &INK
            } else {
                &CANCEL
            };
            let label = kinds
                .iter()
                .map(|k| k.label())
                .collect::<Vec<_>>()
                .join(", ");
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(at, y - 0.3), (at, y + 0.3)],
                colour.stroke_width(2),
            )))?;
            chart.draw_series(std::iter::once(
                EmptyElement::at((at, y + 0.3))
                    + Polygon::new(vec![(-5, -7), (5, -7), (0, 0)], colour.filled())
                    + Text::new(label, (7, -5), text(12, colour, HPos::Left, VPos::Center)),
            ))?;
        }
    }

    // The takeover: an arrow under the next holder's lane, from the fault
    // to its acquisition, labelled left of the fault.
    if let Some((lane, at)) = t.takeover.filter(|(l, _)| *l < t.lanes.len()) {
        let y = middle(lane) - 0.34;
        let (a, b) = (clip(0.0), clip(at));
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(a, y), (b, y)],
            TAKEOVER.stroke_width(2),
        )))?;
        chart.draw_series([
            EmptyElement::at((a, y))
                + Polygon::new(vec![(0, 0), (8, -5), (8, 5)], TAKEOVER.filled()),
            EmptyElement::at((b, y))
                + Polygon::new(vec![(0, 0), (-8, -5), (-8, 5)], TAKEOVER.filled()),
        ])?;
        chart.draw_series(std::iter::once(
            EmptyElement::at((a, y))
                + Text::new(
                    format!("takeover {at:.0} ms"),
                    (-6, 0),
                    text(12, &TAKEOVER, HPos::Right, VPos::Center),
                ),
        ))?;
    }
    Ok(())
}

/// The intervals in which valid bars of two different lanes intersect,
/// merged.
fn overlaps(lanes: &[Lane]) -> Vec<(f64, f64)> {
    let valid: Vec<(usize, f64, f64)> = lanes
        .iter()
        .enumerate()
        .flat_map(|(i, l)| {
            l.bars
                .iter()
                .filter(|b| b.valid_until_ms > b.start_ms)
                .map(move |b| (i, b.start_ms, b.valid_until_ms))
        })
        .collect();
    let mut found: Vec<(f64, f64)> = Vec::new();
    for (k, a) in valid.iter().enumerate() {
        for b in &valid[k + 1..] {
            let (from, to) = (a.1.max(b.1), a.2.min(b.2));
            if a.0 != b.0 && from < to {
                found.push((from, to));
            }
        }
    }
    found.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut merged: Vec<(f64, f64)> = Vec::new();
    for (from, to) in found {
        match merged.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => merged.push((from, to)),
        }
    }
    merged
}

/// The key under the chart.
fn legend<'a>(area: &Area<'a>) -> Result<(), Failed<'a>> {
    let style = text(13, &INK, HPos::Left, VPos::Center);
    let y = 14;
    let mut x = 20;
    let mut item =
        |swatch: &dyn Fn(i32, i32) -> Result<(), Failed<'a>>, label: &str, width: i32| {
            swatch(x, y)?;
            area.draw(&Text::new(label.to_owned(), (x + 22, y), style.clone()))?;
            x += width;
            Ok::<(), Failed<'a>>(())
        };
    item(
        &|x, y| {
            area.draw(&Rectangle::new(
                [(x, y - 6), (x + 16, y + 6)],
                VALID.filled(),
            ))
        },
        "valid (holder believes it holds)",
        240,
    )?;
    item(
        &|x, y| {
            area.draw(&Rectangle::new(
                [(x, y - 6), (x + 16, y + 6)],
                INVALID.filled(),
            ))
        },
        "lease no longer valid, section goes on",
        270,
    )?;
    item(
        &|x, y| {
            area.draw(&Rectangle::new(
                [(x, y - 6), (x + 16, y + 6)],
                FAULT.mix(0.5).filled(),
            ))
        },
        "fault",
        70,
    )?;
    item(
        &|x, y| {
            area.draw(&PathElement::new(
                vec![(x, y), (x + 16, y)],
                TAKEOVER.stroke_width(2),
            ))
        },
        "takeover",
        90,
    )?;
    item(
        &|x, y| {
            area.draw(
                &(EmptyElement::at((x + 8, y + 6))
                    + Polygon::new(vec![(-5, -12), (5, -12), (0, -5)], CANCEL.filled())),
            )
        },
        "token cancelled / process killed",
        250,
    )?;
    Ok(())
}
