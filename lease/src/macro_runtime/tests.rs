//! `#[singleton]`'s runtime side under tokio's paused clock, against `Memory`.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::{Instant, sleep, sleep_until};

use super::{AsLease, AsName, Settings, run, run_or_err};
use crate::backend::Memory;
use crate::test_util::{capture_logs, ms, paused_runtime, pods};
use crate::{Error, Lease, Skippable};

/// ttl 3 s: renewed every 1 s.
const TTL_MS: u64 = 3_000;
const TTL: Duration = Duration::from_millis(TTL_MS);

/// The settings of `name = "job", ttl = "3s"`.
fn job() -> Settings<'static> {
    Settings {
        name: "job",
        ttl: TTL,
        min_hold: None,
        max_hold: None,
        grace: None,
        wait: None,
        once_per: None,
        retry_failed: false,
    }
}

/// `job()` with `min_hold = <n ms>`.
fn min_hold(n: u64) -> Settings<'static> {
    Settings {
        min_hold: Some(ms(n)),
        ..job()
    }
}

/// Run a body that records that it ran and returns `value`.
async fn tick<T: Skippable>(lease: Option<&Lease>, ran: &Mutex<bool>, value: T) -> T {
    run(lease.cloned(), job(), |_, _| async move {
        *ran.lock().unwrap() = true;
        value
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn runs_the_body_with_the_token_and_fencing_token_and_releases() {
    let (db, a, _) = pods();
    for expected_fence in [1, 2] {
        let db = &db;
        let out = run(Some(a.clone()), job(), |token, fence| async move {
            assert!(!token.is_cancelled());
            assert_eq!(db.holder("job").as_deref(), Some("a"));
            fence
        })
        .await;
        assert_eq!(out, Some(expected_fence));
        sleep(ms(1)).await;
        assert_eq!(db.holder("job"), None, "released after the body");
    }
}

#[tokio::test(start_paused = true)]
async fn held_elsewhere_returns_the_skipped_value_without_running() {
    let (_db, a, b) = pods();
    let _held = b.try_acquire("job", TTL).await.unwrap().unwrap();
    let ran = Mutex::new(false);
    tick(Some(&a), &ran, ()).await;
    assert!(!tick(Some(&a), &ran, true).await);
    assert_eq!(tick(Some(&a), &ran, Some(7)).await, None);
    assert_eq!(tick(Some(&a), &ran, Ok::<(), String>(())).await, Ok(()));
    assert_eq!(tick(Some(&a), &ran, Err::<(), _>("boom")).await, Ok(()));
    assert_eq!(
        tick(Some(&a), &ran, Ok::<_, String>(Some(7))).await,
        Ok(None)
    );
    assert!(!*ran.lock().unwrap(), "the body must not run");
}

#[tokio::test(start_paused = true)]
async fn an_acquisition_error_returns_the_skipped_value() {
    let (_db, a, _) = pods();
    let out: Result<Option<u8>, Error> = run(
        Some(a),
        Settings {
            ttl: Duration::ZERO,
            ..job()
        },
        |_, _| async {
            unreachable!("ttl 0 is invalid");
        },
    )
    .await;
    assert!(matches!(out, Ok(None)));
}

#[tokio::test(start_paused = true)]
async fn no_lease_is_skipped_with_an_error_log_not_a_panic() {
    // A name of its own: the once-per-name record is the process's.
    let settings = || Settings {
        name: "no-lease-job",
        ..job()
    };
    let (logs, _guard) = capture_logs();
    let ran = Mutex::new(false);
    let body = |_, _| async {
        *ran.lock().unwrap() = true;
        Some(1)
    };
    assert_eq!(run(None, settings(), body).await, None);
    assert!(!*ran.lock().unwrap());
    let text = logs.text();
    assert!(text.contains("ERROR"), "{text}");
    assert!(text.contains("leasehold::set_global_default"), "{text}");
    assert!(text.contains("lease = ..."), "{text}");
    assert!(text.contains("lease.name=\"no-lease-job\""), "{text}");

    // Every tick after that is skipped too, but not logged at error again.
    for _ in 0..3 {
        assert_eq!(run(None, settings(), body).await, None);
    }
    let text = logs.text();
    assert_eq!(text.matches("ERROR").count(), 1, "{text}");
    assert!(!*ran.lock().unwrap());
}

#[tokio::test(start_paused = true)]
async fn min_hold_keeps_the_lease_after_a_fast_body_then_lets_go() {
    let (db, a, b) = pods();
    let t0 = Instant::now();
    let out = run(Some(a.clone()), min_hold(2_000), |_, _| async { Some(1) }).await;
    assert_eq!(out, Some(1));
    assert_eq!(Instant::now(), t0, "returns at once");

    sleep_until(t0 + ms(1_999)).await;
    assert_eq!(db.holder("job").as_deref(), Some("a"));
    assert!(
        b.try_acquire("job", TTL).await.unwrap().is_none(),
        "another pod is refused"
    );
    let again = run(Some(a.clone()), job(), |_, _| async { Some(2) }).await;
    assert_eq!(again, None, "this pod's next tick is skipped too");

    sleep_until(t0 + ms(2_001)).await;
    assert_eq!(db.holder("job"), None, "released once min_hold has passed");
    assert!(b.try_acquire("job", TTL).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn min_hold_longer_than_the_ttl_renews_the_lease() {
    let (db, a, b) = pods();
    let t0 = Instant::now();
    let fence = run(Some(a.clone()), min_hold(10_000), |_, fence| async move {
        fence
    })
    .await;
    for at in [2_000, 4_000, 6_000, 8_000, 9_999] {
        sleep_until(t0 + ms(at)).await;
        assert_eq!(
            db.holder("job").as_deref(),
            Some("a"),
            "held at {at} ms, past the 3 s ttl"
        );
        assert!(b.try_acquire("job", TTL).await.unwrap().is_none());
    }
    assert_eq!(
        db.fence("job"),
        fence.unwrap(),
        "renewed, never re-acquired"
    );
    sleep_until(t0 + ms(10_001)).await;
    assert_eq!(db.holder("job"), None);
}

#[tokio::test(start_paused = true)]
async fn min_hold_shorter_than_the_body_releases_when_the_body_ends() {
    let (db, a, _) = pods();
    let t0 = Instant::now();
    run(Some(a), min_hold(2_000), |_, _| sleep(ms(5_000))).await;
    assert_eq!(Instant::now() - t0, ms(5_000));
    sleep(ms(1)).await;
    assert_eq!(db.holder("job"), None);
}

#[tokio::test(start_paused = true)]
async fn a_lease_lost_during_min_hold_is_cleaned_up() {
    let (db, a, b) = pods();
    let t0 = Instant::now();
    run(Some(a.clone()), min_hold(10_000), |_, _| async {}).await;
    sleep_until(t0 + ms(1_500)).await;
    db.expire("job");
    let taker = b
        .try_acquire("job", TTL)
        .await
        .unwrap()
        .expect("expired, so free");
    // a's renewal at 2 s finds the lease gone: a stops holding it at once
    // (and does not release b's lease).
    sleep_until(t0 + ms(2_001)).await;
    assert_eq!(db.holder("job").as_deref(), Some("b"));
    assert!(taker.is_valid());
    drop(taker);
    sleep(ms(1)).await;
    assert!(
        a.try_acquire("job", TTL).await.unwrap().is_some(),
        "a may acquire the name again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_lost_during_the_body_is_released_despite_min_hold() {
    let (db, a, _) = pods();
    let db2 = db.clone();
    run(Some(a.clone()), min_hold(10_000), |token, _| async move {
        db2.expire("job");
        token.cancelled().await; // noticed at the renewal at 1 s
    })
    .await;
    sleep(ms(1)).await;
    // Nothing renews a lost lease, so nothing may wait for min_hold to free
    // the name: this pod can run the job again at once.
    let again = run(Some(a.clone()), job(), |_, _| async { true }).await;
    assert!(again, "the name must not stay reserved after a loss");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_body_releases_at_once_despite_min_hold() {
    let (db, a, _) = pods();
    let task: tokio::task::JoinHandle<()> = tokio::spawn(async move {
        run(Some(a), min_hold(10_000), |_, _| async {
            panic!("job failed")
        })
        .await
    });
    let err = task.await.unwrap_err();
    assert!(err.is_panic());
    sleep(ms(1)).await;
    assert_eq!(db.holder("job"), None);
}

#[test]
fn a_runtime_shutting_down_during_min_hold_frees_the_name() {
    let a = Lease::with_holder(Memory::new(), "a");
    let rt = paused_runtime();
    rt.block_on(run(Some(a.clone()), min_hold(10_000), |_, _| async {}));
    drop(rt);
    let rt = paused_runtime();
    let guard = rt.block_on(a.try_acquire("job", TTL)).unwrap();
    assert!(
        guard.is_some(),
        "no scheduler is left to release it, so the name must be free"
    );
}

#[tokio::test(start_paused = true)]
async fn the_future_is_send_when_the_body_is() {
    fn assert_send<F: std::future::Future + Send>(f: F) -> F {
        f
    }
    let (_db, a, _) = pods();
    let fut = assert_send(run(Some(a), min_hold(1_000), |token, _| async move {
        sleep(ms(1)).await;
        token.is_cancelled()
    }));
    assert!(!tokio::spawn(fut).await.unwrap());
}

#[test]
fn as_lease_accepts_every_way_of_holding_a_lease() {
    static LAZY: LazyLock<Lease> = LazyLock::new(|| Lease::with_holder(Memory::new(), "lazy"));
    let lease = Lease::with_holder(Memory::new(), "a");
    let holder = |l: Option<Lease>| l.map(|l| l.holder().to_owned());
    assert_eq!(holder(AsLease::as_lease(&lease)).as_deref(), Some("a"));
    assert_eq!(holder(AsLease::as_lease(&&lease)).as_deref(), Some("a"));
    assert_eq!(holder(AsLease::as_lease(&&&lease)).as_deref(), Some("a"));
    assert_eq!(
        holder(AsLease::as_lease(&Arc::new(lease.clone()))).as_deref(),
        Some("a")
    );
    assert_eq!(
        holder(AsLease::as_lease(&Some(&lease))).as_deref(),
        Some("a")
    );
    assert_eq!(holder(AsLease::as_lease(&None::<&Lease>)), None);
    assert_eq!(holder(AsLease::as_lease(&LAZY)).as_deref(), Some("lazy"));
}

/// Run `settings` on `a` with a body that records that it ran; returns the
/// value and whether the body ran.
async fn run_with(a: &Lease, settings: Settings<'_>) -> (Option<u8>, bool) {
    let ran = Mutex::new(false);
    let out = run(Some(a.clone()), settings, |_, _| async {
        *ran.lock().unwrap() = true;
        Some(1)
    })
    .await;
    (out, ran.into_inner().unwrap())
}

/// `job()` with one setting changed.
fn with_ttl(ttl: Duration) -> Settings<'static> {
    Settings { ttl, ..job() }
}

fn with_grace(grace: Duration) -> Settings<'static> {
    Settings {
        grace: Some(grace),
        ..job()
    }
}

fn with_once_per(period: Duration, retry_failed: bool) -> Settings<'static> {
    Settings {
        once_per: Some(period),
        retry_failed,
        ..job()
    }
}

/// Settings out of bounds, each with the warning it must log.
fn invalid_settings(long: &str) -> Vec<(Settings<'_>, &'static str)> {
    let day_and_a_ms = crate::MAX_TTL + ms(1);
    let mut bad = vec![
        (
            Settings { name: "", ..job() },
            "invalid lease name (0 bytes)",
        ),
        (
            Settings {
                name: long,
                ..job()
            },
            "invalid lease name (256 bytes)",
        ),
        (with_ttl(Duration::ZERO), "invalid ttl"),
        (with_ttl(ms(9)), "invalid ttl"),
        (with_ttl(Duration::from_micros(10_500)), "invalid ttl"),
        (with_ttl(day_and_a_ms), "invalid ttl"),
        (with_ttl(Duration::MAX), "invalid ttl"),
        (
            Settings {
                min_hold: Some(day_and_a_ms),
                ..job()
            },
            "invalid `min_hold`",
        ),
        (
            Settings {
                max_hold: Some(Duration::ZERO),
                ..job()
            },
            "invalid `max_hold`",
        ),
        (
            Settings {
                max_hold: Some(day_and_a_ms),
                ..job()
            },
            "invalid `max_hold`",
        ),
        (
            Settings {
                wait: Some(Duration::from_micros(1_500)),
                ..job()
            },
            "invalid `wait`",
        ),
        (with_grace(ms(31)), "invalid `grace`"),
        (with_grace(ms(1_501)), "invalid `grace`"),
    ];
    for period in [
        Duration::ZERO,
        Duration::from_micros(1_500),
        crate::MAX_PERIOD + ms(1),
    ] {
        for retry_failed in [false, true] {
            bad.push((with_once_per(period, retry_failed), "invalid `once_per`"));
        }
    }
    bad
}

/// The limits a literal gets at compile time hold for expressions at run
/// time, checked at each call: a name of 1 to 255 bytes; a ttl from 10 ms,
/// `min_hold` and `max_hold` (not zero) up to 24 h, and `wait`, in whole
/// milliseconds; a grace from the margin (ttl/100 + 2 ms) to ttl/2; a
/// `once_per` from 1 ms to 366 days. Outside them the run is skipped,
/// nothing is acquired, and a warning says why; the boundaries run.
#[tokio::test(start_paused = true)]
async fn invalid_run_time_settings_are_skipped_and_logged() {
    let (db, a, _) = pods();
    let long = "x".repeat(256);
    for (settings, warning) in invalid_settings(&long) {
        let (logs, _guard) = capture_logs();
        assert_eq!(run_with(&a, settings).await, (None, false), "{settings:?}");
        assert_eq!(db.holder(settings.name), None, "not even acquired");
        let logs = logs.text();
        assert_eq!(logs.matches("WARN").count(), 1, "{logs}");
        assert_eq!(logs.matches(warning).count(), 1, "{logs}");
    }
    // Each `once_per` under a name of its own: a slot's number depends on
    // the period.
    let good = [
        Settings {
            min_hold: Some(Duration::ZERO),
            max_hold: Some(crate::MAX_TTL),
            wait: Some(Duration::ZERO),
            ..job()
        },
        with_grace(ms(32)),
        with_grace(ms(1_500)),
        Settings {
            name: "shortest",
            ..with_once_per(ms(1), false)
        },
        Settings {
            name: "longest",
            ..with_once_per(crate::MAX_PERIOD, false)
        },
    ];
    for settings in good {
        let ran = run_with(&a, settings).await;
        assert_eq!(ran, (Some(1), true), "{settings:?}");
        sleep(ms(1)).await; // the lease is released in the background
    }
}

/// With `on_error = "return"`, an invalid grace or `once_per` is the
/// error returned (and it is logged all the same).
#[tokio::test(start_paused = true)]
async fn run_or_err_returns_an_invalid_grace_or_once_per() {
    let (_db, a, _) = pods();
    let grace = |grace| (with_grace(grace), Error::InvalidGrace { grace, ttl: TTL });
    let once_per = |duration| {
        let argument = "once_per";
        let invalid = Error::InvalidDuration { argument, duration };
        (with_once_per(duration, false), invalid)
    };
    for (settings, invalid) in [
        grace(ms(31)),
        grace(ms(1_501)),
        once_per(Duration::ZERO),
        once_per(Duration::from_micros(1_500)),
        once_per(crate::MAX_PERIOD + ms(1)),
    ] {
        let (logs, _guard) = capture_logs();
        let returned: Result<(), Error> =
            run_or_err(Some(a.clone()), settings, |_, _| async { Ok(()) }).await;
        // `Error` is not `PartialEq`: compared as printed.
        let expected: Result<(), Error> = Err(invalid);
        assert_eq!(format!("{returned:?}"), format!("{expected:?}"));
        assert_eq!(logs.text().matches("WARN").count(), 1, "{}", logs.text());
    }
}

#[tokio::test(start_paused = true)]
async fn wait_runs_the_body_once_the_holder_lets_go() {
    let (_db, a, b) = pods();
    let held = b.try_acquire("job", TTL).await.unwrap().unwrap();
    let t0 = Instant::now();
    tokio::spawn(async move {
        sleep(ms(2_000)).await;
        held.release().await.unwrap();
    });
    let started = run(
        Some(a.clone()),
        Settings {
            wait: Some(ms(5_000)),
            ..job()
        },
        |_, _| async { Some(Instant::now()) },
    )
    .await
    .expect("ran after waiting");
    let waited = started - t0;
    // b's lease is another `Lease`'s: `Memory` is polled every ttl/10 ± 20%.
    assert!(
        waited >= ms(2_000) && waited <= ms(2_400),
        "started after {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn wait_gives_up_with_the_skipped_value_when_the_lease_stays_held() {
    let (_db, a, b) = pods();
    let _held = b.try_acquire("job", TTL).await.unwrap().unwrap();
    let t0 = Instant::now();
    let settings = Settings {
        wait: Some(ms(1_000)),
        ..job()
    };
    assert_eq!(run_with(&a, settings).await, (None, false));
    assert_eq!(Instant::now() - t0, ms(1_000), "waited the whole second");
}

#[tokio::test(start_paused = true)]
async fn max_hold_cancels_the_token_and_ends_the_lease() {
    let (db, a, b) = pods();
    let t0 = Instant::now();
    let settings = Settings {
        max_hold: Some(ms(5_000)),
        ..job()
    };
    let db2 = db.clone();
    let cancelled_at = run(Some(a.clone()), settings, |token, _| async move {
        // Renewed past the ttl until then.
        sleep(ms(4_000)).await;
        assert_eq!(db2.holder("job").as_deref(), Some("a"));
        token.cancelled().await;
        Some(Instant::now())
    })
    .await
    .expect("ran");
    assert_eq!(cancelled_at - t0, ms(5_000), "the token fired at max_hold");
    sleep(ms(1)).await;
    assert_eq!(db.holder("job"), None, "released");
    assert!(b.try_acquire("job", TTL).await.unwrap().is_some());
}

/// With `on_error = "return"`: an acquisition error is `Err(e.into())`;
/// held elsewhere is still the skipped value; a run's value is its own.
#[tokio::test(start_paused = true)]
async fn run_or_err_returns_acquisition_errors() {
    #[derive(Debug)]
    struct JobError(Error);
    impl From<Error> for JobError {
        fn from(e: Error) -> Self {
            JobError(e)
        }
    }
    let (logs, _guard) = capture_logs();
    let (_db, a, b) = pods();
    let body = |_, _| async { Ok::<_, JobError>(Some(1)) };

    let invalid = Settings {
        ttl: Duration::ZERO,
        ..job()
    };
    let out = run_or_err(Some(a.clone()), invalid, body).await;
    assert!(
        matches!(out, Err(JobError(Error::InvalidTtl { .. }))),
        "{out:?}"
    );
    let bad_wait = Settings {
        wait: Some(crate::MAX_TTL + ms(1)),
        ..job()
    };
    let out = run_or_err(Some(a.clone()), bad_wait, body).await;
    assert!(
        matches!(
            out,
            Err(JobError(Error::InvalidDuration {
                argument: "wait",
                ..
            }))
        ),
        "{out:?}"
    );
    let out = run_or_err(None, job(), body).await;
    assert!(matches!(out, Err(JobError(Error::NoLease))), "{out:?}");
    assert!(logs.text().contains("invalid ttl"), "still logged");

    let held = b.try_acquire("job", TTL).await.unwrap().unwrap();
    let out = run_or_err(Some(a.clone()), job(), body).await;
    assert!(matches!(out, Ok(None)), "held elsewhere: {out:?}");
    held.release().await.unwrap();

    let out = run_or_err(Some(a.clone()), job(), body).await;
    assert!(matches!(out, Ok(Some(1))), "{out:?}");
    let out: Result<(), JobError> = run_or_err(Some(a), job(), |_, _| async {
        Err(JobError(Error::ShutDown))
    })
    .await;
    assert!(
        matches!(out, Err(JobError(Error::ShutDown))),
        "the body's own error"
    );
}

#[test]
fn as_name_accepts_every_way_of_holding_a_string() {
    use std::borrow::Cow;
    use std::rc::Rc;
    let owned = String::from("n");
    assert_eq!(AsName::as_name(&"n"), "n");
    assert_eq!(AsName::as_name(&owned), "n");
    assert_eq!(AsName::as_name(&&owned), "n");
    assert_eq!(AsName::as_name(&format!("report-{}", 7)), "report-7");
    assert_eq!(AsName::as_name(&Cow::Borrowed("n")), "n");
    assert_eq!(AsName::as_name(&Box::<str>::from("n")), "n");
    assert_eq!(AsName::as_name(&Arc::<str>::from("n")), "n");
    assert_eq!(AsName::as_name(&Rc::<str>::from("n")), "n");
}

/// `once_per = "1m"`.
const PERIOD: Duration = Duration::from_secs(60);

/// Sleep until 1 s into the next slot of `period` by a `Memory` made just
/// now (its clock is the wall clock at creation advanced by tokio's, which
/// is paused), so that the calls that follow, less than `period - 1 s`
/// apart, share a slot.
async fn into_next_slot(period: Duration) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let period_ms = period.as_millis();
    let to_next = u64::try_from(period_ms - now % period_ms).unwrap();
    sleep(ms(to_next + 1_000)).await;
}

/// A second run in a slot that ran already returns the skipped value,
/// logged at debug (it is the normal case on every replica but one), also
/// with `on_error = "return"`; the next slot runs again.
#[tokio::test(start_paused = true)]
async fn once_per_runs_a_slot_once_and_skips_the_rest_at_debug() {
    let (_db, a, b) = pods();
    into_next_slot(PERIOD).await;
    let (logs, _guard) = capture_logs();
    let settings = Settings {
        once_per: Some(PERIOD),
        ..job()
    };
    assert_eq!(run_with(&a, settings).await, (Some(1), true));
    sleep(ms(1)).await;
    assert_eq!(run_with(&a, settings).await, (None, false), "same pod");
    assert_eq!(run_with(&b, settings).await, (None, false), "other pod");
    let returned: Result<Option<u8>, Error> =
        run_or_err(Some(b.clone()), settings, |_, _| async { Ok(Some(1)) }).await;
    assert!(
        matches!(returned, Ok(None)),
        "skipped, not an error: {returned:?}"
    );
    let text = logs.text();
    assert_eq!(text.matches("has run already").count(), 3, "{text}");
    assert!(
        text.lines()
            .filter(|line| line.contains("has run already"))
            .all(|line| line.contains("DEBUG")),
        "{text}"
    );
    assert!(!text.contains("WARN"), "{text}");

    sleep(PERIOD).await;
    assert_eq!(
        run_with(&b, settings).await,
        (Some(1), true),
        "the next slot"
    );
}

/// With `retry_failed`, a body that did not succeed (`Err`) leaves its slot
/// to be run again, by any pod, until a run succeeds; without it, the
/// failed run used the slot up.
#[tokio::test(start_paused = true)]
async fn retry_failed_runs_a_failed_slot_again_until_it_succeeds() {
    let (_db, a, b) = pods();
    into_next_slot(PERIOD).await;
    for retry_failed in [true, false] {
        let name = if retry_failed {
            "retried"
        } else {
            "not-retried"
        };
        let settings = Settings {
            name,
            once_per: Some(PERIOD),
            retry_failed,
            ..job()
        };
        let runs = Mutex::new(Vec::new());
        let call = |pod: &Lease, fail: bool| {
            let (pod, runs) = (pod.clone(), &runs);
            async move {
                run(Some(pod.clone()), settings, |_, _| async move {
                    runs.lock().unwrap().push(pod.holder().to_owned());
                    if fail { Err("the job failed") } else { Ok(()) }
                })
                .await
            }
        };
        assert_eq!(call(&a, true).await, Err("the job failed"));
        sleep(ms(1)).await;
        if retry_failed {
            assert_eq!(call(&b, true).await, Err("the job failed"), "ran again");
            sleep(ms(1)).await;
            assert_eq!(call(&a, false).await, Ok(()), "ran again");
            sleep(ms(1)).await;
            assert_eq!(call(&b, false).await, Ok(()), "skipped");
            assert_eq!(*runs.lock().unwrap(), ["a", "b", "a"]);
        } else {
            assert_eq!(call(&b, false).await, Ok(()), "skipped");
            assert_eq!(call(&a, false).await, Ok(()), "skipped");
            assert_eq!(*runs.lock().unwrap(), ["a"]);
        }
    }
}
