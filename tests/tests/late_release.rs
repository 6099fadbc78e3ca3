//! A release delayed in the network past the ttl must not end a newer
//! acquisition of the same name by the same holder.
//!
//! The story: a holder's release gets stuck in the network (TCP
//! retransmits, a partition that heals later, bytes still queued on a socket
//! the client gave up on). The release times out; a ttl later the old lease
//! has expired and the same holder acquires the name again. Then the network
//! heals and the old release lands. It must be a no-op: renewals and
//! releases concern one *acquisition*. If it ended the newer lease, another
//! holder could acquire while the newer one is still valid — two holders.
//!
//! The fault proxy holds the release's bytes back (black hole) and delivers
//! them when it heals. The newer acquisition goes through a second backend
//! value with the same holder, straight to the server, since the proxy holds
//! back new connections too while it is a black hole.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use lease_tests::proxy::{FaultProxy, Mode};
use lease_tests::unique;
use leasehold::backend::{MySqlTable, PgTable, Redis};
use leasehold::{Backend, Lease};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use tokio::time::sleep;

/// The lease whose release is held back: it must have expired by the time
/// the same holder acquires the name again.
const TTL: Duration = Duration::from_secs(1);
/// The newer acquisition, which only has to stay held.
const HELD: Duration = Duration::from_secs(2);

fn addr_of(url: &str) -> SocketAddr {
    let host_port = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.rsplit('@').next())
        .and_then(|rest| rest.split('/').next())
        .expect("a URL with a host and port");
    tokio::task::block_in_place(|| {
        std::net::ToSocketAddrs::to_socket_addrs(host_port)
            .expect("resolve")
            .next()
            .expect("an address")
    })
}

/// `url` with its host and port replaced by `to`.
fn via(url: &str, to: SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").expect("scheme");
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (format!("{u}@"), r),
        None => (String::new(), rest),
    };
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    format!("{scheme}://{userinfo}{to}{path}")
}

/// The scenario, for a backend whose first value (`stalled`) talks to the
/// server through `proxy` and whose second (`direct`) talks to it directly.
async fn a_late_release_does_not_end_a_newer_acquisition(
    proxy: &FaultProxy,
    stalled: impl Backend,
    direct: impl Backend + Clone,
) {
    let name = unique("late-release");
    let first = Lease::with_holder(stalled, "pod-a");
    let again = Lease::with_holder(direct.clone(), "pod-a");
    let other = Lease::with_holder(direct, "pod-b");

    // Warm up: the connection has prepared the statements (otherwise the
    // release's first message would be a `Parse` waiting for its answer, and
    // the statement itself would never leave the client).
    let warm = first.try_acquire(&unique("warm-up"), TTL).await.unwrap();
    warm.expect("free").release().await.unwrap();

    let guard = first.try_acquire(&name, TTL).await.unwrap().expect("free");
    let old_fence = guard.fencing_token();
    // sqlx pings a connection on its way back to the pool; once that is
    // done, the release goes out on the idle connection in one message.
    sleep(Duration::from_millis(100)).await;

    // The release's request is held back by the network; the client gives
    // up on it after its time limit (min(ttl, 30 s)).
    proxy.set_mode(Mode::BlackHole);
    let released = guard.release().await;
    assert!(released.is_err(), "the release cannot have been answered");

    // By now the old lease has expired on the server (its last renewal was
    // sent before the release). The same holder acquires the name again.
    sleep(TTL / 2).await;
    let newer = again
        .try_acquire(&name, HELD)
        .await
        .unwrap()
        .expect("expired");
    assert!(
        newer.fencing_token() > old_fence,
        "a new acquisition: {:?} after {old_fence:?}",
        newer.fencing_token()
    );

    // The network heals: the old release reaches the server now.
    proxy.set_mode(Mode::Pass);
    sleep(Duration::from_millis(500)).await;

    // It must not have ended the newer lease: while that one is valid,
    // nobody else can acquire, and it keeps being renewed.
    for _ in 0..6 {
        assert!(newer.is_valid(), "the newer lease was lost");
        assert!(
            other.try_acquire(&name, TTL).await.unwrap().is_none(),
            "pod-b acquired while pod-a's newer lease was valid: the late release ended it"
        );
        sleep(TTL / 4).await;
    }
    assert!(newer.is_valid(), "the newer lease was lost");
    newer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_table() {
    let Some(direct) = lease_tests::postgres().await else {
        return;
    };
    let url = lease_tests::postgres_url();
    let proxy = FaultProxy::start(addr_of(&url)).await;
    let stalled = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&via(&url, proxy.addr()))
        .await
        .unwrap();
    let direct = PgTable::new(direct);
    direct.ensure_schema().await.unwrap();
    a_late_release_does_not_end_a_newer_acquisition(&proxy, PgTable::new(stalled), direct).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_table() {
    let Some(direct) = lease_tests::mysql().await else {
        return;
    };
    let url = lease_tests::mysql_url();
    let proxy = FaultProxy::start(addr_of(&url)).await;
    let stalled = MySqlPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&via(&url, proxy.addr()))
        .await
        .unwrap();
    let direct = MySqlTable::new(direct);
    direct.ensure_schema().await.unwrap();
    a_late_release_does_not_end_a_newer_acquisition(&proxy, MySqlTable::new(stalled), direct).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis() {
    let Some(direct) = lease_tests::redis().await else {
        return;
    };
    let url = lease_tests::redis_url();
    let proxy = FaultProxy::start(addr_of(&url)).await;
    let stalled = leasehold::deadpool_redis::Config::from_url(via(&url, proxy.addr()))
        .create_pool(Some(leasehold::deadpool_redis::Runtime::Tokio1))
        .unwrap();
    a_late_release_does_not_end_a_newer_acquisition(
        &proxy,
        Redis::new(stalled),
        Redis::new(direct),
    )
    .await;
}
