//! `crate = "..."` points the expansion at a re-export of `lease`. The
//! re-export here wraps `__private::run` to prove that it is the one called.

use std::sync::atomic::Ordering;

use lease::singleton;

mod my_lib {
    pub mod lease {
        pub use ::lease::*;

        pub mod __private {
            use std::sync::atomic::{AtomicUsize, Ordering};

            pub use ::lease::__private::{AsLease, Settings};

            pub static CALLS: AtomicUsize = AtomicUsize::new(0);

            pub async fn run<T, F, Fut>(
                lease: Option<::lease::Lease>,
                settings: Settings<'_>,
                f: F,
            ) -> T
            where
                T: ::lease::Skippable,
                F: FnOnce(::lease::CancellationToken, Option<u64>) -> Fut,
                Fut: std::future::Future<Output = T>,
            {
                CALLS.fetch_add(1, Ordering::SeqCst);
                ::lease::__private::run(lease, settings, f).await
            }
        }
    }
}

#[singleton(name = "through-a-re-export", ttl = "90s", lease = lease, crate = "my_lib::lease")]
async fn job(lease: &my_lib::lease::Lease) -> bool {
    true
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = my_lib::lease::Lease::new(my_lib::lease::backend::Memory::new());
    assert!(job(&lease).await);
    assert_eq!(my_lib::lease::__private::CALLS.load(Ordering::SeqCst), 1);
}
