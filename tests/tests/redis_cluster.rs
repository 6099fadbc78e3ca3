//! `Redis` on a 3-master Redis Cluster: `list` scans every master, and
//! `renew_many` splits its batch by
//! hash slot, so the cluster never sees a script over keys of several slots
//! (which it refuses with `CROSSSLOT`). The conformance suite runs on the
//! same kind of cluster (`conformance.rs`, `redis_cluster::*`); the
//! `CROSSSLOT` fallback for a client that does not know it talks to a
//! cluster is checked in `lock_backends/redis_backend.rs`.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::time::Duration;

use lease_tests::unique;
use leasehold::backend::Redis;
use leasehold::{Acquisition, Backend};

/// Taken by every test here: `renew_many_sends_one_script_per_hash_slot`
/// counts the scripts that every node ran, so no other test may send any
/// meanwhile.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The sum of a field over the `INFO` sections of every node, e.g.
/// `cmdstat_evalsha` `calls`.
async fn stat(nodes: &[String], section: &str, line: &str, field: &str) -> u64 {
    let mut total = 0;
    for node in nodes {
        let client = redis::Client::open(node.as_str()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query_async(&mut c)
            .await
            .unwrap();
        for l in info.lines() {
            if let Some(rest) = l.strip_prefix(line).and_then(|r| r.strip_prefix(':')) {
                for part in rest.split(',') {
                    if let Some(v) = part.strip_prefix(field).and_then(|v| v.strip_prefix('=')) {
                        total += v.trim().parse::<u64>().unwrap();
                    }
                }
            }
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_many_sends_one_script_per_hash_slot() {
    lease_tests::init_tracing();
    let Some(cluster) = lease_tests::clusters::redis_cluster() else {
        return;
    };
    let _alone = ONE_AT_A_TIME.lock().await;
    let nodes = cluster.nodes();
    let backend = Redis::cluster(&nodes).await.unwrap();
    assert!(backend.is_cluster());
    let ttl = Duration::from_secs(30);
    let holder = unique("holder");
    // Names spread over the three masters' slots.
    let names: Vec<String> = (0..60)
        .map(|i| unique(&format!("slot-split-{i}")))
        .collect();
    let mut fences = Vec::new();
    for name in &names {
        fences.push(
            backend
                .acquire(name, &holder, ttl)
                .await
                .unwrap()
                .unwrap()
                .fencing_token,
        );
    }
    let slots: HashSet<i64> = {
        let client = redis::cluster::ClusterClient::new(nodes.clone()).unwrap();
        let mut c = client.get_async_connection().await.unwrap();
        let mut slots = HashSet::new();
        for name in &names {
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(backend.lock_key(name))
                .query_async(&mut c)
                .await
                .unwrap();
            slots.insert(slot);
        }
        slots
    };
    let batch: Vec<_> = names
        .iter()
        .zip(&fences)
        .map(|(name, fence)| (Acquisition::new(name, &holder, *fence), ttl))
        .collect();
    // Once first, so that every master has the script loaded (a first
    // `EVALSHA` answered `NOSCRIPT` is sent again).
    assert_eq!(
        backend.renew_many(&batch).await.unwrap(),
        vec![true; names.len()]
    );
    let scripts_before = stat(&nodes, "commandstats", "cmdstat_evalsha", "calls").await
        + stat(&nodes, "commandstats", "cmdstat_eval", "calls").await;
    let crossslot_before = stat(&nodes, "errorstats", "errorstat_CROSSSLOT", "count").await;

    assert_eq!(
        backend.renew_many(&batch).await.unwrap(),
        vec![true; names.len()]
    );

    let scripts = stat(&nodes, "commandstats", "cmdstat_evalsha", "calls").await
        + stat(&nodes, "commandstats", "cmdstat_eval", "calls").await
        - scripts_before;
    let crossslot =
        stat(&nodes, "errorstats", "errorstat_CROSSSLOT", "count").await - crossslot_before;
    assert_eq!(
        crossslot, 0,
        "a script over keys of several slots reached the cluster"
    );
    assert_eq!(
        scripts,
        slots.len() as u64,
        "one renew script per hash slot of the batch ({} slots for {} leases)",
        slots.len(),
        names.len()
    );
    for (name, fence) in names.iter().zip(&fences) {
        backend
            .release(Acquisition::new(name, &holder, *fence))
            .await
            .unwrap();
    }
}

/// `list` on a cluster finds the leases on every master: their names are
/// spread over the slots of all three (checked with `CLUSTER KEYSLOT` and
/// `CLUSTER SLOTS`), and every one of them is listed, held ones with their
/// holder and fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_finds_the_leases_on_every_master() {
    lease_tests::init_tracing();
    let Some(cluster) = lease_tests::clusters::redis_cluster() else {
        return;
    };
    let _alone = ONE_AT_A_TIME.lock().await;
    let nodes = cluster.nodes();
    let prefix = format!("{}:", unique("list"));
    let backend = Redis::cluster(&nodes)
        .await
        .unwrap()
        .with_prefix(prefix)
        .unwrap();
    let ttl = Duration::from_secs(30);
    let holder = unique("holder");
    let names: Vec<String> = (0..30).map(|i| format!("spread-{i}")).collect();
    let mut fences = Vec::new();
    for name in &names {
        fences.push(
            backend
                .acquire(name, &holder, ttl)
                .await
                .unwrap()
                .unwrap()
                .fencing_token,
        );
    }
    // The masters that serve the names' slots: all three.
    let client = redis::cluster::ClusterClient::new(nodes.clone()).unwrap();
    let mut c = client.get_async_connection().await.unwrap();
    let slots: Vec<(i64, i64, redis::Value)> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async::<Vec<Vec<redis::Value>>>(&mut c)
        .await
        .unwrap()
        .into_iter()
        .map(|range| {
            let n = |v: &redis::Value| match v {
                redis::Value::Int(n) => *n,
                other => panic!("not a slot number: {other:?}"),
            };
            (n(&range[0]), n(&range[1]), range[2].clone())
        })
        .collect();
    let mut masters = HashSet::new();
    for name in &names {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(backend.lock_key(name))
            .query_async(&mut c)
            .await
            .unwrap();
        let (_, _, master) = slots
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .unwrap();
        masters.insert(format!("{master:?}"));
    }
    assert_eq!(masters.len(), 3, "the names' slots are on every master");

    let listed = backend.list().await.unwrap();
    assert_eq!(
        listed.len(),
        names.len(),
        "list answers every lease, on every master"
    );
    let listed: HashSet<(String, String, Option<u64>)> = listed
        .iter()
        .map(|l| (l.name.clone(), l.holder.clone(), l.fencing_token))
        .collect();
    let expected: HashSet<(String, String, Option<u64>)> = names
        .iter()
        .zip(&fences)
        .map(|(name, fence)| (name.clone(), holder.clone(), *fence))
        .collect();
    assert_eq!(
        listed, expected,
        "list answers every lease, on every master"
    );

    for (name, fence) in names.iter().zip(&fences) {
        backend
            .release(Acquisition::new(name, &holder, *fence))
            .await
            .unwrap();
    }
}
