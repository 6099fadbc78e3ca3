//! The engine's timing rules, as pure functions of a lease's ttl and the
//! clocks. `docs/ARCHITECTURE.md` ("Timing rules") lists them with their
//! reasons. The local deadline is `t_send + ttl - grace`, `t_send` read
//! *before* the request, never a time computed from the reply ([`Deadline`]).

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// Longest time any single acquire or release call is given, whatever the ttl.
pub(crate) const CALL_TIMEOUT_CAP: Duration = Duration::from_secs(30);

/// The least grace: `ttl/100 + 2ms` (a local clock running up to 1% slow,
/// and the time the request takes to reach the server).
pub(crate) fn margin(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The grace of a lease when none is given: `ttl/3`.
///
/// With the renewal period of `ttl/3`, the token fires `2·ttl/3` after the
/// last successful request: failed renewals have one whole period to be
/// retried in ([`retry_delay`]: at `ttl/3`, `+ttl/30`, `+ttl/10`,
/// `+7·ttl/30`), then the body has a third of the ttl to stop. That third
/// also covers a local clock running up to 1.5× slow: `2·ttl/3` of local
/// time is then at most `ttl` on the server. A larger grace shortens the
/// retry window: `ttl/6` at `ttl/2`, the most.
pub(crate) fn default_grace(ttl: Duration) -> Duration {
    ttl / 3
}

/// How long a healthy lease's renewal has before the deadline when it is
/// due: `min(ttl/3, ttl - grace - ttl/3)` — the renewal period with the
/// default grace (or any grace up to `ttl/3`), less with a larger one. A
/// lease with less left than this has been failing; the scheduler renews it
/// alone, so that its short time limit is not imposed on healthy leases.
pub(crate) fn renew_window(ttl: Duration, grace: Duration) -> Duration {
    let period = renew_period(ttl);
    period.min(ttl.saturating_sub(grace).saturating_sub(period))
}

/// A grace is from [`margin`] to `ttl/2`: less would let the lease pass on
/// before the token fires on a slightly slow clock; more would leave less
/// than a sixth of the ttl to retry renewals in.
pub(crate) fn check_grace(ttl: Duration, grace: Duration) -> Result<(), crate::Error> {
    if grace < margin(ttl) || grace > ttl / 2 {
        return Err(crate::Error::InvalidGrace { grace, ttl });
    }
    Ok(())
}

/// How long after a successful request the next renewal is sent.
pub(crate) fn renew_period(ttl: Duration) -> Duration {
    ttl / 3
}

/// Time given to an acquire call: it must answer before the lease it asks for
/// would already be past its local deadline.
pub(crate) fn acquire_timeout(ttl: Duration) -> Duration {
    (ttl - margin(ttl)).min(CALL_TIMEOUT_CAP)
}

/// Time given to a release call; after `ttl` the lease has ended anyway.
pub(crate) fn release_timeout(ttl: Duration) -> Duration {
    ttl.min(CALL_TIMEOUT_CAP)
}

/// Time given to one renewal call sent at `sent`: its renewal period, and
/// never beyond the lease's deadline.
pub(crate) fn renew_timeout(ttl: Duration, deadline: Instant, sent: Instant) -> Duration {
    renew_period(ttl).min(deadline.saturating_duration_since(sent))
}

/// Wait before retrying the `failures`-th failed renewal in a row:
/// `ttl/30` (between 1 ms and 500 ms), doubling per failure, at most `ttl/6`.
pub(crate) fn retry_delay(ttl: Duration, failures: u32) -> Duration {
    let base = (ttl / 30).clamp(Duration::from_millis(1), Duration::from_millis(500));
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    base.saturating_mul(factor)
        .min(ttl / 6)
        .max(Duration::from_millis(1))
}

/// How long a waiter waits between attempts when the backend cannot tell it
/// of a release: `ttl/10`, between 10 ms and 1 s, plus or minus a fifth at
/// random (`spread` in `0.0..1.0`) so that waiters do not ask in lockstep.
/// A crashed holder's lease is taken about this long after it expires.
pub(crate) fn wait_poll(ttl: Duration, spread: f64) -> Duration {
    let base = (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
    base.mul_f64(0.8 + 0.4 * spread.clamp(0.0, 1.0))
}

/// An instant by both clocks: when a request was sent, or "now".
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamp {
    pub(crate) mono: Instant,
    pub(crate) wall: SystemTime,
}

impl Stamp {
    pub(crate) fn now() -> Self {
        Self {
            mono: Instant::now(),
            wall: wall_now(),
        }
    }
}

/// A lease's local deadline, kept on both clocks: Linux's monotonic clock
/// stops while the machine is suspended, the wall clock does not (and a jump
/// of the wall clock backward is caught by the monotonic one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    pub(crate) mono: Instant,
    wall: SystemTime,
}

impl Deadline {
    /// The deadline of a lease whose request, sent at `sent`, succeeded:
    /// `grace` before the lease could pass to another holder.
    pub(crate) fn after(sent: Stamp, ttl: Duration, grace: Duration) -> Self {
        Self {
            mono: sent.mono + ttl - grace,
            wall: sent.wall + ttl - grace,
        }
    }

    /// The deadline has passed by either clock.
    pub(crate) fn passed(&self, now: Stamp) -> bool {
        now.mono >= self.mono || now.wall >= self.wall
    }

    /// Extend it after another request, sent at `sent`, succeeded; never
    /// shortens it.
    pub(crate) fn extend(&mut self, sent: Stamp, ttl: Duration, grace: Duration) {
        let later = Self::after(sent, ttl, grace);
        self.mono = self.mono.max(later.mono);
        self.wall = self.wall.max(later.wall);
    }
}

/// The wall clock. Tests shift it to simulate a suspended machine.
#[cfg(not(test))]
fn wall_now() -> SystemTime {
    SystemTime::now()
}

#[cfg(test)]
thread_local! {
    pub(crate) static WALL_SHIFT: std::cell::Cell<Duration> =
        const { std::cell::Cell::new(Duration::ZERO) };
}

#[cfg(test)]
fn wall_now() -> SystemTime {
    SystemTime::now() + WALL_SHIFT.get()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::ms;

    #[test]
    fn margins_periods_and_limits() {
        let ttl = Duration::from_secs(3);
        assert_eq!(margin(ttl), ms(32));
        assert_eq!(renew_period(ttl), ms(1000));
        assert_eq!(acquire_timeout(ttl), ms(2968));
        assert_eq!(release_timeout(ttl), ttl);
        let day = Duration::from_secs(86_400);
        assert_eq!(acquire_timeout(day), CALL_TIMEOUT_CAP);
        assert_eq!(release_timeout(day), CALL_TIMEOUT_CAP);
        assert_eq!(margin(ms(10)), Duration::from_micros(2_100));
    }

    #[test]
    fn a_grace_is_from_the_margin_to_half_the_ttl() {
        let ttl = Duration::from_secs(3);
        assert_eq!(default_grace(ttl), ms(1000));
        assert!(check_grace(ttl, ms(32)).is_ok());
        assert!(check_grace(ttl, ms(1500)).is_ok());
        assert!(check_grace(ttl, ms(31)).is_err());
        assert!(check_grace(ttl, ms(1501)).is_err());
        assert!(check_grace(ttl, default_grace(ttl)).is_ok());
        // The default is valid for every valid ttl.
        for ttl in [ms(10), ms(11), ms(1000), Duration::from_secs(86_400)] {
            assert!(check_grace(ttl, default_grace(ttl)).is_ok(), "{ttl:?}");
        }
    }

    /// With the default grace, failed renewals are retried over one whole
    /// renewal period before the token fires.
    #[test]
    fn the_default_grace_leaves_a_renewal_period_of_retries() {
        let ttl = Duration::from_secs(3);
        let deadline = ttl - default_grace(ttl);
        let mut at = renew_period(ttl);
        let mut attempts = vec![at];
        for failures in 1.. {
            at += retry_delay(ttl, failures);
            if at >= deadline {
                break;
            }
            attempts.push(at);
        }
        assert_eq!(attempts, [ms(1000), ms(1100), ms(1300), ms(1700)]);
        assert_eq!(deadline - renew_period(ttl), renew_period(ttl));
    }

    #[test]
    fn the_renew_window_is_the_period_unless_the_grace_is_larger() {
        let ttl = Duration::from_secs(3);
        assert_eq!(renew_window(ttl, default_grace(ttl)), ms(1000));
        assert_eq!(renew_window(ttl, margin(ttl)), ms(1000));
        assert_eq!(renew_window(ttl, ms(1500)), ms(500));
    }

    #[test]
    fn retries_back_off_between_bounds() {
        let ttl = Duration::from_secs(3);
        let delays: Vec<Duration> = (1..=6).map(|f| retry_delay(ttl, f)).collect();
        assert_eq!(
            delays,
            [ms(100), ms(200), ms(400), ms(500), ms(500), ms(500)]
        );
        assert_eq!(retry_delay(ms(10), 1), ms(1));
        assert_eq!(retry_delay(Duration::from_secs(86_400), 1), ms(500));
        assert_eq!(retry_delay(ttl, u32::MAX), ms(500));
    }

    #[test]
    fn waiters_poll_a_tenth_of_the_ttl_within_bounds_with_jitter() {
        let ttl = Duration::from_secs(3);
        assert_eq!(wait_poll(ttl, 0.5), ms(300));
        assert_eq!(wait_poll(ttl, 0.0), ms(240));
        assert_eq!(wait_poll(ttl, 1.0), ms(360));
        assert_eq!(wait_poll(ms(10), 0.5), ms(10));
        assert_eq!(wait_poll(Duration::from_secs(90), 0.5), ms(1000));
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_never_outlive_the_deadline() {
        let ttl = Duration::from_secs(3);
        let now = Instant::now();
        assert_eq!(renew_timeout(ttl, now + ms(5000), now), ms(1000));
        assert_eq!(renew_timeout(ttl, now + ms(268), now), ms(268));
        assert_eq!(renew_timeout(ttl, now, now + ms(1)), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_passes_by_either_clock_and_only_grows() {
        let ttl = Duration::from_secs(3);
        let sent = Stamp::now();
        let mut deadline = Deadline::after(sent, ttl, margin(ttl));
        assert_eq!(deadline.mono - sent.mono, ms(2968));
        let default = Deadline::after(sent, ttl, default_grace(ttl));
        assert_eq!(default.mono - sent.mono, ms(2000));
        assert!(!deadline.passed(sent));
        let later = Stamp {
            mono: sent.mono + ms(2968),
            wall: sent.wall,
        };
        assert!(deadline.passed(later), "by the monotonic clock");
        let suspended = Stamp {
            mono: sent.mono,
            wall: sent.wall + ms(2968),
        };
        assert!(deadline.passed(suspended), "by the wall clock");
        let before = deadline.mono;
        deadline.extend(sent, ms(10), margin(ms(10)));
        assert_eq!(deadline.mono, before, "a shorter renewal never shortens it");
    }
}
