//! Renewal timing: every third of the ttl, the deadline and the grace,
//! errors retried, answers that come late.

use super::*;

#[tokio::test(start_paused = true)]
async fn renewals_and_the_release_carry_the_grants_fencing_token() {
    let backend = Scripted::new([], Step::Answer(true));
    backend.0.lock().unwrap().fence = 41;
    let lease = Lease::with_holder(backend.clone(), "a");
    let one = lease.try_acquire("one", TTL).await.unwrap().unwrap();
    let two = lease.try_acquire("two", TTL).await.unwrap().unwrap();
    assert_eq!(
        (one.fencing_token(), two.fencing_token()),
        (Some(42), Some(43))
    );
    sleep(PERIOD * 2 + ms(10)).await;
    two.release().await.unwrap();
    sleep(PERIOD).await;
    one.release().await.unwrap();
    let calls: Vec<Call> = backend.calls().into_iter().map(|(_, c)| c).collect();
    let fences = backend.0.lock().unwrap().fences.clone();
    // Each lease's renewals and release carry its own grant's token.
    let mut expected = Vec::new();
    for call in &calls {
        match call {
            Call::Acquire(_) => {}
            Call::Renew(n) | Call::Release(n) => expected.push(fence_of(n)),
            Call::RenewMany(names) => expected.extend(names.iter().map(|n| fence_of(n))),
        }
    }
    assert!(expected.len() >= 4, "{calls:?}");
    assert_eq!(fences, expected, "{calls:?}");
}

fn fence_of(name: &str) -> Option<u64> {
    match name {
        "one" => Some(42),
        "two" => Some(43),
        other => panic!("unexpected lease {other}"),
    }
}

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_ttl() {
    let backend = Scripted::new([], Step::Answer(true));
    let (_lease, guard, t0) = job_held(backend.clone()).await;
    sleep(ms(10_500)).await;
    assert!(guard.is_valid());
    assert!(!guard.token().is_cancelled());
    let expected: Vec<Duration> = (1..=10).map(|i| PERIOD * i).collect();
    assert_eq!(backend.times(t0, is_renew), expected);
}

#[tokio::test(start_paused = true)]
async fn definite_loss_cancels_at_once() {
    let backend = Scripted::new(
        [Step::Answer(true), Step::Answer(false)],
        Step::Answer(true),
    );
    let (_lease, guard, t0) = job_held(backend.clone()).await;
    assert_eq!(cancelled_after(&guard, t0).await, 2 * PERIOD);
    assert!(!guard.is_valid());
    // No more renewals after the loss.
    sleep(TTL * 3).await;
    assert_eq!(backend.times(t0, is_renew), vec![PERIOD, 2 * PERIOD]);
}

#[tokio::test(start_paused = true)]
async fn memory_loss_behind_our_back_cancels_at_next_renewal() {
    let db = Memory::new();
    let (_lease, guard, t0) = job_held(db.clone()).await;
    sleep(ms(1_500)).await;
    db.expire("job");
    assert_eq!(cancelled_after(&guard, t0).await, 2 * PERIOD);
}

#[tokio::test(start_paused = true)]
async fn errors_are_retried_and_cancel_exactly_at_the_deadline() {
    let backend = Scripted::new([], Step::Fail);
    let (_lease, guard, t0) = job_held(backend.clone()).await;

    // Not before the deadline (ttl - grace)...
    sleep_until(t0 + TTL - GRACE - ms(1)).await;
    assert!(guard.is_valid());
    assert!(!guard.token().is_cancelled());
    // ...but exactly at it.
    assert_eq!(cancelled_after(&guard, t0).await, TTL - GRACE);
    assert!(!guard.is_valid());

    // Retried with a short backoff (ttl/30 = 100 ms, doubling) over one
    // renewal period, between the first renewal at 1 s and the deadline.
    let renews = backend.times(t0, is_renew);
    assert_eq!(renews, vec![ms(1_000), ms(1_100), ms(1_300), ms(1_700)]);
}

/// An explicit grace moves the deadline: at the least grace (the margin,
/// the timing before issue 28) the token fires at `ttl - margin`, and the
/// retries go on until then.
#[tokio::test(start_paused = true)]
async fn an_explicit_grace_sets_when_failing_renewals_fire_the_token() {
    let backend = Scripted::new([], Step::Fail);
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let least = granted(lease.job("least", TTL).grace(MARGIN)).await;
    let half_s = granted(lease.job("half-s", TTL).grace(ms(500))).await;
    assert_eq!(cancelled_after(&half_s, t0).await, TTL - ms(500));
    assert!(least.is_valid());
    sleep_until(t0 + TTL - MARGIN - ms(1)).await;
    assert!(least.is_valid());
    assert_eq!(cancelled_after(&least, t0).await, TTL - MARGIN);
    let least_renewed = backend.times(t0, renews("least"));
    assert_eq!(
        least_renewed,
        [
            ms(1_000),
            ms(1_100),
            ms(1_300),
            ms(1_700),
            ms(2_200),
            ms(2_700)
        ]
    );
}

/// A grace outside `margin..=ttl/2` is refused before the backend is asked.
#[tokio::test(start_paused = true)]
async fn a_grace_out_of_range_is_refused() {
    let backend = Scripted::new([], Step::Answer(true));
    let lease = Lease::with_holder(backend.clone(), "a");
    for grace in [MARGIN - ms(1), TTL / 2 + ms(1)] {
        let got = lease.job("job", TTL).grace(grace).acquire().await;
        assert!(
            matches!(got, Err(Error::InvalidGrace { grace: g, ttl }) if g == grace && ttl == TTL),
            "{got:?}"
        );
        let ran = lease
            .job("job", TTL)
            .grace(grace)
            .run(|_, _| async {})
            .await;
        assert!(matches!(
            ran,
            Outcome::Skipped(Skip::Error(Error::InvalidGrace { .. }))
        ));
    }
    assert!(backend.calls().is_empty(), "{:?}", backend.calls());
    let at_the_bounds = [MARGIN, TTL / 2];
    for grace in at_the_bounds {
        let guard = lease.job("job", TTL).grace(grace).acquire().await;
        guard.unwrap().unwrap().release().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_success_after_errors_keeps_the_lease() {
    let backend = Scripted::new(
        [Step::Fail, Step::Fail, Step::Answer(true)],
        Step::Answer(true),
    );
    let (_lease, guard, t0) = job_held(backend.clone()).await;
    sleep(TTL * 4).await;
    assert!(guard.is_valid());
    // Failures at 1.0 and 1.1, success at 1.3, then every period from there.
    let renews = backend.times(t0, is_renew);
    assert_eq!(
        &renews[..5],
        &[ms(1_000), ms(1_100), ms(1_300), ms(2_300), ms(3_300)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_renewal_does_not_delay_the_cancellation() {
    let backend = Scripted::new([], Step::Hang);
    let (_lease, guard, t0) = job_held(backend.clone()).await;
    assert_eq!(cancelled_after(&guard, t0).await, TTL - GRACE);
    // The first attempt was cut off after ttl/3, which is the deadline.
    let renews = backend.times(t0, is_renew);
    assert_eq!(renews, vec![ms(1_000)]);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_answering_after_the_deadline_does_not_revive_the_lease() {
    // Answers true, but only after 1.9 s, past the 1 s attempt timeout: the
    // engine must not wait for it, and the lease stays lost afterwards.
    let backend = Scripted::new([], Step::Slow(ms(1_900), true));
    let (_lease, guard, t0) = job_held(backend.clone()).await;
    assert_eq!(cancelled_after(&guard, t0).await, TTL - GRACE);
    sleep(TTL).await;
    assert!(!guard.is_valid());
    assert!(guard.token().is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn the_deadline_counts_from_when_the_renewal_was_sent_not_answered() {
    // The renewal sent at 1 s answers at 1.9 s; the next one hangs. The
    // deadline is 1 s + 2 s, not 1.9 s + 2 s.
    let backend = Scripted::new([Step::Slow(ms(900), true)], Step::Hang);
    let (_lease, guard, t0) = job_held(backend.clone()).await;
    assert_eq!(cancelled_after(&guard, t0).await, PERIOD + TTL - GRACE);
    // The next renewal was due one period after the successful one was sent.
    assert_eq!(backend.times(t0, is_renew)[..2], [ms(1_000), ms(2_000)]);
}
