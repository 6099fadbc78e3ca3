//! The plots of `docs/PERFORMANCE.md`: the numbers of a run handed to
//! [`lease_tests::plots`] (which draws the fault suite's pictures too), and
//! written by `--write FILE` to `img/` beside FILE, where the report embeds
//! them.

use std::fmt::Write as _;
use std::path::Path;

use lease_tests::plots::{
    HandoverSeries, OverheadSeries, ScalePoint, ScaleSeries, handover_svg, overhead_svg, scale_svg,
};

use crate::Results;

/// One picture of the report.
#[derive(Debug, Clone)]
pub struct Plot {
    /// Its path relative to the report (`img/bench-overhead.svg`).
    pub path: &'static str,
    /// What it shows (its alternative text).
    pub alt: &'static str,
    /// The SVG document.
    pub svg: String,
}

/// `with_lease` against the floor, per backend.
pub(crate) const OVERHEAD: (&str, &str) = (
    "img/bench-overhead.svg",
    "with_lease cycle against its floor, per backend: spread of the samples",
);
/// Renewal requests and CPU per window against the number of leases.
pub(crate) const SCALE: (&str, &str) = (
    "img/bench-scale.svg",
    "server requests and CPU per renewal window against the number of leases, batched and unbatched",
);
/// Hand-over latency, push against polling.
pub(crate) const HANDOVER: (&str, &str) = (
    "img/bench-handover.svg",
    "hand-over latency per backend, push against polling",
);

/// The Markdown that shows `plot` (`(path, alt)`).
pub(crate) fn embed(s: &mut String, (path, alt): (&str, &str)) {
    let _ = writeln!(s, "\n![{alt}]({path})");
}

/// Every plot the results of this run make.
pub(crate) fn plots(all: &[Results]) -> Vec<Plot> {
    let mut plots = Vec::new();
    let overhead: Vec<OverheadSeries> = all
        .iter()
        .filter_map(|r| {
            let o = r.overhead.as_ref()?;
            let us = |d: &Vec<std::time::Duration>| {
                d.iter()
                    .map(|d| d.as_secs_f64() * 1e6)
                    .collect::<Vec<f64>>()
            };
            Some(OverheadSeries {
                label: r.label.to_owned(),
                floor: us(&o.samples.0),
                with_lease: us(&o.samples.1),
            })
        })
        .collect();
    if !overhead.is_empty() {
        plots.push(Plot {
            path: OVERHEAD.0,
            alt: OVERHEAD.1,
            svg: overhead_svg(&overhead),
        });
    }
    let mut scale: Vec<ScaleSeries> = Vec::new();
    for r in all {
        for c in &r.scale {
            let point = ScalePoint {
                leases: c.leases as f64,
                requests: c.server_requests.map(|x| x as f64),
                cpu_ms: c.cpu_ms,
            };
            match scale
                .iter_mut()
                .find(|s| s.label == r.label && s.batched == c.batched)
            {
                Some(s) => s.points.push(point),
                None => scale.push(ScaleSeries {
                    label: r.label.to_owned(),
                    batched: c.batched,
                    points: vec![point],
                }),
            }
        }
    }
    for s in &mut scale {
        s.points.sort_by(|a, b| a.leases.total_cmp(&b.leases));
    }
    if !scale.is_empty() {
        plots.push(Plot {
            path: SCALE.0,
            alt: SCALE.1,
            svg: scale_svg(&scale),
        });
    }
    let ms = |d: &Vec<std::time::Duration>| {
        d.iter()
            .map(|d| d.as_secs_f64() * 1e3)
            .collect::<Vec<f64>>()
    };
    let handovers: Vec<HandoverSeries> = all
        .iter()
        .filter_map(|r| {
            let h = r.handover.as_ref()?;
            Some(HandoverSeries {
                label: r.label.to_owned(),
                push: if h.pushes {
                    ms(&h.samples.0)
                } else {
                    Vec::new()
                },
                poll: ms(&h.samples.1),
            })
        })
        .collect();
    if !handovers.is_empty() {
        plots.push(handover(&handovers));
    }
    plots
}

/// The hand-over plot, from per-backend samples (ms) with push and with
/// polling alone.
///
/// [`plots`] adds it when the run has a hand-over section.
pub(crate) fn handover(series: &[HandoverSeries]) -> Plot {
    Plot {
        path: HANDOVER.0,
        alt: HANDOVER.1,
        svg: handover_svg(series),
    }
}

/// Write every plot of the report to its path relative to `doc`'s directory.
///
/// # Errors
///
/// When a file cannot be written.
pub fn write(plots: &[Plot], doc: &Path) -> std::io::Result<()> {
    let dir = doc.parent().unwrap_or(Path::new(""));
    for p in plots {
        let file = dir.join(p.path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(file, &p.svg)?;
    }
    Ok(())
}
