//! The conformance suite of [`leasehold`]'s [`Backend`](leasehold::Backend)
//! trait: every property a lease backend must have, written once, to run
//! against your own backend.
//!
//! Each property is a `pub async fn` generic over a [`Subject`] (a backend
//! plus the few test-only powers the suite needs, such as rewriting a lease
//! behind its holder's back), in a module by subject: [`leases`] (the
//! `Backend` calls), [`engine`] (through [`Lease`](leasehold::Lease)),
//! [`elections`] (waiting and elections), [`many_leases`], [`operating`]
//! (`list`, forced releases), [`once_per`] (schedule slots) and [`values`]
//! (published values, observers). The [`conformance!`] macro makes one test
//! of each property for a subject. `leasehold` runs its own backends
//! through this suite.
//!
//! Backends differ in a few ways, and each difference is a capability
//! ([`Caps`]): fencing tokens, server-side expiry, pushed releases, whom
//! `inspect` names, and the optional `Backend` methods. Where a backend
//! lacks one, the property checks what it does instead: a refusal with
//! [`Error::Unsupported`](leasehold::Error::Unsupported), or, without
//! expiry, a lease that ends with its holder's session. Nothing is skipped.
//!
//! # Wiring your backend
//!
//! Add the suite as a dev-dependency, at the version of `leasehold` your
//! backend is built on:
//!
//! ```toml
//! [dev-dependencies]
//! leasehold-conformance = "0.1"
//! ```
//!
//! Implement [`Subject`] for a type that holds your backend, and invoke
//! [`conformance!`] in a test file (`tests/conformance.rs`) with the groups
//! of properties your backend is for. Here `Memory` stands in for your
//! backend:
//!
//! ```
//! use std::time::Duration;
//! use leasehold::Backend;
//! use leasehold::backend::Memory;
//! use leasehold_conformance::{Caps, Subject};
//!
//! struct MySubject(Memory);
//!
//! impl Subject for MySubject {
//!     type B = Memory;
//!
//!     fn backend(&self) -> Memory {
//!         self.0.clone()
//!     }
//!
//!     fn caps(&self) -> Caps {
//!         Caps::new() // everything but pushed releases
//!     }
//!
//!     // Rewrite the record as another client would: here, expire the
//!     // holder's lease and acquire it for the thief.
//!     async fn steal(&self, name: &str, thief: &str) {
//!         self.0.expire(name);
//!         let ttl = Duration::from_secs(60);
//!         self.0.acquire(name, thief, ttl).await.unwrap().expect("free");
//!     }
//! }
//!
//! /// A new subject per test; `None` would skip the test (a server that
//! /// is not there: say so on stderr).
//! async fn subject() -> Option<MySubject> {
//!     Some(MySubject(Memory::new()))
//! }
//!
//! // `my_backend::exclusive_between_two_holders`, ...: one test a property.
//! leasehold_conformance::conformance!(
//!     my_backend,
//!     super::subject(),
//!     [every, fenced, many_leases, operating, extended]
//! );
//! # fn main() {}
//! ```
//!
//! `cargo test --test conformance` then runs each property as a test of
//! its own, in parallel; most take a few seconds (they wait out ttls of up
//! to 3 s). The tests need nothing else in your crate: each builds its own
//! multi-threaded tokio runtime (two workers), on which the subject is
//! built too. To run a property from a test of your own instead, call it:
//! `leasehold_conformance::leases::names_are_data(&subject).await`.
//!
//! # What the suite asks of a backend
//!
//! Beyond what [`Caps`] lets a backend leave out:
//!
//! - Every clone of the backend, and every [`Subject::backend`], sees the
//!   same leases (one server). The properties use names of their own, so
//!   the server may be shared with other tests.
//! - [`Backend::inspect`](leasehold::Backend::inspect) answers: the `every`
//!   group asks it who holds a lease (as an election does).
//! - Fencing tokens count per name from 1; a backend whose tokens only
//!   grow runs as an [`Ordinal`] of itself.
//! - Names are any UTF-8 of 1 to 255 bytes, and holders of up to 255
//!   bytes, compared byte for byte.
//! - A backend checks its own input where it is called directly: an
//!   invalid name in `force_release` and `force_release_now`, an over-long
//!   value or a `once_per` period out of bounds in `acquire_with`. [`leasehold::backend::validate`] has the
//!   checks.
//!
//! What is particular to `leasehold`'s own backends is not in this suite:
//! the table backends' `with_table`, `ensure_schema` and the server's
//! clock in their statements, and what one server does (SQLite's busy
//! handling, MySQL's lock wait timeouts). Those are checked in
//! `leasehold`'s repository, in `tests/`.

// The properties are tests: a panic (from `unwrap`, `expect` or an
// assertion) is how a property fails, and says why.
#![allow(clippy::unwrap_used)]

pub mod elections;
pub mod engine;
pub mod leases;
pub mod many_leases;
pub mod once_per;
pub mod operating;
pub mod values;

mod macros;
mod ordinal;
mod subject;
pub mod support;

pub use ordinal::Ordinal;
pub use subject::{Caps, Naming, Subject, release_as};

/// Not public API: what the expansion of [`conformance!`] calls.
#[doc(hidden)]
pub mod __private {
    use std::future::Future;

    /// Runs one test on a runtime of its own, as
    /// `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` would
    /// (the runtime the properties' time bounds were set on). The macro
    /// cannot write that attribute: it would name the caller's `tokio`.
    pub fn run(test: impl Future<Output = ()>) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime for the test")
            .block_on(test);
    }
}
