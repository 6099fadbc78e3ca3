//! What the properties share, for `extra` properties of your own too
//! ([`conformance!`](crate::conformance)): unique names, short calls on a
//! backend that must succeed (a failure panics, saying which call), the
//! durations the properties use, and [`lapse`].

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use leasehold::{Acquisition, Backend, Grant, Lease};
use tokio::time::sleep;

use crate::Subject;

/// The ttl of most properties' leases.
pub const TTL: Duration = Duration::from_secs(2);
/// A ttl no property waits out.
pub const LONG: Duration = Duration::from_secs(30);

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A lease name (or holder) no other test uses, on any process sharing
/// the server: `prefix`, a dash, and 16 hex digits of a hash of this
/// process, the time and a counter.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = (
        std::process::id(),
        SystemTime::now(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
    );
    format!("{prefix}-{:016x}", RandomState::new().hash_one(seed))
}

/// A `Lease` on `s`'s backend for `holder`: one replica.
pub fn lease<S: Subject>(s: &S, holder: &str) -> Lease {
    Lease::with_holder(s.backend(), holder)
}

/// The fencing token of the `n`th acquisition of a name on `s`: `n`, or
/// `None` without fencing.
pub fn fence<S: Subject>(s: &S, n: u64) -> Option<u64> {
    s.caps().fencing.then_some(n)
}

/// The acquisition `grant` was for.
pub fn acq<'a>(name: &'a str, holder: &'a str, grant: &Grant) -> Acquisition<'a> {
    Acquisition::new(name, holder, grant.fencing_token)
}

/// `b.acquire`: `None` when another holder has the lease, else the fencing
/// token of the grant.
pub async fn acquire(
    b: &impl Backend,
    name: &str,
    holder: &str,
    ttl: Duration,
) -> Option<Option<u64>> {
    let grant = b
        .acquire(name, holder, ttl)
        .await
        .unwrap_or_else(|e| panic!("acquire {name:?} for {holder:?}: {e}"));
    grant.map(|g| g.fencing_token)
}

/// [`acquire`] of a lease that must be free; its fencing token.
pub async fn acquired(b: &impl Backend, name: &str, holder: &str, ttl: Duration) -> Option<u64> {
    acquire(b, name, holder, ttl)
        .await
        .unwrap_or_else(|| panic!("{holder} could not acquire {name}"))
}

/// `b.renew` of the acquisition of `name` by `holder` that got `fence`.
pub async fn renew(
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
pub async fn release(b: &impl Backend, name: &str, holder: &str, fence: Option<u64>) {
    b.release(Acquisition::new(name, holder, fence))
        .await
        .expect("release");
}

/// Let the lease `holder` has on `name` (acquired with `ttl`, not renewed)
/// lapse, so that another holder can take it over.
///
/// With expiry: wait out the ttl, with a wide margin (the server's clock
/// decides). Without (`PgAdvisory`): the difference is that the lease
/// outlives its ttl — after the same wait it is still held and still
/// renewable by `holder` — and it is the end of the holder's session that
/// frees it.
pub async fn lapse<S: Subject>(s: &S, lease: Acquisition<'_>, ttl: Duration) {
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
