//! Leaders that say where they are ([`Election::proclaim`](leasehold::Election::proclaim),
//! `Leadership::Following { value }`) and observers
//! ([`Lease::observe`](leasehold::Lease::observe)), in the `extended`
//! group. A backend without values ([`Caps::values`] false) must refuse
//! them with `Error::Unsupported`.

use std::time::Duration;

use leasehold::{Acquisition, Backend, Error, Leadership, MAX_VALUE_LEN, Observed, Request};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

use crate::elections::{SLACK, WAITED, assert_follows, hand_over_bound, hand_over_kind, subscribe};
use crate::support::{LONG, TTL, acquired, lease, ms, release, unique};
use crate::{Caps, Naming, Subject};

/// How often an observer asks when nothing wakes it sooner
/// (`Lease::observe`).
const OBSERVE_POLL: Duration = Duration::from_secs(1);

/// A value over 4 KiB is refused (`Error::InvalidValue`), by an election
/// and by the backend; one of 4 KiB is not.
pub async fn a_value_over_4_kib_is_invalid<S: Subject>(s: &S) {
    let name = unique("value-size");
    let election = lease(s, "leader-a").elect(&name, LONG);
    let over = "v".repeat(MAX_VALUE_LEN + 1);
    let answer = election.proclaim(over.clone());
    assert!(
        matches!(answer, Err(Error::InvalidValue { len }) if len == MAX_VALUE_LEN + 1),
        "{answer:?}"
    );
    election.proclaim("v".repeat(MAX_VALUE_LEN)).unwrap();
    if s.caps().values {
        let term = timeout(LONG, election.leading()).await.expect("leads");
        let value = published(&s.backend(), &name, |v| v.is_some()).await;
        assert_eq!(value.map(|v| v.len()), Some(MAX_VALUE_LEN));
        drop(term);
        election.resign().await.unwrap();
    }
    let request = Request::new(&name, "holder-b", TTL).value(&over);
    let answer = s.backend().acquire_with(request).await;
    if s.caps().values {
        assert!(
            matches!(answer, Err(Error::InvalidValue { .. })),
            "{answer:?}"
        );
    } else {
        // Refused either way: a backend may check its input before it
        // finds that it cannot store a value at all.
        assert!(
            matches!(
                answer,
                Err(Error::Unsupported { .. } | Error::InvalidValue { .. })
            ),
            "{answer:?}"
        );
    }
}

/// A leader's proclaimed value is written with its acquisition (`inspect`
/// shows it) and seen by a follower (`Following { value }`); a value
/// proclaimed while leading reaches the follower about one round trip
/// later where the server pushes, else within a poll. Without values, the
/// backend refuses both ways of writing one.
pub async fn a_follower_sees_the_leaders_value<S: Subject>(s: &S) {
    let name = unique("proclaim");
    let b = s.backend();
    if !s.caps().values {
        let request = Request::new(&name, "holder-a", TTL).value("v");
        let answer = b.acquire_with(request).await;
        assert!(
            matches!(answer, Err(Error::Unsupported { .. })),
            "{answer:?}"
        );
        let fence = acquired(&b, &name, "holder-a", TTL).await;
        let answer = b
            .publish(Acquisition::new(&name, "holder-a", fence), Some("v"))
            .await;
        assert!(
            matches!(answer, Err(Error::Unsupported { .. })),
            "{answer:?}"
        );
        return release(&b, &name, "holder-a", fence).await;
    }
    subscribe(s).await;
    let first = lease(s, "leader-a").elect(&name, LONG);
    first.proclaim("10.0.0.1:8080").unwrap();
    let term = timeout(LONG, first.leading()).await.expect("leads");
    let value = published(&b, &name, |v| v.is_some()).await;
    assert_eq!(value.as_deref(), Some("10.0.0.1:8080"));
    let second = lease(s, "leader-b").elect(&name, LONG);
    let mut state = second.watch();
    let follows = |value: &'static str| move |l: &Leadership| matches!(l, Leadership::Following { value: Some(v), .. } if v == value);
    let seen = timeout(LONG, state.wait_for(follows("10.0.0.1:8080"))).await;
    let seen = seen.is_ok_and(|r| r.is_ok());
    assert!(seen, "{:?}", *second.watch().borrow());
    assert_follows(s, &second.watch().borrow().clone(), "leader-a", true);
    sleep(WAITED).await;
    let proclaimed = Instant::now();
    first.proclaim("10.0.0.2:8080").unwrap();
    let bound = hand_over_bound(s, LONG);
    let seen = timeout(LONG, state.wait_for(follows("10.0.0.2:8080"))).await;
    let seen = seen.is_ok_and(|r| r.is_ok());
    assert!(seen, "{:?}", *second.watch().borrow());
    let took = proclaimed.elapsed();
    eprintln!("the follower saw the new value after {took:?}");
    assert!(
        took < bound,
        "seen {took:?} after it was proclaimed, not under {bound:?} ({})",
        hand_over_kind(s)
    );
    assert!(term.is_valid() && !second.is_leader());
    drop(term);
    first.resign().await.unwrap();
    let next = timeout(LONG, second.leading())
        .await
        .expect("the second leads");
    let info = b.inspect(&name).await.unwrap().expect("a record");
    assert_eq!(info.value, None, "the value ended with its term: {info:?}");
    drop(next);
    second.resign().await.unwrap();
}

/// The value `inspect` shows for `name` once it is `wanted` (within
/// [`SLACK`]; else the last one). The first attempt of an election may go
/// out before a `proclaim` right after `elect`: the value then follows, at
/// once, as one published while leading.
async fn published(
    b: &impl Backend,
    name: &str,
    wanted: impl Fn(&Option<String>) -> bool,
) -> Option<String> {
    let deadline = Instant::now() + SLACK;
    loop {
        let info = b.inspect(name).await.unwrap().expect("a record");
        if wanted(&info.value) || Instant::now() > deadline {
            return info.value;
        }
        sleep(ms(20)).await;
    }
}

/// Whether `o` shows `holder` (as the backend names holders, [`Naming`])
/// with `value`.
fn shows<S: Subject>(s: &S, o: &Observed, holder: &str, value: Option<&str>) -> bool {
    let named = match s.caps().leader {
        Naming::Holder | Naming::OwnHolders => o.holder.as_deref() == Some(holder),
        Naming::Session => o.holder.as_deref().is_some_and(|h| h.contains("pid ")),
    };
    named && o.value.as_deref() == value
}

/// An observer (`Lease::observe`) sees a lease's holder and value (where
/// the backend has values), then its hand-over to a new holder within a
/// poll; it never contends: `inspect` never names it, and it holds
/// nothing.
pub async fn an_observer_sees_the_holder_and_the_hand_over<S: Subject>(s: &S) {
    let name = unique("observed");
    let b = s.backend();
    let observer = lease(s, "observer");
    let mut seen = observer.observe(&name);
    let watching = never_named(b.clone(), name.clone(), "observer");
    let value = |v: &'static str| s.caps().values.then_some(v);
    let first = lease(s, "leader-a").elect(&name, LONG);
    if let Some(v) = value("addr-a") {
        first.proclaim(v).unwrap();
    }
    let term = timeout(LONG, first.leading()).await.expect("leads");
    let bound = OBSERVE_POLL * 6 / 5 + SLACK;
    let saw = timeout(
        bound,
        seen.wait_for(|o| shows(s, o, "leader-a", value("addr-a"))),
    );
    let saw = saw.await.is_ok_and(|r| r.is_ok());
    assert!(saw, "{:?}", *seen.borrow());
    let first_holder = seen.borrow().holder.clone();
    let second = lease(s, "leader-b").elect(&name, LONG);
    if let Some(v) = value("addr-b") {
        second.proclaim(v).unwrap();
    }
    sleep(WAITED).await;
    drop(term);
    first.resign().await.unwrap();
    let next = timeout(LONG, second.leading())
        .await
        .expect("the second leads");
    let led = Instant::now();
    // The hand-over is what changed: the fencing token where there is one
    // (with fencing, PgAdvisory's `inspect` can name the new session a
    // moment before its bump of the fence counter commits: the holder
    // changes first, the token follows); else the holder, though a backend
    // that names sessions may name the same one (PgAdvisory returns a
    // released lock's connection to the pool, and `leader-b`'s next attempt
    // may take it).
    let handed_over = |o: &Observed| match s.caps() {
        Caps { fencing: true, .. } => o.fencing_token == next.fencing_token(),
        Caps {
            leader: Naming::Session,
            ..
        } => true,
        _ => o.holder != first_holder,
    };
    let saw = timeout(
        bound,
        seen.wait_for(|o| shows(s, o, "leader-b", value("addr-b")) && handed_over(o)),
    );
    let saw = saw.await.is_ok_and(|r| r.is_ok());
    assert!(saw, "{:?}", *seen.borrow());
    eprintln!("the observer saw the hand-over after {:?}", led.elapsed());
    if s.caps().fencing {
        assert_eq!(seen.borrow().fencing_token, next.fencing_token());
    }
    assert!(observer.held().is_empty(), "the observer holds nothing");
    drop(next);
    second.resign().await.unwrap();
    watching.abort();
    assert!(
        watching.await.unwrap_err().is_cancelled(),
        "named the observer"
    );
}

/// Asks `b` who holds `name` every 20 ms until aborted; panics if it names
/// `holder`.
fn never_named<B: Backend>(b: B, name: String, holder: &'static str) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Ok(Some(info)) = b.inspect(&name).await {
                assert!(!info.holder.contains(holder), "{info:?}");
            }
            sleep(ms(20)).await;
        }
    })
}
