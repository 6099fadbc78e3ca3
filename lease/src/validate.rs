//! Input rules shared by the engine and every backend, public as
//! `backend::validate`. `docs/ARCHITECTURE.md` ("Input rules") says who
//! checks what, and why twice.

use std::time::Duration;

use crate::Error;
use crate::backend::Request;

/// Longest lease name, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Longest holder identity, in bytes.
pub const MAX_HOLDER_LEN: usize = 255;
/// Shortest accepted ttl.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// Longest accepted ttl.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Checks a lease name: 1 to [`MAX_NAME_LEN`] bytes. Its characters are
/// data, never syntax: any UTF-8 is a valid name.
///
/// # Errors
///
/// [`Error::InvalidName`] with the name's length in bytes.
pub fn name(name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(Error::InvalidName { len: name.len() });
    }
    Ok(())
}

/// Checks a holder identity: 1 to [`MAX_HOLDER_LEN`] bytes.
///
/// # Errors
///
/// [`Error::InvalidHolder`] with the holder's length in bytes.
pub fn holder(holder: &str) -> Result<(), Error> {
    if holder.is_empty() || holder.len() > MAX_HOLDER_LEN {
        return Err(Error::InvalidHolder { len: holder.len() });
    }
    Ok(())
}

/// Checks a ttl: whole milliseconds, from [`MIN_TTL`] to [`MAX_TTL`]
/// (both included).
///
/// # Errors
///
/// [`Error::InvalidTtl`] with the ttl.
pub fn ttl(ttl: Duration) -> Result<(), Error> {
    if ttl < MIN_TTL || ttl > MAX_TTL || !ttl.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(Error::InvalidTtl { ttl });
    }
    Ok(())
}

/// A duration argument of `#[singleton]` given as an expression (`min_hold`,
/// `max_hold`, `wait`): whole milliseconds up to [`MAX_TTL`], the rules the
/// macro applies to a literal at compile time; `max_hold` is more than zero
/// (the token would fire at once).
pub(crate) fn hold(argument: &'static str, duration: Duration) -> Result<(), Error> {
    if duration > MAX_TTL
        || !duration.subsec_nanos().is_multiple_of(1_000_000)
        || (argument == "max_hold" && duration.is_zero())
    {
        return Err(Error::InvalidDuration { argument, duration });
    }
    Ok(())
}

/// Longest `once_per` period: a year and a day.
pub const MAX_PERIOD: Duration = Duration::from_secs(366 * 24 * 60 * 60);

/// Longest value an election may proclaim, in bytes.
pub const MAX_VALUE_LEN: usize = 4096;

/// A `once_per` period is whole milliseconds from 1 ms to [`MAX_PERIOD`].
pub(crate) fn once_per(period: Duration) -> Result<(), Error> {
    if period.is_zero() || period > MAX_PERIOD || !period.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(Error::InvalidDuration {
            argument: "once_per",
            duration: period,
        });
    }
    Ok(())
}

/// Checks a value to publish with a lease ([`Request::value`],
/// [`Backend::publish`](crate::Backend::publish)): at most
/// [`MAX_VALUE_LEN`] bytes.
///
/// # Errors
///
/// [`Error::InvalidValue`] with the value's length in bytes.
pub fn value(value: &str) -> Result<(), Error> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::InvalidValue { len: value.len() });
    }
    Ok(())
}

/// Checks everything an acquisition request carries, as
/// [`Lease`](crate::Lease) checks it before it calls a backend: [`name`],
/// [`holder`], [`ttl`], the period of [`Request::once_per`] (whole
/// milliseconds from 1 ms to [`MAX_PERIOD`]) and [`Request::value`].
///
/// # Errors
///
/// The first that fails: [`Error::InvalidName`], [`Error::InvalidHolder`],
/// [`Error::InvalidTtl`], [`Error::InvalidDuration`] (the period) or
/// [`Error::InvalidValue`]. On success, the ttl in whole milliseconds.
pub fn request(request: &Request<'_>) -> Result<u32, Error> {
    let ttl_ms = call(request.name, request.holder, request.ttl)?;
    if let Some(once_per) = request.once_per {
        self::once_per(once_per.period)?;
    }
    if let Some(value) = request.value {
        self::value(value)?;
    }
    Ok(ttl_ms)
}

/// The inputs of a backend call with a ttl (acquire, renew), checked as the
/// engine checks them; the ttl in whole milliseconds, the unit every backend
/// sends.
///
/// An over-long name must never reach a lenient server that would truncate
/// it into another (colliding) name, and a huge ttl must not overflow the
/// server's arithmetic.
pub(crate) fn call(name: &str, holder: &str, ttl: Duration) -> Result<u32, Error> {
    self::name(name)?;
    self::holder(holder)?;
    self::ttl(ttl)?;
    // At most 86_400_000, so the conversion cannot fail.
    Ok(u32::try_from(ttl.as_millis()).expect("BUG: a valid ttl fits in u32 milliseconds"))
}

/// Like [`call`], for calls without a ttl (release).
pub(crate) fn call_no_ttl(name: &str, holder: &str) -> Result<(), Error> {
    self::name(name)?;
    self::holder(holder)
}

/// The inputs of [`Backend::publish`](crate::Backend::publish): the
/// acquisition's name and holder, and the value ([`value`]).
pub(crate) fn publish(lease: &crate::Acquisition<'_>, value: Option<&str>) -> Result<(), Error> {
    call_no_ttl(lease.name, lease.holder)?;
    value.map_or(Ok(()), self::value)
}

/// `[A-Za-z_][A-Za-z0-9_]*`, optionally `schema.`-qualified; at most 63 bytes a part
/// (PostgreSQL's identifier limit, below MySQL's 64).
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]
pub(crate) fn table(table: &str) -> Result<(), Error> {
    fn ident(part: &str) -> bool {
        let mut bytes = part.bytes();
        matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
            && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && part.len() <= 63
    }
    let ok = match table.split_once('.') {
        Some((schema, name)) => ident(schema) && ident(name),
        None => ident(table),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidTable {
            table: table.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_checked() {
        let ms = |ms| Duration::from_millis(ms);
        assert_eq!(call("n", "h", ms(10)).ok(), Some(10));
        assert_eq!(call("n", "h", ms(86_400_000)).ok(), Some(86_400_000));
        assert!(matches!(
            call("n", "h", ms(9)),
            Err(Error::InvalidTtl { .. })
        ));
        assert!(matches!(
            call("n", "h", Duration::MAX),
            Err(Error::InvalidTtl { .. })
        ));
        assert!(matches!(
            call("", "h", ms(10)),
            Err(Error::InvalidName { len: 0 })
        ));
        assert!(matches!(
            call(&"x".repeat(256), "h", ms(10)),
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            call_no_ttl("n", ""),
            Err(Error::InvalidHolder { len: 0 })
        ));
        assert!(call_no_ttl(&"x".repeat(255), &"y".repeat(255)).is_ok());
    }

    #[test]
    fn requests() {
        let ok = Request::new("n", "h", Duration::from_secs(1));
        assert!(request(&ok).is_ok());
        let once = crate::backend::OncePer::new(MAX_PERIOD);
        assert!(request(&ok.once_per(once).value(&"v".repeat(MAX_VALUE_LEN))).is_ok());
        assert!(matches!(
            request(&Request::new("", "h", Duration::from_secs(1))),
            Err(Error::InvalidName { len: 0 })
        ));
        assert!(matches!(
            request(&Request::new("n", "", Duration::from_secs(1))),
            Err(Error::InvalidHolder { len: 0 })
        ));
        assert!(matches!(
            request(&Request::new("n", "h", Duration::ZERO)),
            Err(Error::InvalidTtl { .. })
        ));
        let too_long = crate::backend::OncePer::new(MAX_PERIOD + Duration::from_millis(1));
        assert!(matches!(
            request(&ok.once_per(too_long)),
            Err(Error::InvalidDuration {
                argument: "once_per",
                ..
            })
        ));
        assert!(matches!(
            request(&ok.value(&"v".repeat(MAX_VALUE_LEN + 1))),
            Err(Error::InvalidValue { len }) if len == MAX_VALUE_LEN + 1
        ));
    }

    #[test]
    fn names() {
        assert!(name("a").is_ok());
        assert!(name(&"x".repeat(255)).is_ok());
        assert!(name("it's 100% {ok} \\ _ 🦀").is_ok());
        assert!(matches!(name(""), Err(Error::InvalidName { len: 0 })));
        assert!(matches!(
            name(&"x".repeat(256)),
            Err(Error::InvalidName { len: 256 })
        ));
        // 255 bytes is the limit, not 255 characters.
        assert!(name(&"é".repeat(128)).is_err());
    }

    #[test]
    fn ttls() {
        assert!(ttl(Duration::from_millis(10)).is_ok());
        assert!(ttl(Duration::from_secs(86_400)).is_ok());
        assert!(ttl(Duration::from_millis(9)).is_err());
        assert!(ttl(Duration::ZERO).is_err());
        assert!(ttl(Duration::from_secs(86_400) + Duration::from_millis(1)).is_err());
        assert!(ttl(Duration::from_micros(10_500)).is_err());
    }

    #[test]
    fn holds() {
        let ms = Duration::from_millis;
        for argument in ["min_hold", "max_hold", "wait"] {
            assert!(hold(argument, ms(1)).is_ok());
            assert!(hold(argument, MAX_TTL).is_ok());
            assert!(matches!(
                hold(argument, MAX_TTL + ms(1)),
                Err(Error::InvalidDuration { argument: a, .. }) if a == argument
            ));
            assert!(hold(argument, Duration::from_micros(1_500)).is_err());
        }
        assert!(hold("min_hold", Duration::ZERO).is_ok());
        assert!(hold("wait", Duration::ZERO).is_ok());
        assert!(hold("max_hold", Duration::ZERO).is_err());
    }

    #[test]
    fn tables() {
        for ok in ["task_leases", "_t", "my_schema.leases", "A1.b_2"] {
            assert!(table(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "leases; drop table x",
            "a.b.c",
            ".a",
            "a.",
            "a-b",
            "\"quoted\"",
            "lé",
            &"x".repeat(64),
        ] {
            assert!(
                matches!(table(bad), Err(Error::InvalidTable { .. })),
                "{bad}"
            );
        }
    }
}
