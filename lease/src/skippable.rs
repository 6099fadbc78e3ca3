//! [`Skippable`]: what a `#[singleton]` fn returns when its run is skipped.

/// A return type with a value that means "this run was skipped".
///
/// A [`#[singleton]`](crate::singleton) fn returns [`Skippable::skipped`]
/// instead of running its body when the lease is held by another replica, or
/// when it could not be acquired (the backend failed; logged at warn), or when
/// there is no lease to run on (logged at error).
///
/// | return type | skipped value |
/// |---|---|
/// | `()` | `()` |
/// | `bool` | `false` |
/// | `Option<T>` | `None` |
/// | `Result<(), E>` | `Ok(())` |
/// | `Result<Option<T>, E>` | `Ok(None)` |
///
/// A skipped tick is not an error: the next tick tries again, so `Result`s
/// are skipped as `Ok`. Return `Option` (or `bool`) to tell a skipped run from
/// one that ran.
///
/// # Examples
///
/// ```
/// use lease::Skippable;
///
/// assert_eq!(<Option<u32>>::skipped(), None);
/// assert_eq!(<Result<(), String>>::skipped(), Ok(()));
/// assert_eq!(<Result<Option<u32>, String>>::skipped(), Ok(None));
/// assert!(!bool::skipped());
/// ```
///
/// Implement it for a type of your own to return that type:
///
/// ```
/// enum Tick {
///     Done { rows: usize },
///     Skipped,
/// }
///
/// impl lease::Skippable for Tick {
///     fn skipped() -> Self {
///         Tick::Skipped
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`#[singleton]` cannot skip a run that returns `{Self}`",
    label = "`{Self}` has no value that means \"skipped\"",
    note = "a skipped run returns `()`, `false`, `None`, `Ok(())` or `Ok(None)`: \
            return `()`, `bool`, `Option<T>`, `Result<(), E>` or `Result<Option<T>, E>`, \
            for example wrap the value in `Option<...>`",
    note = "to return a type of your own, implement `lease::Skippable` for it"
)]
pub trait Skippable {
    /// The value returned by a run that was skipped.
    fn skipped() -> Self;
}

impl Skippable for () {
    /// `()`.
    fn skipped() -> Self {}
}

impl Skippable for bool {
    /// `false`: the job did not run.
    fn skipped() -> Self {
        false
    }
}

impl<T> Skippable for Option<T> {
    /// `None`: the job did not run.
    fn skipped() -> Self {
        None
    }
}

impl<E> Skippable for Result<(), E> {
    /// `Ok(())`: a skipped run is not a failure.
    fn skipped() -> Self {
        Ok(())
    }
}

impl<T, E> Skippable for Result<Option<T>, E> {
    /// `Ok(None)`: not a failure, and the job did not run.
    fn skipped() -> Self {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_values() {
        <()>::skipped();
        assert!(!bool::skipped());
        assert_eq!(<Option<String>>::skipped(), None);
        assert_eq!(<Result<(), std::io::ErrorKind>>::skipped(), Ok(()));
        assert_eq!(
            <Result<Option<u8>, std::io::ErrorKind>>::skipped(),
            Ok(None)
        );
    }
}
