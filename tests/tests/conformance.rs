//! The conformance suite on every backend of `leasehold`.
//!
//! The properties live in the `leasehold-conformance` crate (`conformance/`
//! in this repository), published so that the author of a backend can run
//! them against their own: each is a generic `async fn` over a
//! [`Subject`] (a backend plus the few test-only powers the suite needs,
//! such as rewriting a lease behind the holder's back), and its
//! `conformance!` macro makes one `#[test]` of each property for a subject,
//! `<backend>::<property>`. This file runs our backends through it: a new
//! backend gets every check by adding a `conformance!` line here and a
//! `Subject` impl in `conformance/subjects.rs`.
//!
//! Backends differ in a few ways, and each difference is a capability
//! ([`Caps`]; the crate's docs have them all):
//!
//! - **Fencing and expiry.** The `every` group of properties runs on every
//!   backend; where a backend lacks one of these, the property asserts what
//!   that backend does instead rather than skipping. Today that is
//!   `PgAdvisory`: it has no fencing token (unless `with_fencing`: the
//!   `pg_advisory_fenced` subject), and no server-side expiry — a lock that
//!   nobody renews stays held for as long as its holder's session lives,
//!   and is taken over once that session ends ([`Subject::end_session`]).
//!   etcd's fencing tokens are revisions, which the suite counts per name
//!   through `leasehold_conformance::Ordinal`.
//! - **Waking waiters and naming holders.** Where the server pushes
//!   releases (PostgreSQL `NOTIFY`, Redis `PUBLISH` — the Redis subjects
//!   subscribe, `Redis::with_pubsub` — and etcd's watch), a waiter must
//!   have a released lease about one round trip after the release, faster
//!   than any poll; elsewhere within a poll. What an election's
//!   `Following { leader }` shows is what the backend's `inspect` can name.
//! - **Slots, values and forced releases** (the `extended` and `operating`
//!   groups). Where a backend lacks one, the property checks that it is
//!   refused with `Error::Unsupported` (or, for the lock delay, checks
//!   nothing).
//! - **Thousands of leases at once.** The `many_leases` group holds more
//!   leases than one batched statement takes; it is left out for
//!   `PgAdvisory`, which holds one pool connection per lease.
//! - **Tables** ([`TableBackend`]: `with_table`, `ensure_schema`, input
//!   checks on direct calls, the server's clock in the statements). The
//!   `tables` properties, in `conformance/tables.rs`, are ours alone and not
//!   part of the published suite: the table backends run them as the
//!   `extra` properties of their `conformance!` line.
//!
//! `conformance/subjects.rs` has the subjects (they need the servers and
//! `lease_tests`). What only one backend or server does (SQLite's busy
//! handling, MySQL's lock wait timeouts, rows as stored) is checked in
//! `sql_backends/` and `lock_backends/`.

// The properties are test code called by the generated tests, which
// `allow-unwrap-in-tests` (clippy.toml) does not see as tests.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::time::Duration;

use futures_util::future::join_all;
use lease_tests::{TempDb, unique};
use leasehold::backend::{Etcd, Memory, MySqlTable, PgAdvisory, PgTable, Redis, SqliteTable};
use leasehold::{Acquisition, Backend, Error, Lease};
use leasehold_conformance::support::{LONG, acquire, acquired, ms, release, renew};
use leasehold_conformance::{Caps, Naming, Ordinal, Subject, release_as};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgPoolOptions;
use tokio::time::{Instant, sleep, timeout};

#[path = "conformance/subjects.rs"]
mod subjects;
#[path = "conformance/tables.rs"]
mod tables;

use subjects::*;
use tables::*;

// ---------------------------------------------------------------- the matrix

/// `table_backend!(module, subject)`: the published groups for a table
/// backend, and the `tables` properties (which need [`TableBackend`]) as
/// extra properties of the same module.
macro_rules! table_backend {
    ($backend:ident, $subject:expr) => {
        leasehold_conformance::conformance!(
            $backend,
            $subject,
            [every, many_leases, extended],
            extra [
                table_names_are_validated,
                backend_calls_reject_invalid_input,
                expiry_is_the_server_time_of_the_request_plus_the_ttl,
                ensure_schema_twice_and_concurrently,
                a_table_without_last_slot_names_the_alter,
            ]
        );
    };
}

leasehold_conformance::conformance!(memory, super::memory(), [every, many_leases, extended]);
table_backend!(sqlite, super::sqlite());
table_backend!(postgres, super::postgres());
table_backend!(mysql, super::mysql());
// No `many_leases`: PgAdvisory holds one pool connection (one server
// session) per lease, so thousands of leases at once are not what it is for.
leasehold_conformance::conformance!(pg_advisory, super::pg_advisory(), [every, extended]);
// Without the watch of the holding connection (the plain connection path).
leasehold_conformance::conformance!(
    pg_advisory_unwatched,
    super::pg_advisory_unwatched(),
    [every]
);
// With fencing tokens: the `fenced` group too.
leasehold_conformance::conformance!(
    pg_advisory_fenced,
    super::pg_advisory_fenced(),
    [every, fenced, extended]
);
leasehold_conformance::conformance!(redis, super::redis(), [every, many_leases, extended]);
// The Go locker's protocol on Redis: no fencing tokens.
leasehold_conformance::conformance!(
    redis_go_locker,
    super::redis_go_locker(),
    [every, many_leases, extended]
);

// `Backend::list` and `Backend::force_release` (the `lease` command's
// `list` and `release --force`).
leasehold_conformance::conformance!(memory_operating, super::memory(), [operating]);
leasehold_conformance::conformance!(sqlite_operating, super::sqlite(), [operating]);
leasehold_conformance::conformance!(postgres_operating, super::postgres(), [operating]);
leasehold_conformance::conformance!(mysql_operating, super::mysql(), [operating]);
leasehold_conformance::conformance!(pg_advisory_operating, super::pg_advisory(), [operating]);
leasehold_conformance::conformance!(
    pg_advisory_fenced_operating,
    super::pg_advisory_fenced(),
    [operating]
);
leasehold_conformance::conformance!(redis_operating, super::redis(), [operating]);
leasehold_conformance::conformance!(
    redis_go_locker_operating,
    super::redis_go_locker(),
    [operating]
);
leasehold_conformance::conformance!(etcd_operating, super::etcd(), [operating]);
// etcd on a 3-member cluster started by this test binary.
leasehold_conformance::conformance!(etcd, super::etcd(), [every, fenced, many_leases, extended]);
// Redis on a 3-master Redis Cluster started by this test binary.
leasehold_conformance::conformance!(
    redis_cluster,
    super::redis_cluster(),
    [every, fenced, many_leases, extended]
);
