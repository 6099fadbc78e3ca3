//! `crate = "..."` points the expansion at a re-export of `leasehold`. The
//! re-export here wraps `__private::run` to prove that it is the one called.

use std::sync::atomic::Ordering;

use leasehold::singleton;

mod my_lib {
    pub mod leasehold {
        pub use ::leasehold::*;

        pub mod __private {
            use std::sync::atomic::{AtomicUsize, Ordering};

            pub use ::leasehold::__private::{AsLease, Settings};

            pub static CALLS: AtomicUsize = AtomicUsize::new(0);

            pub async fn run<T, F, Fut>(
                lease: Option<::leasehold::Lease>,
                settings: Settings<'_>,
                f: F,
            ) -> T
            where
                T: ::leasehold::Skippable,
                F: FnOnce(::leasehold::CancellationToken, Option<u64>) -> Fut,
                Fut: std::future::Future<Output = T>,
            {
                CALLS.fetch_add(1, Ordering::SeqCst);
                ::leasehold::__private::run(lease, settings, f).await
            }
        }
    }
}

#[singleton(name = "through-a-re-export", ttl = "90s", lease = lease, crate = "my_lib::leasehold")]
async fn job(lease: &my_lib::leasehold::Lease) -> bool {
    true
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = my_lib::leasehold::Lease::new(my_lib::leasehold::backend::Memory::new());
    assert!(job(&lease).await);
    assert_eq!(my_lib::leasehold::__private::CALLS.load(Ordering::SeqCst), 1);
}
