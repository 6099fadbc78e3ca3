//! The fn keeps its attributes, docs, visibility and signature: callers see
//! no change.
#![deny(missing_docs)]

use leasehold::{Lease, backend::Memory, singleton};

/// Jobs.
pub mod jobs {
    use super::*;

    /// Documented, public, `#[must_use]`, with an inner attribute.
    #[must_use]
    #[singleton(name = "kept", ttl = "90s", lease = lease)]
    pub async fn kept(lease: &Lease, mut count: u32) -> Option<u32> {
        #![allow(clippy::needless_return)]
        count += 1;
        return Some(count);
    }
}

/// Hygiene: the expansion's locals do not clash with the user's names.
#[singleton(name = "hygiene", ttl = "90s", lease = lease)]
async fn hygiene(lease: &Lease, __lease: u32, __fake_return: u32, run: u32) -> Option<u32> {
    Some(__lease + __fake_return + run)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let lease = Lease::new(Memory::new());
    let kept: Option<u32> = rt.block_on(jobs::kept(&lease, 1));
    assert_eq!(kept, Some(2));
    assert_eq!(rt.block_on(hygiene(&lease, 1, 2, 3)), Some(6));
}
