//! The picture of each scenario: one injection drawn as a timeline
//! ([`crate::plots::timeline_svg`]), written next to the report as
//! `img/faults-<backend>-<fault>.svg` and shown in it.
//!
//! The injection drawn is the first that cost its victim the lease (killed,
//! paused past it, or its token cancelled), else the first that landed:
//! the one whose takeover and cancellation the table's columns measure.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use super::checker::Section;
use super::{BackendKind, Event, Fault, ScenarioResult, section_at, us, valid_from};
use crate::plots::{Bar, Lane, Mark, MarkKind, Timeline, timeline_svg};

/// The picture's file name, relative to the report's directory.
pub(super) fn path(r: &ScenarioResult) -> String {
    let election = if r.election { "-election" } else { "" };
    format!(
        "img/faults-{}-{}{election}.svg",
        r.backend.as_str(),
        r.fault.as_str()
    )
}

/// Write the picture of every scenario that has one into `dir`/img.
pub(super) fn write_images(results: &[ScenarioResult], dir: &Path) -> std::io::Result<()> {
    for r in results {
        if let Some(t) = &r.timeline {
            let file = dir.join(path(r));
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(file, timeline_svg(t))?;
        }
    }
    Ok(())
}

/// The pictures, per backend, for the report (collapsed: the table's fault
/// column links each one too).
pub(super) fn gallery(results: &[ScenarioResult]) -> String {
    let mut s = String::new();
    let mut backends: Vec<BackendKind> = Vec::new();
    for r in results.iter().filter(|r| r.timeline.is_some()) {
        if !backends.contains(&r.backend) {
            backends.push(r.backend);
        }
    }
    if backends.is_empty() {
        return s;
    }
    let _ = writeln!(
        s,
        "\nTimelines: one injection of each fault (the first that cost its victim the lease, \
         else the first that landed), one lane per contender process. Each fault in the table \
         links to its picture.\n"
    );
    for b in backends {
        let _ = writeln!(s, "<details><summary>{}</summary>\n", b.type_name());
        for r in results
            .iter()
            .filter(|r| r.backend == b && r.timeline.is_some())
        {
            let _ = writeln!(
                s,
                "![{} · {}]({})\n",
                b.type_name(),
                r.fault_label(),
                path(r)
            );
        }
        let _ = writeln!(s, "</details>\n");
    }
    s
}

/// What the picture calls the contender `holder`: `process N`, N counting
/// the processes of the scenario as they were started.
fn lane_name(holder: &str) -> String {
    holder
        .rsplit('-')
        .next()
        .map_or_else(|| holder.to_owned(), |n| format!("process {n}"))
}

/// `(slot, process)` of `holder` (`...-w{slot}-{process}`), for ordering.
fn order(holder: &str) -> (u32, u32) {
    let mut parts = holder.rsplit('-');
    let process = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let slot = parts
        .next()
        .and_then(|w| w.strip_prefix('w'))
        .and_then(|w| w.parse().ok())
        .unwrap_or(0);
    (slot, process)
}

/// The timeline of one injection of this scenario, if one landed;
/// `processes` are the holders of every contender process it started, with
/// when it was started.
pub(super) fn build(
    ttl: Duration,
    backend: BackendKind,
    fault: Fault,
    processes: &HashMap<String, i64>,
    killed: &HashMap<String, i64>,
    events: &[Event],
    sections: &[Section],
) -> Option<Timeline> {
    let ttl_us = us(ttl);
    let next = |i: usize| events.get(i + 1).map_or(i64::MAX, |n| n.t);
    let landed: Vec<(usize, &Event, &str)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.missed.is_none())
        .filter_map(|(i, e)| Some((i, e, e.victim.as_deref()?)))
        .filter(|(_, e, victim)| {
            fault != Fault::Kill
                || section_at(sections, victim, e.t).is_some_and(|s| s.t_end.is_none())
        })
        .collect();
    let lost = |&(i, e, victim): &(usize, &Event, &str)| {
        let ours = |t: i64| e.t <= t && t < next(i);
        match fault {
            Fault::Kill => true,
            Fault::Stop => e.t_lifted.is_some_and(|l| l - e.t > 2 * ttl_us),
            _ => section_at(sections, victim, e.t)
                .and_then(|s| s.t_cancel)
                .is_some_and(ours),
        }
    };
    let &(i, e, victim) = landed.iter().find(|x| lost(x)).or_else(|| landed.first())?;
    let ours = |t: i64| e.t <= t && t < next(i);
    let ms = |t: i64| (t - e.t) as f64 / 1000.0;
    let victim_section = section_at(sections, victim, e.t);
    let was_lost = lost(&(i, e, victim));

    // The takeover, as the table measures it: the first acquisition by
    // another holder after the fault, where the victim lost its lease.
    let takeover = sections
        .iter()
        .filter(|s| s.holder != victim && ours(s.t_start))
        .min_by_key(|s| s.t_start)
        .filter(|_| was_lost);
    // Where the picture ends: after everything the fault set off.
    let lifted_what = fault.spec().lifted;
    let lifted = e.t_lifted.filter(|_| lifted_what.is_some());
    let after = [
        // black-hole-conn: when the victim had acquired again.
        e.t_lifted,
        takeover.map(|s| s.t_start),
        victim_section.and_then(|s| s.t_cancel).filter(|&t| ours(t)),
        victim_section.and_then(|s| s.wake_t).filter(|&t| ours(t)),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(e.t)
    .max(e.t + ttl_us);
    let from = e.t - ttl_us * 6 / 10;
    let to = (after + ttl_us * 6 / 10).min(next(i)).min(e.t + 8 * ttl_us);

    // Every process alive in the window: started before it ends, and not
    // killed before it begins.
    let mut holders: Vec<&str> = processes
        .iter()
        .filter(|&(h, &t)| t < to && killed.get(h).is_none_or(|&k| k > from))
        .map(|(h, _)| h.as_str())
        .chain(
            sections
                .iter()
                .filter(|s| {
                    s.t_start < to
                        && s.t_end
                            .or_else(|| killed.get(&s.holder).copied())
                            .is_none_or(|e| e > from)
                })
                .map(|s| s.holder.as_str()),
        )
        .chain(std::iter::once(victim))
        .collect();
    holders.sort_by_key(|h| order(h));
    holders.dedup();

    let lanes: Vec<Lane> = holders
        .iter()
        .map(|&holder| {
            let mut bars = Vec::new();
            let mut marks = Vec::new();
            for s in sections.iter().filter(|s| s.holder == holder) {
                let died = killed.get(holder).copied();
                let end = s.t_end.or(died).unwrap_or(to);
                if s.t_start >= to || end <= from {
                    continue;
                }
                let valid_until = match s.t_end {
                    Some(_) => s.t_last_valid.unwrap_or(s.t_start),
                    None => end,
                };
                bars.push(Bar {
                    start_ms: ms(valid_from(s).min(s.t_start)),
                    valid_until_ms: ms(valid_until),
                    end_ms: ms(end),
                    fence: s.fence.filter(|_| backend.fenced()),
                });
                if let Some(t) = s.wake_t {
                    marks.push(Mark {
                        at_ms: ms(t),
                        kind: MarkKind::Woke,
                    });
                }
                if let Some(t) = s.t_cancel {
                    marks.push(Mark {
                        at_ms: ms(t),
                        kind: MarkKind::Cancelled,
                    });
                }
                if s.t_end.is_none()
                    && let Some(t) = died
                {
                    marks.push(Mark {
                        at_ms: ms(t),
                        kind: MarkKind::Killed,
                    });
                }
            }
            Lane {
                name: lane_name(holder),
                bars,
                marks,
            }
        })
        .collect();

    let variant = fault
        .variants()
        .get(e.variant)
        .filter(|v| !v.is_empty())
        .map_or(String::new(), |v| format!(" ({v})"));
    let what = fault
        .spec()
        .caption
        .replace("{who}", &lane_name(victim))
        .replace("{variant}", &variant)
        .replace("{count}", &e.count.to_string());
    Some(Timeline {
        title: format!(
            "{} · {}{}",
            backend.type_name(),
            fault.as_str(),
            if fault.revokes(backend) {
                " (a revocation)"
            } else {
                ""
            }
        ),
        fault: what,
        lifted: lifted
            .zip(lifted_what)
            .filter(|&(l, _)| l > e.t)
            .map(|(l, what)| (ms(l), what.to_owned())),
        ttl_ms: ttl.as_secs_f64() * 1000.0,
        from_ms: ms(from),
        to_ms: ms(to),
        takeover: takeover.and_then(|s| {
            let lane = holders.iter().position(|h| *h == s.holder)?;
            Some((lane, ms(s.t_start)))
        }),
        lanes,
    })
}
