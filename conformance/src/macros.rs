//! [`conformance!`](crate::conformance): the properties as tests.

/// One test per property, for a backend: `conformance!(module, subject,
/// [groups])`.
///
/// It defines `mod module` with a `#[test]` fn per property of each group,
/// named after the property (`module::names_are_data`). Each test builds a
/// multi-threaded tokio runtime (two workers), awaits `subject` on it — an
/// expression for a future of `Option<S>` where `S:` [`Subject`](crate::Subject),
/// evaluated inside `mod module`, so an item beside the invocation is
/// `super::item` — and calls the property with the subject. A subject of
/// `None` ends the test there, passing: return it only where the test
/// cannot be run (its server is not there), and say so on stderr.
///
/// The groups (at least one):
///
/// - `every`, for every backend: [`leases`](crate::leases),
///   [`engine`](crate::engine) (but the `fenced` property) and
///   [`elections`](crate::elections) (but the `extended` one).
/// - `fenced`, for backends with fencing tokens
///   ([`Caps::fencing`](crate::Caps::fencing)):
///   [`a_late_release_leaves_a_newer_acquisition`](crate::engine::a_late_release_leaves_a_newer_acquisition).
/// - `many_leases`, for backends that hold many leases for one process:
///   [`many_leases`](crate::many_leases), 2,345 leases renewed in one batch.
/// - `operating`, for every backend: [`operating`](crate::operating)
///   (`list`, `force_release`, `force_release_now`; each refused where
///   [`Caps`](crate::Caps) says).
/// - `extended`, for every backend: [`once_per`](crate::once_per),
///   [`values`](crate::values) (each refused where [`Caps`](crate::Caps)
///   says) and
///   [`a_waiter_is_granted_at_a_crashed_holders_expiry`](crate::elections::a_waiter_is_granted_at_a_crashed_holders_expiry).
///
/// `extra [property, ...]` after the groups adds properties of your own to
/// the module: each an `async fn(&S)` beside the invocation, called as
/// `super::property(&subject)`. [`support`](crate::support) has the
/// helpers the suite's own properties use.
///
/// The expansion names nothing of the caller's crate but the subject
/// expression and the `extra` properties: every other path goes through
/// `$crate` or `::std`, so the caller needs no `tokio` of its own.
/// A group it does not know is a compile error naming the groups.
///
/// # Examples
///
/// ```
/// # use leasehold::backend::Memory;
/// # struct MySubject(Memory);
/// # impl leasehold_conformance::Subject for MySubject {
/// #     type B = Memory;
/// #     fn backend(&self) -> Memory { self.0.clone() }
/// #     async fn steal(&self, _: &str, _: &str) {}
/// # }
/// async fn subject() -> Option<MySubject> {
///     Some(MySubject(Memory::new()))
/// }
///
/// /// A property of my backend only: a new one is empty.
/// async fn starts_empty(s: &MySubject) {
///     use leasehold::Backend;
///     assert_eq!(s.0.list().await.unwrap(), []);
/// }
///
/// leasehold_conformance::conformance!(
///     mine,
///     super::subject(),
///     [every, fenced, many_leases, operating, extended],
///     extra [starts_empty]
/// );
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance {
    (
        $module:ident, $subject:expr, [$($group:ident),+ $(,)?]
        $(, extra [$($extra:ident),* $(,)?])? $(,)?
    ) => {
        mod $module {
            $($crate::conformance!(@$group $subject);)+
            $($crate::conformance!(@extra $subject, [$($extra),*]);)?
        }
    };
    (@every $subject:expr) => {
        $crate::conformance!(@tests $subject, [
            leases::exclusive_between_two_holders,
            leases::idempotent_reacquire_keeps_the_fence,
            leases::takeover_after_expiry_has_a_larger_fence,
            leases::release_then_reacquire_increments_fence,
            leases::renew_extends_a_live_lease,
            leases::renew_never_inserts,
            leases::renew_fails_after_takeover_release_and_expiry,
            leases::renew_and_release_by_a_non_holder_do_nothing,
            leases::fences_strictly_increase,
            leases::names_are_data,
            leases::holders_are_compared_exactly,
            leases::invalid_input_is_rejected,
            leases::one_winner_among_sixteen_contenders,
            leases::concurrent_acquire_of_a_new_name_has_one_winner,
            leases::concurrent_takeover_of_an_expired_lease_has_one_winner,
            engine::one_runner_among_sixteen_with_lease,
            engine::a_stolen_lease_cancels_the_token,
            engine::a_dropped_guard_frees_the_lease,
            engine::shutdown_hands_over_only_after_the_body_returned,
            engine::shutdown_leaves_a_body_that_ignores_its_token_to_expire,
            engine::a_held_lease_is_renewed_past_its_ttl,
            engine::each_lease_learns_its_own_fate,
            elections::a_waiter_has_a_released_lease_at_once,
            elections::a_wait_runs_out_while_another_holds,
            elections::a_waiter_takes_over_from_a_crashed_holder,
            elections::an_election_hands_over_on_resign,
            elections::an_election_hands_over_on_drop,
            elections::an_election_contends_again_after_a_steal,
        ]);
    };
    (@fenced $subject:expr) => {
        $crate::conformance!(@tests $subject, [engine::a_late_release_leaves_a_newer_acquisition]);
    };
    (@many_leases $subject:expr) => {
        $crate::conformance!(@tests $subject, [many_leases::a_batch_larger_than_a_chunk]);
    };
    (@operating $subject:expr) => {
        $crate::conformance!(@tests $subject, [
            operating::force_release_keeps_a_lock_delay,
            operating::force_release_now_hands_over_at_once,
            operating::list_shows_held_and_released_leases,
        ]);
    };
    (@extended $subject:expr) => {
        $crate::conformance!(@tests $subject, [
            once_per::each_slot_runs_once_across_skewed_ticks,
            once_per::a_crashed_or_failed_run_does_not_run_its_slot_again,
            once_per::retry_failed_runs_a_failed_slot_again,
            once_per::a_period_out_of_bounds_is_invalid,
            values::a_value_over_4_kib_is_invalid,
            values::a_follower_sees_the_leaders_value,
            values::an_observer_sees_the_holder_and_the_hand_over,
            elections::a_waiter_is_granted_at_a_crashed_holders_expiry,
        ]);
    };
    (@tests $subject:expr, [$($group:ident :: $property:ident),* $(,)?]) => {
        $(
            #[test]
            fn $property() {
                $crate::__private::run(async {
                    if let ::std::option::Option::Some(subject) = $subject.await {
                        $crate::$group::$property(&subject).await;
                    }
                });
            }
        )*
    };
    (@extra $subject:expr, [$($property:ident),*]) => {
        $(
            #[test]
            fn $property() {
                $crate::__private::run(async {
                    if let ::std::option::Option::Some(subject) = $subject.await {
                        super::$property(&subject).await;
                    }
                });
            }
        )*
    };
    (@$unknown:ident $subject:expr) => {
        ::std::compile_error!(::std::concat!(
            "unknown group `", ::std::stringify!($unknown),
            "`: the groups are every, fenced, many_leases, operating and extended"
        ));
    };
}
