//! `on_error = "return"`: an acquisition error comes back as the fn's `Err`
//! (through `From<leasehold::Error>`); held elsewhere is still the skipped value.
//! `on_error = "skip"` is the default, spelled out.
#![deny(warnings)]

use std::time::Duration;

use leasehold::{Lease, backend::Memory, singleton};

#[derive(Debug)]
enum JobError {
    Lease(leasehold::Error),
}

impl From<leasehold::Error> for JobError {
    fn from(e: leasehold::Error) -> Self {
        JobError::Lease(e)
    }
}

#[singleton(name = "errors", ttl = ttl, lease = lease, on_error = "return")]
async fn errors(lease: Option<&Lease>, ttl: Duration) -> Result<Option<u32>, JobError> {
    Ok(Some(1))
}

#[singleton(name = "errors-unit", ttl = ttl, lease = lease, on_error = "return")]
async fn errors_unit(lease: &Lease, ttl: Duration) -> Result<(), Box<dyn std::error::Error>> {
    Ok(())
}

#[singleton(name = "skips", ttl = ttl, lease = lease, on_error = "skip")]
async fn skips(lease: &Lease, ttl: Duration) -> Result<Option<u32>, JobError> {
    Ok(Some(1))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = Lease::new(Memory::new());
    let ttl = Duration::from_secs(90);
    assert!(matches!(errors(Some(&lease), ttl).await, Ok(Some(1))));
    assert!(matches!(
        errors(Some(&lease), Duration::ZERO).await,
        Err(JobError::Lease(leasehold::Error::InvalidTtl { .. }))
    ));
    assert!(matches!(
        errors(None, ttl).await,
        Err(JobError::Lease(leasehold::Error::NoLease))
    ));
    let held = lease.try_acquire("errors", ttl).await.unwrap().expect("free");
    assert!(matches!(errors(Some(&lease), ttl).await, Ok(None)), "held: skipped");
    held.release().await.unwrap();

    assert!(errors_unit(&lease, ttl).await.is_ok());
    assert!(errors_unit(&lease, Duration::ZERO).await.is_err());
    assert!(matches!(skips(&lease, Duration::ZERO).await, Ok(None)), "the default skips");
}
