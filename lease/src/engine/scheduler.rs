//! The renewal task of one engine ([`Scheduler`]).
//!
//! The scheduler runs while the engine holds at least one live lease, and
//! exits a while ([`IDLE_LINGER`]) after none is left (a new one starts it
//! again). Each turn it looks at every held lease ([`Scheduler::plan`]): it
//! cancels the tokens of leases past their deadline, hands leases whose
//! `min_hold` is over to the release path, sends the renewals that are due
//! ([`batches`], [`send`]), and sleeps until the next thing is due, a
//! renewal answers, or it is woken.
//!
//! A release does not wake it: it notices at its next planned wake-up, which
//! saves a cross-thread wake-up per release.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::{Instant, sleep_until, timeout};

use super::timing::{Stamp, renew_period, renew_timeout, renew_window, retry_delay};
use super::{Engine, Entry, LeaseState, Loss, MAX_BATCH, Names, Slot};
use crate::{Acquisition, Error};

/// How long the scheduler stays after its last lease has ended before it
/// exits, so that a job run in a loop does not start one per run.
pub(super) const IDLE_LINGER: Duration = Duration::from_secs(1);

/// What one turn of the scheduler decided ([`Scheduler::plan`]).
struct Plan {
    /// Nothing live, and lingered long enough: the scheduler exits.
    exit: bool,
    /// Some lease is live (renewed by the scheduler).
    live: bool,
    /// Leases to renew now.
    due: Vec<Arc<Entry>>,
    /// Leases whose `min_hold` is over (or that were lost while waiting it
    /// out): to release now.
    release: Vec<Arc<Entry>>,
    /// When to look again at the latest.
    wake_at: Instant,
}

/// A batch of renewals sent together, and its result.
struct Sent {
    entries: Vec<Arc<Entry>>,
    sent: Stamp,
    result: Result<Vec<bool>, Error>,
}

/// The renewal task of one engine; see the [module docs](self).
pub(super) struct Scheduler {
    engine: Arc<Engine>,
    /// Set when the loop ends normally; otherwise the task was dropped
    /// (runtime shutdown) and `Drop` must tell every live holder.
    finished: bool,
}

impl Scheduler {
    pub(super) fn new(engine: Arc<Engine>) -> Self {
        Self {
            engine,
            finished: false,
        }
    }

    pub(super) async fn run(mut self) {
        let engine = self.engine.clone();
        let mut in_flight = FuturesUnordered::new();
        // Since when no lease has been live.
        let mut idle_since: Option<Instant> = None;
        loop {
            let now = Stamp::now();
            let plan = self.plan(now, idle_since.unwrap_or(now.mono) + IDLE_LINGER);
            for entry in &plan.release {
                engine.release_in_background(entry);
            }
            if plan.exit {
                self.finished = true;
                return;
            }
            idle_since = if plan.live {
                None
            } else {
                idle_since.or(Some(now.mono))
            };
            for batch in batches(plan.due, now.mono) {
                in_flight.push(send(engine.clone(), batch, now));
            }
            tokio::select! {
                biased;
                Some(sent) = in_flight.next(), if !in_flight.is_empty() => self.apply(sent),
                () = sleep_until(plan.wake_at) => {}
                () = engine.wake.notified() => {}
            }
        }
    }

    /// One look at every held lease: see [`Plan`].
    /// When no lease is live and the linger is over, the scheduler flag is
    /// cleared (under the same lock) and the plan says exit.
    fn plan(&self, now: Stamp, linger_until: Instant) -> Plan {
        let mut plan = Plan {
            exit: false,
            live: false,
            due: Vec::new(),
            release: Vec::new(),
            wake_at: now.mono + Duration::from_secs(3600),
        };
        // After a shutdown, the scheduler does not linger.
        let linger_until = if self.engine.is_closed() {
            now.mono
        } else {
            linger_until
        };
        let mut names = self.engine.names();
        let live = self.sort_leases(&names, now, &mut plan);
        if live.is_empty() {
            linger_or_exit(&mut names, now.mono, linger_until, &mut plan);
            return plan;
        }
        plan.live = true;
        pick_due(live, now.mono, &mut plan);
        // Still under the lock: a lease held from now on sees this.
        names.planned = Some(plan.wake_at);
        plan
    }

    /// Cancel the tokens of leases past their deadline, put the leases whose
    /// `min_hold` is over in `plan.release`, and return the live ones.
    fn sort_leases(&self, names: &Names, now: Stamp, plan: &mut Plan) -> Vec<Arc<Entry>> {
        let mut live = Vec::new();
        for slot in names.slots.values() {
            let Slot::Held(entry) = slot else { continue };
            let mut t = entry.timing();
            let holder = &*self.engine.holder;
            if t.state == LeaseState::Live
                && t.wind_down_until.is_none()
                && let Some(at) = entry.max_hold_until.filter(|at| now.mono >= *at)
            {
                if t.release_at.is_some() {
                    // Its body is done already (kept for `min_hold`).
                    entry.lose(
                        &mut t,
                        holder,
                        Loss::MaxHold,
                        "its max_hold ran out; releasing it",
                    );
                    plan.release.push(entry.clone());
                    continue;
                }
                // §6.1: as a shutdown for this lease — the body is told, and
                // the lease kept for it up to its grace; the guard releases.
                crate::metrics::lost(&entry.name, Loss::MaxHold.label());
                tracing::warn!(
                    lease.name = %entry.name,
                    holder,
                    fencing_token = entry.fencing_token,
                    reason = Loss::MaxHold.label(),
                    grace = ?entry.grace,
                    "its max_hold ran out: its token is cancelled; the lease is kept until its body ends, for at most its grace"
                );
                entry.wind_down(&mut t, at + entry.grace);
            }
            if t.wind_down_until.is_some_and(|at| now.mono >= at) {
                entry.abandon(
                    &mut t,
                    holder,
                    "its body is still running at the end of its grace",
                );
                continue;
            }
            if t.state == LeaseState::Live && t.deadline.passed(now) {
                entry.lose(
                    &mut t,
                    &self.engine.holder,
                    Loss::Deadline,
                    "its deadline passed without a successful renewal",
                );
            }
            match (t.state, t.release_at) {
                // Handed to the scheduler for a delayed release (`min_hold`):
                // release when due, or at once once lost.
                (LeaseState::Lost, Some(_)) => plan.release.push(entry.clone()),
                (LeaseState::Live, Some(at)) if at <= now.mono => plan.release.push(entry.clone()),
                (LeaseState::Live, _) => live.push(entry.clone()),
                _ => {}
            }
        }
        live
    }

    /// Record the outcome of a batch of renewals.
    fn apply(&self, mut sent: Sent) {
        let now = Stamp::now();
        let holder = &*self.engine.holder;
        if let Ok(v) = &sent.result
            && v.len() != sent.entries.len()
        {
            let msg = format!(
                "renew_many answered {} results for {} leases",
                v.len(),
                sent.entries.len()
            );
            sent.result = Err(Error::Protocol(msg));
        }
        for (i, entry) in sent.entries.iter().enumerate() {
            let mut t = entry.timing();
            t.in_flight = false;
            let recheck = std::mem::take(&mut t.recheck);
            if t.state != LeaseState::Live {
                continue;
            }
            if t.deadline.passed(now) {
                entry.lose(
                    &mut t,
                    holder,
                    Loss::Deadline,
                    "its deadline passed before a renewal succeeded",
                );
                continue;
            }
            let outcome = sent.result.as_ref().map(|v| v[i]);
            crate::metrics::renewed(match outcome {
                Ok(true) => "renewed",
                Ok(false) => "lost",
                Err(_) => "error",
            });
            match outcome {
                Ok(true) => {
                    t.deadline.extend(sent.sent, entry.ttl, entry.grace);
                    // A hint of loss came while it was in flight: once more.
                    t.next_renew = if recheck {
                        now.mono
                    } else {
                        sent.sent.mono + renew_period(entry.ttl)
                    };
                    t.failures = 0;
                    tracing::trace!(lease.name = %entry.name, holder, "lease renewed");
                }
                Ok(false) => entry.lose(
                    &mut t,
                    holder,
                    Loss::Taken,
                    "the backend says it is no longer ours (expired, released or taken over)",
                ),
                Err(e) => {
                    t.failures += 1;
                    let delay = retry_delay(entry.ttl, t.failures);
                    t.next_renew = now.mono + delay;
                    tracing::warn!(
                        lease.name = %entry.name,
                        holder,
                        fencing_token = entry.fencing_token,
                        error = %e.chain(),
                        failures = t.failures,
                        retry_in = ?delay,
                        "lease renewal failed; retrying until the deadline"
                    );
                }
            }
        }
    }
}

/// No lease is live: linger until `linger_until` ([`IDLE_LINGER`]), then
/// exit.
fn linger_or_exit(names: &mut Names, now: Instant, linger_until: Instant, plan: &mut Plan) {
    if linger_until > now {
        plan.wake_at = linger_until;
        names.planned = Some(plan.wake_at);
    } else {
        names.scheduler = false;
        names.planned = None;
        plan.exit = true;
    }
}

/// Put the live leases due for renewal in `plan.due` (marked in flight) and
/// bring `plan.wake_at` forward to the next deadline, renewal or release.
///
/// Coalescing: when some lease is due anyway, every healthy lease that has
/// run half of its renewal period goes with it. Renewing early never
/// shortens a lease.
fn pick_due(live: Vec<Arc<Entry>>, now: Instant, plan: &mut Plan) {
    let any_due = live.iter().any(|e| {
        let t = e.timing();
        !t.in_flight && t.next_renew <= now
    });
    for entry in live {
        let mut t = entry.timing();
        let max_hold_until = entry.max_hold_until.filter(|_| t.wind_down_until.is_none());
        for at in [t.release_at, max_hold_until, t.wind_down_until]
            .into_iter()
            .flatten()
        {
            plan.wake_at = plan.wake_at.min(at);
        }
        plan.wake_at = plan.wake_at.min(t.deadline.mono);
        if t.in_flight {
            continue;
        }
        let early = renew_period(entry.ttl) / 2;
        if t.next_renew <= now || (any_due && t.failures == 0 && t.next_renew <= now + early) {
            t.in_flight = true;
            drop(t);
            plan.due.push(entry);
        } else {
            plan.wake_at = plan.wake_at.min(t.next_renew);
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // The task was dropped (its runtime is shutting down): nothing will
        // renew these leases any more, so their holders must stop now.
        let mut names = self.engine.names();
        names.scheduler = false;
        names.planned = None;
        names.slots.retain(|_, slot| {
            let Slot::Held(entry) = slot else { return true };
            let mut t = entry.timing();
            entry.lose(
                &mut t,
                &self.engine.holder,
                Loss::Deadline,
                "the runtime running its renewals shut down",
            );
            // A lease waiting out its `min_hold` has no guard left to release
            // it, and no runtime to release it on: stop it and free the name
            // (the lease ends at its ttl).
            if t.release_at.is_some() {
                t.state = LeaseState::Stopped;
                return false;
            }
            true
        });
    }
}

/// Split the leases due for renewal into calls of at most [`MAX_BATCH`],
/// sent together.
///
/// A call gets the time limit of its tightest lease, so a healthy lease
/// must never share a call with one about to be lost. A failing lease goes
/// alone; the others are grouped with leases whose [`renew_window`] is
/// within a factor of two of theirs.
fn batches(due: Vec<Arc<Entry>>, now: Instant) -> Vec<Vec<Arc<Entry>>> {
    let mut groups: HashMap<u32, Vec<Arc<Entry>>> = HashMap::new();
    let mut calls = Vec::new();
    for entry in due {
        let window = renew_window(entry.ttl, entry.grace);
        // A healthy lease has its whole window left when it is due (a grace
        // of ttl/3 leaves exactly that), so "less than the window" is not
        // what tells a failing lease: its failed renewals are, or a deadline
        // less than half a window away (a scheduler woken late).
        let t = entry.timing();
        let failing = t.failures > 0 || t.deadline.mono.saturating_duration_since(now) < window / 2;
        drop(t);
        if failing {
            calls.push(vec![entry]);
        } else {
            // The renewal window's power of two, in milliseconds.
            let ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
            groups.entry(ms.max(1).ilog2()).or_default().push(entry);
        }
    }
    for (_, mut group) in groups {
        while !group.is_empty() {
            let rest = group.split_off(group.len().min(MAX_BATCH));
            calls.push(group);
            group = rest;
        }
    }
    calls
}

/// Send one batch of renewals, within the time limit of its tightest lease
/// ([`renew_timeout`]).
async fn send(engine: Arc<Engine>, entries: Vec<Arc<Entry>>, sent: Stamp) -> Sent {
    let limit = entries
        .iter()
        .map(|e| renew_timeout(e.ttl, e.timing().deadline.mono, sent.mono))
        .min()
        .unwrap_or_default();
    let holder = &*engine.holder;
    let call = async {
        if let [entry] = entries.as_slice() {
            engine
                .backend
                .renew(entry.acquisition(holder), entry.ttl)
                .await
                .map(|ok| vec![ok])
        } else {
            let leases: Vec<(Acquisition<'_>, Duration)> = entries
                .iter()
                .map(|e| (e.acquisition(holder), e.ttl))
                .collect();
            engine.backend.renew_many(&leases).await
        }
    };
    let started = std::time::Instant::now();
    let result = match timeout(limit, call).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout {
            operation: "renew",
            after: limit,
        }),
    };
    crate::metrics::backend_seconds("renew", started.elapsed());
    Sent {
        entries,
        sent,
        result,
    }
}
