//! The conformance suite: every property of a backend, written once, run
//! against every backend.
//!
//! Each property is a generic `async fn` over a [`Subject`] (a backend plus
//! the few test-only powers the suite needs, such as rewriting a lease behind
//! the holder's back). The `conformance!` macro at the bottom instantiates
//! each property as a `#[tokio::test]` per backend, `<backend>::<property>`,
//! so a new backend gets every check by adding one `conformance!` line and a
//! `Subject` impl.
//!
//! Backends differ in a few ways, and each difference is a capability:
//!
//! - **Fencing and expiry** ([`Caps`]). The `every` group of properties
//!   runs on every backend; where a backend lacks one of these, the property
//!   asserts what that backend does instead rather than skipping. Today that is `PgAdvisory`:
//!   it has no fencing token (unless `with_fencing`: the `pg_advisory_fenced`
//!   subject), and no server-side expiry — a lock that nobody
//!   renews stays held for as long as its holder's session lives, and is
//!   taken over once that session ends ([`Subject::end_session`], used by
//!   [`lapse`]).
//! - **Waking waiters and naming holders** ([`Caps`]). Where the server
//!   pushes releases (PostgreSQL `NOTIFY`, Redis `PUBLISH` — the Redis
//!   subjects subscribe, `Redis::with_pubsub`), a waiter must have a
//!   released lease about one round trip after the release, faster than
//!   any poll; elsewhere within a poll. What an election's `Following {
//!   leader }` shows is what the backend's `inspect` can name.
//! - **Tables** ([`TableBackend`]: `with_table`, `ensure_schema`, input
//!   checks on direct calls). The `tables` group of properties needs them,
//!   and the macro instantiates it for the table backends only.
//! - **Thousands of leases at once.** The `many_leases` group holds more
//!   leases than one batched statement takes; the macro leaves it out for
//!   `PgAdvisory`, which holds one pool connection per lease.
//!
//! - **Round three** ([`Caps`]: `once_per`, `values`, `lock_delay`,
//!   `force_now`). Where a backend lacks one, the property
//!   checks that it is refused with `Error::Unsupported` (or, for the lock
//!   delay, checks nothing).
//!
//! The properties live in `conformance/`, by subject: `leases.rs` (the
//! `Backend` calls), `engine.rs` (through `Lease`), `elections.rs` (waiting
//! and elections), `tables.rs` (many leases, the table backends),
//! `operating.rs` (`list`, `force_release`), `once_per.rs` and `values.rs`
//! (round three); `subjects.rs` has the subjects. This file has what they
//! share and the matrix.
//!
//! What only one backend or server does (SQLite's busy handling, MySQL's
//! lock wait timeouts, rows as stored) is checked in `sql_backends/` and
//! `lock_backends/`.

// The properties are test code called by the generated `#[tokio::test]`s,
// which `allow-unwrap-in-tests` (clippy.toml) does not see as tests.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::{StreamExt, stream};
use lease_tests::{TempDb, unique};
use leasehold::backend::{Etcd, Memory, MySqlTable, PgAdvisory, PgTable, Redis, SqliteTable};
use leasehold::{
    Acquired, Acquisition, Backend, Election, Error, Grant, Leadership, Lease, LeaseInfo, OncePer,
    Outcome, Request, Skip,
};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgPoolOptions;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

/// How a backend's guarantees differ from the table backends'.
#[derive(Debug, Clone, Copy)]
struct Caps {
    /// Acquisitions carry a fencing token: 1 for the first acquisition of a
    /// name, one more for each later one, unchanged by an idempotent
    /// re-acquire. When false (`PgAdvisory`), every token is `None`, and
    /// renew and release match name and holder only.
    fencing: bool,
    /// The server expires a lease that is not renewed within its ttl. When
    /// false (`PgAdvisory`), a lease lives as long as its holder's session
    /// and ends when that session does ([`Subject::end_session`]).
    expires: bool,
    /// The server pushes releases to waiters ([`Backend::released`]): a
    /// waiter has a released lease about one round trip after the
    /// release. When false, waiters poll (every `ttl/10`, at most 1 s).
    pushes: bool,
    /// Whom `Backend::inspect` names as the holder of a live lease, which
    /// is what an election's `Leadership::Following { leader }` shows.
    leader: Naming,
    /// Schedule slots (`Request::once_per`, `Job::once_per`).
    /// When false, a request for one is refused with `Error::Unsupported`.
    once_per: bool,
    /// Values published with a lease (`Request::value`, `Backend::publish`,
    /// `Election::proclaim`; §6.4), which `inspect` reports. When false,
    /// both are refused with `Error::Unsupported`.
    values: bool,
    /// `force_release` keeps a lock delay (§6.1): nobody is granted the
    /// name before the expiry the server last set. When false, it is not
    /// checked (`PgAdvisory` cannot delay: the lock ends with its session).
    lock_delay: bool,
    /// `force_release_now` ends a lease at once. When false, it answers
    /// `Error::Unsupported`.
    force_now: bool,
}

/// Whom `Backend::inspect` names as the holder of a live lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Naming {
    /// The holder, whoever took it.
    Holder,
    /// The holder if it acquired through this backend value (or a clone),
    /// else nobody: in the Go locker's protocol the lock's value is a
    /// random token, which only the acquiring backend value can map back.
    OwnHolders,
    /// The server session that holds it (`PgAdvisory`: `... (pid N)`).
    Session,
}

/// Memory, SQLite and MySQL: fencing, expiry, polling waiters, and every
/// addition of round three.
const TABLE_LIKE: Caps = Caps {
    fencing: true,
    expires: true,
    pushes: false,
    leader: Naming::Holder,
    once_per: true,
    values: true,
    lock_delay: true,
    force_now: true,
};

/// Without the additions of round three: no schedule slots, no
/// values, no `force_release` with a lock delay, no `force_release_now`.
const ROUND_TWO: Caps = Caps {
    once_per: false,
    values: false,
    lock_delay: false,
    force_now: false,
    ..TABLE_LIKE
};

/// A backend under test.
trait Subject: Send + Sync + 'static {
    type B: Backend + Clone;

    fn backend(&self) -> Self::B;

    fn caps(&self) -> Caps {
        TABLE_LIKE
    }

    /// Behind the holder's back, make `thief` the holder of `name` with a
    /// larger fence, as an operator or a buggy peer rewriting the row would.
    fn steal(&self, name: &str, thief: &str) -> impl Future<Output = ()> + Send;

    /// How long after an acquisition with `ttl` (not renewed) the server
    /// may still hold the lease: `ttl` where the server expires exactly
    /// (give or take its clock), longer where it rounds the ttl up (etcd:
    /// whole seconds, and an expiry check every 500 ms).
    fn expiry(&self, ttl: Duration) -> Duration {
        ttl
    }

    /// `list` and `inspect` show a released lease (as not held): where the
    /// record keeps the fencing counter, by default.
    fn keeps_released(&self) -> bool {
        self.caps().fencing && self.caps().expires
    }

    /// The thief of [`steal`](Subject::steal) lets the lease go: by
    /// default it releases it through the backend, as a holder would.
    fn let_go(&self, name: &str, thief: &str) -> impl Future<Output = ()> + Send {
        let (b, name, thief) = (self.backend(), name.to_owned(), thief.to_owned());
        async move { release_as(&b, &name, &thief).await }
    }

    /// For backends without expiry: end the session of whoever holds `name`
    /// (as a crash or `pg_terminate_backend` would), and return once the
    /// server has freed the name.
    fn end_session(&self, name: &str) -> impl Future<Output = ()> + Send {
        let _ = name;
        async { panic!("only a backend without expiry has sessions to end") }
    }
}

/// Release `name` as `holder`, with the fencing token `inspect` shows:
/// what a holder that did not keep its grant would do.
async fn release_as(b: &impl Backend, name: &str, holder: &str) {
    let info = b.inspect(name).await.expect("inspect");
    let fence = info.and_then(|i| i.fencing_token);
    b.release(Acquisition::new(name, holder, fence))
        .await
        .unwrap_or_else(|e| panic!("{holder}'s release of {name:?}: {e}"));
}

/// The acquisition `grant` was for.
fn acq<'a>(name: &'a str, holder: &'a str, grant: &Grant) -> Acquisition<'a> {
    Acquisition::new(name, holder, grant.fencing_token)
}

fn lease<S: Subject>(s: &S, holder: &str) -> Lease {
    Lease::with_holder(s.backend(), holder)
}

/// The fencing token of the `n`th acquisition of a name on `s`: `n`, or
/// `None` without fencing.
fn fence<S: Subject>(s: &S, n: u64) -> Option<u64> {
    s.caps().fencing.then_some(n)
}

/// `b.acquire`: `None` when another holder has the lease, else the fencing
/// token of the grant.
async fn acquire(b: &impl Backend, name: &str, holder: &str, ttl: Duration) -> Option<Option<u64>> {
    let grant = b
        .acquire(name, holder, ttl)
        .await
        .unwrap_or_else(|e| panic!("acquire {name:?} for {holder:?}: {e}"));
    grant.map(|g| g.fencing_token)
}

/// [`acquire`] of a lease that must be free; its fencing token.
async fn acquired(b: &impl Backend, name: &str, holder: &str, ttl: Duration) -> Option<u64> {
    acquire(b, name, holder, ttl)
        .await
        .unwrap_or_else(|| panic!("{holder} could not acquire {name}"))
}

/// `b.renew` of the acquisition of `name` by `holder` that got `fence`.
async fn renew(
    b: &impl Backend,
    name: &str,
    holder: &str,
    fence: Option<u64>,
    ttl: Duration,
) -> bool {
    b.renew(Acquisition::new(name, holder, fence), ttl)
        .await
        .expect("renew")
}

/// `b.release` of the acquisition of `name` by `holder` that got `fence`.
async fn release(b: &impl Backend, name: &str, holder: &str, fence: Option<u64>) {
    b.release(Acquisition::new(name, holder, fence))
        .await
        .expect("release");
}

const TTL: Duration = Duration::from_secs(2);
const LONG: Duration = Duration::from_secs(30);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Let the lease `holder` has on `name` (acquired with `ttl`, not renewed)
/// lapse, so that another holder can take it over.
///
/// With expiry: wait out the ttl, with a wide margin (the server's clock
/// decides). Without (`PgAdvisory`): the difference is that the lease
/// outlives its ttl — after the same wait it is still held and still
/// renewable by `holder` — and it is the end of the holder's session that
/// frees it.
async fn lapse<S: Subject>(s: &S, lease: Acquisition<'_>, ttl: Duration) {
    sleep(s.expiry(ttl) + ms(400)).await; // nobody renews
    if !s.caps().expires {
        let (b, name) = (s.backend(), lease.name);
        assert!(
            b.acquire(name, "holder-probe", TTL)
                .await
                .expect("acquire")
                .is_none(),
            "no expiry: the lease must still be held after its ttl"
        );
        assert!(
            b.renew(lease, ttl).await.expect("renew"),
            "no expiry: the holder can still renew after its ttl"
        );
        s.end_session(name).await;
    }
}

#[path = "conformance/elections.rs"]
mod elections;
#[path = "conformance/engine.rs"]
mod engine;
#[path = "conformance/leases.rs"]
mod leases;
#[path = "conformance/once_per.rs"]
mod once_per;
#[path = "conformance/operating.rs"]
mod operating;
#[path = "conformance/subjects.rs"]
mod subjects;
#[path = "conformance/tables.rs"]
mod tables;
#[path = "conformance/values.rs"]
mod values;

use elections::*;
use engine::*;
use leases::*;
use once_per::*;
use operating::*;
use subjects::*;
use tables::*;
use values::*;

// ---------------------------------------------------------------- the matrix

/// `conformance!(module, subject, [groups])`: a module of `#[tokio::test]`s,
/// one per property of each group, each calling `property(&subject)`.
/// Groups: `every` (every backend), `fenced` (backends with fencing
/// tokens), `many_leases` (thousands of leases held
/// at once), `tables` (needs [`TableBackend`]), `operating` (`list`,
/// `force_release`), `round_three` (slots, values, observers,
/// take-over at expiry; each property checks what [`Caps`] says the
/// backend supports, and that the rest is refused).
macro_rules! conformance {
    ($backend:ident, $subject:expr, [$($group:ident),+ $(,)?]) => {
        mod $backend {
            $(conformance!(@$group $subject);)+
        }
    };
    (@every $subject:expr) => {
        conformance!(@tests $subject, [
            exclusive_between_two_holders,
            idempotent_reacquire_keeps_the_fence,
            takeover_after_expiry_has_a_larger_fence,
            release_then_reacquire_increments_fence,
            renew_extends_a_live_lease,
            renew_never_inserts,
            renew_fails_after_takeover_release_and_expiry,
            renew_and_release_by_a_non_holder_do_nothing,
            fences_strictly_increase,
            names_are_data,
            holders_are_compared_exactly,
            invalid_input_is_rejected,
            one_winner_among_sixteen_contenders,
            concurrent_acquire_of_a_new_name_has_one_winner,
            concurrent_takeover_of_an_expired_lease_has_one_winner,
            one_runner_among_sixteen_with_lease,
            a_stolen_lease_cancels_the_token,
            a_dropped_guard_frees_the_lease,
            shutdown_hands_over_only_after_the_body_returned,
            shutdown_leaves_a_body_that_ignores_its_token_to_expire,
            a_held_lease_is_renewed_past_its_ttl,
            each_lease_learns_its_own_fate,
            a_waiter_has_a_released_lease_at_once,
            a_wait_runs_out_while_another_holds,
            a_waiter_takes_over_from_a_crashed_holder,
            an_election_hands_over_on_resign,
            an_election_hands_over_on_drop,
            an_election_contends_again_after_a_steal,
        ]);
    };
    (@fenced $subject:expr) => {
        conformance!(@tests $subject, [a_late_release_leaves_a_newer_acquisition]);
    };
    (@many_leases $subject:expr) => {
        conformance!(@tests $subject, [a_batch_larger_than_a_chunk]);
    };
    (@tables $subject:expr) => {
        conformance!(@tests $subject, [
            table_names_are_validated,
            backend_calls_reject_invalid_input,
            expiry_is_the_server_time_of_the_request_plus_the_ttl,
            ensure_schema_twice_and_concurrently,
            a_table_without_last_slot_names_the_alter,
        ]);
    };
    (@operating $subject:expr) => {
        conformance!(@tests $subject, [
            force_release_keeps_a_lock_delay,
            force_release_now_hands_over_at_once,
            list_shows_held_and_released_leases,
        ]);
    };
    (@round_three $subject:expr) => {
        conformance!(@tests $subject, [
            each_slot_runs_once_across_skewed_ticks,
            a_crashed_or_failed_run_does_not_run_its_slot_again,
            retry_failed_runs_a_failed_slot_again,
            a_value_over_4_kib_is_invalid,
            a_follower_sees_the_leaders_value,
            an_observer_sees_the_holder_and_the_hand_over,
            a_waiter_is_granted_at_a_crashed_holders_expiry,
        ]);
    };
    (@tests $subject:expr, [$($property:ident),* $(,)?]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $property() {
                lease_tests::init_tracing();
                if let Some(subject) = $subject.await {
                    super::$property(&subject).await;
                }
            }
        )*
    };
}

conformance!(memory, super::memory(), [every, many_leases, round_three]);
conformance!(
    sqlite,
    super::sqlite(),
    [every, many_leases, tables, round_three]
);
conformance!(
    postgres,
    super::postgres(),
    [every, many_leases, tables, round_three]
);
conformance!(
    mysql,
    super::mysql(),
    [every, many_leases, tables, round_three]
);
// No `many_leases`: PgAdvisory holds one pool connection (one server
// session) per lease, so thousands of leases at once are not what it is for.
conformance!(pg_advisory, super::pg_advisory(), [every, round_three]);
// Without the watch of the holding connection (the plain connection path).
conformance!(
    pg_advisory_unwatched,
    super::pg_advisory_unwatched(),
    [every]
);
// With fencing tokens: the `fenced` group too.
conformance!(
    pg_advisory_fenced,
    super::pg_advisory_fenced(),
    [every, fenced, round_three]
);
conformance!(redis, super::redis(), [every, many_leases, round_three]);
// The Go locker's protocol on Redis: no fencing tokens.
conformance!(
    redis_go_locker,
    super::redis_go_locker(),
    [every, many_leases, round_three]
);

// `Backend::list` and `Backend::force_release` (the `lease` command's
// `list` and `release --force`).
conformance!(memory_operating, super::memory(), [operating]);
conformance!(sqlite_operating, super::sqlite(), [operating]);
conformance!(postgres_operating, super::postgres(), [operating]);
conformance!(mysql_operating, super::mysql(), [operating]);
conformance!(pg_advisory_operating, super::pg_advisory(), [operating]);
conformance!(
    pg_advisory_fenced_operating,
    super::pg_advisory_fenced(),
    [operating]
);
conformance!(redis_operating, super::redis(), [operating]);
conformance!(
    redis_go_locker_operating,
    super::redis_go_locker(),
    [operating]
);
conformance!(etcd_operating, super::etcd(), [operating]);
// etcd on a 3-member cluster started by this test binary.
conformance!(
    etcd,
    super::etcd(),
    [every, fenced, many_leases, round_three]
);
// Redis on a 3-master Redis Cluster started by this test binary.
conformance!(
    redis_cluster,
    super::redis_cluster(),
    [every, fenced, many_leases, round_three]
);
