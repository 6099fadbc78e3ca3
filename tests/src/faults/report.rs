//! The report of a run: the table of `docs/RELIABILITY.md`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use super::{BackendKind, ByDeadline, Config, Fault, Revokes, ScenarioResult};

/// Start and end markers of the generated part of `docs/RELIABILITY.md`.
pub const MARKERS: (&str, &str) = ("<!-- fault-suite:begin -->", "<!-- fault-suite:end -->");

/// Where and when a run was measured.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// UTC date and time of the run.
    pub date: String,
    /// `uname -a`.
    pub uname: String,
    /// CPUs available to the run.
    pub cpus: usize,
    /// The CPU model.
    pub cpu_model: String,
    /// The private servers' versions.
    pub servers: Vec<String>,
}

impl Environment {
    /// Look at this machine.
    pub async fn probe() -> Self {
        let output = |program: &str, args: &[&str]| {
            std::process::Command::new(program)
                .args(args)
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_default()
        };
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("model name"))
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
            .unwrap_or_default();
        Self {
            date: output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            uname: output("uname", &["-a"]),
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model,
            servers: Vec::new(),
        }
    }
}

/// Everything a run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// What was run.
    pub config: Config,
    /// Where and when.
    pub environment: Environment,
    /// One result per backend × fault.
    pub results: Vec<ScenarioResult>,
    /// The checker's server and tables.
    pub checker: String,
    /// How long the run took.
    pub elapsed: Duration,
}

fn ms(d: Duration) -> String {
    format!("{}", d.as_millis())
}

fn max(ds: impl IntoIterator<Item = Duration>) -> Option<Duration> {
    ds.into_iter().max()
}

fn median(mut ds: Vec<Duration>) -> Option<Duration> {
    ds.sort();
    ds.get(ds.len() / 2).copied()
}

impl Report {
    /// Every required property that did not hold, as `backend/fault: what`.
    pub fn failures(&self) -> Vec<String> {
        self.results
            .iter()
            .flat_map(|r| {
                r.failures
                    .iter()
                    .map(move |f| format!("{}/{}: {f}", r.backend.as_str(), r.fault_label()))
            })
            .collect()
    }

    /// The report as Markdown: how it was measured, the table, the failures.
    pub fn markdown(&self) -> String {
        let c = &self.config;
        let e = &self.environment;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Measured {} on `{}` ({} CPUs, {}); servers: {}; checker: {}.",
            e.date,
            e.uname,
            e.cpus,
            if e.cpu_model.is_empty() {
                "unknown CPU"
            } else {
                &e.cpu_model
            },
            e.servers.join(", "),
            self.checker
        );
        let _ = writeln!(
            s,
            "\nttl {} ms, {} contender processes per scenario, {} injection(s) per backend × fault \
             (at least one per variant of a fault), timing slack {} ms, sqlx pools with \
             test_before_acquire({}){}; the run took {:.0} s.\n",
            c.ttl.as_millis(),
            c.workers,
            c.injections,
            c.slack.as_millis(),
            c.pool_ping,
            if super::breaks::active().is_empty() {
                String::new()
            } else {
                format!(
                    "; **deliberately broken: {}={}**",
                    super::breaks::VAR,
                    super::breaks::active()
                )
            },
            self.elapsed.as_secs_f64()
        );
        let _ = writeln!(
            s,
            "| backend | fault | injections landed (missed) | critical sections completed (all) \
             | overlaps between bodies (longest, ms) \
             | overlaps between valid holders (longest, ms) | stale-fence writes accepted \
             | fences handed out again / valid holders' writes rejected \
             | takeover after the fault, ms: median / max (bound) \
             | fault → holder's token cancelled, ms: max (bound) | what the fault did | result |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        for r in &self.results {
            let _ = writeln!(s, "{}", self.row(r));
        }
        s.push_str(&super::timeline::gallery(&self.results));
        let failures = self.failures();
        if failures.is_empty() {
            let _ = writeln!(s, "\nEvery required property held.");
        } else {
            let _ = writeln!(s, "\nRequired properties that did **not** hold:\n");
            for f in failures {
                let _ = writeln!(s, "- {f}");
            }
        }
        let notes: Vec<String> = self
            .results
            .iter()
            .filter(|r| {
                r.fence_reissues > 0
                    || r.valid_rejected > 0
                    || (!r.downtimes.is_empty() && r.fault != Fault::MasterKill)
                    || !r.miss_reasons.is_empty()
            })
            .map(|r| {
                let mut parts = Vec::new();
                if !r.downtimes.is_empty() && r.fault != Fault::MasterKill {
                    parts.push(format!(
                        "server down {} ms (max)",
                        max(r.downtimes.clone()).map_or_else(String::new, ms)
                    ));
                }
                if !r.miss_reasons.is_empty() {
                    parts.push(format!("missed injections: {}", r.miss_reasons.join("; ")));
                }
                if r.fence_reissues > 0 {
                    parts.push(format!(
                        "{} acquisitions got a fence not above an earlier holder's",
                        r.fence_reissues
                    ));
                }
                if r.valid_rejected > 0 {
                    parts.push(format!(
                        "{} writes rejected while the writer's lease was valid",
                        r.valid_rejected
                    ));
                }
                format!(
                    "- {}/{}: {}",
                    r.backend.as_str(),
                    r.fault_label(),
                    parts.join("; ")
                )
            })
            .collect();
        if !notes.is_empty() {
            let _ = writeln!(s, "\nAlso measured:\n");
            for n in notes {
                let _ = writeln!(s, "{n}");
            }
        }
        s
    }

    fn row(&self, r: &ScenarioResult) -> String {
        let c = &self.config;
        let revocation = r.revocation();
        let overlaps = if r.overlaps == 0 {
            "0".to_owned()
        } else {
            format!("{} ({})", r.overlaps, ms(r.max_overlap))
        };
        let overlaps = if revocation && r.overlaps > 0 {
            format!("{overlaps} — revocation")
        } else {
            overlaps
        };
        let overlaps = match c.overlap_bound(r.fault, r.backend) {
            bound if revocation && bound != c.cancel_bound() => {
                format!("{overlaps} (≤ {})", ms(bound))
            }
            _ => overlaps,
        };
        let mut bodies = if r.body_overlaps == 0 {
            "0".to_owned()
        } else {
            format!("{} ({})", r.body_overlaps, ms(r.max_body_overlap))
        };
        if revocation && r.body_overlaps > 0 {
            bodies.push_str(" — revocation");
        }
        if r.frozen_overlaps > 0 {
            bodies.push_str(&format!(
                "; frozen body: {} ({})",
                r.frozen_overlaps,
                ms(r.max_frozen_overlap)
            ));
        }
        let stale = if r.backend.fenced() {
            format!(
                "{} (of {} accepted, {} rejected)",
                r.stale_accepted, r.writes.0, r.writes.1
            )
        } else {
            "n/a — no fencing token".to_owned()
        };
        let takeover = if r.fault == Fault::Stop && r.backend.advisory() {
            format!(
                "taken during the pause {}/{} pauses of 2.5 ttl (the stopped session keeps the lock); \
                 {} ms after the stop (max), once the woken holder released",
                r.taken_during_pause,
                (r.hits as usize).saturating_sub(r.short_pauses),
                max(r.takeovers.clone()).map_or_else(|| "—".to_owned(), ms)
            )
        } else if r.takeovers.is_empty() {
            "—".to_owned()
        } else {
            let bound = if r.fault.spec().takeover_bound {
                format!(" (≤ {})", ms(c.takeover_bound(r.backend)))
            } else {
                String::new()
            };
            format!(
                "{} / {}{bound}",
                median(r.takeovers.clone()).map_or_else(String::new, ms),
                max(r.takeovers.clone()).map_or_else(String::new, ms)
            )
        };
        let cancel = if r.cancels.is_empty() {
            "—".to_owned()
        } else {
            let cancelled: Vec<Duration> = r.cancels.iter().flatten().copied().collect();
            let kept = r.cancels.len() - cancelled.len();
            let spec = r.fault.spec();
            let bound = if spec.cancels_at_once {
                format!(" (≤ {})", ms(c.slack))
            } else if spec.cancels_at_renewal {
                format!(" (≤ {})", ms(c.cancel_bound()))
            } else if spec.by_deadline != ByDeadline::No {
                format!(" (≤ {})", ms(c.deadline_bound()))
            } else if spec.reported_only.is_some() || !r.revocation() {
                String::new()
            } else if spec.revokes == Revokes::ResumedLeader {
                // Counted from the pause, bounded from the resumption.
                format!(" (≤ the pause + {})", ms(c.cancel_bound()))
            } else {
                format!(" (≤ {})", ms(c.cancel_bound()))
            };
            match (cancelled.is_empty(), kept) {
                (true, _) => format!("not cancelled: lease kept {kept}/{}", r.cancels.len()),
                (false, 0) => format!("{}{bound}", max(cancelled).map_or_else(String::new, ms)),
                (false, k) => format!(
                    "{}{bound}; kept {k}/{}",
                    max(cancelled).map_or_else(String::new, ms),
                    r.cancels.len()
                ),
            }
        };
        let fencing = if r.backend.fenced() {
            format!("{} / {}", r.fence_reissues, r.valid_rejected)
        } else {
            "n/a".to_owned()
        };
        let did = self.what_the_fault_did(r);
        let result = if !r.failures.is_empty() {
            "**FAIL**"
        } else if let Some(reported) = r.fault.spec().reported_only {
            reported
        } else if revocation {
            "pass (revocation: bounded)"
        } else {
            "pass"
        };
        format!(
            "| {} | {} | {} ({}) | {} ({}) | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.backend.type_name(),
            // Linked to its timeline (written by `write_into`).
            if r.timeline.is_some() {
                format!("[{}]({})", r.fault_label(), super::timeline::path(r))
            } else {
                r.fault_label()
            },
            r.hits,
            r.misses,
            r.completed,
            r.sections,
            bodies,
            overlaps,
            stale,
            fencing,
            takeover,
            cancel,
            did,
            result
        )
    }

    /// The fault-specific column: what the nemesis did and what it saw.
    fn what_the_fault_did(&self, r: &ScenarioResult) -> String {
        let c = &self.config;
        let kept = r.cancels.iter().filter(|c| c.is_none()).count();
        let per_variant = || {
            r.fault
                .variants()
                .iter()
                .zip(&r.variants)
                .map(|(name, (landed, lost))| format!("{name}: lease lost {lost}/{landed}"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let handed = || {
            let handed: Vec<Duration> = r.handovers.iter().flatten().copied().collect();
            format!(
                "granted again {}/{} within {} ms of the body's return (≤ {})",
                handed.len(),
                r.handovers.len(),
                max(handed).map_or_else(|| "—".to_owned(), ms),
                ms(c.handover_bound())
            )
        };
        match r.fault {
            Fault::Kill => "—".to_owned(),
            Fault::Deploy => {
                let exited: Vec<Duration> = r.exits.iter().flatten().copied().collect();
                format!(
                    "SIGTERM: shutdown() and exit {}/{} within {} ms (≤ {}); {}",
                    exited.len(),
                    r.exits.len(),
                    max(exited).map_or_else(|| "—".to_owned(), ms),
                    ms(c.exit_bound()),
                    handed()
                )
            }
            Fault::MaxHold => format!("max_hold {} ms; {}", ms(c.max_hold()), handed()),
            Fault::Drift => {
                let rates = r.clocks.iter().map(|c| c.0);
                let (lo, hi) =
                    rates.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
                format!(
                    "the holder's clocks at {}× (measured {lo:.3}–{hi:.3}×, its times within \
                     {} ms); link cut 2 ttl; lease lost {}/{}; closest hand-over {} ms",
                    c.drift_rate,
                    max(r.clocks.iter().map(|c| c.1)).map_or_else(
                        || "—".to_owned(),
                        |e| format!("{:.1}", e.as_secs_f64() * 1e3)
                    ),
                    r.cancels.iter().flatten().count(),
                    r.cancels.len(),
                    r.closest.map_or_else(
                        || "—".to_owned(),
                        |c| format!("{:.1}", c.as_secs_f64() * 1e3)
                    )
                )
            }
            Fault::Stop => self.woken(r),
            Fault::StopInTxn => format!(
                "stopped 2.5 ttl in its checked-in transaction, then wrote and committed {}/{}; \
                 taken during the pause {}/{}; unfenced writes committed {}, stale (after a \
                 later holder's) {}",
                r.connections,
                r.hits,
                r.taken_during_pause,
                r.hits,
                r.unfenced_writes,
                r.unfenced_stale
            ),
            Fault::ForceRelease => format!(
                "{} live lease(s) force-released; lease lost {}/{}; closest hand-over {} ms",
                r.connections,
                r.cancels.iter().flatten().count(),
                r.cancels.len(),
                r.closest.map_or_else(
                    || "—".to_owned(),
                    |c| format!("{:.1}", c.as_secs_f64() * 1e3)
                )
            ),
            Fault::ConnKill if r.backend == BackendKind::Etcd => format!(
                "{} connection(s) reset in the proxy (etcd cannot kill a client's); \
                 lease kept {kept}/{}",
                r.connections,
                r.cancels.len()
            ),
            Fault::ConnKill => format!(
                "{} connection(s) killed; lease kept {kept}/{}",
                r.connections,
                r.cancels.len()
            ),
            Fault::Reset => format!(
                "{} of the holder's connection(s) reset; lease kept {kept}/{}",
                r.connections,
                r.cancels.len()
            ),
            Fault::Steal if r.backend == BackendKind::Etcd => {
                format!("{} etcd lease(s) revoked", r.connections)
            }
            Fault::Steal => format!("{} live lease(s) ended on the server", r.connections),
            Fault::Latency | Fault::Restart | Fault::RestartNoPersistence => per_variant(),
            Fault::BlackHole => "—".to_owned(),
            Fault::BlackHoleLong => {
                let freed: Vec<Duration> = r.freed.iter().flatten().copied().collect();
                format!(
                    "link cut {} s; another contender held the lock {}/{} within {} ms \
                     of the heal (≤ {})",
                    super::LONG_BLACK_HOLE.as_secs(),
                    freed.len(),
                    r.freed.len(),
                    max(freed).map_or_else(|| "—".to_owned(), ms),
                    ms(c.takeover_bound(r.backend))
                )
            }
            Fault::BlackHoleConn => {
                let again: Vec<Duration> = r.reacquires.iter().flatten().copied().collect();
                format!(
                    "{} connection(s) black-holed for good; lease kept {kept}/{}; \
                     acquired again {}/{} within {} ms of ending its section (≤ {})",
                    r.connections,
                    r.cancels.len(),
                    again.len(),
                    r.reacquires.len(),
                    max(again).map_or_else(|| "—".to_owned(), ms),
                    ms(c.reconnect_bound_of(r.backend))
                )
            }
            Fault::MasterKill => {
                let n = r.replicated.len();
                let had_lock = r.replicated.iter().filter(|(lock, _)| *lock).count();
                let had_counter = r.replicated.iter().filter(|(_, c)| *c).count();
                let overlaps = if r.overlap_lengths.is_empty() {
                    "no overlap".to_owned()
                } else {
                    format!(
                        "overlaps {} ms median, {} ms max",
                        median(r.overlap_lengths.clone()).map_or_else(String::new, ms),
                        max(r.overlap_lengths.clone()).map_or_else(String::new, ms)
                    )
                };
                format!(
                    "{}; slot served again {} ms after the kill (max); the replica had the \
                     holder's lock {had_lock}/{n}, the fence counter {had_counter}/{n}; {overlaps}",
                    per_variant(),
                    max(r.downtimes.clone()).map_or_else(|| "—".to_owned(), ms)
                )
            }
            Fault::LateRelease => format!(
                "stalled release delivered after the same holder's new acquisition {}/{}; \
                 newer lease kept {}/{}",
                r.late_releases.0,
                r.hits + r.misses,
                r.late_releases.1,
                r.late_releases.0
            ), // etcd's members: the cluster goes on; each holder keeps its
            // lease or loses it at its deadline.
            Fault::LeaderKill | Fault::LeaderPause | Fault::Partition => {
                let lost: u32 = r.variants.iter().map(|v| v.1).sum();
                let landed: u32 = r.variants.iter().map(|v| v.0).sum();
                if r.fault == Fault::Partition {
                    per_variant()
                } else {
                    format!("lease lost {lost}/{landed}")
                }
            }
        }
    }

    /// What the holders woken from `SIGSTOP` saw.
    fn woken(&self, r: &ScenarioResult) -> String {
        if r.wakes.is_empty() {
            return "—".to_owned();
        }
        let n = r.wakes.len();
        let invalid = r.wakes.iter().filter(|w| !w.valid).count();
        let at_once = r.wakes.iter().filter(|w| w.cancelled_at_once).count();
        let cancel = r.wakes.iter().filter_map(|w| w.cancel_after).max();
        let long = r.wakes.iter().filter(|w| w.long).count();
        let rejected = r
            .wakes
            .iter()
            .filter(|w| w.long && w.write_accepted == Some(false))
            .count();
        let fence = if r.backend.fenced() {
            format!(", old-fence write rejected {rejected}/{long} (after 2.5 ttl)")
        } else {
            ", no fence to write with".to_owned()
        };
        format!(
            "woken: is_valid() false {invalid}/{n}; token cancelled ≤ {} ms after waking \
             (already at once {at_once}/{n}){fence}{}",
            cancel.map_or_else(|| "?".to_owned(), ms),
            if r.short_pauses > 0 {
                format!("; {} pauses of 0.6–1.4 ttl", r.short_pauses)
            } else {
                String::new()
            }
        )
    }

    /// Replace the generated part of the Markdown file at `path` (between
    /// [`MARKERS`]) with this report, keeping the rest; a file without the
    /// markers gets them appended. The timelines the report shows are
    /// written to `img/` beside the file.
    ///
    /// # Errors
    ///
    /// When the file cannot be read or written.
    pub fn write_into(&self, path: &Path, command: &str) -> std::io::Result<()> {
        let old = match std::fs::read_to_string(path) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let block = format!(
            "{}\n<!-- generated by `{command}`; do not edit by hand -->\n\n{}\n{}",
            MARKERS.0,
            self.markdown(),
            MARKERS.1
        );
        let new = match (old.find(MARKERS.0), old.find(MARKERS.1)) {
            (Some(a), Some(b)) if a < b => {
                format!("{}{block}{}", &old[..a], &old[b + MARKERS.1.len()..])
            }
            _ => format!("{old}\n{block}\n"),
        };
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir)?;
        }
        super::timeline::write_images(&self.results, path.parent().unwrap_or(Path::new("")))?;
        std::fs::write(path, new)
    }
}
