//! Backend-specific behaviour of `PgAdvisory` and `Redis` (the Go `lock`
//! package's two backends), driven through `leasehold::Lease` against real
//! servers. What every backend shares is checked by the conformance suite;
//! this file checks what only these two do: sqlx key interop, connection
//! death, cancelled acquires, pool hygiene and runtime shutdown (an ending
//! app frees its locks; no drop panics) for `PgAdvisory`; key
//! encoding, keys deleted or connections killed behind the holder's back,
//! an unreachable server and fencing for `Redis`; the tokens of
//! `PgAdvisory::with_fencing`.
//!
//! Timings are asserted with generous slack (a loaded 2-core machine) and
//! printed, so `--nocapture` shows the measured values.

use std::time::{Duration, Instant};

use leasehold::LeaseGuard;

mod pg_advisory;
mod pg_fencing;
mod pg_runtimes;
mod redis_backend;

/// Slack added to every "within" bound.
pub(crate) const SLACK: Duration = Duration::from_millis(500);

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Wait (at most `limit`) for the guard's token to be cancelled; how long it took.
pub(crate) async fn cancelled_within(guard: &LeaseGuard, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    tokio::time::timeout(limit, guard.token().cancelled())
        .await
        .ok()
        .map(|()| start.elapsed())
}

/// Poll `f` every 10 ms until it is true or `limit` passes; how long it took.
pub(crate) async fn eventually<F, Fut>(limit: Duration, mut f: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(ms(10)).await;
    }
}
