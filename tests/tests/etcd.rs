//! `Etcd` specifics on the 3-member cluster of this test binary: operating
//! it (`inspect`, `list`, `force_release`), what a revocation of a held
//! lease's etcd lease or a deleted key does, and what the watch tells
//! holders and waiters. The conformance suite runs on the same kind of
//! cluster (`conformance.rs`, `etcd::*`).

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use lease_tests::unique;
use leasehold::backend::Etcd;
use leasehold::{
    Acquired, Acquisition, Backend, Grant, Leadership, Lease, LeaseInfo, OncePer, Request,
};

async fn etcd() -> Option<Etcd> {
    let cluster = lease_tests::clusters::etcd_cluster()?;
    let prefix = format!("{}/", unique("lease-etcd"));
    Some(
        Etcd::connect(cluster.endpoints())
            .await
            .unwrap()
            .with_prefix(prefix)
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_list_and_force_release_now() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    let ttl = Duration::from_secs(30);
    let a = etcd.acquire("a", "pod-a", ttl).await.unwrap().unwrap();
    let b = etcd.acquire("b", "pod-b", ttl).await.unwrap().unwrap();
    assert!(b.fencing_token > a.fencing_token);

    let listed = etcd.list().await.unwrap();
    let names: Vec<(&str, &str, Option<u64>)> = listed
        .iter()
        .map(|i| (i.name.as_str(), i.holder.as_str(), i.fencing_token))
        .collect();
    assert_eq!(
        names,
        [
            ("a", "pod-a", a.fencing_token),
            ("b", "pod-b", b.fencing_token)
        ]
    );
    for info in &listed {
        let left = info.expires_in.expect("held");
        assert!(left > Duration::from_secs(20) && left <= ttl, "{info:?}");
    }
    assert_eq!(etcd.inspect("a").await.unwrap().as_ref(), listed.first());
    assert_eq!(etcd.inspect("never").await.unwrap(), None);

    assert!(etcd.force_release_now("a").await.unwrap());
    assert!(
        !etcd.force_release_now("a").await.unwrap(),
        "not held any more"
    );
    assert_eq!(etcd.inspect("a").await.unwrap(), None);
    assert!(
        !etcd
            .renew(Acquisition::new("a", "pod-a", a.fencing_token), ttl)
            .await
            .unwrap(),
        "the evicted holder's renewal finds its etcd lease gone"
    );
    let again = etcd.acquire("a", "pod-c", ttl).await.unwrap().unwrap();
    assert!(again.fencing_token > b.fencing_token);
    assert_eq!(etcd.list().await.unwrap().len(), 2);
    assert!(etcd.force_release_now("a").await.unwrap());
    assert!(etcd.force_release_now("b").await.unwrap());
    assert_eq!(etcd.list().await.unwrap(), []);
}

/// `force_release` keeps a lock delay: the holder's renewals fail at once
/// (its token fires by the watch), nobody acquires until the etcd lease
/// expires, `inspect` says forced, and the next holder gets a larger
/// fencing token; `force_release_now` then frees a forced name at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_keeps_a_lock_delay() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    let ttl = Duration::from_secs(3);
    let lease = Lease::with_holder(etcd.clone(), "pod-a");
    let job = lease.elect("job", ttl);
    job.proclaim("10.0.0.1:80").unwrap();
    let term = tokio::time::timeout(PROMPT, job.leading()).await.unwrap();
    let fence = term.fencing_token();
    // Published with the acquisition, or just after it.
    let published = Instant::now() + PROMPT;
    while etcd.inspect("job").await.unwrap().unwrap().value.is_none() {
        assert!(Instant::now() < published, "the value was not published");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    assert!(etcd.force_release("job").await.unwrap());
    let forced = Instant::now();
    assert!(!etcd.force_release("job").await.unwrap(), "evicted already");
    let info = etcd.inspect("job").await.unwrap().unwrap();
    assert!(info.forced && info.is_held(), "{info:?}");
    assert_eq!((info.holder.as_str(), info.value), ("", None));
    assert_eq!(info.fencing_token, fence, "the fence is kept");
    assert!(
        !etcd
            .renew(Acquisition::new("job", "pod-a", fence), ttl)
            .await
            .unwrap(),
        "the evicted holder's renewal must fail"
    );
    tokio::time::timeout(PROMPT, term.token().cancelled())
        .await
        .expect("the watch must cancel the evicted term's token");
    let other = Lease::with_holder(etcd.clone(), "pod-b");
    assert!(
        other.try_acquire("job", ttl).await.unwrap().is_none(),
        "acquired within the lock delay"
    );
    assert_eq!(etcd.acquire("job", "pod-a", ttl).await.unwrap(), None);
    drop(term);
    drop(job);

    // Free once the etcd lease expires (its ttl, rounded up, plus etcd's
    // expiry sweep), not before the ttl.
    let taken = other
        .acquire("job", ttl, ttl * 3)
        .await
        .unwrap()
        .expect("free once the etcd lease expired");
    let after = forced.elapsed();
    eprintln!("acquired {after:?} after the forced release");
    assert!(taken.fencing_token() > fence);
    assert!(after >= ttl / 2, "no lock delay: acquired after {after:?}");

    // `force_release_now` ends a forced lease too.
    assert!(etcd.force_release("job").await.unwrap());
    assert!(etcd.force_release_now("job").await.unwrap());
    assert_eq!(etcd.inspect("job").await.unwrap(), None);
    assert!(!etcd.force_release("job").await.unwrap(), "not held");
}

/// `inspect` says a lease is held as long as its key keeps others from
/// acquiring it: the etcd lease's TTL is in whole seconds, rounded down, so
/// a key with less than a second left must not be reported free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_says_held_until_the_lease_can_be_taken() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    let ttl = Duration::from_secs(2);
    etcd.acquire("job", "crashed", ttl).await.unwrap().unwrap();
    let limit = Instant::now() + ttl * 5;
    while etcd
        .inspect("job")
        .await
        .unwrap()
        .is_some_and(|i| i.is_held())
    {
        assert!(Instant::now() < limit, "held for good");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        etcd.acquire("job", "next", ttl).await.unwrap().is_some(),
        "inspect said free, yet the key was still there"
    );
}

/// A period no test run crosses the end of: every claim in a test is of
/// one slot.
const YEAR: Duration = Duration::from_secs(366 * 24 * 60 * 60);

fn granted(acquired: Acquired) -> Grant {
    match acquired {
        Acquired::Granted(grant) => grant,
        other => panic!("not granted: {other:?}"),
    }
}

/// `once_per` on etcd: a slot claimed by one holder is refused to another
/// (`AlreadyRan`), whether the first still holds the lease, released it, or
/// let it expire; the ledger never goes back and `inspect` shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_runs_once_across_holders_release_and_expiry() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    let ttl = Duration::from_secs(1);
    let once = |holder| Request::new("job", holder, ttl).once_per(OncePer::new(YEAR));
    let first = granted(etcd.acquire_with(once("pod-a")).await.unwrap());
    let slot = first.slot.expect("a slot");
    assert_eq!(first.last_slot, None, "nothing ran before");
    let by_b = once("pod-b");
    assert_eq!(
        etcd.acquire_with(by_b).await.unwrap(),
        Acquired::AlreadyRan { slot },
        "while pod-a holds it"
    );
    etcd.release(Acquisition::new("job", "pod-a", first.fencing_token))
        .await
        .unwrap();
    assert_eq!(
        etcd.acquire_with(by_b).await.unwrap(),
        Acquired::AlreadyRan { slot },
        "after the release"
    );
    let info = etcd.inspect("job").await.unwrap().expect("the ledger");
    assert_eq!((info.slot, info.expires_in), (Some(slot), None), "{info:?}");

    // A plain acquisition is not refused; left to expire, the ledger stays.
    etcd.acquire("job", "pod-c", ttl).await.unwrap().unwrap();
    let expiry = Instant::now() + Duration::from_secs(10);
    while etcd.inspect("job").await.unwrap().unwrap().is_held() {
        assert!(Instant::now() < expiry, "the etcd lease did not expire");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        etcd.acquire_with(by_b).await.unwrap(),
        Acquired::AlreadyRan { slot },
        "after an expiry"
    );
    // A slot recorded late below the ledger does not lower it.
    let lease = granted(
        etcd.acquire_with(Request::new("job", "pod-b", ttl))
            .await
            .unwrap(),
    );
    etcd.release_ran(
        Acquisition::new("job", "pod-b", lease.fencing_token),
        slot - 3,
    )
    .await
    .unwrap();
    assert_eq!(etcd.inspect("job").await.unwrap().unwrap().slot, Some(slot));
    assert_eq!(
        etcd.acquire_with(by_b).await.unwrap(),
        Acquired::AlreadyRan { slot }
    );
    let listed = etcd.list().await.unwrap();
    assert_eq!(listed.len(), 1, "one name: {listed:?}");
    assert_eq!(
        (listed[0].name.as_str(), listed[0].slot),
        ("job", Some(slot))
    );
}

/// `retry_failed` on etcd: the slot is recorded by `release_ran` only, so
/// a run that failed (a plain release) leaves it to another holder; the
/// record is made even when the key is no longer the acquisition's, and
/// leaves that key alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_failed_records_the_slot_when_the_run_succeeded() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    let ttl = Duration::from_secs(30);
    let retry = OncePer::new(YEAR).retry_failed(true);
    let by = |holder| Request::new("job", holder, ttl).once_per(retry);
    let failed = granted(etcd.acquire_with(by("pod-a")).await.unwrap());
    let slot = failed.slot.unwrap();
    etcd.release(Acquisition::new("job", "pod-a", failed.fencing_token))
        .await
        .unwrap();
    assert_eq!(etcd.inspect("job").await.unwrap(), None, "nothing recorded");

    let retried = granted(etcd.acquire_with(by("pod-b")).await.unwrap());
    assert_eq!(retried.slot, Some(slot), "the failed slot runs again");
    // Taken from pod-b (its run goes on) before it records its success.
    assert!(etcd.force_release_now("job").await.unwrap());
    let next = etcd.acquire("job", "pod-c", ttl).await.unwrap().unwrap();
    etcd.release_ran(
        Acquisition::new("job", "pod-b", retried.fencing_token),
        slot,
    )
    .await
    .unwrap();
    let info = etcd.inspect("job").await.unwrap().unwrap();
    assert_eq!(info.slot, Some(slot), "recorded: {info:?}");
    assert_eq!(
        (info.holder.as_str(), info.fencing_token),
        ("pod-c", next.fencing_token),
        "pod-c's lease was left alone"
    );
    etcd.release(Acquisition::new("job", "pod-c", next.fencing_token))
        .await
        .unwrap();
    assert_eq!(
        etcd.acquire_with(by("pod-d")).await.unwrap(),
        Acquired::AlreadyRan { slot }
    );
}

/// How long a holder or a waiter may take to learn of a change of its key
/// by the watch: about one round trip, with room for a loaded machine —
/// far below the next renewal (`LONG / 3`) or the poll these tests give.
const PROMPT: Duration = Duration::from_secs(3);

/// A ttl whose renewals (every 10 s) are too far apart to explain a prompt
/// cancellation.
const LONG: Duration = Duration::from_secs(30);

/// A poll too long to explain a prompt wake-up.
const POLL: Duration = Duration::from_secs(60);

/// Revoking the etcd lease of a held lease (an operator's `etcdctl lease
/// revoke`, or a resumed etcd leader's revocation, etcd issue #15247)
/// cancels the holder's token at once, by the watch — not at its next
/// renewal, 10 s later — and another holder can acquire at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_etcd_lease_cancels_the_token_at_once() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    let lease = Lease::with_holder(etcd.clone(), "pod-a");
    let guard = lease.try_acquire("job", LONG).await.unwrap().unwrap();
    let mut client = etcd.client().clone();
    let key = client.get(etcd.key("job"), None).await.unwrap();
    let id = key.kvs()[0].lease();
    client.lease_revoke(id).await.unwrap();
    let revoked = Instant::now();
    tokio::time::timeout(PROMPT, guard.token().cancelled())
        .await
        .expect("the watch must cancel the token, not the next renewal");
    eprintln!("token cancelled {:?} after the revoke", revoked.elapsed());
    assert!(!guard.is_valid());
    let other = Lease::with_holder(etcd.clone(), "pod-b");
    let taken = other
        .try_acquire("job", LONG)
        .await
        .unwrap()
        .expect("free after the revoke");
    assert!(taken.fencing_token() > guard.fencing_token());
    taken.release().await.unwrap();
}

/// A key deleted by hand (`etcdctl del`) while its etcd lease lives on:
/// the watch tells the holder, whose renewal then finds the key gone, and
/// its token is cancelled at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_by_hand_cancels_the_token_at_once() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    let lease = Lease::with_holder(etcd.clone(), "pod-a");
    let guard = lease.try_acquire("job", LONG).await.unwrap().unwrap();
    let mut client = etcd.client().clone();
    client.delete(etcd.key("job"), None).await.unwrap();
    let deleted = Instant::now();
    tokio::time::timeout(PROMPT, guard.token().cancelled())
        .await
        .expect("the watch must cancel the token, not the next renewal");
    eprintln!("token cancelled {:?} after the delete", deleted.elapsed());
    assert!(!guard.is_valid());
}

/// A value published with a lease is read by `inspect` while the lease is
/// held, and each change wakes the waiters of its name by the watch (the
/// observers and followers of an election wait there); an acquisition that
/// ended publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_value_wakes_the_waiters() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    subscribed(&etcd).await;
    let request = Request::new("job", "pod-a", LONG).value("10.0.0.1:80");
    let grant = granted(etcd.acquire_with(request).await.unwrap());
    let lease = Acquisition::new("job", "pod-a", grant.fencing_token);
    let value = |info: Option<LeaseInfo>| info.unwrap().value;
    assert_eq!(
        value(etcd.inspect("job").await.unwrap()).as_deref(),
        Some("10.0.0.1:80")
    );
    // Past the acquisition's own event.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for published in [Some("10.0.0.2:80"), None] {
        let waiting = tokio::spawn(etcd.released("job", POLL));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "woken while nothing changed");
        assert!(etcd.publish(lease, published).await.unwrap());
        let sent = Instant::now();
        tokio::time::timeout(PROMPT, waiting)
            .await
            .expect("the watch must wake the waiter, not its poll")
            .unwrap();
        eprintln!("woken {:?} after publishing {published:?}", sent.elapsed());
        assert_eq!(
            value(etcd.inspect("job").await.unwrap()).as_deref(),
            published
        );
    }
    let info = etcd.list().await.unwrap();
    assert_eq!((info.len(), info[0].holder.as_str()), (1, "pod-a"));
    etcd.release(lease).await.unwrap();
    assert!(!etcd.publish(lease, Some("stale")).await.unwrap());
    assert_eq!(
        etcd.inspect("job").await.unwrap(),
        None,
        "no value left behind"
    );
}

/// Whether `state` follows `leader` with `value`.
fn follows(state: &Leadership, leader: &str, value: &str) -> bool {
    matches!(state, Leadership::Following { leader: Some(l), value: Some(v) } if l == leader && v == value)
}

/// An election's follower sees the leader's proclaimed value, and a value
/// proclaimed later (the leader's publication wakes it by the watch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_sees_the_value_the_leader_proclaims() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    let leader = Lease::with_holder(etcd.clone(), "pod-a").elect("job", LONG);
    leader.proclaim("10.0.0.1:80").unwrap();
    let term = tokio::time::timeout(PROMPT, leader.leading())
        .await
        .unwrap();
    let follower = Lease::with_holder(etcd.clone(), "pod-b").elect("job", LONG);
    let mut seen = follower.watch();
    tokio::time::timeout(
        PROMPT,
        seen.wait_for(|s| follows(s, "pod-a", "10.0.0.1:80")),
    )
    .await
    .expect("the follower names the leader and its value")
    .unwrap();
    leader.proclaim("10.0.0.2:80").unwrap();
    let proclaimed = Instant::now();
    tokio::time::timeout(
        PROMPT,
        seen.wait_for(|s| follows(s, "pod-a", "10.0.0.2:80")),
    )
    .await
    .expect("the follower sees the new value")
    .unwrap();
    eprintln!(
        "the follower saw the new value {:?} after",
        proclaimed.elapsed()
    );
    drop(term);
    leader.resign().await.unwrap();
    tokio::time::timeout(PROMPT, follower.leading())
        .await
        .unwrap();
    let info = etcd.inspect("job").await.unwrap().unwrap();
    assert_eq!(
        (info.holder.as_str(), info.value),
        ("pod-b", None),
        "the value ended with the term"
    );
}

/// `Lease::observe` on etcd sees a hand-over between two leaders, with
/// each one's value and fencing token, about when it happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_a_hand_over() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    let mut seen = Lease::with_holder(etcd.clone(), "dashboard").observe("job");
    let a = Lease::with_holder(etcd.clone(), "pod-a").elect("job", LONG);
    a.proclaim("a").unwrap();
    let term = tokio::time::timeout(PROMPT, a.leading()).await.unwrap();
    tokio::time::timeout(PROMPT, seen.wait_for(|o| o.value.as_deref() == Some("a")))
        .await
        .expect("the first leader is seen")
        .unwrap();
    let b = Lease::with_holder(etcd.clone(), "pod-b").elect("job", LONG);
    b.proclaim("b").unwrap();
    drop(term);
    let handed = Instant::now();
    a.resign().await.unwrap();
    let next = tokio::time::timeout(PROMPT, b.leading()).await.unwrap();
    let now = tokio::time::timeout(
        PROMPT,
        // (`proclaim` after `elect` may come just after the acquisition.)
        seen.wait_for(|o| o.holder.as_deref() == Some("pod-b") && o.value.is_some()),
    )
    .await
    .expect("the hand-over is seen")
    .unwrap()
    .clone();
    eprintln!(
        "hand-over seen {:?} after the resign began",
        handed.elapsed()
    );
    assert_eq!(
        (now.value.as_deref(), now.fencing_token),
        (Some("b"), next.fencing_token())
    );
}

/// etcd-io/etcd#18163 ("Observe reports a wrong leader after a compaction
/// or restart"): an observer whose only member was down while the lease
/// changed hands, and whose history was compacted meanwhile, reports the
/// real holder once the member is back — never a stale or mixed one. A
/// lease held through the same backend value, whose watch then resumes
/// from a compacted revision, is not lost for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_reports_the_real_holder_after_a_compaction_and_a_restart() {
    lease_tests::init_tracing();
    let mut cluster = match lease_tests::faults::etcd::Cluster::start(3).await {
        Ok(cluster) => cluster,
        Err(e) if lease_tests::services_required() => panic!("no etcd cluster: {e}"),
        Err(e) => {
            println!("skipped: no etcd cluster ({e})");
            return;
        }
    };
    // The observer talks to a member that does not lead (so that its
    // restart costs no election), the candidates to the others.
    let leader = cluster.wait_leader(Duration::from_secs(10)).await.unwrap();
    let down = (leader + 1) % cluster.len();
    let mut endpoints = cluster.endpoints();
    let near = endpoints.remove(down);
    let prefix = format!("{}/", unique("lease-etcd"));
    let near = Etcd::connect([near])
        .await
        .unwrap()
        .with_prefix(&prefix)
        .unwrap();
    let far = Etcd::connect(endpoints)
        .await
        .unwrap()
        .with_prefix(&prefix)
        .unwrap();
    let observer = Lease::with_holder(near, "dashboard");
    let held = observer.try_acquire("held", LONG).await.unwrap().unwrap();
    let seen = observer.observe("job");
    let history = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorder = tokio::spawn({
        let (mut seen, history) = (seen.clone(), history.clone());
        async move {
            loop {
                let now = seen.borrow_and_update().clone();
                history.lock().unwrap().push(now);
                if seen.changed().await.is_err() {
                    return;
                }
            }
        }
    });
    let a = Lease::with_holder(far.clone(), "pod-a").elect("job", LONG);
    a.proclaim("a").unwrap();
    let term = tokio::time::timeout(PROMPT, a.leading()).await.unwrap();
    let fence_a = term.fencing_token();
    tokio::time::timeout(
        PROMPT,
        seen.clone().wait_for(|o| o.value.as_deref() == Some("a")),
    )
    .await
    .expect("the first leader is seen")
    .unwrap();

    // The observer's member goes down; the lease changes hands; the
    // history of it is compacted away.
    cluster.kill(down);
    drop(term);
    a.resign().await.unwrap();
    let b = Lease::with_holder(far.clone(), "pod-b").elect("job", LONG);
    b.proclaim("b").unwrap();
    let term = tokio::time::timeout(PROMPT, b.leading()).await.unwrap();
    let fence_b = term.fencing_token();
    let mut client = far.client().clone();
    let revision = client
        .get(far.key("job"), None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let physical = etcd_client::CompactionOptions::new().with_physical();
    client.compact(revision, Some(physical)).await.unwrap();
    cluster.restart(down).await.unwrap();
    cluster.ensure_healthy().await.unwrap();
    let back = Instant::now();

    let now = tokio::time::timeout(
        Duration::from_secs(15),
        seen.clone()
            .wait_for(|o| o.holder.as_deref() == Some("pod-b")),
    )
    .await
    .expect("the observer must report the new holder")
    .unwrap()
    .clone();
    eprintln!(
        "the new holder seen {:?} after the member was back",
        back.elapsed()
    );
    assert_eq!(
        (now.value.as_deref(), now.fencing_token),
        (Some("b"), fence_b)
    );
    recorder.abort();
    let history = history.lock().unwrap().clone();
    let mut after_b = false;
    for o in &history {
        let fits = match o.holder.as_deref() {
            None => o.value.is_none() && o.fencing_token.is_none(),
            Some("pod-a") => {
                !after_b && o.fencing_token == fence_a && o.value.as_deref() != Some("b")
            }
            Some("pod-b") => o.fencing_token == fence_b && o.value.as_deref() != Some("a"),
            Some(_) => false,
        };
        assert!(
            fits,
            "a wrong or stale state was observed: {o:?} in {history:?}"
        );
        after_b |= o.holder.as_deref() == Some("pod-b");
    }
    // Time for the watch to learn that its history was compacted, tell the
    // holder, and for the renewal that follows to find the lease still held.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        held.is_valid(),
        "the lease held through the observer's backend was lost"
    );
    held.release().await.unwrap();
    drop(term);
    b.resign().await.unwrap();
}

/// Have `etcd`'s watch subscribed, so that what follows is timed against
/// a watch that is up (its first subscription wakes every waiter; without
/// a watch, this waits `PROMPT` for nothing).
async fn subscribed(etcd: &Etcd) {
    let _ = tokio::time::timeout(PROMPT, etcd.released("subscribe", POLL)).await;
}

/// A waiter learns of a release by the watch, about one round trip after
/// it, not at its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_learns_of_a_release_by_the_watch() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    subscribed(&etcd).await;
    let grant = etcd.acquire("job", "pod-a", LONG).await.unwrap().unwrap();
    let waiting = tokio::spawn(etcd.released("job", POLL));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "woken while the lease is held");
    etcd.release(Acquisition::new("job", "pod-a", grant.fencing_token))
        .await
        .unwrap();
    let released = Instant::now();
    tokio::time::timeout(PROMPT, waiting)
        .await
        .expect("the watch must wake the waiter, not its poll")
        .unwrap();
    eprintln!("woken {:?} after the release", released.elapsed());
}

/// A holder that crashed (nothing renews or releases its lease): the
/// waiter is woken when etcd expires the lease and deletes the key, not a
/// poll later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_expiry_wakes_the_waiter() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    subscribed(&etcd).await;
    let ttl = Duration::from_secs(2);
    let sent = Instant::now();
    etcd.acquire("job", "crashed", ttl).await.unwrap().unwrap();
    tokio::time::timeout(ttl + PROMPT, etcd.released("job", POLL))
        .await
        .expect("the expiry must wake the waiter, not its poll");
    let woken = sent.elapsed();
    eprintln!("woken {woken:?} after the acquire was sent (ttl {ttl:?})");
    assert!(woken >= ttl, "woken before the lease expired");
    etcd.acquire("job", "survivor", ttl)
        .await
        .unwrap()
        .expect("free once expired");
}

/// A backend value has one watch, on one stream, whatever it holds and
/// waits for (the etcd server counts them, on a cluster of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_watch_per_backend_value() {
    lease_tests::init_tracing();
    let cluster = match lease_tests::clusters::EtcdCluster::start(1) {
        Ok(cluster) => cluster,
        Err(e) if lease_tests::services_required() => panic!("no etcd: {e}"),
        Err(e) => {
            println!("skipped: no etcd ({e})");
            return;
        }
    };
    let endpoint = cluster.endpoints().remove(0);
    let etcd = Etcd::connect([&endpoint]).await.unwrap();
    let lease = Lease::with_holder(etcd.clone(), "pod-a");
    let mut guards = Vec::new();
    for i in 0..5 {
        let name = format!("held-{i}");
        guards.push(lease.try_acquire(&name, LONG).await.unwrap().unwrap());
    }
    let waiters: Vec<_> = (0..3)
        .map(|i| tokio::spawn(etcd.released(&format!("held-{i}"), POLL)))
        .collect();
    // Until the watch is up (or 5 s), then a little longer for any other.
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if watch_counts(&endpoint).await != (0, 0) {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        watch_counts(&endpoint).await,
        (1, 1),
        "(watch streams, watchers) on the server, with 5 leases held and 3 waiters"
    );
    for waiter in waiters {
        waiter.abort();
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// The server's counts of watch streams and watchers (its `/metrics`).
async fn watch_counts(endpoint: &str) -> (u64, u64) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = endpoint.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(address).await.unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).await.unwrap();
    let gauge = |name: &str| -> u64 {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in the metrics")) as u64
    };
    (
        gauge("etcd_debugging_mvcc_watch_stream_total "),
        gauge("etcd_debugging_mvcc_watcher_total "),
    )
}

/// An idempotent re-acquire with a longer ttl (the same holder after a
/// restart, say) must hold the lease that long: the key moves to an etcd
/// lease of the new ttl, keeping its fencing token. Kept on the first etcd
/// lease, it would expire at the first ttl while the holder's local
/// deadline is the second — two holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reacquire_with_a_longer_ttl_holds_that_long() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    let first = etcd
        .acquire("job", "pod-a", Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    let again = etcd
        .acquire("job", "pod-a", Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.fencing_token, first.fencing_token);
    // Past the first ttl, etcd's expiry check (500 ms) and slack.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        etcd.acquire("job", "pod-b", Duration::from_secs(10))
            .await
            .unwrap(),
        None,
        "the lease must live for the ttl of the re-acquire"
    );
    let info = etcd.inspect("job").await.unwrap().unwrap();
    assert_eq!(info.holder, "pod-a");
    assert!(
        info.expires_in.unwrap() > Duration::from_secs(5),
        "{info:?}"
    );
    assert!(etcd.force_release("job").await.unwrap());
}

/// A key deleted by hand (`etcdctl del`) without revoking its etcd lease:
/// the etcd lease lives on, so a keep-alive alone still succeeds; the
/// renewal reads the key too and must report the lease lost, because
/// another holder can acquire the name at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_by_hand_is_lost_at_the_next_renewal() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    let name = "deleted-by-hand";
    let ttl = Duration::from_secs(5);
    let grant = etcd.acquire(name, "pod-a", ttl).await.unwrap().unwrap();
    let lease = Acquisition::new(name, "pod-a", grant.fencing_token);
    assert!(
        etcd.renew(lease, ttl).await.unwrap(),
        "held before the delete"
    );
    let mut client = etcd.client().clone();
    client.delete(etcd.key(name), None).await.unwrap();
    assert!(
        !etcd.renew(lease, ttl).await.unwrap(),
        "the key is gone: the renewal must report the lease lost"
    );
    let other = etcd
        .acquire(name, "pod-b", ttl)
        .await
        .unwrap()
        .expect("free after the delete");
    assert!(other.fencing_token > grant.fencing_token);
    etcd.release(Acquisition::new(name, "pod-b", other.fencing_token))
        .await
        .unwrap();
}

/// Each member's id and whether it leads, by endpoint.
async fn members(endpoints: &[String]) -> Vec<(u64, bool)> {
    let mut found = Vec::new();
    for endpoint in endpoints {
        let mut client = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        let status = client.status().await.unwrap();
        let id = status.header().unwrap().member_id();
        found.push((id, status.leader() == id));
    }
    found
}

/// A leader change (here a hand-over, `move_leader`) loses no lease: the
/// new leader restarts every etcd lease's TTL, and the renewals go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_go_on_when_the_leader_moves() {
    lease_tests::init_tracing();
    let Some(cluster) = lease_tests::clusters::etcd_cluster() else {
        return;
    };
    let Some(etcd) = etcd().await else { return };
    let ttl = Duration::from_secs(5);
    let name = "moving";
    let grant = etcd.acquire(name, "pod-a", ttl).await.unwrap().unwrap();
    let lease = Acquisition::new(name, "pod-a", grant.fencing_token);
    assert!(etcd.renew(lease, ttl).await.unwrap());

    // Hand the leadership to another member: the old leader goes on as a
    // follower in a newer term, and forwards the keep-alives that reach it.
    let endpoints = cluster.endpoints();
    let before = members(&endpoints).await;
    let leader = before.iter().position(|m| m.1).expect("a leader");
    let target = before[(leader + 1) % before.len()].0;
    let mut to_leader = etcd_client::Client::connect([&endpoints[leader]], None)
        .await
        .unwrap();
    to_leader.move_leader(target).await.unwrap();

    // A renewal may fail while the leadership moves (retried by the
    // engine), but none may find the lease lost.
    let mut renewed = 0;
    for _ in 0..10 {
        match etcd.renew(lease, ttl).await {
            Ok(alive) => {
                assert!(alive, "the lease was lost when the leader moved");
                renewed += 1;
            }
            Err(e) => eprintln!("renewal failed: {e}"),
        }
    }
    assert!(renewed >= 8, "{renewed} of 10 renewals succeeded");
    let info = etcd.inspect(name).await.unwrap().unwrap();
    assert_eq!(info.fencing_token, grant.fencing_token);
    etcd.release(lease).await.unwrap();
    assert_eq!(etcd.inspect(name).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_endpoint_that_does_not_lead_still_renews() {
    lease_tests::init_tracing();
    let Some(cluster) = lease_tests::clusters::etcd_cluster() else {
        return;
    };
    let endpoints = cluster.endpoints();
    let follower = members(&endpoints)
        .await
        .iter()
        .position(|m| !m.1)
        .expect("a follower");
    let etcd = Etcd::connect([&endpoints[follower]])
        .await
        .unwrap()
        .with_prefix(format!("{}/", unique("lease-etcd")))
        .unwrap();
    let ttl = Duration::from_secs(5);
    let grant = etcd.acquire("far", "pod-a", ttl).await.unwrap().unwrap();
    let lease = Acquisition::new("far", "pod-a", grant.fencing_token);
    // The leader is not among the endpoints: the one given forwards the
    // keep-alives.
    for _ in 0..3 {
        assert!(etcd.renew(lease, ttl).await.unwrap());
    }
    etcd.release(lease).await.unwrap();
}
