//! `name` and the durations accept expressions, evaluated at each call in
//! the fn (parameters and `self` in scope): a `const`, `format!` over the
//! parameters, a field, a `Duration`. Nothing here may warn.
#![deny(warnings)]

use std::sync::Arc;
use std::time::Duration;

use leasehold::{Lease, backend::Memory, singleton};

const JOB: &str = "expr-const";
const TTL: Duration = Duration::from_secs(90);

#[singleton(name = JOB, ttl = TTL, lease = lease)]
async fn from_consts(lease: &Lease) -> bool {
    true
}

#[singleton(name = format!("report-{tenant}"), ttl = "90s", lease = lease, fence = fence)]
async fn per_tenant(lease: &Lease, tenant: String) -> Option<(String, u64)> {
    // `tenant` is still the body's: the name was made before it moved in.
    Some((tenant, fence?))
}

#[singleton(
    name = "expr-durations",
    ttl = Duration::from_secs(ttl_secs),
    min_hold = Duration::ZERO,
    max_hold = Duration::from_secs(600),
    wait = Duration::from_millis(wait_ms),
    lease = lease,
)]
async fn durations(lease: &Lease, ttl_secs: u64, wait_ms: u64) -> Option<u64> {
    Some(ttl_secs + wait_ms)
}

struct Reports {
    lease: Lease,
    name: String,
    ttl: Duration,
}

impl Reports {
    #[singleton(name = self.name, ttl = self.ttl, lease = self.lease)]
    async fn shared(&self) -> Option<usize> {
        Some(self.name.len())
    }

    #[singleton(name = &self.name, ttl = self.ttl, max_hold = self.ttl * 10, lease = self.lease)]
    async fn exclusive(&mut self) -> Option<usize> {
        self.name.push('!');
        Some(self.name.len())
    }

    #[singleton(name = self.name.as_str(), ttl = self.ttl, wait = "5s", lease = self.lease)]
    async fn owned(self: Arc<Self>) -> Option<Arc<Self>> {
        Some(self)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = Lease::new(Memory::new());
    assert!(from_consts(&lease).await);
    let (tenant, _fence) = per_tenant(&lease, "acme".to_owned()).await.expect("ran");
    assert_eq!(tenant, "acme");
    assert_eq!(durations(&lease, 90, 5).await, Some(95));
    // An invalid run-time ttl skips the run (logged), it does not panic.
    assert_eq!(durations(&lease, 0, 5).await, None);

    let mut reports = Reports {
        lease: lease.clone(),
        name: "expr-self".to_owned(),
        ttl: TTL,
    };
    assert_eq!(reports.shared().await, Some(9));
    assert_eq!(reports.exclusive().await, Some(10));
    let reports = Arc::new(reports);
    assert!(reports.clone().owned().await.is_some());

    // The name is the value of the expression: held under it, the run skips.
    let _held = lease.try_acquire("report-busy", TTL).await.unwrap().expect("free");
    assert_eq!(per_tenant(&lease, "busy".to_owned()).await, None);
}
