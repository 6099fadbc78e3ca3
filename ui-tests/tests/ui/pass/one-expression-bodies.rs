//! A body that is a single expression compiles without a warning, for every
//! return type with a skipped value, in free fns and in methods: the
//! expansion must not make rustc lint the user's code (it used to get
//! `unused_braces`).
//!
//! The bodies stay on one line, as written (do not rustfmt this file): rustc
//! only lints braces that do not span several lines.
#![deny(warnings)]

use std::sync::atomic::{AtomicBool, Ordering};

use lease::{Lease, backend::Memory, singleton};

static RAN: AtomicBool = AtomicBool::new(false);

#[singleton(name = "unit-empty", ttl = "90s", lease = lease)]
async fn unit_empty(lease: &Lease) {}

#[singleton(name = "unit", ttl = "90s", lease = lease)]
async fn unit(lease: &Lease) { RAN.store(true, Ordering::Relaxed) }

// clippy's own advice on the user's `()`, nothing to do with the macro.
#[allow(clippy::unused_unit)]
#[singleton(name = "unit-expr", ttl = "90s", lease = lease)]
async fn unit_expr(lease: &Lease) { () }

#[singleton(name = "bool", ttl = "90s", lease = lease)]
async fn boolean(lease: &Lease) -> bool { true }

#[singleton(name = "option", ttl = "90s", lease = lease)]
async fn option(lease: &Lease) -> Option<u32> { Some(1) }

#[singleton(name = "result", ttl = "90s", lease = lease)]
async fn result(lease: &Lease) -> Result<(), String> { Ok(()) }

#[singleton(name = "result-option", ttl = "90s", lease = lease)]
async fn result_option(lease: &Lease) -> Result<Option<u8>, String> { Ok(Some(1)) }

#[singleton(name = "awaited", ttl = "90s", lease = lease)]
async fn awaited(lease: &Lease) -> bool { std::future::ready(true).await }

macro_rules! ok {
    () => {
        Ok(())
    };
}

#[singleton(name = "macro", ttl = "90s", lease = lease)]
async fn macro_call(lease: &Lease) -> Result<(), String> { ok!() }

#[singleton(name = "if-else", ttl = "90s", lease = lease)]
async fn if_else(lease: &Lease, n: u32) -> Option<u32> { if n > 0 { Some(n) } else { None } }

struct Jobs {
    lease: Lease,
    runs: u32,
}

impl Jobs {
    #[singleton(name = "m-unit-empty", ttl = "90s", lease = self.lease)]
    async fn unit_empty(&self) {}

    #[singleton(name = "m-unit", ttl = "90s", lease = self.lease)]
    async fn unit(&self) { RAN.store(self.runs > 0, Ordering::Relaxed) }

    #[allow(clippy::unused_unit)]
    #[singleton(name = "m-unit-expr", ttl = "90s", lease = self.lease)]
    async fn unit_expr(&self) { () }

    #[singleton(name = "m-bool", ttl = "90s", lease = self.lease)]
    async fn boolean(&self) -> bool { self.runs > 0 }

    #[singleton(name = "m-option", ttl = "90s", lease = self.lease)]
    async fn option(&self) -> Option<u32> { Some(self.runs) }

    #[singleton(name = "m-result", ttl = "90s", lease = self.lease)]
    async fn result(&self) -> Result<(), String> { Ok(()) }

    #[singleton(name = "m-result-option", ttl = "90s", lease = self.lease)]
    async fn result_option(&self) -> Result<Option<u32>, String> { Ok(Some(self.runs)) }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = Lease::new(Memory::new());
    unit_empty(&lease).await;
    unit(&lease).await;
    unit_expr(&lease).await;
    assert!(RAN.load(Ordering::Relaxed));
    assert!(boolean(&lease).await);
    assert_eq!(option(&lease).await, Some(1));
    assert_eq!(result(&lease).await, Ok(()));
    assert_eq!(result_option(&lease).await, Ok(Some(1)));
    assert!(awaited(&lease).await);
    assert_eq!(macro_call(&lease).await, Ok(()));
    assert_eq!(if_else(&lease, 2).await, Some(2));
    assert_eq!(if_else(&lease, 0).await, None);

    let jobs = Jobs { lease, runs: 1 };
    jobs.unit_empty().await;
    jobs.unit_expr().await;
    RAN.store(false, Ordering::Relaxed);
    jobs.unit().await;
    assert!(RAN.load(Ordering::Relaxed));
    assert!(jobs.boolean().await);
    assert_eq!(jobs.option().await, Some(1));
    assert_eq!(jobs.result().await, Ok(()));
    assert_eq!(jobs.result_option().await, Ok(Some(1)));
}
