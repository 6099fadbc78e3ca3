//! The process-wide default [`Lease`], used by `#[singleton]` without `lease = ...`.

use std::sync::OnceLock;

use crate::{Error, Lease};

static GLOBAL: OnceLock<Lease> = OnceLock::new();

/// Install `leasehold` as the process-wide default, once, at start-up.
///
/// `#[singleton]` functions without a `lease = ...` argument use it; until it
/// is set they skip their runs (and log an error).
///
/// # Examples
///
/// ```
/// use leasehold::{backend::Memory, Lease};
///
/// leasehold::set_global_default(Lease::new(Memory::new())).unwrap();
/// assert!(leasehold::global_default().is_some());
/// assert!(leasehold::set_global_default(Lease::new(Memory::new())).is_err());
/// ```
///
/// # Errors
///
/// [`Error::GlobalDefaultAlreadySet`] if a default is already installed; the
/// first one stays.
pub fn set_global_default(lease: Lease) -> Result<(), Error> {
    GLOBAL
        .set(lease)
        .map_err(|_| Error::GlobalDefaultAlreadySet)
}

/// The default installed by [`set_global_default`], if any.
pub fn global_default() -> Option<&'static Lease> {
    GLOBAL.get()
}
