//! Through the engine ([`Lease`]: renewals, loss, shutdown, batches of
//! renewals), in the `every` group; and the `fenced` group, for backends
//! with fencing tokens.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use futures_util::future::join_all;
use leasehold::{Acquisition, Backend, Lease, Outcome, Skip};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, timeout};

use crate::Subject;
use crate::support::{LONG, TTL, acquire, acquired, lease, ms, release, renew, unique};

/// Sixteen `Lease`s run `with_lease` on one name at once, ten times: never
/// do two bodies run at once, and each round runs one.
pub async fn one_runner_among_sixteen_with_lease<S: Subject>(s: &S) {
    let name = unique("with-lease");
    let running = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..10 {
        let pods: Vec<Lease> = (0..16).map(|i| lease(s, &format!("pod-{i:02}"))).collect();
        let outs = join_all(pods.iter().map(|p| {
            let (running, ran) = (running.clone(), ran.clone());
            p.with_lease(&name, TTL, move |_| async move {
                assert_eq!(
                    running.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two pods ran at once"
                );
                sleep(ms(50)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                ran.fetch_add(1, Ordering::SeqCst);
            })
        }))
        .await;
        for out in outs {
            assert!(!matches!(out, Outcome::Skipped(Skip::Error(_))), "{out:?}");
        }
    }
    assert!(
        ran.load(Ordering::SeqCst) >= 10,
        "every round ran on one pod"
    );
}

/// A lease stolen behind its holder's back ([`Subject::steal`]): the
/// guard's token fires at the next renewal (within ttl/3, plus 500 ms for
/// a loaded machine), the guard is no longer valid, and its release does
/// not free the thief's lease.
pub async fn a_stolen_lease_cancels_the_token<S: Subject>(s: &S) {
    let name = unique("stolen");
    let ttl = ms(1_500);
    let holder = lease(s, "holder-a");
    let guard = holder.try_acquire(&name, ttl).await.unwrap().expect("free");
    sleep(ms(100)).await;
    let stolen_at = Instant::now();
    s.steal(&name, "thief").await;
    // Noticed at the next renewal: within ttl/3 plus slack for a loaded machine.
    let bound = ttl / 3 + ms(500);
    timeout(bound, guard.token().cancelled())
        .await
        .unwrap_or_else(|_| panic!("token not cancelled within {bound:?} of the steal"));
    let noticed = stolen_at.elapsed();
    assert!(!guard.is_valid());
    eprintln!(
        "stolen lease noticed after {noticed:?} (ttl/3 = {:?})",
        ttl / 3
    );
    // Releasing after a takeover does not free the thief's lease.
    guard.release().await.unwrap();
    assert!(
        lease(s, "holder-b")
            .try_acquire(&name, ttl)
            .await
            .unwrap()
            .is_none()
    );
}

/// A guard dropped without `release` frees the lease in the background:
/// another holder has it within a second.
pub async fn a_dropped_guard_frees_the_lease<S: Subject>(s: &S) {
    let name = unique("dropped");
    let a = lease(s, "holder-a");
    let b = lease(s, "holder-b");
    drop(a.try_acquire(&name, TTL).await.unwrap().expect("free"));
    // Released in the background: poll for a little while.
    let deadline = Instant::now() + ms(1_000);
    loop {
        if let Some(g) = b.try_acquire(&name, TTL).await.unwrap() {
            g.release().await.unwrap();
            break;
        }
        assert!(Instant::now() < deadline, "dropped guard did not release");
        sleep(ms(10)).await;
    }
}

/// `shutdown` cancels the token and keeps the lease while the body winds
/// down (400 ms, within its grace of ttl/3), releasing it only once the
/// body has returned: another holder trying all along never gets it while
/// the body runs.
pub async fn shutdown_hands_over_only_after_the_body_returned<S: Subject>(s: &S) {
    // Issue 28, point 2. Causal, not timed: the body sets a flag before it
    // returns, and the other holder checks it the moment it gets the lease.
    let name = unique("shutdown-body");
    let a = lease(s, "holder-a");
    let b = lease(s, "holder-b");
    let returned = Arc::new(AtomicBool::new(false));
    let started = Arc::new(Notify::new());
    let job = tokio::spawn({
        let (a, name, returned, started) =
            (a.clone(), name.clone(), returned.clone(), started.clone());
        async move {
            a.with_lease(&name, TTL, |token| async move {
                started.notify_one();
                token.cancelled().await;
                sleep(ms(400)).await; // winding down
                returned.store(true, Ordering::SeqCst);
            })
            .await
        }
    });
    started.notified().await;
    let shutdown = tokio::spawn({
        let a = a.clone();
        async move { a.shutdown().await }
    });
    let deadline = Instant::now() + LONG;
    loop {
        if let Some(g) = b.try_acquire(&name, TTL).await.unwrap() {
            assert!(
                returned.load(Ordering::SeqCst),
                "another holder got the lease while the body was still running"
            );
            g.release().await.unwrap();
            break;
        }
        assert!(Instant::now() < deadline, "the lease was never handed over");
        sleep(ms(10)).await;
    }
    assert!(job.await.unwrap().ran().is_some());
    timeout(LONG, shutdown).await.unwrap().unwrap();
}

/// A body that ignores its token does not make `shutdown` hang — it
/// returns once the grace (ttl/3) is over, within the grace plus a
/// release's time limit — and its lease is left unreleased: another holder
/// gets it only once it has expired on the server (no sooner than a ttl
/// after the acquisition was sent), and, where leases do not expire, not
/// while the body runs.
pub async fn shutdown_leaves_a_body_that_ignores_its_token_to_expire<S: Subject>(s: &S) {
    // Issue 28, point 2.
    let name = unique("shutdown-stubborn");
    let a = lease(s, "holder-a");
    let b = lease(s, "holder-b");
    let started = Arc::new(Notify::new());
    let sent = Instant::now();
    let job = tokio::spawn({
        let (a, name, started) = (a.clone(), name.clone(), started.clone());
        async move {
            a.with_lease(&name, TTL, |_| async move {
                started.notify_one();
                std::future::pending::<()>().await;
            })
            .await
        }
    });
    started.notified().await;
    let t_shutdown = Instant::now();
    timeout(TTL / 3 + TTL + ms(500), a.shutdown())
        .await
        .expect("shutdown hung on a body that ignores its token");
    assert!(
        Instant::now() - t_shutdown >= TTL / 3 - ms(1),
        "returned before the grace"
    );
    if s.caps().expires {
        let (taken_at, taken) = loop {
            if let Some(g) = b.try_acquire(&name, TTL).await.unwrap() {
                break (Instant::now(), g);
            }
            assert!(Instant::now() - sent < LONG, "the lease never expired");
            sleep(ms(10)).await;
        };
        // The server's expiry is at least a ttl after the request was sent
        // (less 1% for a server clock running a little fast).
        assert!(
            taken_at - sent >= TTL - TTL / 100,
            "another holder got the lease {:?} after it was acquired, before it could expire",
            taken_at - sent
        );
        taken.release().await.unwrap();
        job.abort();
    } else {
        sleep(TTL * 2).await;
        assert!(
            b.try_acquire(&name, TTL).await.unwrap().is_none(),
            "another holder got the lease while the body was still running"
        );
        job.abort();
        let _ = job.await;
        let deadline = Instant::now() + LONG;
        while b.try_acquire(&name, TTL).await.unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "not released once the body ended"
            );
            sleep(ms(10)).await;
        }
    }
}

/// A body that runs for 1.5 ttls keeps its lease: the engine renews it,
/// the token does not fire, and another holder is refused.
pub async fn a_held_lease_is_renewed_past_its_ttl<S: Subject>(s: &S) {
    let name = unique("renewed");
    let ttl = TTL;
    let a = lease(s, "holder-a");
    let b = &lease(s, "holder-b");
    let name = &name;
    let out = a
        .with_lease(name, ttl, |token| async move {
            sleep(ttl * 3 / 2).await;
            let other = b.try_acquire(name, ttl).await.unwrap();
            (token.is_cancelled(), other.is_some())
        })
        .await;
    assert_eq!(
        out.ran(),
        Some((false, false)),
        "lease must be renewed and stay exclusive"
    );
}

/// `Backend::renew_many` with one batch that mixes live, expired, stolen,
/// released, superseded and never-existing names: which acquisitions are
/// current and live must come back `true`, in order, and only those must be
/// extended; nothing is inserted.
pub async fn each_lease_learns_its_own_fate<S: Subject>(s: &S) {
    let b = s.backend();
    let holder = unique("holder");
    let thief = unique("thief");
    // `live_short` must still be held when the batch is sent, and expire
    // (but for the batch) soon after.
    let short = TTL.max(s.expiry(ms(50)) * 2);
    let name = |what: &str| unique(&format!("renew-many-{what}"));
    let (live, live_short, other_ttl) = (name("live"), name("live-short"), name("other-ttl"));
    let (expired, stolen, released, never, superseded) = (
        name("expired"),
        name("stolen"),
        name("released"),
        name("never"),
        name("superseded"),
    );
    let f_live = acquired(&b, &live, &holder, LONG).await;
    let t_live_short = Instant::now();
    let f_live_short = acquired(&b, &live_short, &holder, short).await;
    let f_other_ttl = acquired(&b, &other_ttl, &holder, LONG).await;
    let f_expired = acquired(&b, &expired, &holder, ms(50)).await;
    let f_stolen = acquired(&b, &stolen, &holder, ms(50)).await;
    let f_released = acquired(&b, &released, &holder, LONG).await;
    release(&b, &released, &holder, f_released).await;
    // An older acquisition of a name the same holder holds again.
    let f_old = acquired(&b, &superseded, &holder, LONG).await;
    release(&b, &superseded, &holder, f_old).await;
    let f_new = acquired(&b, &superseded, &holder, LONG).await;
    sleep(s.expiry(ms(50)) + ms(150)).await; // `expired` and `stolen` expire
    if !s.caps().expires {
        // No expiry: they end with their sessions instead (see `lapse`).
        s.end_session(&expired).await;
        s.end_session(&stolen).await;
    }
    acquired(&b, &stolen, &thief, LONG).await;

    let batch = [
        (Acquisition::new(&live, &holder, f_live), LONG),
        (Acquisition::new(&expired, &holder, f_expired), LONG),
        (Acquisition::new(&live_short, &holder, f_live_short), LONG),
        (Acquisition::new(&stolen, &holder, f_stolen), LONG),
        (Acquisition::new(&never, &holder, f_live), LONG),
        (
            Acquisition::new(&other_ttl, &holder, f_other_ttl),
            ms(20_000),
        ),
        (Acquisition::new(&released, &holder, f_released), LONG),
        (Acquisition::new(&superseded, &holder, f_old), LONG),
    ];
    // Without fencing tokens, an older acquisition of a name its holder
    // holds again cannot be told from the newer one: name and holder match.
    let superseded_renewed = !s.caps().fencing;
    let expected = [
        true,
        false,
        true,
        false,
        false,
        true,
        false,
        superseded_renewed,
    ];
    let renewed = b.renew_many(&batch).await.unwrap();
    assert_eq!(renewed, expected);
    // The newer acquisition is still the current one.
    assert!(renew(&b, &superseded, &holder, f_new, LONG).await);

    // `live_short` was extended past its first ttl.
    tokio::time::sleep_until(t_live_short + s.expiry(short) + ms(200)).await;
    assert_eq!(
        acquire(&b, &live_short, &thief, LONG).await,
        None,
        "renew_many must have extended the lease"
    );
    // Nothing was renewed for the thief or inserted for us.
    assert_eq!(acquire(&b, &stolen, &holder, LONG).await, None);
    acquired(&b, &never, &thief, LONG).await;
    acquired(&b, &expired, &thief, LONG).await;
    acquired(&b, &released, &thief, LONG).await;
    // The holder's answers stay per lease on the next batch too.
    let renewed = b.renew_many(&batch).await.unwrap();
    assert_eq!(renewed, expected);
    assert_eq!(b.renew_many(&[]).await.unwrap(), Vec::<bool>::new());
    // All ours and live (MySQL answers from the matched-row count alone).
    let all_ours = [
        (Acquisition::new(&live, &holder, f_live), LONG),
        (Acquisition::new(&other_ttl, &holder, f_other_ttl), LONG),
    ];
    assert_eq!(b.renew_many(&all_ours).await.unwrap(), [true, true]);
}

// ------------------------------------------ properties of fenced backends

/// A late copy of the release of an older acquisition (the network
/// delivered it after the same holder acquired the name again) must not end
/// the newer acquisition: release concerns one acquisition, told apart by
/// its fencing token. (Backends without fencing tokens cannot tell the two
/// acquisitions of one holder apart.) The `fenced` group.
pub async fn a_late_release_leaves_a_newer_acquisition<S: Subject>(s: &S) {
    assert!(s.caps().fencing, "for backends with fencing tokens");
    let b = s.backend();
    let name = unique("late-release");
    let first = acquired(&b, &name, "holder-a", LONG).await;
    release(&b, &name, "holder-a", first).await;
    let second = acquired(&b, &name, "holder-a", LONG).await;
    assert_ne!(first, second);
    release(&b, &name, "holder-a", first).await; // the late copy
    assert!(
        renew(&b, &name, "holder-a", second, LONG).await,
        "the newer acquisition must still be held"
    );
    assert_eq!(acquire(&b, &name, "holder-b", LONG).await, None);
    release(&b, &name, "holder-a", second).await;
    acquired(&b, &name, "holder-b", LONG).await;
}
