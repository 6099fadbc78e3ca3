//! [`DropGuard`]: a value with something to do when it is dropped, unless
//! the code that owns it disarms it first — the one idiom for "clean up if
//! this path is cut short" in the crate.

use std::ops::{Deref, DerefMut};

/// Holds a value and runs `on_drop` on it when dropped, unless
/// [`disarm`](DropGuard::disarm)ed, which hands the value back instead.
///
/// `on_drop` is a plain `fn`: what it needs travels in the value, so a guard
/// costs no allocation.
pub(crate) struct DropGuard<T> {
    value: Option<T>,
    on_drop: fn(T),
}

impl<T> DropGuard<T> {
    pub(crate) fn new(value: T, on_drop: fn(T)) -> Self {
        Self {
            value: Some(value),
            on_drop,
        }
    }

    /// The value, without running `on_drop`.
    pub(crate) fn disarm(mut self) -> T {
        self.value
            .take()
            .expect("BUG: a drop guard holds its value until disarmed or dropped")
    }
}

impl<T> Deref for DropGuard<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.value
            .as_ref()
            .expect("BUG: a drop guard holds its value until disarmed or dropped")
    }
}

impl<T> DerefMut for DropGuard<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value
            .as_mut()
            .expect("BUG: a drop guard holds its value until disarmed or dropped")
    }
}

impl<T> Drop for DropGuard<T> {
    fn drop(&mut self) {
        if let Some(value) = self.value.take() {
            (self.on_drop)(value);
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for DropGuard<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DropGuard").field(&self.value).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static DROPPED: AtomicUsize = AtomicUsize::new(0);

    fn count(n: usize) {
        DROPPED.fetch_add(n, Ordering::Relaxed);
    }

    #[test]
    fn runs_on_drop_unless_disarmed() {
        let before = DROPPED.load(Ordering::Relaxed);
        drop(DropGuard::new(1, count));
        assert_eq!(DROPPED.load(Ordering::Relaxed), before + 1);
        let guard = DropGuard::new(10, count);
        assert_eq!(*guard, 10);
        assert_eq!(guard.disarm(), 10);
        assert_eq!(DROPPED.load(Ordering::Relaxed), before + 1);
    }
}
