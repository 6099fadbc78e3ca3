//! `Redis`'s round-three features, on one server
//! and on a Redis Cluster: schedule slots by Redis `TIME` and the ledger
//! beside the fence, published values, the lock delay of a forced release,
//! `HeldElsewhere`'s `PTTL`, and `set_fenced` for the application's keys.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lease_tests::unique;
use leasehold::backend::Redis;
use leasehold::{Acquired, Acquisition, Backend, Error, Grant, OncePer, Request};
use tokio::time::{Instant, sleep};

const HOUR: Duration = Duration::from_secs(3600);
const TTL: Duration = Duration::from_secs(30);

async fn single() -> Option<Redis> {
    lease_tests::redis().await?;
    Some(Redis::connect(&lease_tests::redis_url()).await.unwrap())
}

async fn cluster() -> Option<Redis> {
    let cluster = lease_tests::clusters::redis_cluster()?;
    Some(Redis::cluster(cluster.nodes()).await.unwrap())
}

fn granted(answer: Acquired) -> Grant {
    match answer {
        Acquired::Granted(grant) => grant,
        other => panic!("not granted: {other:?}"),
    }
}

fn once(name: &str, holder: &str, ttl: Duration, once_per: OncePer) -> Request<'static> {
    let (name, holder) = (leak(name), leak(holder));
    Request::new(name, holder, ttl).once_per(once_per)
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

fn acq<'a>(name: &'a str, holder: &'a str, grant: &Grant) -> Acquisition<'a> {
    Acquisition::new(name, holder, grant.fencing_token)
}

/// The slot is the server's hour (this host's clock is close to it), and a
/// second claim of it is refused whoever holds the lease, also after the
/// release, the expiry and by the same holder; a plain acquire ignores it.
async fn once_per_refuses_the_same_slot(b: &Redis) {
    let (name, a, c) = (unique("slot"), unique("a"), unique("c"));
    let hour = OncePer::new(HOUR);
    let first = granted(b.acquire_with(once(&name, &a, TTL, hour)).await.unwrap());
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let here = now.as_secs() / 3600;
    let slot = first.slot.expect("a slot");
    assert!(slot.abs_diff(here) <= 1, "slot {slot}, this host's {here}");
    assert_eq!(first.last_slot, None);
    for holder in [&c, &a] {
        let again = b
            .acquire_with(once(&name, holder, TTL, hour))
            .await
            .unwrap();
        assert_eq!(again, Acquired::AlreadyRan { slot }, "{holder}");
    }
    b.release(acq(&name, &a, &first)).await.unwrap();
    let again = b.acquire_with(once(&name, &c, TTL, hour)).await.unwrap();
    assert_eq!(again, Acquired::AlreadyRan { slot });
    let info = b.inspect(&name).await.unwrap().unwrap();
    assert_eq!((info.slot, info.expires_in), (Some(slot), None));

    // Expiry: the ledger stays.
    let short = Duration::from_millis(100);
    let plain = b.acquire(&name, &c, short).await.unwrap().unwrap();
    assert!(plain.fencing_token > first.fencing_token);
    assert_eq!(plain.slot, None);
    sleep(short * 3).await;
    assert_eq!(b.inspect(&name).await.unwrap().unwrap().slot, Some(slot));
    let again = b.acquire_with(once(&name, &c, TTL, hour)).await.unwrap();
    assert_eq!(again, Acquired::AlreadyRan { slot });

    // A shorter period's slot is larger: claimed, with the last one.
    let minute = OncePer::new(Duration::from_secs(60));
    let next = granted(b.acquire_with(once(&name, &c, TTL, minute)).await.unwrap());
    assert!(next.slot.unwrap() > slot);
    assert_eq!(next.last_slot, Some(slot));
}

/// With `retry_failed`, a grant does not record its slot: a failed run's
/// slot runs again; `release_ran` records it (never lower, even after the
/// lease was lost) and releases.
async fn retry_failed_records_only_a_run(b: &Redis) {
    let (name, a, c) = (unique("retry"), unique("a"), unique("c"));
    let retry = OncePer::new(HOUR).retry_failed(true);
    let failed = granted(b.acquire_with(once(&name, &a, TTL, retry)).await.unwrap());
    let slot = failed.slot.unwrap();
    assert_eq!(b.inspect(&name).await.unwrap().unwrap().slot, None);
    b.release(acq(&name, &a, &failed)).await.unwrap();
    let run = granted(b.acquire_with(once(&name, &c, TTL, retry)).await.unwrap());
    assert_eq!(run.slot, Some(slot));
    b.release_ran(acq(&name, &c, &run), slot).await.unwrap();
    let info = b.inspect(&name).await.unwrap().unwrap();
    assert_eq!((info.slot, info.expires_in), (Some(slot), None), "released");
    let again = b.acquire_with(once(&name, &a, TTL, retry)).await.unwrap();
    assert_eq!(again, Acquired::AlreadyRan { slot });

    // A stale acquisition's run is recorded, without touching the holder;
    // a lower slot never lowers the ledger.
    let holder = b.acquire(&name, &a, TTL).await.unwrap().unwrap();
    b.release_ran(acq(&name, &c, &run), slot + 2).await.unwrap();
    b.release_ran(acq(&name, &c, &run), slot + 1).await.unwrap();
    let info = b.inspect(&name).await.unwrap().unwrap();
    assert_eq!(
        (info.slot, info.holder.as_str()),
        (Some(slot + 2), a.as_str())
    );
    assert!(b.renew(acq(&name, &a, &holder), TTL).await.unwrap());
}

/// A value is set with the grant, published by the holder only, and ends
/// with the term (release, expiry, force) and with a grant without one.
async fn a_value_lives_with_its_term(b: &Redis) {
    let (name, a, c) = (unique("value"), unique("a"), unique("c"));
    let value = |v| Request::new(leak(&name), leak(&a), TTL).value(v);
    let grant = granted(b.acquire_with(value("10.0.0.7:80")).await.unwrap());
    let seen = |info: Option<leasehold::LeaseInfo>| info.unwrap().value;
    assert_eq!(
        seen(b.inspect(&name).await.unwrap()).as_deref(),
        Some("10.0.0.7:80")
    );
    let lease = acq(&name, &a, &grant);
    assert!(b.publish(lease, Some("10.0.0.8:80")).await.unwrap());
    assert_eq!(
        seen(b.inspect(&name).await.unwrap()).as_deref(),
        Some("10.0.0.8:80")
    );
    // Not the holder, or not this acquisition: refused, nothing changes.
    let stale = Acquisition::new(&name, &a, grant.fencing_token.map(|f| f - 1));
    for other in [Acquisition::new(&name, &c, grant.fencing_token), stale] {
        assert!(!b.publish(other, Some("x")).await.unwrap());
        assert!(!b.publish(other, None).await.unwrap());
    }
    assert_eq!(
        seen(b.inspect(&name).await.unwrap()).as_deref(),
        Some("10.0.0.8:80")
    );
    assert!(b.publish(lease, None).await.unwrap());
    assert_eq!(seen(b.inspect(&name).await.unwrap()), None);
    assert!(b.publish(lease, Some("")).await.unwrap());
    assert_eq!(seen(b.inspect(&name).await.unwrap()).as_deref(), Some(""));
    // An idempotent re-acquire without a value clears it.
    let same = b.acquire(&name, &a, TTL).await.unwrap().unwrap();
    assert_eq!(same.fencing_token, grant.fencing_token);
    assert_eq!(seen(b.inspect(&name).await.unwrap()), None);
    // Release.
    granted(b.acquire_with(value("v1")).await.unwrap());
    b.release(lease).await.unwrap();
    assert_eq!(seen(b.inspect(&name).await.unwrap()), None);
    // Expiry, then another holder's grant.
    let short = Request::new(leak(&name), leak(&a), Duration::from_millis(100)).value("v2");
    let grant = granted(b.acquire_with(short).await.unwrap());
    sleep(Duration::from_millis(300)).await;
    assert_eq!(seen(b.inspect(&name).await.unwrap()), None, "expired");
    let other = b.acquire(&name, &c, TTL).await.unwrap().unwrap();
    assert!(other.fencing_token > grant.fencing_token);
    assert_eq!(seen(b.inspect(&name).await.unwrap()), None);
    // A forced release.
    assert!(b.publish(acq(&name, &c, &other), Some("v3")).await.unwrap());
    assert!(b.force_release(&name).await.unwrap());
    let info = b.inspect(&name).await.unwrap().unwrap();
    assert!(info.forced && info.value.is_none(), "{info:?}");
    assert!(!b.publish(acq(&name, &c, &other), Some("v4")).await.unwrap());
    // Too long.
    let long = "x".repeat(4097);
    let err = b.acquire_with(value(leak(&long))).await.unwrap_err();
    assert!(matches!(err, Error::InvalidValue { .. }), "{err:?}");
}

/// `force_release`: the holder's renewals fail, nobody is granted the name
/// before the lock's expiry (`inspect` says `forced`), and the next grant
/// has a larger fence.
async fn a_forced_release_keeps_a_lock_delay(b: &Redis) {
    let (name, a, c) = (unique("delay"), unique("a"), unique("c"));
    let ttl = Duration::from_millis(1500);
    let first = b.acquire(&name, &a, ttl).await.unwrap().unwrap();
    let forced_at = Instant::now();
    assert!(b.force_release(&name).await.unwrap());
    assert!(!b.force_release(&name).await.unwrap(), "forced already");
    let info = b.inspect(&name).await.unwrap().unwrap();
    let left = info.expires_in.expect("kept until its expiry");
    assert!(info.forced && info.holder.is_empty(), "{info:?}");
    assert!(left <= ttl && left > ttl / 2, "{left:?}");
    assert_eq!(info.fencing_token, first.fencing_token);
    assert!(!b.renew(acq(&name, &a, &first), ttl).await.unwrap());
    b.release(acq(&name, &a, &first)).await.unwrap(); // no effect
    let grant = loop {
        match b
            .acquire_with(Request::new(leak(&name), leak(&c), TTL))
            .await
            .unwrap()
        {
            Acquired::Granted(grant) => break grant,
            Acquired::HeldElsewhere { expires_in } => {
                let wait = expires_in.expect("the PTTL");
                assert!(wait <= ttl, "{wait:?}");
                sleep(wait.min(Duration::from_millis(100))).await;
            }
            other => panic!("{other:?}"),
        }
    };
    // The delay: at least what `inspect` reported, less its round trip.
    assert!(
        forced_at.elapsed() + Duration::from_millis(100) >= left,
        "granted {:?} after the force, {left:?} before the expiry",
        forced_at.elapsed()
    );
    assert!(grant.fencing_token > first.fencing_token);
    let info = b.inspect(&name).await.unwrap().unwrap();
    assert!(!info.forced && info.holder == c, "{info:?}");
}

/// `force_release_now`: the lock is gone at once (also a force-released
/// one), the fence stays.
async fn force_release_now_frees_at_once(b: &Redis) {
    let (name, a, c) = (unique("now"), unique("a"), unique("c"));
    assert!(!b.force_release_now(&name).await.unwrap(), "never held");
    let first = b.acquire(&name, &a, TTL).await.unwrap().unwrap();
    assert!(b.force_release_now(&name).await.unwrap());
    assert!(!b.renew(acq(&name, &a, &first), TTL).await.unwrap());
    let info = b.inspect(&name).await.unwrap().unwrap();
    assert!(!info.forced && info.expires_in.is_none(), "{info:?}");
    let second = b.acquire(&name, &c, TTL).await.unwrap().unwrap();
    assert!(second.fencing_token > first.fencing_token);
    assert!(b.force_release(&name).await.unwrap());
    assert!(
        b.force_release_now(&name).await.unwrap(),
        "the delay ends now"
    );
    let third = b.acquire(&name, &a, TTL).await.unwrap().unwrap();
    assert!(third.fencing_token > second.fencing_token);
}

/// `HeldElsewhere` carries the lock's `PTTL`.
async fn held_elsewhere_says_when_it_expires(b: &Redis) {
    let (name, a, c) = (unique("pttl"), unique("a"), unique("c"));
    let ttl = Duration::from_secs(10);
    b.acquire(&name, &a, ttl).await.unwrap().unwrap();
    let answer = b
        .acquire_with(Request::new(leak(&name), leak(&c), TTL))
        .await
        .unwrap();
    let Acquired::HeldElsewhere {
        expires_in: Some(left),
    } = answer
    else {
        panic!("{answer:?}");
    };
    assert!(
        left <= ttl && left > ttl - Duration::from_secs(3),
        "{left:?}"
    );
}

/// A stale holder's write is refused, a newer (or the same) token's
/// accepted; tokens compare exactly up to `u64::MAX`.
async fn set_fenced_refuses_an_older_token(b: &Redis) {
    let key = format!("{{{}}}:report", unique("fenced"));
    assert!(b.set_fenced(&key, "by 5", 5).await.unwrap());
    assert!(!b.set_fenced(&key, "by 4", 4).await.unwrap(), "stale");
    assert_eq!(get(b, &key).await, "by 5");
    assert!(b.set_fenced(&key, "by 5 again", 5).await.unwrap());
    assert!(b.set_fenced(&key, "by 10", 10).await.unwrap());
    assert!(
        !b.set_fenced(&key, "by 9", 9).await.unwrap(),
        "9 < 10, not by text"
    );
    assert_eq!(get(b, &key).await, "by 10");
    assert!(b.set_fenced(&key, "max", u64::MAX).await.unwrap());
    assert!(!b.set_fenced(&key, "max - 1", u64::MAX - 1).await.unwrap());
    assert_eq!(get(b, &key).await, "max");
    // On a cluster, a key without a hash tag has its token elsewhere.
    if let Some(cluster) = lease_tests::clusters::redis_cluster().filter(|_| b.is_cluster()) {
        let plain = "set-fenced-without-a-tag";
        let token_key = Redis::fencing_token_key(plain);
        assert_ne!(cluster.keyslot(plain), cluster.keyslot(&token_key));
        let refused = b.set_fenced(plain, "x", 1).await;
        assert!(matches!(refused, Err(Error::Redis(_))), "{refused:?}");
    }
    // With a lease's own tokens: a holder that lost its lease.
    let name = unique("fenced-lease");
    let (a, c) = (unique("a"), unique("c"));
    let old = b.acquire(&name, &a, TTL).await.unwrap().unwrap();
    assert!(b.force_release_now(&name).await.unwrap());
    let new = b.acquire(&name, &c, TTL).await.unwrap().unwrap();
    let data = format!("{{{name}}}:data");
    assert!(
        b.set_fenced(&data, "new", new.fencing_token.unwrap())
            .await
            .unwrap()
    );
    assert!(
        !b.set_fenced(&data, "old", old.fencing_token.unwrap())
            .await
            .unwrap()
    );
    assert_eq!(get(b, &data).await, "new");
}

/// `GET key`, on the server or cluster of `b`.
async fn get(b: &Redis, key: &str) -> String {
    let get = redis::cmd("GET").arg(key).clone();
    if b.is_cluster() {
        let nodes = lease_tests::clusters::redis_cluster().unwrap().nodes();
        let client = redis::cluster::ClusterClient::new(nodes).unwrap();
        let mut c = client.get_async_connection().await.unwrap();
        return get.query_async(&mut c).await.unwrap();
    }
    let client = redis::Client::open(lease_tests::redis_url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    get.query_async(&mut c).await.unwrap()
}

macro_rules! redis_tests {
    ($($subject:ident),*) => {$(
        mod $subject {
            redis_tests!(@each $subject,
                once_per_refuses_the_same_slot,
                retry_failed_records_only_a_run,
                a_value_lives_with_its_term,
                a_forced_release_keeps_a_lock_delay,
                force_release_now_frees_at_once,
                held_elsewhere_says_when_it_expires,
                set_fenced_refuses_an_older_token);
        }
    )*};
    (@each $subject:ident, $($test:ident),*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            lease_tests::init_tracing();
            if let Some(b) = super::$subject().await {
                super::$test(&b).await;
            }
        }
    )*};
}

redis_tests!(single, cluster);

/// A published value wakes a waiter of the name (pub/sub), as a release does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_wakes_waiters_and_observers() {
    let Some(b) = single().await else { return };
    let (name, a) = (unique("push"), unique("a"));
    let grant = b.acquire(&name, &a, TTL).await.unwrap().unwrap();
    // Subscribed once the first wake-up came (a poll, at worst).
    b.released(&name, Duration::from_millis(200)).await;
    sleep(Duration::from_millis(300)).await;
    let woken = b.released(&name, Duration::from_secs(30));
    let lease = leasehold::Lease::with_holder(b.clone(), "observer");
    let mut seen = lease.observe(&name);
    seen.wait_for(|o| o.holder.as_deref() == Some(a.as_str()))
        .await
        .unwrap();
    assert!(
        b.publish(acq(&name, &a, &grant), Some("here"))
            .await
            .unwrap()
    );
    tokio::time::timeout(Duration::from_secs(5), woken)
        .await
        .expect("woken by the publish");
    let got = tokio::time::timeout(
        Duration::from_millis(900), // less than the observer's 1 s poll
        seen.wait_for(|o| o.value.as_deref() == Some("here")),
    )
    .await;
    assert!(
        got.is_ok(),
        "the observer did not learn of the value by push"
    );
}

fn unsupported<T>(r: Result<T, Error>) -> bool {
    matches!(r, Err(Error::Unsupported { .. }))
}

/// The Go locker's protocol keeps no ledger and no value: those calls are
/// `Unsupported`; a forced release empties the lock and keeps its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_locker_protocol_says_what_it_cannot_do() {
    let Some(b) = single().await else { return };
    let b = b
        .with_prefix("lease-go-features:")
        .unwrap()
        .with_go_locker_protocol();
    let (name, a, c) = (unique("go"), unique("a"), unique("c"));
    let req = Request::new(leak(&name), leak(&a), TTL);
    assert!(unsupported(
        b.acquire_with(req.once_per(OncePer::new(HOUR))).await
    ));
    assert!(unsupported(b.acquire_with(req.value("v")).await));
    let grant = granted(b.acquire_with(req).await.unwrap());
    let lease = acq(&name, &a, &grant);
    assert!(unsupported(b.publish(lease, Some("v")).await));
    assert!(unsupported(b.release_ran(lease, 1).await));
    assert!(b.force_release(&name).await.unwrap());
    assert!(!b.renew(lease, TTL).await.unwrap());
    let info = b.inspect(&name).await.unwrap().unwrap();
    assert!(info.forced && info.expires_in.is_some(), "{info:?}");
    assert!(
        b.acquire(&name, &c, TTL).await.unwrap().is_none(),
        "the delay"
    );
    assert!(b.force_release_now(&name).await.unwrap());
    assert!(b.acquire(&name, &c, TTL).await.unwrap().is_some());
}
