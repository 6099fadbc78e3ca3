//! Run a periodic task on exactly one replica at a time.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
mod engine;
mod error;
mod global;
mod guard;
mod lease;
mod outcome;
mod private;
mod skippable;
mod validate;

pub use backend::{Backend, Grant};
pub use error::{Error, Result};
pub use global::{global_default, set_global_default};
pub use guard::LeaseGuard;
pub use lease::Lease;
pub use outcome::{Outcome, Skip};
pub use skippable::Skippable;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use sqlx;
pub use tokio_util::sync::CancellationToken;
pub use validate::{MAX_HOLDER_LEN, MAX_NAME_LEN, MAX_TTL, MIN_TTL};

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use lease_macros::singleton;

/// Not public API: the runtime side of `#[singleton]`'s expansion.
#[doc(hidden)]
pub mod __private {
    pub use crate::private::{AsLease, global, run};
}
