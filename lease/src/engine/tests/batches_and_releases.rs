//! Batched renewals, runtimes that shut down, releases that fail, hang or
//! are dropped, grants that come late, hints of a loss.

use super::*;

#[tokio::test(start_paused = true)]
async fn leases_falling_due_together_are_renewed_in_one_batch() {
    let backend = Scripted::new([], Step::Answer(true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let a = lease.try_acquire("a", TTL).await.unwrap().unwrap();
    sleep(ms(400)).await; // within half a period of `a`
    let b = lease.try_acquire("b", TTL).await.unwrap().unwrap();
    sleep(ms(2_700)).await;
    let renews = backend.renewals(t0);
    let both = Call::RenewMany(vec!["a".into(), "b".into()]);
    let both_rev = Call::RenewMany(vec!["b".into(), "a".into()]);
    assert_eq!(renews.len(), 3, "{renews:?}");
    for (i, (at, call)) in renews.iter().enumerate() {
        assert_eq!(*at, PERIOD * (i as u32 + 1));
        assert!(*call == both || *call == both_rev, "{call:?}");
    }
    assert!(a.is_valid() && b.is_valid());
}

#[test]
fn a_runtime_shutting_down_cancels_the_tokens_it_renewed() {
    let rt = paused_runtime();
    let lease = Lease::with_holder(Memory::new(), "a");
    let guard = rt.block_on(lease.try_acquire("job", TTL)).unwrap().unwrap();
    assert!(!guard.token().is_cancelled());
    drop(rt);
    assert!(
        guard.token().is_cancelled(),
        "nothing renews the lease any more"
    );
    assert!(!guard.is_valid());
    // A new runtime can acquire through the same Lease once the guard is gone.
    drop(guard);
    let rt = paused_runtime();
    let guard = rt.block_on(lease.try_acquire("job", TTL)).unwrap().unwrap();
    rt.block_on(async {
        sleep(TTL * 2).await;
        assert!(guard.is_valid(), "a fresh scheduler renews it");
    });
}

#[test]
fn a_release_awaited_beside_a_runtime_that_shuts_down_ends_at_its_limit() {
    // The scheduler runs on runtime `a`; the release waits on runtime `b`.
    // When `a` shuts down, the release still ends (as timed out, by its
    // own timer) rather than wait forever.
    let backend = Scripted::new([], Step::Answer(true)).releases(Step::Hang);
    let lease = Lease::with_holder(backend, "a");
    let a = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let guard = a.block_on(lease.try_acquire("job", TTL)).unwrap().unwrap();
    let b = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let shutdown = std::thread::spawn(move || {
        std::thread::sleep(ms(100));
        drop(a);
    });
    let t0 = std::time::Instant::now();
    let err = b.block_on(guard.release()).unwrap_err();
    shutdown.join().unwrap();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    // Its limit is the ttl, 3 s; generous above it.
    let limit = crate::engine::timing::release_timeout(TTL);
    assert!(t0.elapsed() < limit + ms(2000), "{:?}", t0.elapsed());
}

#[test]
fn outside_a_runtime_acquire_is_an_error() {
    let lease = Lease::with_holder(Memory::new(), "a");
    let err = futures_util::FutureExt::now_or_never(lease.try_acquire("job", TTL))
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::NoRuntime));
}

#[tokio::test(start_paused = true)]
async fn a_large_batch_is_split_into_calls_of_at_most_max_batch() {
    let backend = Scripted::new([], Step::Answer(true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let mut guards = Vec::new();
    for i in 0..2500 {
        let name = format!("n{i}");
        guards.push(lease.try_acquire(&name, TTL).await.unwrap().unwrap());
    }
    sleep(PERIOD + ms(10)).await;
    let mut sizes = Vec::new();
    let mut renewed = std::collections::HashSet::new();
    for (at, call) in backend.calls() {
        match call {
            Call::RenewMany(names) => {
                assert_eq!(at - t0, PERIOD, "all due together, sent together");
                sizes.push(names.len());
                for name in names {
                    assert!(renewed.insert(name), "a lease renewed twice");
                }
            }
            Call::Renew(name) => panic!("{name} renewed on its own"),
            _ => {}
        }
    }
    sizes.sort_unstable();
    assert_eq!(
        sizes,
        [500, crate::engine::MAX_BATCH, crate::engine::MAX_BATCH]
    );
    assert_eq!(renewed.len(), 2500);
    assert!(guards.iter().all(|g| g.is_valid()));
}

#[tokio::test(start_paused = true)]
async fn after_a_failed_release_the_name_stays_taken_for_a_ttl() {
    // The failed release may still reach the backend later; had this Lease
    // taken the name again meanwhile, it would end the new lease behind its
    // back. So the name stays taken until the old lease has ended anyway.
    let backend = Scripted::new([], Step::Answer(true)).releases(Step::Fail);
    let (lease, guard, _) = job_held(backend).await;
    let t_release = Instant::now();
    assert!(guard.release().await.is_err());
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_none());
    sleep_until(t_release + TTL - ms(1)).await;
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_none());
    sleep_until(t_release + TTL).await;
    tokio::task::yield_now().await;
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_confirmed_release_frees_the_name_at_once() {
    let (lease, guard, _) = job_held(Scripted::new([], Step::Answer(true))).await;
    guard.release().await.unwrap();
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_release_is_sent_again_and_keeps_the_name_for_a_ttl() {
    // The first release is cut off in flight; it is sent again in the
    // background. Even though the second one succeeds, the first may still
    // land, so the name stays taken until a ttl after it was sent.
    let backend = Scripted::new([], Step::Answer(true)).releases(Step::Slow(ms(50), true));
    let (lease, guard, _) = job_held(backend.clone()).await;
    let t_release = Instant::now();
    assert!(tokio::time::timeout(ms(10), guard.release()).await.is_err());
    sleep(ms(100)).await; // the second release has answered by now
    let releases = backend.times(t_release, |c| matches!(c, Call::Release(_)));
    assert_eq!(releases, vec![ms(0), ms(10)]);
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_none());
    sleep_until(t_release + TTL).await;
    tokio::task::yield_now().await;
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_some());
}

/// Through a backend whose releases never answer, holder "a" takes "job"
/// for `ttl` and releases it 100 ms later: the release fails with
/// `Error::Timeout` after `limit`, sent once and not waited for any longer.
/// The `Lease`.
async fn a_release_that_hangs_times_out(ttl: Duration, limit: Duration) -> Lease {
    let backend = Scripted::new([], Step::Answer(true)).releases(Step::Hang);
    let lease = Lease::with_holder(backend.clone(), "a");
    let guard = lease.try_acquire("job", ttl).await.unwrap().unwrap();
    sleep(ms(100)).await;
    let t_release = Instant::now();
    let err = guard.release().await.unwrap_err();
    assert!(
        matches!(err, Error::Timeout { operation: "release", after } if after == limit),
        "{err:?}"
    );
    assert_eq!(Instant::now() - t_release, limit);
    let releases = backend.times(t_release, |c| matches!(c, Call::Release(_)));
    assert_eq!(releases, [Duration::ZERO]);
    lease
}

#[tokio::test(start_paused = true)]
async fn a_hanging_release_times_out_at_its_limit() {
    let limit = crate::engine::timing::release_timeout(TTL);
    let lease = a_release_that_hangs_times_out(TTL, limit).await;
    // A ttl after it was sent, the old lease has ended anyway: the name is free.
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_hanging_release_times_out_after_the_scheduler_has_gone() {
    // The lease is lost at its first renewal; the scheduler lingers and exits.
    let backend = Scripted::new([], Step::Answer(false)).releases(Step::Hang);
    let (_lease, guard, _) = job_held(backend).await;
    sleep(PERIOD + crate::engine::scheduler::IDLE_LINGER + ms(100)).await;
    assert!(!guard.is_valid());
    let t_release = Instant::now();
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert_eq!(
        Instant::now() - t_release,
        crate::engine::timing::release_timeout(TTL)
    );
}

#[tokio::test(start_paused = true)]
async fn a_suspended_machine_wakes_up_with_its_leases_invalid() {
    // On Linux the monotonic clock stops while the machine is suspended; the
    // wall clock does not. Simulate a suspend of 10 ttls: the wall clock jumps,
    // tokio's clock does not move.
    let (_lease, guard, t0) = job_held(Memory::new()).await;
    sleep(ms(100)).await;
    assert!(guard.is_valid());
    crate::engine::timing::WALL_SHIFT.set(TTL * 10);
    assert!(!guard.is_valid(), "is_valid reads the wall clock too");
    // The token fires when the scheduler next looks, at the renewal that was
    // due anyway — without renewing a lease that may be someone else's by now.
    assert_eq!(cancelled_after(&guard, t0).await, PERIOD);
    crate::engine::timing::WALL_SHIFT.set(Duration::ZERO);
}

/// A backend whose acquisitions answer only after `delay` (a reply that sat
/// in a socket while the runtime stalled), always granting.
#[derive(Clone)]
struct SlowGrant {
    delay: Duration,
    released: Arc<Mutex<Vec<Option<u64>>>>,
}

impl Backend for SlowGrant {
    async fn acquire(&self, _: &str, _: &str, _: Duration) -> Result<Option<Grant>, Error> {
        sleep(self.delay).await;
        Ok(Some(Grant::new(Some(7))))
    }
    async fn renew(&self, _: Acquisition<'_>, _: Duration) -> Result<bool, Error> {
        Ok(true)
    }
    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        self.released.lock().unwrap().push(lease.fencing_token);
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_grant_handled_after_its_deadline_is_not_handed_out() {
    // The runtime stalls (or the machine is suspended) while the grant sits
    // in the socket: when the task runs again, both the reply and the call's
    // time limit are ready, and `tokio::time::timeout` polls the reply first.
    let backend = SlowGrant {
        delay: TTL * 2,
        released: Arc::default(),
    };
    let lease = Lease::with_holder(backend.clone(), "a");
    let acquiring = tokio::spawn({
        let lease = lease.clone();
        async move { lease.try_acquire("job", TTL).await }
    });
    tokio::task::yield_now().await; // the acquire is sent and waits
    // Both timers expire in one step, as after a stall of the runtime.
    tokio::time::advance(TTL * 2).await;
    let got = acquiring.await.unwrap();
    match got {
        Err(Error::Timeout {
            operation: "acquire",
            ..
        }) => {}
        Ok(Some(guard)) => panic!(
            "a grant past its deadline was handed out: valid {}, token cancelled {}",
            guard.is_valid(),
            guard.token().is_cancelled()
        ),
        other => panic!("{other:?}"),
    }
    // The lease the server may hold for us is given back, by its fence.
    sleep(ms(10)).await;
    assert_eq!(*backend.released.lock().unwrap(), [Some(7)]);
}

#[tokio::test(start_paused = true)]
async fn a_lease_near_its_deadline_does_not_shorten_a_healthy_ones_renewal() {
    use crate::test_util::capture_logs;
    let (logs, _guard) = capture_logs();
    // "a", with the least grace (the margin, 32 ms), fails five renewals in
    // a row (at 1.0, 1.1, 1.3, 1.7 and 2.2 s), so its retry at 2.7 s has
    // 0.268 s left before its deadline (2.968 s). "b",
    // acquired at 2.0 s, is due at 3.0 s and would be coalesced with that
    // retry. The backend answers every call after 400 ms: in a batch with
    // "a", "b" would get a's 0.268 s and time out for nothing.
    let backend = Scripted::new(vec![Step::Fail; 5], Step::Slow(ms(400), true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let a = granted(lease.job("a", TTL).grace(MARGIN)).await;
    sleep_until(t0 + ms(2000)).await;
    let b = lease.try_acquire("b", TTL).await.unwrap().unwrap();
    assert_eq!(
        cancelled_after(&a, t0).await,
        TTL - MARGIN,
        "a is lost at its deadline"
    );
    sleep_until(t0 + ms(3500)).await;
    assert!(b.is_valid());
    let logs = logs.text();
    let b_failures: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("renewal failed") && l.contains("lease.name=b"))
        .collect();
    assert!(b_failures.is_empty(), "b's renewal failed: {b_failures:#?}");
    // b was renewed by a call of its own, sent at 2.7 s.
    let b_renewed = backend.times(t0, renews("b"));
    assert_eq!(b_renewed, [ms(2700)], "{:?}", backend.calls());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_outside_any_runtime_is_released_on_the_renewing_runtime() {
    let db = Memory::new();
    let lease = Lease::with_holder(db.clone(), "a");
    let guard = lease
        .try_acquire("job", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    // Dropped on a thread with no runtime (a destructor in a plain thread,
    // a callback of a C library): the release is sent all the same, on the
    // runtime that renews the lease, instead of waiting out the ttl.
    std::thread::spawn(move || drop(guard)).join().unwrap();
    let mut released = false;
    for _ in 0..200 {
        if db.holder("job").is_none() {
            released = true;
            break;
        }
        tokio::time::sleep(ms(10)).await;
    }
    assert!(
        released,
        "the lease is still held: its release was never sent"
    );
    // And the name is free for this Lease again, once the engine has
    // handled the release's answer (until then it is "releasing", and
    // `try_acquire` says `None`: the backend's row goes a moment earlier).
    let mut again = None;
    for _ in 0..200 {
        again = lease.try_acquire("job", TTL).await.unwrap();
        if again.is_some() {
            break;
        }
        tokio::time::sleep(ms(10)).await;
    }
    assert!(again.is_some(), "the name stayed taken in this Lease");
}

/// The longest ttl there is: the time limits of acquire and release are
/// capped at 30 s, far below `ttl - margin` and `ttl`.
const DAY: Duration = Duration::from_secs(86_400);
const CAP: Duration = Duration::from_secs(30);

#[tokio::test(start_paused = true)]
async fn a_hanging_acquire_with_a_long_ttl_times_out_after_30_s() {
    let lease = an_acquire_that_hangs_times_out(DAY, CAP).await;
    // Through `with_lease`: skipped with the same error, after the same 30 s.
    let t0 = Instant::now();
    let out = lease
        .with_lease("job", DAY, |_| async { unreachable!("must not run") })
        .await;
    assert!(
        matches!(
            out,
            Outcome::Skipped(Skip::Error(Error::Timeout {
                operation: "acquire",
                ..
            }))
        ),
        "{out:?}"
    );
    assert_eq!(Instant::now() - t0, CAP);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_release_with_a_long_ttl_times_out_after_30_s() {
    a_release_that_hangs_times_out(DAY, CAP).await;
}

/// A hint of loss makes the engine renew at once, and the renewal decides:
/// `false` cancels the token then, not at the next renewal a period later.
#[tokio::test(start_paused = true)]
async fn a_hint_of_loss_renews_at_once_and_the_renewal_decides() {
    let backend = Scripted::new([Step::Answer(false)], Step::Answer(true)).hinted();
    let (_lease, guard, t0) = job_held(backend.clone()).await;
    sleep(ms(200)).await;
    backend.hint();
    tokio::time::timeout(ms(1), guard.token().cancelled())
        .await
        .expect("cancelled by the renewal the hint asked for");
    let renews = backend.times(t0, is_renew);
    assert_eq!(renews, [ms(200)]);
    assert!(!guard.is_valid());
}

/// A spurious hint costs one renewal: the lease stays, and the next renewal
/// comes a period after that one.
#[tokio::test(start_paused = true)]
async fn a_spurious_hint_costs_one_renewal() {
    let backend = Scripted::new([], Step::Answer(true)).hinted();
    let (_lease, guard, t0) = job_held(backend.clone()).await;
    sleep(ms(200)).await;
    backend.hint();
    sleep(ms(1500)).await;
    assert!(guard.is_valid());
    let renews = backend.times(t0, is_renew);
    assert_eq!(renews, [ms(200), ms(200) + PERIOD]);
    guard.release().await.unwrap();
}
