//! The `#[singleton]` attribute macro of the [`leasehold`](https://docs.rs/leasehold)
//! crate. Use it as `leasehold::singleton`: this crate is an implementation
//! detail, versioned in lockstep with `leasehold` (which pins it exactly).
//!
//! The macro only rewires the fn's body into one call of a runtime function,
//! `leasehold::__private::run` (or `run_or_err`), where all the behaviour lives
//! and is tested. The
//! code is split by role: `attr.rs` parses the arguments, `valid.rs` checks
//! them (and the fn), `expand.rs` generates the code.

mod attr;
mod expand;
mod valid;

use proc_macro::TokenStream;

/// Run an `async fn` on exactly one replica at a time.
///
/// Each call of the fn first tries to acquire the lease `name`. If it gets
/// it, the body runs while the lease is renewed in the background (every
/// `ttl/3`), and the lease is released when the body returns. If another
/// replica holds it, the body does not run and the fn returns the *skipped
/// value* of its return type at once. Call it on every replica, on every
/// tick of your schedule: one of them runs it.
///
/// ```
/// use leasehold::{Lease, backend::Memory, singleton};
///
/// #[singleton(name = "nightly-report", ttl = "90s", lease = lease, token = cancel)]
/// async fn nightly_report(lease: &Lease, rows: &[u32]) -> Option<u32> {
///     let mut total = 0;
///     for row in rows {
///         if cancel.is_cancelled() {
///             return None; // the lease was lost: another replica may take over
///         }
///         total += row;
///     }
///     Some(total)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let db = Memory::new();
/// let pod_a = Lease::with_holder(db.clone(), "pod-a");
/// let pod_b = Lease::with_holder(db, "pod-b");
///
/// // While pod-b holds the lease, pod-a's run is skipped...
/// let ttl = std::time::Duration::from_secs(90);
/// let held = pod_b.try_acquire("nightly-report", ttl).await.unwrap().expect("free");
/// assert_eq!(nightly_report(&pod_a, &[1, 2, 3]).await, None);
/// held.release().await.unwrap();
/// // ...and once it is free, pod-a runs it.
/// assert_eq!(nightly_report(&pod_a, &[1, 2, 3]).await, Some(6));
/// # }
/// ```
///
/// # Arguments
///
/// All are `key = value`, in any order, each at most once.
///
/// | key | | value |
/// |---|---|---|
/// | `name` | required | the lease's name, 1 to 255 bytes. Every replica running this job must use the same name. A string literal is checked at compile time; any other expression that gives a string (`&str`, `String`, `Cow<str>`, ...) is evaluated at each call, inside the fn, with the parameters and `self` in scope (`name = JOB`, `name = format!("report-{tenant}")`, `name = self.name`), and checked then by the same rules: an invalid one skips the run with `leasehold::Error::InvalidName` (logged at warn). |
/// | `ttl` | required | a duration literal in [humantime] syntax (`"90s"`, `"1m 30s"`, `"500ms"`), whole milliseconds from 10 ms to 24 h; or a `std::time::Duration` expression, evaluated at each call like `name` and checked then (`leasehold::Error::InvalidTtl`). How long a crashed holder blocks the others; the lease is renewed every `ttl/3` while the body runs. |
/// | `lease` | | an expression that gives the `leasehold::Lease` to use: `Lease`, `&Lease`, `Arc<Lease>`, `LazyLock<Lease>` or `Option<&Lease>`. Evaluated at each call, inside the fn, with the parameters and `self` in scope (`lease = self.lease`). Default: `leasehold::global_default()`. |
/// | `token` | | an identifier: the body sees the lease's `leasehold::CancellationToken` under this name. It is cancelled the moment the lease is lost; stop work that must not overlap with another holder. |
/// | `fence` | | an identifier: the body sees this acquisition's fencing token (`Option<u64>`) under this name, to pass to the resource the job writes to. |
/// | `min_hold` | | a duration (literal or expression, as `ttl`), whole milliseconds, at most 24 h (longer than `ttl` is fine). The lease is kept — and renewed — until at least this long after it was acquired, even if the body finishes sooner; then it is released in the background while the fn has returned already. Stops a fast job from running twice per tick on replicas whose clocks differ (ShedLock's `lockAtLeastFor`). |
/// | `max_hold` | | a duration (as `min_hold`), more than zero: a ceiling on renewal. That long after the lease was acquired, the token is cancelled; the lease is still renewed while the body winds down, for up to its `grace`, and released when the body returns. A body still running after its grace no longer has it renewed: the lease expires on the server, so a hung job keeps it at most `max_hold + grace + ttl`, and nobody else gets it while the body may still run. |
/// | `grace` | | a duration (literal or expression, as `ttl`): how long before the lease could pass to another holder the token fires when renewals fail — at the send time of the last successful request + `ttl` − `grace`. Default `ttl/3`: one renewal period of retries, then a third of the ttl for the body to stop (and a local clock may run up to 1.5× slow). From `ttl/100 + 2 ms` to `ttl/2`: a literal is checked against a literal `ttl` at compile time, an expression at each call (`leasehold::Error::InvalidGrace`). A definite loss still fires the token at once. It is also how long a `Lease::shutdown` or `max_hold` keeps the lease renewed for the body to stop. |
/// | `wait` | | a duration (as `min_hold`): wait up to this long for another holder to let the lease go, instead of skipping the run at once. |
/// | `once_per` | | a duration (literal or expression, as `ttl`), whole milliseconds from 1 ms to 366 days: run at most once per slot of this period across every replica. A call in a slot that ran already — on this replica or another, however late its tick — returns the skipped value (logged at debug). The slot is `floor(clock / once_per)`, by the backend's clock where it has one; it is claimed when the lease is acquired, so a run that fails or crashes still used it up. On a backend without a record of slots the run is skipped with `leasehold::Error::Unsupported` (see `leasehold::Job::once_per`). |
/// | `retry_failed` | | `true` (or `false`, the default), only with `once_per`: the slot is recorded when the body succeeds — it returns; for a `Result`, it returns `Ok` (`leasehold::Skippable::succeeded`) — so that a failed or crashed run may run again within its slot, on any replica. |
/// | `on_error` | | `"skip"` (the default) or `"return"`. With `"return"`, an acquisition *error* — the backend failed, an invalid run-time `name`, `ttl` or duration, no lease at all — is returned as `Err(e.into())`; the fn must return `Result<(), E>` or `Result<Option<T>, E>` with `E: From<leasehold::Error>`. A lease held elsewhere, or a slot that ran already (`once_per`), is still a skipped run (`Ok(())` / `Ok(None)`). |
/// | `crate` | | the path of the `leasehold` crate as a string, when it is re-exported: `crate = "my_lib::leasehold"`. Default: `::leasehold`. |
///
/// An invalid duration given as an expression skips the run with
/// `leasehold::Error::InvalidDuration` (logged at warn); a literal is checked at
/// compile time instead. Expressions are evaluated in the order `lease`,
/// `name`, `ttl`, `min_hold`, `max_hold`, `grace`, `wait`, `once_per`, before
/// the body runs.
///
/// ```
/// use std::time::Duration;
/// use leasehold::{Lease, backend::Memory, singleton};
///
/// struct Reports {
///     lease: Lease,
///     ttl: Duration,
/// }
///
/// impl Reports {
///     // One lease per tenant; wait up to 5 s for it; at most 10 minutes;
///     // a backend failure is an `Err`, not a skipped run.
///     #[singleton(
///         name = format!("report-{tenant}"),
///         ttl = self.ttl,
///         wait = "5s",
///         max_hold = "10m",
///         lease = self.lease,
///         on_error = "return",
///     )]
///     async fn report(&self, tenant: &str) -> Result<Option<usize>, leasehold::Error> {
///         Ok(Some(tenant.len()))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let reports = Reports { lease: Lease::new(Memory::new()), ttl: Duration::from_secs(90) };
/// assert_eq!(reports.report("acme").await.unwrap(), Some(4));
/// # }
/// ```
///
/// # Return type and skipped runs
///
/// The fn keeps exactly the signature that was written. Its return type must
/// implement `leasehold::Skippable`, which gives the value returned when the run
/// is skipped: `()`, `false` for `bool`, `None` for `Option<T>`, `Ok(())` for
/// `Result<(), E>` and `Ok(None)` for `Result<Option<T>, E>`. A run is
/// skipped when
///
/// - another replica holds the lease (logged at debug) — the normal case on
///   all replicas but one;
/// - with `once_per`, the schedule slot has run already (logged at debug);
/// - the lease could not be acquired: the backend failed, or a `name`,
///   `ttl` or duration given as an expression is invalid (logged at warn);
///   the next tick tries again;
/// - there is no lease: no `lease = ...` and no `leasehold::set_global_default`
///   (logged at error, never a panic).
///
/// With `on_error = "return"`, the last two return the error instead.
///
/// `return` and `?` in the body return from the fn as usual. Methods (`&self`,
/// `&mut self`, `self: Arc<Self>`), generic fns and `impl Trait` arguments
/// work; the fn's future is `Send` whenever its body is.
///
/// If the body panics, or the fn's future is dropped while the body runs,
/// the lease is released at once (in the background), `min_hold` or not.
///
/// # Compile errors
///
/// Mistakes are reported at compile time on the token that is wrong: a fn
/// that is not `async`, a missing `name` or `ttl`, an unknown or duplicate
/// argument, an empty or over-long `name` literal, a `name` expression that
/// is not a string, a `ttl` literal that does not parse or is out of range,
/// a duration expression that is not a `Duration`, a `min_hold`, `max_hold`
/// or `wait` over 24 h, a zero `max_hold`, a `grace` below `ttl/100 + 2 ms`
/// or above `ttl/2`, a `once_per` of zero, over 366 days or not whole
/// milliseconds, a `retry_failed` that is not `true` or `false` or comes
/// without `once_per`, an `on_error` other than
/// `"skip"` or `"return"`, a `token` or `fence` that is not an identifier,
/// a `lease` that is not a `Lease`, a return type that is not `Skippable`
/// (or, with `on_error = "return"`, not a `Result` whose error type has
/// `From<leasehold::Error>`), and `#[singleton]` on anything but a fn. The fn is still emitted next to such an error, with the names given
/// by `token` and `fence` bound in its body, so the body adds no errors of
/// its own (no "cannot find value `cancel`").
///
/// [humantime]: https://docs.rs/humantime
#[proc_macro_attribute]
pub fn singleton(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::singleton(args.into(), item.into()).into()
}
