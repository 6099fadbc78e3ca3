//! The fault suite's etcd machinery ([`lease_tests::faults::etcd`]): the
//! leader finder finds the member that leads, and a partition cuts a member
//! off in both directions — it can neither commit a write nor hear of the
//! others' — and heals.
//!
//! Needs `etcd` (Debian's `etcd-server`); without it the tests print
//! `skipped: ...` and pass — unless `LEASE_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};
use lease_tests::faults::etcd::{Cluster, ELECTION_TIMEOUT};

async fn cluster() -> Option<Cluster> {
    match Cluster::start(3).await {
        Ok(cluster) => Some(cluster),
        Err(e) if lease_tests::services_required() => panic!("no etcd cluster: {e}"),
        Err(e) => {
            println!("skipped: no etcd cluster ({e})");
            None
        }
    }
}

/// A client of member `i` alone, whose calls give up after `timeout`.
async fn client_of(cluster: &Cluster, i: usize, timeout: Duration) -> Client {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(timeout);
    Client::connect([cluster.endpoints()[i].clone()], Some(options))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_finder_finds_the_member_that_leads() {
    let Some(mut cluster) = cluster().await else {
        return;
    };
    let leader = cluster.wait_leader(Duration::from_secs(10)).await.unwrap();
    // The member found says it leads, and the others name it.
    let (own, named) = cluster.status(leader).await.unwrap();
    assert_eq!(own, named, "member {leader} was found, but does not lead");
    for i in (0..cluster.len()).filter(|&i| i != leader) {
        let (id, named) = cluster.status(i).await.unwrap();
        assert_ne!(id, named, "member {i} leads too");
        assert_eq!(named, own, "member {i} names another leader");
    }
    // Killed, it is no longer found; another member leads.
    cluster.kill(leader);
    let next = cluster.wait_leader(Duration::from_secs(10)).await.unwrap();
    assert_ne!(next, leader);
    cluster.restart(leader).await.unwrap();
    cluster.ensure_healthy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_member_is_cut_off_both_ways() {
    let Some(mut cluster) = cluster().await else {
        return;
    };
    let leader = cluster.wait_leader(Duration::from_secs(10)).await.unwrap();
    // Every member's peer connections went through the pair proxies.
    for i in 0..cluster.len() {
        for j in (0..cluster.len()).filter(|&j| j != i) {
            assert!(
                cluster.peer_connections(i, j) > 0,
                "no connection from member {i} to member {j} seen"
            );
        }
    }
    assert_eq!(
        cluster.unidentified(),
        0,
        "peer connections of unknown origin"
    );

    // Cut off the leader: the two others elect one of them.
    cluster.partition(leader);
    tokio::time::sleep(ELECTION_TIMEOUT * 3).await;
    let next = cluster.wait_leader(Duration::from_secs(10)).await.unwrap();
    assert_ne!(next, leader, "the partitioned member still leads");
    // The majority side commits a write...
    let mut majority = client_of(&cluster, next, Duration::from_secs(5)).await;
    majority.put("partition-test", "after", None).await.unwrap();
    // ...which the cut-off member never hears of (its messages from the
    // others are cut)...
    let mut isolated = client_of(&cluster, leader, Duration::from_secs(2)).await;
    let seen = isolated
        .get(
            "partition-test",
            Some(GetOptions::new().with_serializable()),
        )
        .await
        .unwrap();
    assert!(
        seen.kvs().is_empty(),
        "the partitioned member got the write"
    );
    // ...and it cannot commit one itself (its messages to them are cut).
    let write = isolated.put("partition-test", "isolated", None).await;
    assert!(
        write.is_err(),
        "a write through the partitioned member committed"
    );
    // Nor has it heard from the new leader at all: it names no leader, or
    // still itself, never the one the others elected.
    let (new_id, _) = cluster.status(next).await.unwrap();
    let (_, named) = cluster.status(leader).await.unwrap();
    assert_ne!(
        named, new_id,
        "the partitioned member heard from the new leader"
    );
    // And the others hear nothing from it: its elections (it campaigns
    // with ever higher terms) would depose their leader.
    let (_, _, term) = cluster.status_term(next).await.unwrap();
    tokio::time::sleep(ELECTION_TIMEOUT * 4).await;
    let (_, still, term_after) = cluster.status_term(next).await.unwrap();
    assert_eq!(
        (still, term_after),
        (new_id, term),
        "the partitioned member's elections reached the others"
    );

    // Healed: it catches up and takes writes again.
    cluster.heal();
    cluster.ensure_healthy().await.unwrap();
    let mut again = client_of(&cluster, leader, Duration::from_secs(5)).await;
    let mut caught_up = false;
    for _ in 0..50 {
        let got = again
            .get(
                "partition-test",
                Some(GetOptions::new().with_serializable()),
            )
            .await
            .unwrap();
        if got.kvs().first().is_some_and(|kv| kv.value() == b"after") {
            caught_up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(caught_up, "the healed member did not catch up");
    again.put("partition-test", "healed", None).await.unwrap();
    assert_eq!(cluster.unidentified(), 0);
}
