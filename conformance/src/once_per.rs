//! Once per schedule slot ([`Job::once_per`](leasehold::Job::once_per),
//! `retry_failed`, [`Backend::acquire_with`] with a slot), in the
//! `extended` group. A backend without slots
//! ([`Caps::once_per`](crate::Caps::once_per) false)
//! must refuse them with `Error::Unsupported`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::{Acquired, Backend, Error, Lease, OncePer, Outcome, Request, Skip};
use tokio::time::{Instant, sleep};

use crate::Subject;
use crate::support::{LONG, TTL, acq, acquire, fence, lapse, lease, ms, unique};

/// A period whose slot does not change during a test (a year and a day:
/// one slot boundary a year).
const YEAR: Duration = leasehold::MAX_PERIOD;

/// Where `s` has no slot ledger: `once_per` is refused with
/// `Error::Unsupported`, through the backend and through a job. `true` if
/// so (the property has nothing else to check).
async fn refused_without_a_ledger<S: Subject>(s: &S, name: &str) -> bool {
    if s.caps().once_per {
        return false;
    }
    let request = Request::new(name, "holder-a", TTL).once_per(OncePer::new(YEAR));
    let answer = s.backend().acquire_with(request).await;
    assert!(
        matches!(answer, Err(Error::Unsupported { .. })),
        "{answer:?}"
    );
    let lease = lease(s, "holder-a");
    let answer = lease.job(name, TTL).once_per(YEAR).acquire().await;
    assert!(
        matches!(answer, Err(Error::Unsupported { .. })),
        "{answer:?}"
    );
    true
}

/// One tick of a replica: run the job of `name` once per `period` (30 ms of
/// work); the slot it ran, if it ran.
async fn tick(lease: &Lease, name: &str, period: Duration) -> Option<u64> {
    match lease.job(name, TTL).once_per(period).acquire().await {
        Ok(Some(guard)) => {
            let slot = guard.slot().expect("a run claims a slot");
            sleep(ms(30)).await;
            guard.release().await.unwrap();
            Some(slot)
        }
        Ok(None) | Err(Error::AlreadyRan { .. }) => None,
        Err(e) => panic!("{}: {e}", lease.holder()),
    }
}

/// Milliseconds since the Unix epoch, by this host's clock.
fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(since.as_millis()).unwrap()
}

/// Two replicas (two `Lease`s, two holders) tick the same job every 200 ms,
/// 90 ms apart, for 3.3 s, with `once_per(1 s)`: every slot in that time
/// runs exactly once, on one replica or the other; slots only go up; and a
/// slot is `floor(clock / period)` (the backend's clock, here the host's,
/// give or take a slot).
pub async fn each_slot_runs_once_across_skewed_ticks<S: Subject>(s: &S) {
    let name = unique("once-per");
    if refused_without_a_ledger(s, &name).await {
        return;
    }
    let period = ms(1_000);
    let runs = Arc::new(Mutex::new(Vec::new()));
    let replica = |holder: &'static str, offset: Duration| {
        let (lease, name, runs) = (lease(s, holder), name.clone(), runs.clone());
        tokio::spawn(async move {
            sleep(offset).await;
            let until = Instant::now() + ms(3_300);
            while Instant::now() < until {
                let next = Instant::now() + ms(200);
                let clock = now_ms();
                if let Some(slot) = tick(&lease, &name, period).await {
                    runs.lock().unwrap().push((slot, holder, clock));
                }
                tokio::time::sleep_until(next).await;
            }
        })
    };
    let (a, b) = (replica("holder-a", ms(0)), replica("holder-b", ms(90)));
    a.await.unwrap();
    b.await.unwrap();
    let runs = runs.lock().unwrap().clone();
    eprintln!("runs: {runs:?}");
    let slots: Vec<u64> = runs.iter().map(|&(slot, ..)| slot).collect();
    assert!(
        slots.windows(2).all(|w| w[0] < w[1]),
        "a slot ran twice, or went back: {runs:?}"
    );
    let (first, last) = (slots[0], slots[slots.len() - 1]);
    assert_eq!(
        slots,
        (first..=last).collect::<Vec<_>>(),
        "a slot was missed"
    );
    assert!(slots.len() >= 3, "3.3 s of ticks span 3 slots: {runs:?}");
    for &(slot, _, clock) in &runs {
        let here = clock / 1_000;
        assert!(
            slot + 1 >= here && slot <= here + 1,
            "slot {slot} at {clock} ms"
        );
    }
}

/// By default a slot is claimed with the grant: a run that crashes (it
/// acquired, and never renews or releases) or fails is not run again in
/// its slot, by anyone, while its lease lives or after; `inspect` shows
/// the slot. A plain acquisition of the name is not refused.
pub async fn a_crashed_or_failed_run_does_not_run_its_slot_again<S: Subject>(s: &S) {
    let name = unique("once-crash");
    if refused_without_a_ledger(s, &name).await {
        return;
    }
    let b = s.backend();
    let ttl = ms(500);
    let claim = Request::new(&name, "crashed", ttl).once_per(OncePer::new(YEAR));
    let Acquired::Granted(grant) = b.acquire_with(claim).await.unwrap() else {
        panic!("the first run of a slot is granted");
    };
    let slot = grant.slot.expect("a claimed slot");
    let again = Request::new(&name, "holder-b", LONG).once_per(OncePer::new(YEAR));
    let refused = b.acquire_with(again).await.unwrap();
    assert_eq!(refused, Acquired::AlreadyRan { slot }, "while it is held");
    lapse(s, acq(&name, "crashed", &grant), ttl).await;
    assert_eq!(
        b.acquire_with(again).await.unwrap(),
        Acquired::AlreadyRan { slot }
    );
    let other = lease(s, "holder-b");
    let outcome = other
        .job(&name, TTL)
        .once_per(YEAR)
        .run(|_, _| async {})
        .await;
    assert!(
        matches!(outcome, Outcome::Skipped(Skip::AlreadyRan { slot: s }) if s == slot),
        "{outcome:?}"
    );
    let info = b.inspect(&name).await.unwrap().expect("a record");
    assert_eq!(info.slot, Some(slot), "{info:?}");
    let plain = other.try_acquire(&name, TTL).await.unwrap();
    plain
        .expect("a plain lease is not refused")
        .release()
        .await
        .unwrap();

    // A run that fails keeps its slot too.
    let failing = unique("once-failed");
    let failed = other
        .job(&failing, TTL)
        .once_per(YEAR)
        .try_run(|_, _| async { Err::<(), _>("failed") })
        .await;
    assert!(matches!(failed, Outcome::Ran(Err(_))), "{failed:?}");
    let outcome = lease(s, "holder-c")
        .job(&failing, TTL)
        .once_per(YEAR)
        .run(|_, _| async {})
        .await;
    assert!(
        matches!(outcome, Outcome::Skipped(Skip::AlreadyRan { .. })),
        "{outcome:?}"
    );
}

/// With `retry_failed` a slot is recorded only when its run succeeds: a
/// run that crashed or failed (its body returned `Err`) runs again in its
/// slot, on any replica; once one has succeeded, the slot is refused.
pub async fn retry_failed_runs_a_failed_slot_again<S: Subject>(s: &S) {
    let name = unique("once-retry");
    if refused_without_a_ledger(s, &name).await {
        return;
    }
    let b = s.backend();
    let ttl = ms(500);
    let once = OncePer::new(YEAR).retry_failed(true);
    let claim = Request::new(&name, "crashed", ttl).once_per(once);
    let Acquired::Granted(grant) = b.acquire_with(claim).await.unwrap() else {
        panic!("the first run of a slot is granted");
    };
    let slot = grant.slot.expect("a claimed slot");
    lapse(s, acq(&name, "crashed", &grant), ttl).await;
    let job = |holder: &str| {
        let lease = lease(s, holder);
        let name = name.clone();
        async move {
            let job = lease.job(&name, TTL).once_per(YEAR).retry_failed();
            job.try_run(|_, _| async { Err::<(), _>("failed") }).await
        }
    };
    let failed = job("holder-a").await;
    assert!(
        matches!(failed, Outcome::Ran(Err(_))),
        "runs again after a crash: {failed:?}"
    );
    let failed = job("holder-b").await;
    assert!(
        matches!(failed, Outcome::Ran(Err(_))),
        "runs again after a failure: {failed:?}"
    );
    let succeeding = lease(s, "holder-c");
    let ran = succeeding
        .job(&name, TTL)
        .once_per(YEAR)
        .retry_failed()
        .acquire()
        .await
        .unwrap()
        .expect("runs again after a failure");
    assert_eq!(ran.slot(), Some(slot), "the same slot");
    ran.succeeded();
    ran.release().await.unwrap();
    let skipped = job("holder-a").await;
    assert!(
        matches!(skipped, Outcome::Skipped(Skip::AlreadyRan { slot: s }) if s == slot),
        "{skipped:?}"
    );
}

/// A period that is not whole milliseconds from 1 ms to
/// `leasehold::MAX_PERIOD` is refused with `Error::InvalidDuration`:
/// through a job, and by the backend called directly (a backend without
/// slots may answer `Error::Unsupported` instead). Nothing is taken: the
/// name is free afterwards.
pub async fn a_period_out_of_bounds_is_invalid<S: Subject>(s: &S) {
    let name = unique("period");
    let invalid = |e: &Error| {
        matches!(
            e,
            Error::InvalidDuration {
                argument: "once_per",
                ..
            }
        )
    };
    let a = lease(s, "holder-a");
    for period in [Duration::ZERO, YEAR + ms(1), Duration::from_micros(1_500)] {
        let answer = a.job(&name, TTL).once_per(period).acquire().await;
        assert!(
            matches!(&answer, Err(e) if invalid(e)),
            "{period:?}: {answer:?}"
        );
        let request = Request::new(&name, "holder-a", TTL).once_per(OncePer::new(period));
        let answer = s.backend().acquire_with(request).await;
        let unsupported = |e: &Error| !s.caps().once_per && matches!(e, Error::Unsupported { .. });
        assert!(
            matches!(&answer, Err(e) if invalid(e) || unsupported(e)),
            "{period:?}: the backend answered {answer:?}"
        );
    }
    assert_eq!(
        acquire(&s.backend(), &name, "holder-b", TTL).await,
        Some(fence(s, 1))
    );
}
