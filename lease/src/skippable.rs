//! [`Skippable`]: what a `#[singleton]` fn returns when its run is skipped.

/// A return type with a value that means "this run was skipped".
///
/// A [`#[singleton]`](crate::singleton) fn returns [`Skippable::skipped`]
/// instead of running its body when the lease is held by another replica,
/// when (with `once_per`) its schedule slot has run already, when it could
/// not be acquired (the backend failed; logged at warn), or when there is no
/// lease to run on (logged at error).
///
/// | return type | skipped value | a run succeeded when it returns |
/// |---|---|---|
/// | `()` | `()` | anything |
/// | `bool` | `false` | anything |
/// | `Option<T>` | `None` | anything |
/// | `Result<(), E>` | `Ok(())` | `Ok` |
/// | `Result<Option<T>, E>` | `Ok(None)` | `Ok` |
///
/// A skipped tick is not an error: the next tick tries again, so `Result`s
/// are skipped as `Ok`. Return `Option` (or `bool`) to tell a skipped run from
/// one that ran. With `once_per` and `retry_failed = true`, a run that did not
/// succeed ([`Skippable::succeeded`]) leaves its schedule slot to be run
/// again.
///
/// # Examples
///
/// ```
/// use leasehold::Skippable;
///
/// assert_eq!(<Option<u32>>::skipped(), None);
/// assert_eq!(<Result<(), String>>::skipped(), Ok(()));
/// assert_eq!(<Result<Option<u32>, String>>::skipped(), Ok(None));
/// assert!(!bool::skipped());
/// ```
///
/// Implement it for a type of your own to return that type (and
/// `succeeded`, if some of its values are failures that `retry_failed`
/// should run again):
///
/// ```
/// enum Tick {
///     Done { rows: usize },
///     Failed,
///     Skipped,
/// }
///
/// impl leasehold::Skippable for Tick {
///     fn skipped() -> Self {
///         Tick::Skipped
///     }
///
///     fn succeeded(&self) -> bool {
///         !matches!(self, Tick::Failed)
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`#[singleton]` cannot skip a run that returns `{Self}`",
    label = "`{Self}` has no value that means \"skipped\"",
    note = "a skipped run returns `()`, `false`, `None`, `Ok(())` or `Ok(None)`: \
            return `()`, `bool`, `Option<T>`, `Result<(), E>` or `Result<Option<T>, E>`, \
            for example wrap the value in `Option<...>`",
    note = "to return a type of your own, implement `leasehold::Skippable` for it"
)]
pub trait Skippable {
    /// The value returned by a run that was skipped.
    fn skipped() -> Self;

    /// Whether a run that returned this value succeeded: what
    /// `#[singleton(once_per = .., retry_failed = true)]` records its
    /// schedule slot for. Every value by default; `Ok` for the `Result`s.
    fn succeeded(&self) -> bool {
        true
    }
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

    /// `Ok`.
    fn succeeded(&self) -> bool {
        self.is_ok()
    }
}

impl<T, E> Skippable for Result<Option<T>, E> {
    /// `Ok(None)`: not a failure, and the job did not run.
    fn skipped() -> Self {
        Ok(None)
    }

    /// `Ok`.
    fn succeeded(&self) -> bool {
        self.is_ok()
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

    #[test]
    fn a_run_succeeded_when_it_returned_ok() {
        assert!(().succeeded());
        assert!(false.succeeded());
        assert!(None::<u8>.succeeded());
        assert!(Ok::<(), u8>(()).succeeded());
        assert!(!Err::<(), u8>(1).succeeded());
        assert!(Ok::<Option<u8>, u8>(None).succeeded());
        assert!(!Err::<Option<u8>, u8>(1).succeeded());
    }
}
