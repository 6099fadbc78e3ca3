//! `Etcd` specifics on the 3-member cluster of this test binary: operating
//! it (`inspect`, `list`, `force_release`) and what a revocation of a held
//! lease's etcd lease does. The conformance suite runs on the same kind of
//! cluster (`conformance.rs`, `etcd::*`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lease::backend::Etcd;
use lease::{Acquisition, Backend, Lease};
use lease_tests::unique;

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
async fn inspect_list_and_force_release() {
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

    assert!(etcd.force_release("a").await.unwrap());
    assert!(!etcd.force_release("a").await.unwrap(), "not held any more");
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
    assert!(etcd.force_release("a").await.unwrap());
    assert!(etcd.force_release("b").await.unwrap());
    assert_eq!(etcd.list().await.unwrap(), []);
}

/// Revoking the etcd lease of a held lease (an operator's `etcdctl lease
/// revoke`) cancels the holder's token at its next renewal, and another
/// holder can acquire at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_etcd_lease_cancels_the_token() {
    lease_tests::init_tracing();
    let Some(etcd) = etcd().await else { return };
    let ttl = Duration::from_secs(3);
    let lease = Lease::with_holder(etcd.clone(), "pod-a");
    let guard = lease.try_acquire("job", ttl).await.unwrap().unwrap();
    let mut client = etcd.client().clone();
    let key = client.get(etcd.key("job"), None).await.unwrap();
    let id = key.kvs()[0].lease();
    client.lease_revoke(id).await.unwrap();
    let other = Lease::with_holder(etcd.clone(), "pod-b");
    let taken = other
        .try_acquire("job", ttl)
        .await
        .unwrap()
        .expect("free after the revoke");
    assert!(taken.fencing_token() > guard.fencing_token());
    // The holder learns at its next renewal (every ttl/3 = 1 s).
    tokio::time::timeout(ttl / 3 + Duration::from_secs(2), guard.token().cancelled())
        .await
        .expect("the token must be cancelled at the next renewal");
    assert!(!guard.is_valid());
    taken.release().await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_follow_the_leader_when_it_moves() {
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

    // The first renewal is sent to the member that led: it answers from
    // another term, which a renewal does not trust (the answer may be a
    // deposed leader's); it is an error, neither renewed nor lost.
    let first = etcd.renew(lease, ttl).await;
    assert!(
        matches!(first, Err(lease::Error::Etcd(_))),
        "a renewal answered by a member that no longer leads must not be trusted: {first:?}"
    );
    // Its retry asks who leads now, and renews there.
    assert!(
        etcd.renew(lease, ttl).await.unwrap(),
        "renewed through the new leader"
    );
    assert!(etcd.renew(lease, ttl).await.unwrap());
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
    // The leader is not among the endpoints: renewals go through the one
    // given, with the check by raft term alone (see the `Etcd` docs).
    for _ in 0..3 {
        assert!(etcd.renew(lease, ttl).await.unwrap());
    }
    etcd.release(lease).await.unwrap();
}
