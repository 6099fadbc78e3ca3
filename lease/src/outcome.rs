//! What [`Lease::with_lease`](crate::Lease::with_lease) returns.

use crate::Error;

/// The result of [`Lease::with_lease`](crate::Lease::with_lease): the job ran,
/// or it was skipped and why.
#[must_use = "a skipped run may carry an error"]
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome<T> {
    /// The lease was acquired and the job ran to completion with this value.
    Ran(T),
    /// The job did not run.
    Skipped(Skip),
}

/// Why a run was skipped.
///
/// It is an [`Error`](std::error::Error) so that it can travel up as one
/// (`?` into `Box<dyn Error>` or `anyhow::Error`); its source is the
/// acquisition error, if any.
#[derive(Debug)]
#[non_exhaustive]
pub enum Skip {
    /// Another holder has the lease (or this `Lease` is running the same
    /// name already). The normal case on all replicas but one.
    HeldElsewhere,
    /// The schedule slot of this run ([`Job::once_per`](crate::Job::once_per))
    /// was claimed already — by a run on this or another replica. Logged at
    /// debug.
    AlreadyRan {
        /// The slot this run asked for.
        slot: u64,
    },
    /// The lease could not be acquired: the backend failed, or the name, ttl
    /// or holder is invalid. Already logged with `tracing::warn!`.
    Error(Error),
}

impl<T> Outcome<T> {
    /// `Ok(Some(value))` if the job ran, `Ok(None)` if the lease is held
    /// elsewhere or the slot ran already, `Err` if acquiring it failed.
    ///
    /// # Errors
    ///
    /// The acquisition error of [`Skip::Error`].
    pub fn into_result(self) -> Result<Option<T>, Error> {
        match self {
            Outcome::Ran(value) => Ok(Some(value)),
            Outcome::Skipped(Skip::HeldElsewhere | Skip::AlreadyRan { .. }) => Ok(None),
            Outcome::Skipped(Skip::Error(e)) => Err(e),
        }
    }

    /// True if the job ran.
    pub fn is_ran(&self) -> bool {
        matches!(self, Outcome::Ran(_))
    }

    /// The job's value if it ran.
    pub fn ran(self) -> Option<T> {
        match self {
            Outcome::Ran(value) => Some(value),
            Outcome::Skipped(_) => None,
        }
    }
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::HeldElsewhere => f.write_str("lease held elsewhere"),
            Skip::AlreadyRan { slot } => write!(f, "schedule slot {slot} has run already"),
            Skip::Error(e) => write!(f, "lease could not be acquired: {}", e.chain()),
        }
    }
}

impl std::error::Error for Skip {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Skip::HeldElsewhere | Skip::AlreadyRan { .. } => None,
            Skip::Error(e) => Some(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_is_an_error_with_the_acquisition_error_as_source() {
        let held: Box<dyn std::error::Error> = Box::new(Skip::HeldElsewhere);
        assert_eq!(held.to_string(), "lease held elsewhere");
        assert!(held.source().is_none());
        let failed = Skip::Error(Error::backend("connection refused"));
        let source = std::error::Error::source(&failed).expect("a source");
        assert_eq!(source.to_string(), "backend error");
    }

    #[test]
    fn a_skip_for_a_lease_held_elsewhere_is_no_value_and_no_error() {
        let skipped: Outcome<()> = Outcome::Skipped(Skip::HeldElsewhere);
        assert_eq!(skipped.into_result().unwrap(), None);
    }
}
