//! Every return type with a skipped value, and one of the user's own.

use leasehold::{Lease, Skippable, backend::Memory, singleton};

#[singleton(name = "unit", ttl = "90s", lease = lease)]
async fn unit(lease: &Lease) {}

#[singleton(name = "bool", ttl = "90s", lease = lease)]
async fn boolean(lease: &Lease) -> bool {
    true
}

#[singleton(name = "option", ttl = "90s", lease = lease)]
async fn option(lease: &Lease) -> Option<&'static str> {
    Some("ran")
}

#[singleton(name = "result", ttl = "90s", lease = lease)]
async fn result(lease: &Lease) -> Result<(), String> {
    Err("failed".into())
}

#[singleton(name = "result-option", ttl = "90s", lease = lease)]
async fn result_option(lease: &Lease) -> Result<Option<u8>, String> {
    Ok(Some(1))
}

#[derive(Debug, PartialEq)]
enum Tick {
    Done,
    Skipped,
}

impl Skippable for Tick {
    fn skipped() -> Self {
        Tick::Skipped
    }
}

#[singleton(name = "own", ttl = "90s", lease = lease)]
async fn own(lease: &Lease) -> Tick {
    Tick::Done
}

/// An `impl Trait` return type works when the hidden type is `Skippable`.
#[singleton(name = "opaque", ttl = "90s", lease = lease)]
async fn opaque(lease: &Lease) -> impl std::fmt::Debug {
    Some(1)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = Lease::new(Memory::new());
    unit(&lease).await;
    assert!(boolean(&lease).await);
    assert_eq!(option(&lease).await, Some("ran"));
    assert_eq!(result(&lease).await, Err("failed".into()));
    assert_eq!(result_option(&lease).await, Ok(Some(1)));
    assert_eq!(own(&lease).await, Tick::Done);
    assert_eq!(format!("{:?}", opaque(&lease).await), "Some(1)");
}
