//! The analysis of a scenario, from the checker's records and what the
//! nemesis did: [`analyse`] turns them into a [`ScenarioResult`], whose
//! `failures` are the required properties that did not hold.
//!
//! A section is a *body*: from its grant until the body returned (a
//! cooperative body stops a random 0 to grace/2 after its token fires).
//! The required zero is on overlaps between bodies of different holders,
//! but for revocations (bounded, as the overlaps between valid holders)
//! and a frozen body (`stop`: reported apart); the overlaps between valid
//! intervals (while `is_valid()`) are measured and required as before.
//!
//! In order: sections that never ended must be explained by a kill
//! ([`unexplained_ends`]); overlaps between bodies ([`body_overlaps`]) and
//! between valid intervals ([`overlaps`]);
//! the write log re-checked ([`write_log`]), the fences handed out
//! ([`fences`]) and the writes of valid holders rejected
//! ([`rejected_writes`]); then each injection ([`injection`]: was it a
//! hit, the takeover, the cancellation, and the checks of its fault); then
//! the requirements of the whole scenario ([`requirements`]).

use std::collections::HashMap;
use std::time::Duration;

use super::checker::{Section, Write};
use super::kinds::{ByDeadline, Revokes};
use super::{BackendKind, Config, Event, Fault, us};

/// What one backend × fault showed.
#[derive(Debug, Clone)]
pub struct ScenarioResult {
    /// The backend.
    pub backend: BackendKind,
    /// The fault.
    pub fault: Fault,
    /// An election scenario: the contenders ran `Lease::elect`.
    pub election: bool,
    /// The lease's ttl.
    pub ttl: Duration,
    /// Injections that landed while the victim held the lease.
    pub hits: u32,
    /// Injections that missed (the victim had just released): not counted.
    pub misses: u32,
    /// Critical sections, all of them.
    pub sections: usize,
    /// Critical sections that ran to their end with the lease still valid.
    pub completed: usize,
    /// Pairs of bodies (sections, from the grant until the body returned,
    /// or its process was reaped) of different holders that intersect in
    /// time, but for those of [`frozen_overlaps`](ScenarioResult::frozen_overlaps).
    pub body_overlaps: usize,
    /// The longest such intersection.
    pub max_body_overlap: Duration,
    /// Where the victim lost its lease to the fault, the least time from
    /// its body's return to the next grant to another holder, if that came
    /// after it: how close the hand-overs came to an overlap.
    pub closest: Option<Duration>,
    /// `stop`: body overlaps with the section of a frozen victim, which
    /// nobody can stop (reported apart, not required to be zero).
    pub frozen_overlaps: usize,
    /// The longest such intersection.
    pub max_frozen_overlap: Duration,
    /// Pairs of sections of different holders, both valid, that intersect in time.
    pub overlaps: usize,
    /// The longest such intersection.
    pub max_overlap: Duration,
    /// Writes the fenced resource accepted with a fence lower than one it
    /// had accepted before (or equal, from another holder), found by
    /// re-checking the write log.
    pub stale_accepted: usize,
    /// Writes accepted / rejected by the fenced resource.
    pub writes: (usize, usize),
    /// Writes rejected although the writer's lease was valid from before
    /// the write until after it returned.
    pub valid_rejected: usize,
    /// Acquisitions whose fence was not larger than an earlier holder's.
    pub fence_reissues: usize,
    /// Connections killed, reset or black-holed (summed over the injections).
    pub connections: usize,
    /// `late-release`: stalled releases delivered after the same holder's
    /// newer acquisition, and how many of those newer leases were kept.
    pub late_releases: (usize, usize),
    /// `black-hole-conn`: per landed injection, the time from the end of the
    /// victim's section to its next acquisition (`None`: it did not acquire).
    pub reacquires: Vec<Option<Duration>>,
    /// `black-hole-long`: per landed injection, the time from the heal to
    /// the first acquisition by another contender (`None`: none after the
    /// injection).
    pub freed: Vec<Option<Duration>>,
    /// Landed injections per variant ([`Fault::variants`]), and how many of
    /// them cost the victim its lease.
    pub variants: Vec<(u32, u32)>,
    /// Why the missed injections missed.
    pub miss_reasons: Vec<String>,
    /// Time from each landed injection that cost the victim its lease to the
    /// next holder's acquisition (kill, stop of 2.5 ttl, and every fault after
    /// which the victim's token was cancelled).
    pub takeovers: Vec<Duration>,
    /// Time from each landed injection to the victim's token being
    /// cancelled; `None` where it was not (the lease was kept).
    pub cancels: Vec<Option<Duration>>,
    /// What each holder woken by `SIGCONT` saw.
    pub wakes: Vec<Wake>,
    /// Pauses (SIGSTOP) during which another contender acquired the lease.
    pub taken_during_pause: usize,
    /// Pauses of 0.6 to 1.4 ttl (around the local deadline): only the
    /// overlap count and, if the holder noticed, its wake-up are checked.
    pub short_pauses: usize,
    /// Server downtime per restart; `master-kill`: from the kill until the
    /// cluster served the slot again (the failover).
    pub downtimes: Vec<Duration>,
    /// The length of every overlap counted in [`overlaps`](ScenarioResult::overlaps).
    pub overlap_lengths: Vec<Duration>,
    /// `master-kill`, per landed injection: whether the replica had the
    /// victim's lock, and the fence counter up to the victim's fence, when
    /// the master died.
    pub replicated: Vec<(bool, bool)>,
    /// Required properties that did not hold.
    pub failures: Vec<String>,
    /// `deploy`, `max-hold`, per landed injection: from the victim's body's
    /// return to the next grant of the lease, to anyone (`None`: nobody was
    /// granted it after).
    pub handovers: Vec<Option<Duration>>,
    /// `deploy`, per landed injection: from the `SIGTERM` to the victim's
    /// exit (`None`: it did not exit in time and was killed).
    pub exits: Vec<Option<Duration>>,
    /// `drift`, per landed injection: the victim's clock speed, measured,
    /// and how far from the real time its recorded times were.
    pub clocks: Vec<(f64, Duration)>,
    /// `stop-in-txn`: writes committed to the unfenced table, in
    /// transactions checked in with the writer's lease.
    pub unfenced_writes: usize,
    /// `stop-in-txn`: those committed after a write of a later holder
    /// (one with a larger fence), which was granted before it wrote.
    pub unfenced_stale: usize,
    /// One injection drawn (`None`: none landed); the report writes it
    /// to `img/` beside itself.
    pub timeline: Option<crate::plots::Timeline>,
}

impl ScenarioResult {
    /// The fault's name, and `(election)` for an election scenario.
    pub fn fault_label(&self) -> String {
        if self.election {
            format!("{} (election)", self.fault.as_str())
        } else {
            self.fault.as_str().to_owned()
        }
    }

    /// A revocation (see [`Fault::revokes`]): overlaps are reported, bounded, not required to be zero.
    pub fn revocation(&self) -> bool {
        self.fault.revokes(self.backend)
    }
}

/// What a holder saw when it woke up from a pause longer than its ttl.
#[derive(Debug, Clone, Copy)]
pub struct Wake {
    /// After a pause of 2.5 ttl (else 0.6 to 1.4 ttl).
    pub long: bool,
    /// `is_valid()` at once: must be false.
    pub valid: bool,
    /// The token was already cancelled at once (before the engine's task ran).
    pub cancelled_at_once: bool,
    /// How long after waking the token was cancelled (`None`: not within 2 s).
    pub cancel_after: Option<Duration>,
    /// Whether the resource accepted a write with its old fence (`None`: no fence).
    pub write_accepted: Option<bool>,
}

impl ScenarioResult {
    /// A result with nothing counted yet.
    fn new(
        config: &Config,
        backend: BackendKind,
        fault: Fault,
        events: &[Event],
        sections: &[Section],
        writes: &[Write],
    ) -> Self {
        ScenarioResult {
            backend,
            fault,
            election: false,
            ttl: config.ttl,
            hits: 0,
            misses: 0,
            sections: sections.len(),
            completed: sections
                .iter()
                .filter(|s| s.valid_end == Some(true))
                .count(),
            body_overlaps: 0,
            max_body_overlap: Duration::ZERO,
            closest: None,
            frozen_overlaps: 0,
            max_frozen_overlap: Duration::ZERO,
            overlaps: 0,
            max_overlap: Duration::ZERO,
            stale_accepted: 0,
            writes: (
                writes.iter().filter(|w| w.accepted).count(),
                writes.iter().filter(|w| !w.accepted).count(),
            ),
            valid_rejected: 0,
            fence_reissues: 0,
            connections: 0,
            late_releases: (0, 0),
            reacquires: Vec::new(),
            freed: Vec::new(),
            variants: vec![(0, 0); fault.variants().len()],
            miss_reasons: Vec::new(),
            takeovers: Vec::new(),
            cancels: Vec::new(),
            wakes: Vec::new(),
            downtimes: events.iter().filter_map(|e| e.downtime).collect(),
            taken_during_pause: 0,
            short_pauses: 0,
            overlap_lengths: Vec::new(),
            replicated: Vec::new(),
            failures: Vec::new(),
            handovers: Vec::new(),
            exits: Vec::new(),
            clocks: Vec::new(),
            unfenced_writes: 0,
            unfenced_stale: 0,
            timeline: None,
        }
    }
}

/// Analyse one scenario: its sections and writes from the checker, the
/// holders the nemesis killed (and when they were reaped), and its events.
#[allow(clippy::too_many_arguments)]
pub(super) fn analyse(
    config: &Config,
    backend: BackendKind,
    fault: Fault,
    killed: &HashMap<String, i64>,
    events: &[Event],
    sections: &[Section],
    writes: &[Write],
    resource: &(i64, String),
) -> ScenarioResult {
    let mut r = ScenarioResult::new(config, backend, fault, events, sections, writes);
    unexplained_ends(&mut r, sections, killed);
    body_overlaps(&mut r, events, sections, killed, config.ttl);
    overlaps(&mut r, sections, killed, config.ttl);
    write_log(&mut r, writes, resource);
    fences(&mut r, sections);
    rejected_writes(config, &mut r, events, writes);
    for i in 0..events.len() {
        injection(config, &mut r, events, i, sections);
    }
    requirements(config, &mut r);
    r
}

/// Sections that never ended must be explained by a kill.
fn unexplained_ends(r: &mut ScenarioResult, sections: &[Section], killed: &HashMap<String, i64>) {
    for s in sections.iter().filter(|s| s.t_end.is_none()) {
        if !killed.contains_key(&s.holder) {
            r.failures.push(format!(
                "contender {} died in a section (not killed by the nemesis)",
                s.holder
            ));
        }
    }
}

/// Overlaps between bodies of different holders: from the grant until the
/// body returned (the section's end) or, for a killed one, until its
/// process was reaped. Under `stop`, those with the victim's section at a
/// pause are counted apart: a frozen body cannot be stopped by anyone.
fn body_overlaps(
    r: &mut ScenarioResult,
    events: &[Event],
    sections: &[Section],
    killed: &HashMap<String, i64>,
    ttl: Duration,
) {
    // Every section of a paused process that spans part of its pause, also
    // where the injection missed (the process was frozen all the same: an
    // election may have been granted the lease just before the pause, and
    // its term starts once the process wakes).
    let frozen: Vec<&Section> = sections
        .iter()
        .filter(|s| {
            r.fault.spec().freezes
                && events.iter().any(|e| {
                    e.victim.as_deref() == Some(s.holder.as_str())
                        && valid_from(s) <= e.t_lifted.unwrap_or(e.t)
                        && body_until(s, killed, ttl) >= e.t
                })
        })
        .collect();
    let bodies: Vec<(&Section, i64, i64)> = sections
        .iter()
        .map(|s| (s, valid_from(s), body_until(s, killed, ttl)))
        .filter(|&(_, from, until)| until >= from)
        .collect();
    for (i, a) in bodies.iter().enumerate() {
        for b in &bodies[i + 1..] {
            if a.0.holder != b.0.holder && a.1 < b.2 && b.1 < a.2 {
                let length = dur(a.2.min(b.2) - a.1.max(b.1));
                if frozen
                    .iter()
                    .any(|f| std::ptr::eq(*f, a.0) || std::ptr::eq(*f, b.0))
                {
                    r.frozen_overlaps += 1;
                    r.max_frozen_overlap = r.max_frozen_overlap.max(length);
                } else {
                    r.body_overlaps += 1;
                    r.max_body_overlap = r.max_body_overlap.max(length);
                }
            }
        }
    }
}

/// Overlaps between valid intervals of different holders.
fn overlaps(
    r: &mut ScenarioResult,
    sections: &[Section],
    killed: &HashMap<String, i64>,
    ttl: Duration,
) {
    let intervals: Vec<(&str, i64, i64)> = sections
        .iter()
        .filter_map(|s| {
            let until = valid_until(s, killed, ttl)?;
            (until >= valid_from(s)).then_some((s.holder.as_str(), valid_from(s), until))
        })
        .collect();
    for (i, a) in intervals.iter().enumerate() {
        for b in &intervals[i + 1..] {
            if a.0 != b.0 && a.1 < b.2 && b.1 < a.2 {
                r.overlaps += 1;
                let length = dur(a.2.min(b.2) - a.1.max(b.1));
                r.max_overlap = r.max_overlap.max(length);
                r.overlap_lengths.push(length);
            }
        }
    }
}

/// The write log, re-checked: accepted writes in the order they were
/// applied; and the resource's final state must be what the log says.
fn write_log(r: &mut ScenarioResult, writes: &[Write], resource: &(i64, String)) {
    let mut max: Option<(i64, &str)> = None;
    for w in writes.iter().filter(|w| w.accepted) {
        if let Some((f, h)) = max
            && (w.fence < f || (w.fence == f && w.holder != h))
        {
            r.stale_accepted += 1;
        }
        if max.is_none_or(|(f, _)| w.fence >= f) {
            max = Some((w.fence, &w.holder));
        }
    }
    let expected = max.map_or((0, String::new()), |(f, h)| (f, h.to_owned()));
    if r.backend.fenced() && *resource != expected {
        r.failures.push(format!(
            "checker inconsistent: the resource holds {resource:?}, its write log says {expected:?}"
        ));
    }
}

/// Fences handed out: each acquisition's must exceed every earlier holder's.
fn fences(r: &mut ScenarioResult, sections: &[Section]) {
    if !r.backend.fenced() {
        return;
    }
    let mut max: Option<(i64, &str)> = None;
    for s in sections {
        let Some(f) = s.fence else { continue };
        if let Some((m, h)) = max
            && (f < m || (f == m && s.holder != h))
        {
            r.fence_reissues += 1;
        }
        if max.is_none_or(|(m, _)| f >= m) {
            max = Some((f, &s.holder));
        }
    }
}

/// Writes rejected although their holder's lease was valid from before
/// the write until after it returned, so while it was applied: another
/// holder had written with a newer fence while this one was valid.
/// Only a revocation can explain that, and only for its victim until it
/// learns of it (one renewal period). Also fails the fences handed out
/// again ([`fences`]), with the same exemption.
fn rejected_writes(config: &Config, r: &mut ScenarioResult, events: &[Event], writes: &[Write]) {
    let (backend, fault) = (r.backend, r.fault);
    let revoked = |w: &Write| {
        fault.revokes(backend)
            && events.iter().any(|e| {
                e.victim.as_deref() == Some(w.holder.as_str())
                    && e.t <= w.t_client
                    && w.t_client <= fault.revoked_from(e) + us(config.cancel_bound())
            })
    };
    let valid_rejected: Vec<&Write> = writes
        .iter()
        .filter(|w| !w.accepted && w.valid_after == Some(true))
        .collect();
    r.valid_rejected = valid_rejected.len();
    if backend.fenced() && !fault.reported_only() {
        let unexplained = valid_rejected.iter().filter(|w| !revoked(w)).count();
        if unexplained > 0 {
            r.failures.push(format!(
                "{unexplained} writes rejected while their holder's lease was valid"
            ));
        }
        if r.fence_reissues > 0 {
            r.failures.push(format!(
                "{} acquisitions got a fence not above an earlier holder's",
                r.fence_reissues
            ));
        }
    }
}

/// One injection that landed on its victim's section: what the checks of
/// its fault look at.
struct Landed<'a> {
    e: &'a Event,
    victim: &'a str,
    /// The victim's section at the fault.
    section: &'a Section,
    /// When the next injection came (what happens before it is this one's doing).
    next: i64,
    /// A pause longer than 2 ttl: the lease has surely been taken over.
    long_pause: bool,
    /// When the victim woke from a pause, if it did after this injection.
    woke: Option<i64>,
    /// From the fault to the first acquisition by another holder.
    takeover: Option<i64>,
    /// From the fault to the victim's token being cancelled.
    cancel: Option<Duration>,
}

impl Landed<'_> {
    /// Did `t` happen after this injection and before the next?
    fn ours(&self, t: i64) -> bool {
        self.e.t <= t && t < self.next
    }
}

/// The `i`-th injection: a miss (and why) or a hit, and the checks of its fault.
fn injection(
    config: &Config,
    r: &mut ScenarioResult,
    events: &[Event],
    i: usize,
    sections: &[Section],
) {
    let (ttl, fault) = (config.ttl, r.fault);
    let e = &events[i];
    let Some(victim) = e.victim.as_deref() else {
        return;
    };
    if let Some(reason) = &e.missed {
        r.misses += 1;
        r.miss_reasons.push(reason.clone());
        return;
    }
    if fault == Fault::LateRelease {
        late_release(config, r, e, victim, sections);
        return;
    }
    let Some(section) = section_at(sections, victim, e.t) else {
        // Every victim promised to hold (and said so) before the fault.
        r.misses += 1;
        r.miss_reasons
            .push("no section of the victim's in the log".to_owned());
        r.failures.push(format!(
            "the fault landed on {victim} while it held, but no section of its in the log covers it"
        ));
        return;
    };
    let mut landed = Landed {
        e,
        victim,
        section,
        next: events.get(i + 1).map_or(i64::MAX, |n| n.t),
        long_pause: e.t_lifted.is_some_and(|l| l - e.t > 2 * us(ttl)),
        woke: None,
        takeover: None,
        cancel: None,
    };
    landed.woke = section.wake_t.filter(|&t| landed.ours(t));
    let hit = match fault {
        Fault::Kill => section.t_end.is_none(),
        Fault::Stop if landed.long_pause => landed.woke.is_some(),
        _ => true,
    };
    if !hit {
        r.misses += 1;
        r.miss_reasons
            .push("the victim's section had ended".to_owned());
        return;
    }
    r.hits += 1;
    r.connections += e.count;
    r.replicated.extend(e.replicated);
    // A lock delay (`force-release`) ends with the name granted again to
    // whoever asks first: the evicted holder too. So does a lease lost to a
    // silent connection (`black-hole-conn`): the victim, on a new
    // connection, contends at the expiry with the others, and may win (CI
    // once saw the others' first section only after they were let go).
    let anyone = fault.spec().cancels_at_renewal || fault == Fault::BlackHoleConn;
    landed.takeover = sections
        .iter()
        .filter(|s| s.holder != victim || (anyone && !std::ptr::eq(*s, section)))
        .filter(|s| landed.ours(s.t_start))
        .map(|s| s.t_start - e.t)
        .min();
    landed.cancel = section
        .t_cancel
        .filter(|&c| landed.ours(c))
        .map(|c| dur(c - e.t));
    // A takeover is reported where the victim lost its lease to the
    // fault: killed, paused past its lease, or its token cancelled
    // (otherwise the next acquisition merely follows its release).
    let lost = match fault {
        Fault::Kill => true,
        Fault::Stop => landed.long_pause,
        _ => landed.cancel.is_some(),
    };
    if let Some(v) = r.variants.get_mut(e.variant) {
        v.0 += 1;
        v.1 += u32::from(lost);
    }
    if let Some(t) = landed.takeover.filter(|_| lost) {
        r.takeovers.push(dur(t));
    }
    match fault {
        Fault::Kill => after_kill(config, r, &landed),
        Fault::Stop => after_pause(config, r, &landed),
        _ => after_fault(config, r, &landed, sections),
    }
}

/// `kill`: another contender takes over within the takeover bound.
fn after_kill(config: &Config, r: &mut ScenarioResult, landed: &Landed<'_>) {
    let bound = config.takeover_bound(r.backend);
    match landed.takeover {
        Some(t) if dur(t) <= bound => {}
        Some(t) => r.failures.push(format!(
            "takeover {:?} after SIGKILL exceeds {bound:?}",
            dur(t)
        )),
        None => r.failures.push("nobody took over after SIGKILL".to_owned()),
    }
}

/// `stop`: what the woken holder saw, and (after a long pause) the takeover
/// during the pause.
fn after_pause(config: &Config, r: &mut ScenarioResult, landed: &Landed<'_>) {
    let (backend, section, e) = (r.backend, landed.section, landed.e);
    // Woken after a gap longer than the ttl (every long pause, and
    // the short ones that exceeded the ttl).
    if landed.woke.is_some() {
        let valid = section.wake_valid.unwrap_or(true);
        let cancel_after = section.wake_cancel_us.map(dur);
        r.wakes.push(Wake {
            long: landed.long_pause,
            valid,
            cancelled_at_once: section.wake_cancelled_now.unwrap_or(false),
            cancel_after,
            write_accepted: section.wake_write_accepted,
        });
        if valid {
            r.failures
                .push("the woken holder's is_valid() was true".to_owned());
        }
        if cancel_after.is_none_or(|c| c > config.slack) {
            r.failures.push(format!(
                "the woken holder's token was not cancelled within {:?} ({cancel_after:?})",
                config.slack
            ));
        }
    }
    if !landed.long_pause {
        r.short_pauses += 1;
        return;
    }
    // An advisory lock outlives the pause with its session: the
    // woken holder may still hold the lock, and its fence still
    // be the newest, so its write is rightly accepted. What must
    // hold there is that no write with a fence older than one
    // already written is accepted: the stale-fence count,
    // required of every fenced backend.
    if section.wake_write_accepted == Some(true) && !backend.advisory() {
        r.failures
            .push("the woken holder's write with its old fence was accepted".to_owned());
    }
    let lifted = e.t_lifted.unwrap_or(i64::MAX);
    if landed.takeover.is_some_and(|t| e.t + t < lifted) {
        r.taken_during_pause += 1;
    }
    if !backend.advisory() {
        let bound = config.takeover_bound(backend);
        match landed.takeover.filter(|&t| e.t + t < lifted) {
            Some(t) if dur(t) <= bound => {}
            Some(t) => r.failures.push(format!(
                "takeover {:?} during the pause exceeds {bound:?}",
                dur(t)
            )),
            None => r
                .failures
                .push("nobody took over during the pause".to_owned()),
        }
    }
}

/// Every other fault: when the victim's token was cancelled, against the
/// fault's bound ([`ByDeadline`], a revocation's renewal period); a lease
/// that must be kept; and the checks of `black-hole-conn` and
/// `black-hole-long`.
fn after_fault(config: &Config, r: &mut ScenarioResult, landed: &Landed<'_>, sections: &[Section]) {
    let (backend, fault, e, cancel) = (r.backend, r.fault, landed.e, landed.cancel);
    let spec = fault.spec();
    r.cancels.push(cancel);
    if cancel.is_some()
        && let Some(returned) = landed.section.t_end
        && let Some(grant) = sections
            .iter()
            .filter(|s| s.holder != landed.victim && landed.ours(s.t_start))
            .map(valid_from)
            .min()
            .filter(|&grant| grant >= returned)
    {
        let gap = dur(grant - returned);
        r.closest = Some(r.closest.map_or(gap, |c| c.min(gap)));
    }
    // etcd revokes after a leader's pause only sometimes (the
    // resumed leader must find the lease expired first): a
    // victim that kept its lease, with nobody else holding
    // before its section ended, had nothing to learn. Where
    // another holder did start first, the bound applies (and
    // the overlap and fence checks, always).
    let taken_from_victim = sections.iter().any(|s| {
        s.holder != landed.victim
            && landed.ours(s.t_start)
            && landed.section.t_end.is_none_or(|end| s.t_start < end)
    });
    let bound = if spec.cancels_at_once {
        Some(config.slack)
    } else if spec.by_deadline == ByDeadline::Always {
        Some(config.deadline_bound())
    } else if spec.cancels_at_renewal {
        Some(config.cancel_bound())
    } else if spec.revokes == Revokes::ResumedLeader && !taken_from_victim {
        None
    } else if fault.revokes(backend) && !fault.reported_only() {
        Some(dur(fault.revoked_from(e) - e.t) + config.cancel_bound())
    } else {
        None
    };
    if let Some(bound) = bound {
        match cancel {
            Some(c) if c <= bound => {}
            // The victim may have finished its section valid
            // before it could learn (only if it was not held).
            other => r.failures.push(format!(
                "{}: the victim's token was cancelled after {other:?}, bound {bound:?}",
                fault.as_str()
            )),
        }
    }
    // Documented as "lease kept": the renewal is retried on a
    // new connection long before the deadline.
    if spec.keeps_lease
        && !fault.revokes(backend)
        && let Some(c) = cancel
    {
        r.failures.push(format!(
            "{}: the lease was lost ({c:?} after the fault); it must be kept",
            fault.as_str()
        ));
    }
    if spec.hands_over {
        hand_over(config, r, landed, sections);
    }
    if let Some(clock) = e.clock {
        r.clocks.push((clock.rate, clock.error));
        if clock.error > DRIFT_MAP_ERROR {
            r.failures.push(format!(
                "drift: the drifting holder's times were off by {:?} (more than {DRIFT_MAP_ERROR:?})",
                clock.error
            ));
        }
    }
    if fault == Fault::BlackHoleConn {
        black_hole_conn(config, r, e, cancel, landed.takeover, backend);
    }
    if fault == Fault::BlackHoleLong {
        black_hole_long(config, r, e, landed.takeover, backend);
    }
    if spec.takeover_bound && spec.cancels_at_renewal {
        // `force-release`: the name is granted again at the lock delay's end.
        let bound = config.takeover_bound(backend);
        match landed.takeover {
            Some(t) if dur(t) <= bound => {}
            other => r.failures.push(format!(
                "{}: taken over {:?} after the fault, bound {bound:?}",
                fault.as_str(),
                other.map(dur)
            )),
        }
    }
    if fault == Fault::StopInTxn
        && landed
            .takeover
            .is_some_and(|t| e.t + t < e.t_lifted.unwrap_or(i64::MAX))
    {
        // Reported: the check-in's lock keeps the next grant waiting.
        r.taken_during_pause += 1;
    }
}

/// How far from the real time a drifting holder's recorded times may be
/// (its clock mapped back, [`super::nemesis::DriftClock::error`]): less
/// than the overlaps the suite looks for, more than a round trip between
/// the orchestrator and the worker on a busy machine.
const DRIFT_MAP_ERROR: Duration = Duration::from_millis(5);

/// `deploy`, `max-hold`: the victim's body returned, and the lease was
/// granted again (to another contender, or the victim) within
/// [`Config::handover_bound`]; `deploy`: the victim exited within
/// [`Config::exit_bound`].
fn hand_over(config: &Config, r: &mut ScenarioResult, landed: &Landed<'_>, sections: &[Section]) {
    let (e, fault) = (landed.e, r.fault.as_str());
    let returned = landed.section.t_end;
    // The next grant, to anyone: the victim may take the lease again.
    let next = sections
        .iter()
        .filter(|s| !std::ptr::eq(*s, landed.section) && landed.ours(s.t_start))
        .map(valid_from)
        .min();
    let handover = returned.zip(next).map(|(end, grant)| dur(grant - end));
    r.handovers.push(handover);
    match handover {
        Some(h) if h <= config.handover_bound() => {}
        other => r.failures.push(format!(
            "{fault}: the lease was handed over {other:?} after the body returned, bound {:?}",
            config.handover_bound()
        )),
    }
    if r.fault == Fault::Deploy {
        let exit = e.t_lifted.map(|t| dur(t - e.t));
        r.exits.push(exit);
        match exit {
            Some(x) if x <= config.exit_bound() => {}
            other => r.failures.push(format!(
                "deploy: the victim exited {other:?} after SIGTERM, bound {:?}",
                config.exit_bound()
            )),
        }
    }
}

/// The requirements of the whole scenario: every variant landed, the fault
/// happened, a section completed, no stale-fence write, no overlap between
/// bodies and none between valid holders (bounded, for a revocation).
fn requirements(config: &Config, r: &mut ScenarioResult) {
    let (backend, fault) = (r.backend, r.fault);
    // Every documented variant of the fault must have landed.
    for (name, (landed, _)) in fault.variants().iter().zip(&r.variants) {
        if *landed == 0 && r.hits > 0 && !name.is_empty() {
            r.failures
                .push(format!("the variant \"{name}\" never landed"));
        }
    }
    if r.hits == 0 {
        r.failures.push(format!(
            "the fault never happened ({})",
            if r.miss_reasons.is_empty() {
                "no injection".to_owned()
            } else {
                r.miss_reasons.join("; ")
            }
        ));
    }
    if r.completed == 0 {
        r.failures.push("no critical section completed".to_owned());
    }
    if backend.fenced() && r.stale_accepted > 0 {
        r.failures
            .push(format!("{} stale-fence writes accepted", r.stale_accepted));
    }
    if fault.reported_only() {
        // Reported, not required: see docs/RELIABILITY.md.
    } else if fault.revokes(backend) {
        let bound = config.overlap_bound(fault, backend);
        if r.max_overlap > bound {
            r.failures.push(format!(
                "overlap of {:?} exceeds {bound:?} ({})",
                r.max_overlap,
                if bound == config.cancel_bound() {
                    "one renewal period"
                } else {
                    "the revocation is watched"
                }
            ));
        }
    } else {
        if r.body_overlaps > 0 {
            r.failures.push(format!(
                "{} overlaps between bodies (longest {:?})",
                r.body_overlaps, r.max_body_overlap
            ));
        }
        if r.overlaps > 0 {
            r.failures.push(format!(
                "{} overlaps between valid holders (longest {:?})",
                r.overlaps, r.max_overlap
            ));
        }
    }
}

/// Election scenarios: after every landed injection, someone leads again
/// within [`Config::takeover_bound`] of the fault's end — a section other
/// than the victim's section at the fault is valid at some instant of that
/// window, or the victim's section is still valid at its end (the lease was
/// kept).
pub(super) fn leader_again(
    config: &Config,
    backend: BackendKind,
    killed: &HashMap<String, i64>,
    events: &[Event],
    sections: &[Section],
    r: &mut ScenarioResult,
) {
    let bound = config.takeover_bound(backend);
    for e in events.iter().filter(|e| e.missed.is_none()) {
        let Some(victim) = e.victim.as_deref() else {
            continue;
        };
        let at_fault = section_at(sections, victim, e.t);
        let lifted = e.t_lifted.unwrap_or(e.t);
        let until = lifted + us(bound);
        let is_at_fault = |s: &Section| at_fault.is_some_and(|a| std::ptr::eq(a, s));
        let led = sections.iter().any(|s| {
            let Some(end) = valid_until(s, killed, config.ttl) else {
                return false;
            };
            if is_at_fault(s) {
                end >= until
            } else {
                valid_from(s) <= until && end >= e.t
            }
        });
        if !led {
            r.failures.push(format!(
                "election: nobody led within {bound:?} after the fault ended (injection at {} µs)",
                e.t
            ));
        }
    }
}

/// Where section `s`'s valid interval ends: the last instant its holder
/// found it valid; for a section that never ended, the moment its process
/// was reaped after the kill (the latest it could have acted).
pub(super) fn valid_until(
    s: &Section,
    killed: &HashMap<String, i64>,
    ttl: Duration,
) -> Option<i64> {
    match s.t_end {
        Some(_) => s.t_last_valid,
        None => Some(
            killed
                .get(&s.holder)
                .copied()
                .unwrap_or(s.t_start + us(ttl)),
        ),
    }
}

/// Where section `s`'s body ends: when it returned; for a section that
/// never ended, as [`valid_until`] (the kill's reaping).
pub(super) fn body_until(s: &Section, killed: &HashMap<String, i64>, ttl: Duration) -> i64 {
    s.t_end.unwrap_or_else(|| {
        killed
            .get(&s.holder)
            .copied()
            .unwrap_or(s.t_start + us(ttl))
    })
}

/// Where section `s`'s valid interval starts: when the grant's answer left
/// the server, if the proxy saw it, else when the acquisition returned.
pub(super) fn valid_from(s: &Section) -> i64 {
    s.t_granted.unwrap_or(s.t_start)
}

/// The section of `victim` that was running at `t`.
pub(super) fn section_at<'s>(sections: &'s [Section], victim: &str, t: i64) -> Option<&'s Section> {
    sections
        .iter()
        .filter(|s| s.holder == victim && s.t_start <= t)
        .rfind(|s| s.t_end.is_none_or(|end| end >= t))
}

pub(super) fn dur(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// One `late-release` injection that happened: the victim's release was
/// stalled, it acquired the name again, then the release was delivered.
/// Its newer lease must be kept: the old release concerns another
/// acquisition.
fn late_release(
    config: &Config,
    r: &mut ScenarioResult,
    e: &Event,
    victim: &str,
    sections: &[Section],
) {
    r.hits += 1;
    r.connections += e.count;
    if let Some(v) = r.variants.get_mut(e.variant) {
        v.0 += 1;
    }
    let (old, new) = e.fences.unwrap_or_default();
    r.late_releases.0 += 1;
    if new <= old {
        r.failures.push(format!(
            "late-release: the holder's acquisition after its release got fence {new}, not above {old}"
        ));
    }
    let lifted = e.t_lifted.unwrap_or(e.t);
    // The newer section: acquired before the delivery, held across it.
    let Some(newer) = sections
        .iter()
        .rfind(|s| s.holder == victim && s.fence == Some(new) && s.t_start <= lifted)
    else {
        r.failures
            .push("late-release: the holder's newer section is not in the log".to_owned());
        return;
    };
    let kept = newer.t_cancel.is_none() && newer.valid_end != Some(false);
    r.cancels.push(newer.t_cancel.map(|c| dur(c - lifted)));
    if kept {
        r.late_releases.1 += 1;
    } else {
        r.failures.push(format!(
            "late-release: the newer lease was lost {:?} after the old release was delivered",
            newer.t_cancel.map(|c| dur(c - lifted))
        ));
    }
    // It was held (3 ttl) well past the delivery.
    if newer.t_end.is_some_and(|end| end < lifted + us(config.ttl)) {
        r.failures
            .push("late-release: the newer section ended within a ttl of the delivery".to_owned());
    }
}

/// One `black-hole-long` injection that happened: another contender must
/// acquire within the takeover bound of the heal (the victim acquires
/// nothing by then). A lock that went back into the victim's pool with its
/// connection stays held by an idle session there, and nobody acquires.
fn black_hole_long(
    config: &Config,
    r: &mut ScenarioResult,
    e: &Event,
    takeover: Option<i64>,
    backend: BackendKind,
) {
    let lifted = e.t_lifted.unwrap_or(e.t);
    let freed = takeover.map(|t| dur((e.t + t - lifted).max(0)));
    r.freed.push(freed);
    let bound = config.takeover_bound(backend);
    match freed {
        Some(f) if f <= bound => {}
        other => r.failures.push(format!(
            "black-hole-long: another contender acquired {other:?} after the heal, bound {bound:?}"
        )),
    }
}

/// One `black-hole-conn` injection that happened: the lease is kept, or
/// lost at its deadline and taken over within the takeover bound; either
/// way the holder acquires again within [`Config::reconnect_bound`].
fn black_hole_conn(
    config: &Config,
    r: &mut ScenarioResult,
    e: &Event,
    cancel: Option<Duration>,
    takeover: Option<i64>,
    backend: BackendKind,
) {
    if let Some(c) = cancel {
        if c > config.deadline_bound() {
            r.failures.push(format!(
                "black-hole-conn: the victim's token was cancelled after {c:?}, bound {:?}",
                config.deadline_bound()
            ));
        }
        match takeover {
            Some(t) if dur(t) <= config.takeover_bound(backend) => {}
            other => r.failures.push(format!(
                "black-hole-conn: the lost lease was taken over after {:?}, bound {:?}",
                other.map(dur),
                config.takeover_bound(backend)
            )),
        }
    }
    let again = e.reacquired_after.flatten();
    r.reacquires.push(again);
    match again {
        Some(t) if t <= config.reconnect_bound_of(backend) => {}
        other => r.failures.push(format!(
            "black-hole-conn: the holder acquired again after {other:?}, bound {:?}",
            config.reconnect_bound_of(backend)
        )),
    }
}
