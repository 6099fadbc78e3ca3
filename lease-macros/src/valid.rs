//! Checks: the item is an `async fn`, the required arguments are there, and
//! the values follow the runtime's rules — so that a mistake is reported at
//! compile time, on the token that is wrong, rather than as a skipped run.

use std::time::Duration;

use proc_macro2::Span;
use syn::{Expr, Ident, ItemFn, LitStr, Path};

use crate::attr::{Args, Value};

// The runtime's limits, copied: a proc-macro crate cannot depend on `leasehold`.
// The test `limits_are_the_runtimes` checks them against `leasehold`'s.

/// Shortest ttl (`leasehold::MIN_TTL`).
const MIN_TTL: Duration = Duration::from_millis(10);
/// Longest ttl (`leasehold::MAX_TTL`); also the longest `min_hold`, `max_hold`
/// and `wait`.
const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Longest lease name in bytes (`leasehold::MAX_NAME_LEN`).
const MAX_NAME_LEN: usize = 255;
/// Longest `once_per` period (`leasehold::MAX_PERIOD`): 366 days.
const MAX_PERIOD: Duration = Duration::from_secs(366 * 24 * 60 * 60);

/// A duration argument that passed its checks.
pub(crate) enum Dur {
    /// A literal: its value in whole milliseconds, and its span.
    Millis(u64, Span),
    /// An expression, checked at run time.
    Expr(Expr),
}

/// Arguments that passed every check.
pub(crate) struct Singleton {
    /// A literal (checked) or an expression.
    pub(crate) name: Value,
    pub(crate) ttl: Dur,
    pub(crate) min_hold: Option<Dur>,
    pub(crate) max_hold: Option<Dur>,
    pub(crate) grace: Option<Dur>,
    pub(crate) wait: Option<Dur>,
    pub(crate) once_per: Option<Dur>,
    /// `retry_failed = true` (only with `once_per`).
    pub(crate) retry_failed: bool,
    /// `on_error = "return"`: an acquisition error is the fn's `Err`.
    pub(crate) return_errors: bool,
    pub(crate) lease: Option<Expr>,
    pub(crate) token: Option<Ident>,
    pub(crate) fence: Option<Ident>,
    pub(crate) krate: Option<Path>,
}

/// Check `args` against `item`, reporting every problem found at once.
///
/// Wrong arguments found while parsing are reported alone: the checks would
/// only repeat them (`name = digest` is also a missing `name`).
pub(crate) fn check(args: &Args, item: &ItemFn) -> syn::Result<Singleton> {
    if let Some(parse_errors) = &args.errors {
        return Err(parse_errors.clone());
    }
    let mut errors = Errors::default();

    if item.sig.asyncness.is_none() {
        errors.push(syn::Error::new_spanned(
            item.sig.fn_token,
            "the `async` keyword is missing from the function declaration; \
             `#[singleton]` runs an async job: write `async fn`",
        ));
    }

    let name = match &args.name {
        Some(Value::Lit(name)) => errors.check(check_name(name)).map(|()| Value::Lit(name.clone())),
        Some(expr @ Value::Expr(_)) => Some(expr.clone()),
        None => errors.missing("missing `name` argument; add the lease's name, shared by every replica: `name = \"nightly-report\"`"),
    };
    let ttl = match &args.ttl {
        Some(Value::Lit(ttl)) => errors.check(check_ttl(ttl)),
        Some(Value::Expr(expr)) => Some(Dur::Expr(expr.clone())),
        None => errors.missing(
            "missing `ttl` argument; add how long a crashed holder keeps the lease, e.g. `ttl = \"90s\"` \
             (it is renewed every ttl/3 while the job runs)",
        ),
    };
    let mut hold = |value: &Option<Value>, key: Key| match value {
        Some(Value::Lit(lit)) => errors.check(check_hold(lit, key)),
        Some(Value::Expr(expr)) => Some(Dur::Expr(expr.clone())),
        None => None,
    };
    let min_hold = hold(&args.min_hold, Key::MinHold);
    let max_hold = hold(&args.max_hold, Key::MaxHold);
    let wait = hold(&args.wait, Key::Wait);
    let literal_ttl = match &ttl {
        Some(Dur::Millis(ms, _)) => Some(Duration::from_millis(*ms)),
        _ => None,
    };
    let grace = match &args.grace {
        Some(Value::Lit(lit)) => errors.check(check_grace(lit, literal_ttl)),
        Some(Value::Expr(expr)) => Some(Dur::Expr(expr.clone())),
        None => None,
    };
    let once_per = match &args.once_per {
        Some(Value::Lit(lit)) => errors.check(check_once_per(lit)),
        Some(Value::Expr(expr)) => Some(Dur::Expr(expr.clone())),
        None => None,
    };
    let retry_failed = match &args.retry_failed {
        Some((_, key)) if args.once_per.is_none() => {
            errors.push(syn::Error::new(
                *key,
                "`retry_failed` needs `once_per`: it lets a failed run run again within its \
                 schedule slot; add the schedule's period, e.g. `once_per = \"1h\"`, or remove \
                 `retry_failed`",
            ));
            false
        }
        Some((lit, _)) => lit.value,
        None => false,
    };
    let return_errors = match &args.on_error {
        Some(lit) => errors.check(check_on_error(lit)).unwrap_or(false),
        None => false,
    };
    if let (Some(token), Some(fence)) = (&args.token, &args.fence)
        && token == fence
    {
        errors.push(syn::Error::new(
            fence.span(),
            format!("`token` and `fence` are both `{fence}`; give the fencing token another name"),
        ));
    }

    errors.finish()?;
    Ok(Singleton {
        name: name.expect("BUG: a missing name is an error"),
        ttl: ttl.expect("BUG: a missing ttl is an error"),
        min_hold,
        max_hold,
        grace,
        wait,
        once_per,
        retry_failed,
        return_errors,
        lease: args.lease.clone(),
        token: args.token.clone(),
        fence: args.fence.clone(),
        krate: args.krate.clone(),
    })
}

fn check_name(name: &LitStr) -> syn::Result<()> {
    let value = name.value();
    if value.is_empty() {
        return Err(syn::Error::new(
            name.span(),
            "`name` must not be empty; name the job, e.g. `name = \"nightly-report\"`",
        ));
    }
    if value.len() > MAX_NAME_LEN {
        return Err(syn::Error::new(
            name.span(),
            format!(
                "`name` is {} bytes long; shorten it to at most {MAX_NAME_LEN} bytes",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// A ttl in whole milliseconds from 10 ms to 24 h, like `Lease::try_acquire`'s.
fn check_ttl(lit: &LitStr) -> syn::Result<Dur> {
    let ttl = duration(lit, "ttl")?;
    let fail = |msg: &str| Err(syn::Error::new(lit.span(), msg));
    if ttl.is_zero() {
        return fail(
            "`ttl` must not be zero: the lease would expire at once; \
             use how long a crashed holder may block the others, e.g. `ttl = \"90s\"`",
        );
    }
    if ttl < MIN_TTL {
        return fail(&format!(
            "`ttl` must be at least {}; use a longer duration, e.g. `ttl = \"90s\"`",
            format_limit(MIN_TTL)
        ));
    }
    if ttl > MAX_TTL {
        return fail(&format!(
            "`ttl` must be at most {}; use a shorter duration, e.g. `ttl = \"1h\"`",
            format_limit(MAX_TTL)
        ));
    }
    Ok(Dur::Millis(whole_millis(lit, "ttl", ttl)?, lit.span()))
}

/// The duration arguments besides `ttl`.
#[derive(Clone, Copy, PartialEq)]
enum Key {
    MinHold,
    MaxHold,
    Wait,
}

impl Key {
    fn name(self) -> &'static str {
        match self {
            Key::MinHold => "min_hold",
            Key::MaxHold => "max_hold",
            Key::Wait => "wait",
        }
    }
}

/// Any duration up to 24 h, in whole milliseconds (the rules `leasehold` applies
/// to an expression at run time); `max_hold` is not zero.
///
/// `min_hold` longer than the ttl is fine (the lease is renewed meanwhile);
/// longer than a day is a mistake: a job that finished would block every
/// replica for more than a day. A `max_hold` or `wait` over a day is not a
/// ceiling or a wait anyone means.
fn check_hold(lit: &LitStr, hold: Key) -> syn::Result<Dur> {
    let key = hold.name();
    let value = duration(lit, key)?;
    let fail = |msg: String| Err(syn::Error::new(lit.span(), msg));
    if value > MAX_TTL {
        let limit = format_limit(MAX_TTL);
        return fail(match hold {
            Key::MinHold => format!(
                "`min_hold` must be at most {limit}: it keeps the lease after the job is done, \
                 so use about one tick of the schedule, e.g. `min_hold = \"30s\"`"
            ),
            Key::MaxHold => format!(
                "`max_hold` must be at most {limit}; use the longest a run may take, \
                 e.g. `max_hold = \"10m\"`, or leave it out to renew for as long as the job runs"
            ),
            Key::Wait => format!(
                "`wait` must be at most {limit}; use how long a tick may wait for the lease, \
                 e.g. `wait = \"5s\"`"
            ),
        });
    }
    if hold == Key::MaxHold && value.is_zero() {
        return fail(
            "`max_hold` must not be zero: the token would fire as soon as the lease is acquired; \
             use the longest a run may take, e.g. `max_hold = \"10m\"`"
                .to_owned(),
        );
    }
    Ok(Dur::Millis(whole_millis(lit, key, value)?, lit.span()))
}

/// The least grace for `ttl` (`leasehold`'s margin, `ttl/100 + 2ms`).
fn margin(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// A grace in whole milliseconds from the margin (`ttl/100 + 2 ms`) to
/// `ttl/2`, the rule `leasehold` applies at run time (`Job::grace`). With a
/// `ttl` expression the range is checked at run time; here only that it
/// parses, is whole milliseconds and is at most half the longest ttl.
fn check_grace(lit: &LitStr, ttl: Option<Duration>) -> syn::Result<Dur> {
    let grace = duration(lit, "grace")?;
    let fail = |msg: String| Err(syn::Error::new(lit.span(), msg));
    let ms = whole_millis(lit, "grace", grace.min(MAX_TTL))?;
    let Some(ttl) = ttl else {
        if grace > MAX_TTL / 2 {
            return fail(format!(
                "`grace` must be at most {} (half the longest ttl); use about a third of the ttl",
                format_limit(MAX_TTL / 2)
            ));
        }
        return Ok(Dur::Millis(ms, lit.span()));
    };
    let (least, most) = (margin(ttl), ttl / 2);
    if grace < least {
        return fail(format!(
            "`grace` must be at least {} for a ttl of {} (ttl/100 + 2ms): the token must fire \
             before the lease can pass to another holder; use about a third of the ttl, or \
             leave it out for ttl/3",
            format_ms_fraction(least),
            format_limit(ttl),
        ));
    }
    if grace > most {
        return fail(format!(
            "`grace` must be at most {} for a ttl of {} (ttl/2): a longer grace leaves too \
             little time to retry failed renewals; use about a third of the ttl, or leave \
             it out for ttl/3",
            format_ms_fraction(most),
            format_limit(ttl),
        ));
    }
    Ok(Dur::Millis(ms, lit.span()))
}

/// A duration that may have a fraction of a millisecond: `32ms`, `2.1ms`, `45s`.
fn format_ms_fraction(d: Duration) -> String {
    if d.subsec_nanos().is_multiple_of(1_000_000) {
        format_limit(d)
    } else {
        format!("{}ms", d.as_secs_f64() * 1000.0)
    }
}

/// A `once_per` period in whole milliseconds from 1 ms to 366 days, the
/// rule `leasehold` applies at run time (`Job::once_per`).
fn check_once_per(lit: &LitStr) -> syn::Result<Dur> {
    let period = duration(lit, "once_per")?;
    let fail = |msg: &str| Err(syn::Error::new(lit.span(), msg));
    if period.is_zero() {
        return fail(
            "`once_per` must not be zero: it is the schedule's period, and the job runs at \
             most once in each slot of it; use the job's interval, e.g. `once_per = \"1h\"`",
        );
    }
    if period > MAX_PERIOD {
        return fail(
            "`once_per` must be at most 366 days; use the job's interval, \
             e.g. `once_per = \"1day\"`",
        );
    }
    Ok(Dur::Millis(
        whole_millis(lit, "once_per", period)?,
        lit.span(),
    ))
}

/// `"skip"` (the default) or `"return"`: whether an acquisition error is
/// returned as the fn's `Err`.
fn check_on_error(lit: &LitStr) -> syn::Result<bool> {
    match lit.value().as_str() {
        "skip" => Ok(false),
        "return" => Ok(true),
        other => Err(syn::Error::new(
            lit.span(),
            format!(
                "`on_error` must be \"skip\" (the default: an acquisition error skips the run) \
                 or \"return\" (it comes back as the fn's `Err`), not {other:?}"
            ),
        )),
    }
}

/// Parse a humantime duration (`"90s"`, `"1m 30s"`, `"500ms"`).
fn duration(lit: &LitStr, key: &str) -> syn::Result<Duration> {
    humantime::parse_duration(&lit.value()).map_err(|e| {
        syn::Error::new(
            lit.span(),
            format!(
                "invalid `{key}` {:?}: {}; write a duration like \"90s\", \"1m 30s\" or \"500ms\"",
                lit.value(),
                lowercase_first(&e.to_string()),
            ),
        )
    })
}

fn whole_millis(lit: &LitStr, key: &str, d: Duration) -> syn::Result<u64> {
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`{key}` must be whole milliseconds; round it, e.g. to {:?}",
                format_ms(d)
            ),
        ));
    }
    // At most 366 days, so this fits easily.
    Ok(d.as_millis() as u64)
}

fn format_ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// A limit in its largest whole unit: `10ms`, `24h`.
fn format_limit(d: Duration) -> String {
    let ms = d.as_millis();
    [(3_600_000, "h"), (60_000, "m"), (1_000, "s")]
        .into_iter()
        .find(|&(unit, _)| ms > 0 && ms.is_multiple_of(unit))
        .map_or_else(
            || format_ms(d),
            |(unit, name)| format!("{}{name}", ms / unit),
        )
}

fn lowercase_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Errors collected while checking, reported together.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    fn check<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|e| self.push(e)).ok()
    }

    /// A required argument is missing: there is no token of the user's to
    /// point at but the attribute itself.
    fn missing<T>(&mut self, msg: &str) -> Option<T> {
        self.push(syn::Error::new(Span::call_site(), msg));
        None
    }

    fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(s: &str) -> LitStr {
        LitStr::new(s, Span::call_site())
    }

    fn ms(r: syn::Result<Dur>) -> Result<u64, String> {
        match r {
            Ok(Dur::Millis(ms, _)) => Ok(ms),
            Ok(Dur::Expr(_)) => Err("an expression".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    }

    fn check_min_hold(lit: &LitStr) -> syn::Result<Dur> {
        check_hold(lit, Key::MinHold)
    }

    #[test]
    fn ttls() {
        assert_eq!(ms(check_ttl(&lit("90s"))), Ok(90_000));
        assert_eq!(ms(check_ttl(&lit("1m 30s"))), Ok(90_000));
        assert_eq!(ms(check_ttl(&lit("10ms"))), Ok(10));
        assert_eq!(ms(check_ttl(&lit("24h"))), Ok(86_400_000));
        assert!(
            ms(check_ttl(&lit("9ms")))
                .unwrap_err()
                .contains("at least 10ms")
        );
        assert!(
            ms(check_ttl(&lit("24h 1ms")))
                .unwrap_err()
                .contains("at most 24h")
        );
        assert!(
            ms(check_ttl(&lit("0s")))
                .unwrap_err()
                .contains("must not be zero")
        );
        assert!(
            ms(check_ttl(&lit("10500us")))
                .unwrap_err()
                .contains("whole milliseconds")
        );
        let bad = ms(check_ttl(&lit("90x"))).unwrap_err();
        assert!(
            bad.starts_with("invalid `ttl` \"90x\": unknown time unit \"x\""),
            "{bad}"
        );
        assert!(ms(check_ttl(&lit(""))).is_err());
    }

    #[test]
    fn min_holds() {
        assert_eq!(ms(check_min_hold(&lit("0s"))), Ok(0));
        assert_eq!(ms(check_min_hold(&lit("30s"))), Ok(30_000));
        assert_eq!(ms(check_min_hold(&lit("24h"))), Ok(86_400_000));
        assert!(
            ms(check_min_hold(&lit("25h")))
                .unwrap_err()
                .contains("at most 24h")
        );
        assert!(ms(check_min_hold(&lit("1.5ms"))).is_err());
    }

    #[test]
    fn max_holds_and_waits() {
        let max_hold = |s: &str| ms(check_hold(&lit(s), Key::MaxHold));
        let wait = |s: &str| ms(check_hold(&lit(s), Key::Wait));
        assert_eq!(max_hold("10m"), Ok(600_000));
        assert_eq!(max_hold("1ms"), Ok(1));
        assert_eq!(max_hold("24h"), Ok(86_400_000));
        assert!(max_hold("0s").unwrap_err().contains("must not be zero"));
        assert!(max_hold("25h").unwrap_err().contains("at most 24h"));
        assert!(
            max_hold("1.5ms")
                .unwrap_err()
                .contains("whole milliseconds")
        );
        assert_eq!(wait("5s"), Ok(5_000));
        assert_eq!(wait("0s"), Ok(0));
        assert!(
            wait("25h")
                .unwrap_err()
                .contains("`wait` must be at most 24h")
        );
        let bad = wait("5x").unwrap_err();
        assert!(bad.starts_with("invalid `wait` \"5x\""), "{bad}");
    }

    #[test]
    fn graces_are_checked_against_a_literal_ttl() {
        let secs = |n| Some(Duration::from_secs(n));
        // ttl 3 s: margin 32 ms, half 1.5 s.
        assert_eq!(ms(check_grace(&lit("32ms"), secs(3))), Ok(32));
        assert_eq!(ms(check_grace(&lit("1500ms"), secs(3))), Ok(1500));
        let low = ms(check_grace(&lit("31ms"), secs(3))).unwrap_err();
        assert!(low.contains("at least 32ms for a ttl of 3s"), "{low}");
        let high = ms(check_grace(&lit("1501ms"), secs(3))).unwrap_err();
        assert!(high.contains("at most 1500ms for a ttl of 3s"), "{high}");
        // ttl 10 ms: margin 2.1 ms.
        let low = ms(check_grace(&lit("2ms"), Some(Duration::from_millis(10)))).unwrap_err();
        assert!(low.contains("at least 2.1ms"), "{low}");
        // A ttl expression: the range is the runtime's to check.
        assert_eq!(ms(check_grace(&lit("1ms"), None)), Ok(1));
        assert!(ms(check_grace(&lit("13h"), None)).is_err());
        assert!(ms(check_grace(&lit("1.5ms"), secs(3))).is_err());
        assert!(ms(check_grace(&lit("20x"), secs(3))).is_err());
    }

    #[test]
    fn once_pers() {
        let once_per = |s: &str| ms(check_once_per(&lit(s)));
        assert_eq!(once_per("1h"), Ok(3_600_000));
        assert_eq!(once_per("1ms"), Ok(1));
        assert_eq!(once_per("366days"), Ok(366 * 86_400_000));
        assert!(once_per("0s").unwrap_err().contains("must not be zero"));
        assert!(
            once_per("367days")
                .unwrap_err()
                .contains("at most 366 days")
        );
        assert!(
            once_per("1500us")
                .unwrap_err()
                .contains("`once_per` must be whole milliseconds")
        );
        let bad = once_per("1x").unwrap_err();
        assert!(bad.starts_with("invalid `once_per` \"1x\""), "{bad}");
    }

    #[test]
    fn on_error_values() {
        assert_eq!(check_on_error(&lit("skip")).ok(), Some(false));
        assert_eq!(check_on_error(&lit("return")).ok(), Some(true));
        let bad = check_on_error(&lit("Return")).unwrap_err().to_string();
        assert!(bad.contains("not \"Return\""), "{bad}");
    }

    /// The macro's limits are `leasehold`'s (here a dev-dependency, which a
    /// proc-macro crate cannot have as a dependency): at each boundary, the
    /// last value `leasehold` accepts passes and one step past it fails, so a
    /// limit changed in either crate alone fails this test.
    #[test]
    fn limits_are_the_runtimes() {
        let ttl = |d: Duration| ms(check_ttl(&lit(&format_ms(d))));
        let min_hold = |d: Duration| ms(check_min_hold(&lit(&format_ms(d))));
        let max_hold = |d: Duration| ms(check_hold(&lit(&format_ms(d)), Key::MaxHold));
        let wait = |d: Duration| ms(check_hold(&lit(&format_ms(d)), Key::Wait));
        let name = |len: usize| check_name(&lit(&"x".repeat(len))).map_err(|e| e.to_string());
        let (min_ttl, max_ttl) = (leasehold::MIN_TTL, leasehold::MAX_TTL);
        let step = Duration::from_millis(1);

        assert_eq!(ttl(min_ttl), Ok(min_ttl.as_millis() as u64));
        let below = ttl(min_ttl - step).unwrap_err();
        assert!(
            below.contains(&format!("at least {}", format_limit(min_ttl)))
                || (min_ttl == step && below.contains("must not be zero")),
            "{below}"
        );
        assert_eq!(ttl(max_ttl), Ok(max_ttl.as_millis() as u64));
        let above = ttl(max_ttl + step).unwrap_err();
        assert!(
            above.contains(&format!("at most {}", format_limit(max_ttl))),
            "{above}"
        );

        for hold in [min_hold, max_hold, wait] {
            assert_eq!(hold(max_ttl), Ok(max_ttl.as_millis() as u64));
            let above = hold(max_ttl + step).unwrap_err();
            assert!(
                above.contains(&format!("at most {}", format_limit(max_ttl))),
                "{above}"
            );
        }

        let once_per = |d: Duration| ms(check_once_per(&lit(&format_ms(d))));
        let max_period = leasehold::MAX_PERIOD;
        assert_eq!(once_per(max_period), Ok(max_period.as_millis() as u64));
        let above = once_per(max_period + step).unwrap_err();
        assert!(above.contains("at most 366 days"), "{above}");
        assert_eq!(once_per(step), Ok(1), "the shortest period is 1 ms");

        assert_eq!(name(leasehold::MAX_NAME_LEN), Ok(()));
        let long = name(leasehold::MAX_NAME_LEN + 1).unwrap_err();
        assert!(
            long.contains(&format!("at most {} bytes", leasehold::MAX_NAME_LEN)),
            "{long}"
        );
    }

    #[test]
    fn limits_are_written_in_their_largest_unit() {
        assert_eq!(format_limit(Duration::from_millis(10)), "10ms");
        assert_eq!(format_limit(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_limit(Duration::from_secs(90)), "90s");
        assert_eq!(format_limit(Duration::from_secs(120)), "2m");
        assert_eq!(format_limit(Duration::from_secs(24 * 60 * 60)), "24h");
        assert_eq!(format_limit(Duration::ZERO), "0ms");
    }

    #[test]
    fn names() {
        assert!(check_name(&lit("a")).is_ok());
        assert!(check_name(&lit(&"é".repeat(127))).is_ok());
        assert!(check_name(&lit("")).is_err());
        assert!(
            check_name(&lit(&"é".repeat(128)))
                .unwrap_err()
                .to_string()
                .contains("256 bytes")
        );
    }
}
