//! Run a periodic task on exactly one replica at a time.
//!
//! Every replica of a service runs the same schedule ("every minute, check
//! the schedules"; "at 2:00, send the digest"), but the job must run once,
//! not once per replica. Put [`#[singleton]`](singleton) on the async fn that
//! runs the job and call it on every replica, on every tick: one replica
//! takes a *lease* on the job's name and runs the body — renewing the lease
//! while the body runs, releasing it when the body returns — and the others
//! skip that tick. If the lease is lost mid-run, a cancellation token fires
//! at once.
//!
//! # In production
//!
//! Make one [`Lease`] per process on a table in your database, install it
//! as the default, and install a [`tracing`](https://docs.rs/tracing)
//! subscriber: a skipped or failed run is reported only through `tracing`
//! (see [What is logged](#what-is-logged)), so without a subscriber a
//! misconfigured job and one held elsewhere look the same.
//!
#![cfg_attr(all(feature = "postgres", feature = "macros"), doc = "```no_run")]
#![cfg_attr(not(all(feature = "postgres", feature = "macros")), doc = "```ignore")]
//! use std::time::Duration;
//! use leasehold::{Lease, backend::PgTable, singleton, sqlx::PgPool};
//!
//! #[singleton(name = "agent-scheduler", ttl = "90s", token = cancel)]
//! async fn check_schedules(db: &PgPool) -> Result<(), leasehold::sqlx::Error> {
//!     // Runs on one replica per tick; on the others the call returns Ok(()) at once.
//!     // `cancel` fires the moment this replica loses the lease: stop then.
//!     if !cancel.is_cancelled() {
//!         leasehold::sqlx::query("SELECT 1").execute(db).await?;
//!     }
//!     Ok(())
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     tracing_subscriber::fmt().with_env_filter("info").init(); // or your own subscriber
//!
//!     let pool = PgPool::connect("postgres://app@db.internal/app").await?;
//!     let table = PgTable::new(pool.clone()); // the `task_leases` table
//!     table.ensure_schema().await?; // or run migrations/postgres/ with your own tool
//!     leasehold::set_global_default(Lease::new(table))?;
//!
//!     let mut tick = tokio::time::interval(Duration::from_secs(60));
//!     loop {
//!         tick.tick().await;
//!         check_schedules(&pool).await?; // every replica calls it; one runs it
//!     }
//! }
//! ```
//!
//! A `#[singleton]` fn called before [`set_global_default`] (and without
//! `lease = ...`) does not run: it returns its skipped value and logs
//! [`Error::NoLease`] at error, naming `set_global_default`
//! (`on_error = "return"` returns that error instead).
//!
//! # What is logged
//!
//! Through `tracing`, with the lease's name (`lease.name`) and holder:
//!
//! | level | when |
//! |---|---|
//! | error | a `#[singleton]` fn has no [`Lease`] to run on (no `lease = ...`, no global default); an election stopped for good |
//! | warn | a run skipped because the lease could not be acquired (the store unreachable or failing, an invalid name or ttl, after [`Lease::shutdown`]); a renewal failed (retried until the deadline); a lease lost; a release that failed (the lease then ends at its ttl) |
//! | info | an election's candidate starts leading |
//! | debug | a run skipped because another replica holds the lease; a lease released |
//!
//! # Trying it without a database
//!
//! [`Memory`](backend::Memory) is an in-process store for tests. Two
//! replicas on one store, both ticking at once:
//!
//! ```
//! use std::time::Duration;
//! use leasehold::{Lease, backend::Memory, singleton};
//!
//! #[singleton(name = "nightly-report", ttl = "90s", lease = pod, token = cancel)]
//! async fn nightly_report(pod: &Lease, orders: &[u64]) -> Option<u64> {
//!     let mut total = 0;
//!     for amount in orders {
//!         if cancel.is_cancelled() {
//!             return None; // the lease was lost: stop, another replica may take over
//!         }
//!         tokio::time::sleep(Duration::from_millis(10)).await; // ... real work ...
//!         total += amount;
//!     }
//!     Some(total)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Two replicas sharing one lease store (in production, a table in your
//! // database: see above and `backend`).
//! let db = Memory::new();
//! let pod_a = Lease::with_holder(db.clone(), "pod-a");
//! let pod_b = Lease::with_holder(db, "pod-b");
//!
//! // Both replicas tick at once: exactly one runs the job, the other's call
//! // returns `None` (the skipped value of `Option`) without running it.
//! let orders = [120, 80];
//! let (a, b) = tokio::join!(nightly_report(&pod_a, &orders), nightly_report(&pod_b, &orders));
//! assert!(matches!((a, b), (Some(200), None) | (None, Some(200))));
//! # }
//! ```
//!
//! `name` and `ttl` are required; each is a literal (checked at compile
//! time) or an expression evaluated at each call (`name = format!("report-{tenant}")`).
//! The return type must implement [`Skippable`]: `()`, `bool`, `Option<T>`,
//! `Result<(), E>` or `Result<Option<T>, E>`, whose skipped values are `()`,
//! `false`, `None`, `Ok(())` and `Ok(None)`. Mistakes in the arguments are
//! compile errors. See [`singleton`] for the other arguments (`lease`,
//! `token`, `fence`, `min_hold`, `max_hold`, `grace`, `wait`, `once_per`,
//! `retry_failed`, `on_error`, `crate`); the attribute does what [`Lease::job`] does.
//!
//! # Without the macro
//!
//! - [`Lease`] pairs a [`Backend`] (where leases are stored) with this
//!   process's holder identity. Make one per process and clone it freely.
//! - [`Lease::with_lease`] runs a closure under a lease and returns an
//!   [`Outcome`]: [`Ran`](Outcome::Ran) with the closure's value, or
//!   [`Skipped`](Outcome::Skipped) with the reason ([`Skip`]).
//! - [`Lease::try_acquire`] hands out a [`LeaseGuard`] to hold as long as you
//!   like: renewed in the background, with a [`token`](LeaseGuard::token)
//!   that is cancelled when the lease is lost and a
//!   [`fencing_token`](LeaseGuard::fencing_token) for the resource it
//!   protects; released by [`release`](LeaseGuard::release) or on drop.
//! - [`set_global_default`] installs the `Lease` that `#[singleton]` fns use
//!   without `lease = ...`.
//! - [`backend`] has the stores (see [Features](#features)) and compares
//!   their guarantees. Implement [`Backend`] for another one.
//! - [`Error`] is the one error type; invalid input (a name over 255 bytes, a
//!   ttl outside [`MIN_TTL`]..=[`MAX_TTL`]) has variants of its own.
//!
//! ```
//! use std::time::Duration;
//! use leasehold::{Lease, Outcome, backend::Memory};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), leasehold::Error> {
//! let lease = Lease::new(Memory::new());
//! let ttl = Duration::from_secs(90);
//!
//! let outcome = lease.with_lease("nightly-report", ttl, |_token| async { 200 }).await;
//! assert!(matches!(outcome, Outcome::Ran(200)));
//!
//! if let Some(guard) = lease.try_acquire("compaction", ttl).await? {
//!     assert!(guard.is_valid());
//!     guard.release().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! - `macros` (default): [`#[singleton]`](singleton).
//! - `sqlite`, `postgres`, `mysql`: the table backends (`SqliteTable`,
//!   `PgTable`, `MySqlTable`) on `sqlx` (re-exported); `postgres` also
//!   brings `PgAdvisory`.
//! - `redis`: `Redis`, on `deadpool_redis` (re-exported).
//! - `etcd`: `Etcd`, on `etcd_client` (re-exported; its build script needs
//!   `protoc`, see the `Etcd` docs).
//! - `metrics`: the metrics below, through the [`metrics`](https://docs.rs/metrics)
//!   facade; install the exporter of your choice. Without the feature they
//!   cost nothing.
//!
//! # Metrics
//!
//! | metric | kind | labels | counts |
//! |---|---|---|---|
//! | `lease_acquire_total` | counter | `name`, `outcome` = `acquired` \| `held_elsewhere` \| `error` | acquisition attempts |
//! | `lease_renew_total` | counter | `outcome` = `renewed` \| `lost` \| `error` | renewals, one per lease |
//! | `lease_lost_total` | counter | `name`, `reason` = `taken` \| `deadline` \| `max_hold` | held leases lost (taken over or expired behind our back; no renewal before the local deadline; `max_hold` ran out) |
//! | `lease_held` | gauge | | leases this process holds now |
//! | `lease_backend_seconds` | histogram | `op` = `acquire` \| `renew` \| `release` | the time of each backend call |
//!
//! # Operating it
//!
//! - [`Lease::held`]: a snapshot of what this process holds, for health
//!   checks and status pages.
//! - [`Lease::shutdown`]: on SIGTERM, tell every job to stop and release
//!   each lease as soon as its job has stopped (waiting up to its grace), so
//!   that a rolling deploy does not stall the jobs for a ttl.
//! - [`Lease::job`]: everything `#[singleton]` offers, without the macro:
//!   `min_hold`, `max_hold` (a ceiling on how long a hung job keeps a lease),
//!   `wait`, and the fencing token.
//! - [`Lease::acquire`] waits for a lease; [`Lease::elect`] runs a leader
//!   election.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
mod drop_guard;
mod election;
mod engine;
mod error;
mod global;
mod guard;
mod job;
mod lease;
mod macro_runtime;
mod metrics;
mod observe;
mod outcome;
mod skippable;
#[cfg(test)]
mod test_util;
mod validate;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use backend::CheckIn;
pub use backend::{Acquired, Acquisition, Backend, Grant, LeaseInfo, OncePer, Request};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use deadpool_redis;
pub use election::{Election, Leadership, Term};
pub use error::{Error, Result};
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use etcd_client;
pub use global::{global_default, set_global_default};
pub use guard::LeaseGuard;
pub use job::Job;
pub use lease::{Held, Lease};
pub use observe::Observed;
pub use outcome::{Outcome, Skip};
pub use skippable::Skippable;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use sqlx;
pub use tokio_util::sync::CancellationToken;
pub use validate::{MAX_HOLDER_LEN, MAX_NAME_LEN, MAX_PERIOD, MAX_TTL, MAX_VALUE_LEN, MIN_TTL};

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use leasehold_macros::singleton;

/// Not public API: the runtime side of `#[singleton]`'s expansion.
#[doc(hidden)]
pub mod __private {
    pub use crate::macro_runtime::{
        AsLease, AsName, ReturnsError, Settings, global, run, run_or_err,
    };
}
