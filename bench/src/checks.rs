//! The required numbers: every check that a run makes, met or not.
//!
//! A check compares one measured number with its requirement. A counter
//! that counted nothing gives 0, which meets no requirement on a count (each
//! is `= n` or `≥ n` with n ≥ 1): a server that does not count is a failure,
//! never a skip.

use std::fmt;
use std::time::Duration;

use crate::check_in::CheckInCost;
use crate::handover::Handover;
use crate::measure::{Contention, Overhead, RoundTrips, Scale};

/// `with_lease` / floor, medians of 3,000 cycles each (full run).
pub const OVERHEAD_TARGET: f64 = 1.15;

/// `with_lease` / floor on `Redis` (full run), whose floor is the same two
/// scripts on one multiplexed connection: what issue 31.6 asks for.
pub const REDIS_OVERHEAD_TARGET: f64 = 1.05;

/// `with_lease` / floor in the quick run (medians of 300 cycles each, on a
/// machine that may be busy with other work): loose enough for the noise
/// of a loaded machine, tight enough for a real regression such as one more
/// round trip per call (a ratio of about 2; see `docs/PERFORMANCE.md`).
pub const QUICK_OVERHEAD_BOUND: f64 = 1.5;

/// Hand-over with the server's push, p50, in round trips of the same
/// backend (`PgTable`, `PgAdvisory`, `Redis`), full run: the notification
/// reaches the waiter about when the release's answer reaches the holder,
/// and the waiter's acquire takes one round trip.
pub const HANDOVER_RTT_TARGET: f64 = 2.0;

/// The same in the quick run (15 samples, in the smoke test a debug build,
/// on a machine that may be busy): on loopback a round trip is 50 to 400 µs,
/// about the cost of the task wake-ups between the notification and the
/// waiter's acquire on a loaded machine (see `docs/PERFORMANCE.md`; a debug
/// run measured 3.75 on `PgAdvisory`). A push that does not work costs a
/// poll, hundreds of round trips; one more round trip per hand-over shows
/// in the full run only.
pub const QUICK_HANDOVER_RTT_BOUND: f64 = 6.0;

/// A crashed holder's lease taken over, p50, after its expiry, full run:
/// the waiter sleeps until the expiry the server reported and tries with a
/// jitter of at most 5 ms (`Lease::acquire`); one attempt is one round
/// trip, and one more may be needed when the waiter's clock runs a little
/// ahead of the server's. Against this, a poll later costs ttl/10 (100 ms
/// at the bench's ttl of 1 s).
pub(crate) const CRASH_SLACK: Duration = Duration::from_millis(5);

/// The same slack in the quick run (a debug build on a machine that may be
/// busy): still well under the 100 ms of a poll.
pub(crate) const QUICK_CRASH_SLACK: Duration = Duration::from_millis(25);

/// How much later than its expiry etcd deletes an expired lease's key: its
/// leader checks for expired leases every 500 ms (a fixed interval of its
/// lessor, not configurable), then revokes them through raft. A waiter
/// cannot take the key before, and may not revoke the holder's etcd lease
/// itself: etcd reports a lease's remaining time in whole seconds only, so
/// a waiter cannot tell an expired lease from one renewed a moment ago.
pub(crate) const ETCD_EXPIRY_SWEEP: Duration = Duration::from_millis(500);

/// Server-counted requests of one `Etcd` renewal: a `LeaseKeepAlive`
/// message (on a stream of its own) and a linearizable `Range`, sent
/// together: one round trip of latency.
pub(crate) const ETCD_RENEW_REQUESTS: f64 = 2.0;

/// Server-counted requests of one `Etcd` acquisition: a `LeaseGrant`, then
/// a `Txn` (two round trips of latency).
pub(crate) const ETCD_ACQUIRE_REQUESTS: f64 = 2.0;

/// Server-counted requests of one `Etcd` release: a `Txn` and a
/// `LeaseRevoke`.
pub(crate) const ETCD_RELEASE_REQUESTS: f64 = 2.0;

/// A requirement on one number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Required {
    /// Exactly this.
    Exactly(f64),
    /// This or less.
    AtMost(f64),
    /// This or more.
    AtLeast(f64),
}

impl Required {
    /// Whether `x` meets the requirement (never for NaN).
    pub fn met_by(self, x: f64) -> bool {
        match self {
            Required::Exactly(v) => (x - v).abs() < 1e-9,
            Required::AtMost(v) => x <= v,
            Required::AtLeast(v) => x >= v,
        }
    }
}

impl fmt::Display for Required {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Required::Exactly(v) => write!(f, "= {}", number(*v)),
            Required::AtMost(v) => write!(f, "≤ {}", number(*v)),
            Required::AtLeast(v) => write!(f, "≥ {}", number(*v)),
        }
    }
}

/// One required property of a run, checked against the numbers.
#[derive(Debug, Clone)]
pub struct Check {
    /// The backend, as labelled in the tables.
    pub backend: &'static str,
    /// The section of the report: `rt`, `overhead`, `contention`, `scale`,
    /// `handover` or `check_in`.
    pub section: &'static str,
    /// What is checked.
    pub what: String,
    /// The requirement.
    pub required: Required,
    /// The measured number.
    pub measured: f64,
}

impl Check {
    /// Whether the measured number meets the requirement.
    pub fn met(&self) -> bool {
        self.required.met_by(self.measured)
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} is {} (required {})",
            self.backend,
            self.what,
            number(self.measured),
            self.required
        )
    }
}

fn number(x: f64) -> String {
    if (x - x.round()).abs() < 0.005 {
        format!("{}", x.round())
    } else {
        format!("{x:.2}")
    }
}

/// What was measured for one backend, as far as the checks need it.
pub(crate) struct Measured<'a> {
    pub(crate) label: &'static str,
    pub(crate) round_trips: Option<&'a RoundTrips>,
    pub(crate) overhead: Option<&'a Overhead>,
    pub(crate) contention: &'a [Contention],
    pub(crate) scale: &'a [Scale],
    pub(crate) handover: Option<&'a Handover>,
    pub(crate) check_in: Option<&'a CheckInCost>,
}

/// Every check of one backend's numbers.
pub(crate) fn checks(m: &Measured<'_>, quick: bool) -> Vec<Check> {
    use Required::{AtLeast, AtMost, Exactly};
    let mut out = Vec::new();
    let mut check = |section: &'static str, what: String, required: Required, measured: f64| {
        out.push(Check {
            backend: m.label,
            section,
            what,
            required,
            measured,
        });
    };
    let advisory = m.label == "PgAdvisory";
    // A watched `PgAdvisory` connection goes back to the pool after an
    // `UNLISTEN *` that sqlx's listener sends (`PgAdvisory::with_watch`):
    // one request more per acquire and release, not waited for.
    let watched = m.label.starts_with("PgAdvisory") && m.label != "PgAdvisory (unwatched)";
    let unlisten = if watched { 1.0 } else { 0.0 };
    let etcd = m.label == "Etcd";
    // An `Etcd` renewal: a keep-alive and a linearizable read of the key.
    let renew = if etcd { ETCD_RENEW_REQUESTS } else { 1.0 };
    // A `PgTable` batch of two or more is an unnamed statement, parsed for
    // the batch (its plan made for the table as it is): two requests.
    let batch = if m.label == "PgTable" { 2.0 } else { 1.0 };
    if let Some(rt) = m.round_trips
        && rt.counted
    {
        let rt_check = |what: &str| format!("server requests per {what}");
        check(
            "rt",
            rt_check("floor cycle (the backend's acquire and release statements, sent directly)"),
            Exactly(if etcd { 4.0 } else { 2.0 }),
            rt.floor,
        );
        if rt.acquire_with_release {
            check(
                "rt",
                rt_check(if watched {
                    "acquire + release (and the watched connection's UNLISTEN *)"
                } else {
                    "acquire + release"
                }),
                Exactly(2.0 + unlisten),
                rt.acquire,
            );
            check(
                "rt",
                rt_check("renew (a heartbeat)"),
                Exactly(1.0),
                rt.renew,
            );
            check(
                "rt",
                format!(
                    "server requests per renew_many of {} leases (one heartbeat per lock: not batched, by design)",
                    rt.batch
                ),
                Exactly(rt.batch as f64),
                rt.renew_many,
            );
        } else {
            // etcd: a grant and a transaction to acquire; a transaction and
            // a revoke to release.
            let (acquire, release) = if etcd {
                (ETCD_ACQUIRE_REQUESTS, ETCD_RELEASE_REQUESTS)
            } else {
                (1.0, 1.0)
            };
            check("rt", rt_check("acquire"), Exactly(acquire), rt.acquire);
            check(
                "rt",
                rt_check("acquire of a new name"),
                Exactly(acquire),
                rt.acquire_new,
            );
            check("rt", rt_check("renew"), Exactly(renew), rt.renew);
            check("rt", rt_check("release"), Exactly(release), rt.release);
            let (many, why) = match rt.slots {
                _ if etcd => (
                    renew * rt.batch as f64,
                    " (one renewal each: not batched)".to_owned(),
                ),
                Some(slots) => (slots as f64, format!(" (one per hash slot: {slots})")),
                None if batch > 1.0 => (batch, " (a parse, then the batch)".to_owned()),
                None => (1.0, String::new()),
            };
            check(
                "rt",
                format!("server requests per renew_many of {} leases{why}", rt.batch),
                Exactly(many),
                rt.renew_many,
            );
        }
        check(
            "rt",
            rt_check("with_lease cycle, empty job (acquire + release)"),
            Exactly(if etcd {
                ETCD_ACQUIRE_REQUESTS + ETCD_RELEASE_REQUESTS
            } else {
                2.0 + unlisten
            }),
            rt.with_lease,
        );
    }
    // A watched `PgAdvisory` cycle also sets up sqlx's listener and sends
    // its `UNLISTEN *`, which the floor does not: about 1.2 in a full run
    // (1.19 before the spare connections, which alone met the target and
    // are gone, issue 30). It keeps the quick run's bound.
    if let Some(o) = m.overhead
        && (quick || !watched)
    {
        let ratio = o.with_lease.median.as_secs_f64() / o.floor.median.as_secs_f64();
        check(
            "overhead",
            "with_lease / floor, medians".to_owned(),
            AtMost(if quick {
                QUICK_OVERHEAD_BOUND
            } else if m.label == "Redis" {
                REDIS_OVERHEAD_TARGET
            } else {
                OVERHEAD_TARGET
            }),
            ratio,
        );
    }
    for c in m.contention {
        let on = format!("64 contenders on {} name(s)", c.names);
        check(
            "contention",
            format!("{on}: acquisitions"),
            AtLeast(1.0),
            c.acquisitions as f64,
        );
        check(
            "contention",
            format!("{on}: errors"),
            Exactly(0.0),
            c.errors as f64,
        );
        if let Some(x) = c.requests_per_acquisition {
            // At least the acquisition and its release.
            check(
                "contention",
                format!("{on}: server requests per acquisition"),
                AtLeast(2.0),
                x,
            );
        }
    }
    for c in m.scale {
        let of = format!(
            "{} leases, {}",
            c.leases,
            if c.batched { "batched" } else { "unbatched" }
        );
        check(
            "scale",
            format!("{of}: leases renewed in the window (each once)"),
            Exactly(c.leases as f64),
            c.renewed as f64,
        );
        // Up to two rounds of batches when the acquisitions spread over more
        // than half a renewal period.
        let most = 2.0 * c.leases.div_ceil(1000) as f64;
        if c.batched && !advisory {
            check(
                "scale",
                format!("{of}: renewal calls in the window"),
                AtMost(most),
                c.calls as f64,
            );
        }
        if let Some(n) = c.server_requests {
            if c.batched && !advisory {
                // On a Redis Cluster, one script per hash slot per round.
                let (most, per) = match c.slots {
                    Some(slots) => (2.0 * slots as f64, format!(" ({slots} hash slots)")),
                    None => (batch * most, String::new()),
                };
                check(
                    "scale",
                    format!("{of}: server requests in the window{per}"),
                    AtMost(most),
                    n as f64,
                );
            }
            if etcd {
                // One renewal's requests per renewal call, nothing more (the
                // window holds each acquisition's first renewal: its stream
                // was opened by the acquisition).
                check(
                    "scale",
                    format!(
                        "{of}: server requests in the window, at most {renew} per renewal call"
                    ),
                    AtMost(renew * c.counted_calls as f64),
                    n as f64,
                );
            }
            // Each renewal call is at least one request.
            check(
                "scale",
                format!("{of}: server requests in the window, against the renewal calls"),
                AtLeast(c.counted_calls as f64),
                n as f64,
            );
        }
    }
    if let Some(h) = m.handover {
        check(
            "handover",
            "hand-over samples (push and polling)".to_owned(),
            AtLeast(1.0),
            h.push.n.min(h.poll.n) as f64,
        );
        if h.pushes {
            check(
                "handover",
                "hand-over p50 with push, in round trips (release returned → waiter's acquire returned)"
                    .to_owned(),
                AtMost(if quick {
                    QUICK_HANDOVER_RTT_BOUND
                } else {
                    HANDOVER_RTT_TARGET
                }),
                h.push.median.as_secs_f64() / h.rtt.as_secs_f64(),
            );
        }
        // `PgAdvisory` has no expiry: its crashed holder's lock is free
        // when the session ends, and a waiter polls for it.
        if !m.label.starts_with("PgAdvisory") {
            check(
                "handover",
                "crash take-over samples".to_owned(),
                AtLeast(1.0),
                h.crash.n as f64,
            );
            let slack = if quick {
                QUICK_CRASH_SLACK
            } else {
                CRASH_SLACK
            };
            let sweep = if etcd {
                ETCD_EXPIRY_SWEEP
            } else {
                Duration::ZERO
            };
            check(
                "handover",
                format!(
                    "crash take-over p50 after the expiry, in ms (at most 2 round trips + {} ms{})",
                    slack.as_millis(),
                    if etcd {
                        " + etcd's 500 ms expiry sweep"
                    } else {
                        ""
                    }
                ),
                AtMost((h.rtt * 2 + slack + sweep).as_secs_f64() * 1e3),
                h.crash.median.as_secs_f64() * 1e3,
            );
        }
    }
    if let Some(c) = m.check_in {
        check(
            "check_in",
            "check_in samples (plain and checked transactions)".to_owned(),
            AtLeast(1.0),
            c.plain.n.min(c.checked.n) as f64,
        );
        // One statement per check, on the lease row: a second
        // statement, or none (a check that does not reach the server),
        // fails.
        if let Some(x) = c.statements {
            check(
                "check_in",
                "server statements per check_in".to_owned(),
                Exactly(1.0),
                x,
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::measure::Stats;

    fn exact_round_trips() -> RoundTrips {
        RoundTrips {
            floor: 2.0,
            acquire: 1.0,
            acquire_new: 1.0,
            renew: 1.0,
            renew_many: 1.0,
            batch: 3,
            release: 1.0,
            with_lease: 2.0,
            counted: true,
            ..RoundTrips::default()
        }
    }

    fn overhead(ratio: f64) -> Overhead {
        let stats = |us: f64| Stats {
            median: Duration::from_secs_f64(us / 1e6),
            ..Stats::default()
        };
        Overhead {
            floor: stats(100.0),
            with_lease: stats(100.0 * ratio),
            ..Overhead::default()
        }
    }

    fn scale(leases: usize, calls: u64, server_requests: Option<u64>) -> Scale {
        Scale {
            leases,
            batched: true,
            calls,
            counted_calls: calls,
            renewed: leases as u64,
            server_requests,
            ..Scale::default()
        }
    }

    fn unmet(label: &'static str, m: Measured<'_>, quick: bool) -> Vec<String> {
        let m = Measured { label, ..m };
        checks(&m, quick)
            .into_iter()
            .filter(|c| !c.met())
            .map(|c| c.to_string())
            .collect()
    }

    fn measured<'a>(rt: Option<&'a RoundTrips>, scale: &'a [Scale]) -> Measured<'a> {
        Measured {
            label: "PgTable",
            round_trips: rt,
            overhead: None,
            contention: &[],
            scale,
            handover: None,
            check_in: None,
        }
    }

    #[test]
    fn the_expected_numbers_meet_every_check() {
        let rt = exact_round_trips();
        let s = [scale(50, 1, Some(2))];
        assert_eq!(
            unmet("MySqlTable", measured(Some(&rt), &s), true),
            Vec::<String>::new()
        );
        assert!(!checks(&measured(Some(&rt), &s), true).is_empty());
    }

    #[test]
    fn a_counter_that_counts_nothing_fails_every_count() {
        let zero = RoundTrips {
            batch: 3,
            counted: true,
            ..RoundTrips::default()
        };
        let s = [scale(50, 1, Some(0))];
        let unmet = unmet("MySqlTable", measured(Some(&zero), &s), true);
        // floor, acquire, acquire of a new name, renew, release, renew_many,
        // with_lease, and the scale window's requests against its calls.
        assert_eq!(unmet.len(), 8, "{unmet:#?}");
        assert!(unmet[0].contains("floor cycle"), "{unmet:#?}");
    }

    #[test]
    fn a_backend_without_a_server_has_no_round_trip_checks() {
        let rt = RoundTrips {
            counted: false,
            ..RoundTrips::default()
        };
        let all = checks(&measured(Some(&rt), &[]), true);
        assert!(all.is_empty(), "{all:#?}");
    }

    #[test]
    fn a_new_name_costs_exactly_one_request_on_every_table() {
        for label in ["PgTable", "MySqlTable", "Redis"] {
            let rt = RoundTrips {
                acquire_new: 2.0,
                // A `PgTable` batch is parsed for itself: two requests.
                renew_many: if label == "PgTable" { 2.0 } else { 1.0 },
                ..exact_round_trips()
            };
            let unmet = unmet(label, measured(Some(&rt), &[]), false);
            assert_eq!(unmet.len(), 1, "{label}: {unmet:#?}");
            assert!(unmet[0].contains("new name"), "{unmet:#?}");
        }
    }

    #[test]
    fn etcd_and_redis_cluster_are_held_to_their_own_counts() {
        let none = Vec::<String>::new();
        // Etcd: 2 requests to acquire (grant, txn), 2 to release (txn,
        // revoke), 2 to renew (a keep-alive, a read), per lease in
        // renew_many.
        let etcd = RoundTrips {
            floor: 4.0,
            acquire: 2.0,
            acquire_new: 2.0,
            release: 2.0,
            renew: 2.0,
            renew_many: 6.0,
            with_lease: 4.0,
            ..exact_round_trips()
        };
        assert_eq!(unmet("Etcd", measured(Some(&etcd), &[]), false), none);
        // A renewal that sends a second keep-alive (3 requests) fails renew
        // and renew_many.
        let reopened = RoundTrips {
            renew: 3.0,
            renew_many: 9.0,
            ..etcd
        };
        assert_eq!(
            unmet("Etcd", measured(Some(&reopened), &[]), false).len(),
            2
        );
        // The single-server counts are not etcd's: floor, acquire, acquire
        // of a new name, renew, release, renew_many and with_lease fail.
        let unmet_etcd = unmet("Etcd", measured(Some(&exact_round_trips()), &[]), false);
        assert_eq!(unmet_etcd.len(), 7, "{unmet_etcd:#?}");
        // Redis Cluster: renew_many is one script per hash slot.
        let cluster = RoundTrips {
            renew_many: 3.0,
            slots: Some(3),
            ..exact_round_trips()
        };
        assert_eq!(
            unmet("RedisCluster", measured(Some(&cluster), &[]), false),
            none
        );
        let once = RoundTrips {
            slots: Some(3),
            ..exact_round_trips()
        };
        assert_eq!(
            unmet("RedisCluster", measured(Some(&once), &[]), false).len(),
            1
        );
        // Its scale window: up to two rounds of one script per slot.
        let ok = [Scale {
            slots: Some(40),
            ..scale(50, 1, Some(80))
        }];
        assert_eq!(unmet("RedisCluster", measured(None, &ok), false), none);
        let over = [Scale {
            slots: Some(40),
            ..scale(50, 1, Some(81))
        }];
        assert_eq!(unmet("RedisCluster", measured(None, &over), false).len(), 1);
        // Etcd's unbatched window: one renewal's requests per renewal call.
        let window = |requests| {
            [Scale {
                batched: false,
                ..scale(50, 50, Some(requests))
            }]
        };
        assert_eq!(unmet("Etcd", measured(None, &window(100)), false), none);
        assert_eq!(unmet("Etcd", measured(None, &window(101)), false).len(), 1);
        assert_eq!(unmet("Etcd", measured(None, &window(49)), false).len(), 1);
    }

    #[test]
    fn the_overhead_is_checked_in_both_modes() {
        let o = overhead(1.3);
        let m = Measured {
            overhead: Some(&o),
            ..measured(None, &[])
        };
        assert_eq!(unmet("Redis", m, true), Vec::<String>::new());
        let m = Measured {
            overhead: Some(&o),
            ..measured(None, &[])
        };
        assert_eq!(unmet("Redis", m, false).len(), 1);
        let o = overhead(QUICK_OVERHEAD_BOUND + 0.01);
        let m = Measured {
            overhead: Some(&o),
            ..measured(None, &[])
        };
        assert_eq!(unmet("Redis", m, true).len(), 1);
        // A watched `PgAdvisory` is held to the quick bound only.
        let o = overhead(1.3);
        let m = |o| Measured {
            overhead: Some(o),
            ..measured(None, &[])
        };
        assert_eq!(
            unmet("PgAdvisory (fenced)", m(&o), false),
            Vec::<String>::new()
        );
        assert_eq!(unmet("PgAdvisory (unwatched)", m(&o), false).len(), 1);
        let o = overhead(QUICK_OVERHEAD_BOUND + 0.01);
        assert_eq!(unmet("PgAdvisory", m(&o), true).len(), 1);
    }

    #[test]
    fn a_batch_sent_twice_or_not_counted_fails() {
        // Up to two rounds of one batch, two requests each on `PgTable`.
        let too_many = [scale(50, 1, Some(5))];
        assert_eq!(unmet("PgTable", measured(None, &too_many), true).len(), 1);
        let too_many = [scale(50, 1, Some(3))];
        assert_eq!(
            unmet("MySqlTable", measured(None, &too_many), true).len(),
            1
        );
        let uncounted = [scale(50, 1, Some(0))];
        assert_eq!(unmet("PgTable", measured(None, &uncounted), true).len(), 1);
        let lost = [Scale {
            renewed: 49,
            ..scale(50, 1, Some(1))
        }];
        assert_eq!(unmet("PgTable", measured(None, &lost), true).len(), 1);
    }

    #[test]
    fn contention_needs_acquisitions_no_errors_and_two_requests_each() {
        let ok = Contention {
            names: 64,
            acquisitions: 100,
            requests_per_acquisition: Some(2.0),
            ..Contention::default()
        };
        let bad = [
            Contention {
                acquisitions: 0,
                requests_per_acquisition: None,
                ..ok
            },
            Contention { errors: 1, ..ok },
            Contention {
                requests_per_acquisition: Some(0.0),
                ..ok
            },
        ];
        for c in bad {
            let list = [c];
            let m = Measured {
                contention: &list,
                ..measured(None, &[])
            };
            assert_eq!(unmet("Redis", m, true).len(), 1);
        }
    }

    #[test]
    fn a_slow_push_hand_over_fails_where_the_server_pushes() {
        let ms = |x: f64| Duration::from_secs_f64(x / 1e3);
        let stats = |median: f64| Stats {
            median: ms(median),
            p99: ms(median),
            n: 10,
        };
        let handover = |push_ms: f64, pushes: bool| Handover {
            rtt: ms(1.0),
            push: stats(push_ms),
            poll: stats(100.0),
            crash: stats(3.0),
            pushes,
            ..Handover::default()
        };
        let with = |h: &Handover, label| {
            let m = Measured {
                handover: Some(h),
                ..measured(None, &[])
            };
            unmet(label, m, true)
        };
        assert_eq!(with(&handover(1.9, true), "PgTable"), Vec::<String>::new());
        let slow = with(&handover(6.5, true), "Redis");
        assert_eq!(slow.len(), 1, "{slow:#?}");
        assert!(slow[0].contains("round trips"), "{slow:#?}");
        // The full run's target is tighter.
        let full = |h: &Handover| {
            let m = Measured {
                handover: Some(h),
                ..measured(None, &[])
            };
            unmet("PgAdvisory", m, false)
        };
        assert_eq!(full(&handover(2.5, true)).len(), 1);
        assert_eq!(full(&handover(1.5, true)), Vec::<String>::new());
        // A backend that polls is measured, not held to the push target.
        assert_eq!(
            with(&handover(50.0, false), "MySqlTable"),
            Vec::<String>::new()
        );
        // No samples: not met (hand-over and crash samples both).
        let empty = Handover::default();
        assert_eq!(with(&empty, "MySqlTable").len(), 2);
    }

    #[test]
    fn a_crash_taken_over_a_poll_after_its_expiry_fails() {
        let ms = |x: f64| Duration::from_secs_f64(x / 1e3);
        let stats = |median: f64, n| Stats {
            median: ms(median),
            p99: ms(median),
            n,
        };
        let handover = |crash_ms: f64| Handover {
            rtt: ms(0.5),
            push: stats(1.0, 10),
            poll: stats(100.0, 10),
            crash: stats(crash_ms, 10),
            pushes: true,
            ..Handover::default()
        };
        let unmet_crash = |label, crash_ms, quick| {
            let h = handover(crash_ms);
            let m = Measured {
                handover: Some(&h),
                ..measured(None, &[])
            };
            unmet(label, m, quick)
        };
        // Full run: 2 round trips (1 ms) + 5 ms.
        assert_eq!(unmet_crash("Redis", 5.9, false), Vec::<String>::new());
        let late = unmet_crash("Redis", 6.1, false);
        assert_eq!(late.len(), 1, "{late:#?}");
        assert!(late[0].contains("crash take-over"), "{late:#?}");
        // A poll later (ttl/10 at 1 s) fails the quick run too.
        assert_eq!(unmet_crash("MySqlTable", 100.0, true).len(), 1);
        assert_eq!(unmet_crash("MySqlTable", 20.0, true), Vec::<String>::new());
        // etcd deletes an expired key at its next sweep, up to 500 ms on.
        assert_eq!(unmet_crash("Etcd", 400.0, false), Vec::<String>::new());
        assert_eq!(unmet_crash("Etcd", 520.0, false).len(), 1);
        // `PgAdvisory` has no expiry: not held to it.
        assert_eq!(
            unmet_crash("PgAdvisory", 100.0, false),
            Vec::<String>::new()
        );
        // No crash samples on a backend with expiry: not met.
        let mut none = handover(3.0);
        none.crash.n = 0;
        let m = Measured {
            handover: Some(&none),
            ..measured(None, &[])
        };
        assert_eq!(unmet("SqliteTable", m, false).len(), 1);
    }

    #[test]
    fn a_check_in_of_more_or_less_than_one_statement_fails() {
        let stats = Stats {
            median: Duration::from_micros(300),
            p99: Duration::from_micros(400),
            n: 100,
        };
        let cost = |statements| CheckInCost {
            plain: stats,
            checked: stats,
            statements,
        };
        let with = |c: &CheckInCost| {
            let m = Measured {
                check_in: Some(c),
                ..measured(None, &[])
            };
            unmet("PgTable", m, false)
        };
        assert_eq!(with(&cost(Some(1.0))), Vec::<String>::new());
        // SQLite: no server count; its statement is checked by the test
        // `check_in_sends_one_statement`.
        assert_eq!(with(&cost(None)), Vec::<String>::new());
        for bad in [2.0, 1.1, 0.0] {
            let unmet = with(&cost(Some(bad)));
            assert_eq!(unmet.len(), 1, "{bad}: {unmet:#?}");
            assert!(unmet[0].contains("statements per check_in"), "{unmet:#?}");
        }
        // No samples: not met.
        let empty = CheckInCost::default();
        assert_eq!(with(&empty).len(), 1);
    }
}
