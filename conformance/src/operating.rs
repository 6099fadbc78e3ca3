//! What an operator does ([`Backend::list`], [`Backend::force_release`],
//! [`Backend::force_release_now`]): the `operating` group. A backend
//! without them must refuse them with `Error::Unsupported`, as
//! [`Caps`](crate::Caps) says.

use leasehold::{Backend, Error};
use tokio::time::{Instant, sleep, timeout};

use crate::elections::SLACK;
use crate::support::{LONG, TTL, acquire, acquired, lease, ms, release, unique};
use crate::{Naming, Subject};

/// `force_release` evicts whoever holds a lease, with a lock
/// delay. The holder's token fires at its next renewal (within ttl/3); nobody
/// is granted the name before the expiry the server last set (not even
/// after the evicted holder's own release), while `inspect` reports it
/// `forced` with the fence kept; then the next holder gets a larger fence.
/// A forced or free name answers `false`.
pub async fn force_release_keeps_a_lock_delay<S: Subject>(s: &S) {
    if !s.caps().lock_delay {
        return;
    }
    let name = unique("forced");
    let ttl = ms(3_000); // renewed every second
    let b = s.backend();
    let sent = Instant::now();
    let guard = lease(s, "holder-a")
        .try_acquire(&name, ttl)
        .await
        .unwrap()
        .expect("free");
    let evicted = guard.fencing_token();
    sleep(ttl / 2).await; // renewed once: the server's expiry moved on
    assert!(b.force_release(&name).await.unwrap(), "it was held");
    let forced_at = Instant::now();
    let asked = Instant::now();
    let info = b.inspect(&name).await.unwrap().expect("a record");
    let left = info.expires_in.expect("kept from new holders");
    assert!(info.forced && info.is_held(), "{info:?}");
    assert_eq!(info.fencing_token, evicted, "the fence is kept: {info:?}");
    // The expiry the server set is no sooner than this (it answered after `asked`).
    let held_until = (sent + ttl).max(asked + left);
    let bound = ttl / 3 + ms(500); // slack for a loaded machine
    timeout(bound, guard.token().cancelled())
        .await
        .unwrap_or_else(|_| panic!("token not cancelled within {bound:?} of the eviction"));
    eprintln!("eviction noticed after {:?}", forced_at.elapsed());
    assert!(!guard.is_valid());
    assert!(!b.force_release(&name).await.unwrap(), "forced already");
    guard.release().await.unwrap(); // frees nothing
    let info = b.inspect(&name).await.unwrap().expect("a record");
    assert!(info.forced && info.is_held(), "after its release: {info:?}");
    let next = take_when_free(&b, &name, forced_at + s.expiry(ttl) + SLACK).await;
    let early = ms(20); // clocks that round to the millisecond
    assert!(
        Instant::now() + early >= held_until,
        "granted {:?} before the expiry the server last set",
        held_until.saturating_duration_since(Instant::now())
    );
    if s.caps().fencing {
        assert!(next > evicted, "fence {next:?} after {evicted:?}");
    }
    let info = b.inspect(&name).await.unwrap().expect("a record");
    assert!(!info.forced && info.holder == "holder-b", "{info:?}");
    release(&b, &name, "holder-b", next).await;
    assert!(!b.force_release(&name).await.unwrap(), "released");
    let never = unique("forced-never");
    assert!(!b.force_release(&never).await.unwrap());
    assert!(matches!(
        b.force_release("").await,
        Err(Error::InvalidName { .. })
    ));
}

/// `b.acquire` of `name` by `holder-b` every 20 ms until it is granted (by
/// `deadline`); its fencing token.
pub(crate) async fn take_when_free(b: &impl Backend, name: &str, deadline: Instant) -> Option<u64> {
    loop {
        if let Some(fence) = acquire(b, name, "holder-b", LONG).await {
            return fence;
        }
        assert!(Instant::now() < deadline, "{name} still refused");
        sleep(ms(20)).await;
    }
}

/// `force_release_now` ends a lease at once, whoever holds it,
/// also one kept by `force_release`'s lock delay: the next acquisition is
/// granted at once with a larger fence, the evicted holder's token fires
/// at its next renewal, and its release does not end the next holder's
/// lease. A free name answers `false`.
pub async fn force_release_now_hands_over_at_once<S: Subject>(s: &S) {
    let b = s.backend();
    let name = unique("forced-now");
    if !s.caps().force_now {
        let answer = b.force_release_now(&name).await;
        assert!(
            matches!(answer, Err(Error::Unsupported { .. })),
            "{answer:?}"
        );
        return;
    }
    let ttl = ms(1_500);
    let guard = lease(s, "holder-a")
        .try_acquire(&name, ttl)
        .await
        .unwrap()
        .expect("free");
    let evicted = guard.fencing_token();
    assert!(b.force_release_now(&name).await.unwrap(), "it was held");
    let forced_at = Instant::now();
    let next = acquired(&b, &name, "holder-b", LONG).await;
    if s.caps().fencing {
        assert!(next > evicted, "fence {next:?} after {evicted:?}");
    }
    let bound = ttl / 3 + ms(500);
    timeout(bound, guard.token().cancelled())
        .await
        .unwrap_or_else(|_| panic!("token not cancelled within {bound:?} of the eviction"));
    eprintln!("eviction noticed after {:?}", forced_at.elapsed());
    guard.release().await.unwrap();
    assert!(acquire(&b, &name, "holder-c", TTL).await.is_none());
    if s.caps().lock_delay {
        assert!(b.force_release(&name).await.unwrap());
        assert!(b.force_release_now(&name).await.unwrap(), "a forced lease");
        let last = acquired(&b, &name, "holder-c", TTL).await;
        if s.caps().fencing {
            assert!(last > next, "fence {last:?} after {next:?}");
        }
        release(&b, &name, "holder-c", last).await;
    } else {
        release(&b, &name, "holder-b", next).await;
    }
    assert!(!b.force_release_now(&name).await.unwrap(), "released");
    assert!(matches!(
        b.force_release_now("").await,
        Err(Error::InvalidName { .. })
    ));
}

/// `list` shows every held lease with its holder; a backend that keeps
/// released leases (with expiry and fencing) lists them as not held.
pub async fn list_shows_held_and_released_leases<S: Subject>(s: &S) {
    let (kept, freed) = (unique("listed-held"), unique("listed-freed"));
    let b = s.backend();
    let kept_fence = acquired(&b, &kept, "holder-a", LONG).await;
    let freed_fence = acquired(&b, &freed, "holder-b", LONG).await;
    release(&b, &freed, "holder-b", freed_fence).await;
    let listed = b.list().await.expect("list");
    let find = |name: &str| listed.iter().find(|l| l.name == name);
    let held = find(&kept).unwrap_or_else(|| panic!("{kept} not listed"));
    assert!(held.is_held(), "{held:?}");
    assert_eq!(held.fencing_token, kept_fence);
    if s.caps().leader == Naming::Holder {
        // `PgAdvisory` names the session instead of the holder.
        assert_eq!(held.holder, "holder-a");
    }
    let inspected = b.inspect(&kept).await.expect("inspect").expect("a record");
    assert_eq!(
        (
            &inspected.holder,
            inspected.fencing_token,
            inspected.is_held()
        ),
        (&held.holder, held.fencing_token, true),
        "list and inspect agree"
    );
    match find(&freed) {
        Some(info) => assert!(!info.is_held(), "{info:?}"),
        None => assert!(
            !s.keeps_released(),
            "{freed}: a backend that keeps fences keeps released leases"
        ),
    }
    release(&b, &kept, "holder-a", kept_fence).await;
}
