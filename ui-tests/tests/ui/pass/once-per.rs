//! `once_per`: a literal (checked at compile time) or a `Duration`
//! expression (checked at each call); `retry_failed = true` (or `false`, the
//! default) with either.
#![deny(warnings)]

use std::time::Duration;

use leasehold::{Lease, backend::Memory, singleton};

#[singleton(name = "literal", ttl = "90s", once_per = "1h", lease = lease)]
async fn literal(lease: &Lease) -> bool {
    true
}

#[singleton(name = "expression", ttl = "90s", once_per = period, retry_failed = true, lease = lease)]
async fn expression(lease: &Lease, period: Duration) -> Result<Option<u8>, String> {
    Ok(Some(1))
}

#[singleton(name = "retried", ttl = "90s", once_per = "1h", retry_failed = true, lease = lease)]
async fn retried(lease: &Lease, fail: bool) -> Result<Option<u8>, String> {
    if fail { Err("failed".into()) } else { Ok(Some(1)) }
}

#[singleton(name = "not-retried", ttl = "90s", retry_failed = false, once_per = "1h", lease = lease)]
async fn not_retried(lease: &Lease, fail: bool) -> Result<Option<u8>, String> {
    if fail { Err("failed".into()) } else { Ok(Some(1)) }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = Lease::new(Memory::new());
    let hour = Duration::from_secs(3600);
    assert!(literal(&lease).await);
    assert!(!literal(&lease).await, "this hour ran already");
    // Zero is invalid: the run is skipped (logged).
    assert_eq!(expression(&lease, Duration::ZERO).await, Ok(None));
    assert_eq!(expression(&lease, hour).await, Ok(Some(1)));
    assert_eq!(expression(&lease, hour).await, Ok(None));
    assert_eq!(retried(&lease, true).await, Err("failed".into()));
    assert_eq!(retried(&lease, false).await, Ok(Some(1)), "ran again");
    assert_eq!(retried(&lease, false).await, Ok(None));
    assert_eq!(not_retried(&lease, true).await, Err("failed".into()));
    assert_eq!(not_retried(&lease, false).await, Ok(None));
}
