//! The metrics of the crate docs' "Metrics" table, counted through the
//! `metrics` facade (feature `metrics`), read back with `metrics-util`'s
//! debugging recorder.

#![cfg(feature = "metrics")]
#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::backend::Memory;
use leasehold::{Acquisition, Backend, Error, Grant, Lease};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(3);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Memory whose renewals can be made to fail, and whose acquisitions can
/// be made to error.
#[derive(Clone, Default)]
struct Switchable {
    db: Memory,
    down: Arc<AtomicBool>,
}

impl Backend for Switchable {
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> leasehold::Result<Option<Grant>> {
        if self.down.load(Ordering::Relaxed) {
            return Err(Error::backend("connection refused"));
        }
        self.db.acquire(name, holder, ttl).await
    }
    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> leasehold::Result<bool> {
        if self.down.load(Ordering::Relaxed) {
            return Err(Error::backend("connection refused"));
        }
        self.db.renew(lease, ttl).await
    }
    async fn release(&self, lease: Acquisition<'_>) -> leasehold::Result<()> {
        self.db.release(lease).await
    }
}

/// A metric's name and its sorted labels.
type MetricKey = (String, Vec<(String, String)>);

/// The metrics seen so far. The debugging recorder's snapshot resets what
/// it reads (counters and gauges to 0, histograms emptied), so every reading
/// is added to running totals: counts for counters and histograms, the sum
/// of increments for the gauge.
struct Seen {
    snapshotter: Snapshotter,
    totals: Mutex<HashMap<MetricKey, f64>>,
}

impl Seen {
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut totals = self.totals.lock().unwrap();
        for (key, _, _, v) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            *totals.entry((key.name().to_owned(), labels)).or_default() += match v {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(h) => h.len() as f64,
            };
        }
        let mut want: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        want.sort();
        totals
            .get(&(name.to_owned(), want))
            .copied()
            .unwrap_or_default()
    }
}

#[tokio::test(start_paused = true)]
async fn acquiring_skipping_renewing_losing_and_holding_are_counted() {
    let recorder = DebuggingRecorder::new();
    let seen = Seen {
        snapshotter: recorder.snapshotter(),
        totals: Mutex::default(),
    };
    recorder.install().unwrap();

    let backend = Switchable::default();
    let a = Lease::with_holder(backend.clone(), "pod-a");
    let b = Lease::with_holder(backend.clone(), "pod-b");

    let guard = a.try_acquire("job", TTL).await.unwrap().unwrap();
    assert_eq!(
        seen.value(
            "lease_acquire_total",
            &[("name", "job"), ("outcome", "acquired")]
        ),
        1.0
    );
    assert!(b.try_acquire("job", TTL).await.unwrap().is_none());
    assert_eq!(
        seen.value(
            "lease_acquire_total",
            &[("name", "job"), ("outcome", "held_elsewhere")]
        ),
        1.0
    );
    assert_eq!(seen.value("lease_held", &[]), 1.0);

    sleep(ms(1100)).await; // one renewal
    assert_eq!(
        seen.value("lease_renew_total", &[("outcome", "renewed")]),
        1.0
    );
    assert!(seen.value("lease_backend_seconds", &[("op", "acquire")]) >= 2.0);
    assert!(seen.value("lease_backend_seconds", &[("op", "renew")]) >= 1.0);

    // Taken: the store gives the lease to someone else.
    backend.db.expire("job");
    let thief = b.try_acquire("job", TTL).await.unwrap().unwrap();
    guard.token().cancelled().await;
    assert_eq!(seen.value("lease_renew_total", &[("outcome", "lost")]), 1.0);
    assert_eq!(
        seen.value("lease_lost_total", &[("name", "job"), ("reason", "taken")]),
        1.0
    );
    drop(guard);
    thief.release().await.unwrap();
    sleep(ms(10)).await;
    assert_eq!(seen.value("lease_held", &[]), 0.0);
    assert!(seen.value("lease_backend_seconds", &[("op", "release")]) >= 1.0);

    // Deadline: renewals fail until the local deadline.
    let guard = a.try_acquire("flaky", TTL).await.unwrap().unwrap();
    backend.down.store(true, Ordering::Relaxed);
    guard.token().cancelled().await;
    assert!(seen.value("lease_renew_total", &[("outcome", "error")]) >= 1.0);
    assert_eq!(
        seen.value(
            "lease_lost_total",
            &[("name", "flaky"), ("reason", "deadline")]
        ),
        1.0
    );
    assert!(a.try_acquire("other", TTL).await.is_err());
    assert_eq!(
        seen.value(
            "lease_acquire_total",
            &[("name", "other"), ("outcome", "error")]
        ),
        1.0
    );
    backend.down.store(false, Ordering::Relaxed);
    drop(guard);

    // max_hold.
    let out = a
        .job("capped", TTL)
        .max_hold(ms(2000))
        .run(|token, _| async move { token.cancelled().await })
        .await;
    assert!(out.is_ran());
    assert_eq!(
        seen.value(
            "lease_lost_total",
            &[("name", "capped"), ("reason", "max_hold")]
        ),
        1.0
    );
    sleep(ms(10)).await;
    assert_eq!(seen.value("lease_held", &[]), 0.0);
}
