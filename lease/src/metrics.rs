//! The crate's metrics, through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`): the application installs the exporter. With
//! the feature off every function here is empty and inlined away.
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `lease_acquire_total` | counter | `name`, `outcome` = `acquired` \| `held_elsewhere` \| `already_ran` \| `error` | acquisition attempts |
//! | `lease_renew_total` | counter | `outcome` = `renewed` \| `lost` \| `error` | renewals, per lease |
//! | `lease_lost_total` | counter | `name`, `reason` = `taken` \| `deadline` \| `max_hold` | leases lost while held |
//! | `lease_held` | gauge | | leases this process holds now |
//! | `lease_backend_seconds` | histogram | `op` = `acquire` \| `renew` \| `release` | time of each backend call |
//! | `lease_slots_missed_total` | counter | `name` | schedule slots no run claimed (`once_per`) |

use std::time::Duration;

/// An acquisition attempt of `name` ended with `outcome`.
#[inline]
pub(crate) fn acquired(name: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("lease_acquire_total", "name" => name.to_owned(), "outcome" => outcome)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, outcome);
}

/// One lease's renewal ended with `outcome`.
#[inline]
pub(crate) fn renewed(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("lease_renew_total", "outcome" => outcome).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = outcome;
}

/// A held lease of `name` was lost, for `reason` (`taken`, `deadline`,
/// `max_hold`).
#[inline]
pub(crate) fn lost(name: &str, reason: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("lease_lost_total", "name" => name.to_owned(), "reason" => reason)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, reason);
}

/// The number of leases held changed by `delta`.
#[inline]
pub(crate) fn held(delta: f64) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!("lease_held").increment(delta);
    #[cfg(not(feature = "metrics"))]
    let _ = delta;
}

/// A backend call `op` took `took`.
#[inline]
pub(crate) fn backend_seconds(op: &'static str, took: Duration) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!("lease_backend_seconds", "op" => op).record(took.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (op, took);
}

/// `missed` schedule slots of `name` were claimed by no run (`once_per`).
#[inline]
pub(crate) fn slots_missed(name: &str, missed: u64) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("lease_slots_missed_total", "name" => name.to_owned()).increment(missed);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, missed);
}
