//! Parsing `#[singleton(key = value, ...)]`: syntax only. Each value is kept
//! with its span; what the values mean is checked in `valid.rs`.
//!
//! Parsing never fails: each mistake is recorded, and parsing goes on with
//! the next argument after a wrong one (an unknown or duplicate key, a value
//! of the wrong kind), or stops at broken syntax, keeping the arguments
//! before it. So the names `token` and `fence` give the body are known
//! whenever they were written correctly, and the expansion of an error can
//! bind them (`expand::fallback`).

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitBool, LitStr, Path, Token};

mod kw {
    syn::custom_keyword!(name);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(token);
    syn::custom_keyword!(fence);
    syn::custom_keyword!(min_hold);
    syn::custom_keyword!(max_hold);
    syn::custom_keyword!(grace);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(once_per);
    syn::custom_keyword!(retry_failed);
    syn::custom_keyword!(on_error);
}

/// Every argument, in the order of the attribute's docs (`leasehold::singleton`).
pub(crate) const KEYS: &str = "`name`, `ttl`, `lease`, `token`, `fence`, `min_hold`, `max_hold`, \
                               `grace`, `wait`, `once_per`, `retry_failed`, `on_error`, `crate`";

/// A value that may be a string literal, checked at compile time, or any
/// other expression, evaluated (and checked) at run time.
#[derive(Clone)]
pub(crate) enum Value {
    Lit(LitStr),
    Expr(Expr),
}

/// The arguments as written, each at most once.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) name: Option<Value>,
    pub(crate) ttl: Option<Value>,
    pub(crate) lease: Option<Expr>,
    pub(crate) token: Option<Ident>,
    pub(crate) fence: Option<Ident>,
    pub(crate) min_hold: Option<Value>,
    pub(crate) max_hold: Option<Value>,
    pub(crate) grace: Option<Value>,
    pub(crate) wait: Option<Value>,
    pub(crate) once_per: Option<Value>,
    /// The value, and the key's span (what `retry_failed` without
    /// `once_per` is reported on).
    pub(crate) retry_failed: Option<(LitBool, Span)>,
    pub(crate) on_error: Option<LitStr>,
    pub(crate) krate: Option<Path>,
    /// Every mistake found, reported together.
    pub(crate) errors: Option<syn::Error>,
}

impl Args {
    /// The arguments of `#[singleton(...)]`, with the mistakes in `errors`.
    pub(crate) fn parse(tokens: TokenStream) -> Self {
        let mut args = Args::default();
        let parser = |input: ParseStream<'_>| {
            if let Err(syntax) = args.parse_each(input) {
                push(&mut args.errors, syntax);
                // Skip the rest: parsing can't tell where it resumes.
                input.step(|cursor| {
                    let mut rest = *cursor;
                    while let Some((_, next)) = rest.token_tree() {
                        rest = next;
                    }
                    Ok(((), rest))
                })?;
            }
            Ok(())
        };
        if let Err(error) = parser.parse2(tokens) {
            push(&mut args.errors, error);
        }
        args
    }

    /// Parse each `key = value`, recording wrong ones; `Err` at broken syntax.
    fn parse_each(&mut self, input: ParseStream<'_>) -> syn::Result<()> {
        let errors = &mut self.errors;
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            if lookahead.peek(kw::name) {
                let key = key::<kw::name>(input)?;
                let value = value(input, "name", NAME, errors)?;
                set(&mut self.name, key, "name", value, errors);
            } else if lookahead.peek(kw::ttl) {
                let key = key::<kw::ttl>(input)?;
                let value = value(input, "ttl", &duration("ttl = \"90s\""), errors)?;
                set(&mut self.ttl, key, "ttl", value, errors);
            } else if lookahead.peek(kw::lease) {
                let key = key::<kw::lease>(input)?;
                let value = input.parse::<Expr>()?;
                set(&mut self.lease, key, "lease", Some(value), errors);
            } else if lookahead.peek(kw::token) {
                let key = key::<kw::token>(input)?;
                let value = ident(
                    input,
                    "token",
                    "the body's name for the `CancellationToken`, e.g. `token = cancel`",
                    errors,
                )?;
                set(&mut self.token, key, "token", value, errors);
            } else if lookahead.peek(kw::fence) {
                let key = key::<kw::fence>(input)?;
                let value = ident(
                    input,
                    "fence",
                    "the body's name for the fencing token, e.g. `fence = fence`",
                    errors,
                )?;
                set(&mut self.fence, key, "fence", value, errors);
            } else if lookahead.peek(kw::min_hold) {
                let key = key::<kw::min_hold>(input)?;
                let value = value(input, "min_hold", &duration("min_hold = \"30s\""), errors)?;
                set(&mut self.min_hold, key, "min_hold", value, errors);
            } else if lookahead.peek(kw::max_hold) {
                let key = key::<kw::max_hold>(input)?;
                let value = value(input, "max_hold", &duration("max_hold = \"10m\""), errors)?;
                set(&mut self.max_hold, key, "max_hold", value, errors);
            } else if lookahead.peek(kw::grace) {
                let key = key::<kw::grace>(input)?;
                let value = value(input, "grace", &duration("grace = \"20s\""), errors)?;
                set(&mut self.grace, key, "grace", value, errors);
            } else if lookahead.peek(kw::wait) {
                let key = key::<kw::wait>(input)?;
                let value = value(input, "wait", &duration("wait = \"5s\""), errors)?;
                set(&mut self.wait, key, "wait", value, errors);
            } else if lookahead.peek(kw::once_per) {
                let key = key::<kw::once_per>(input)?;
                let value = value(input, "once_per", &duration("once_per = \"1h\""), errors)?;
                set(&mut self.once_per, key, "once_per", value, errors);
            } else if lookahead.peek(kw::retry_failed) {
                let key = key::<kw::retry_failed>(input)?;
                let value = boolean(input, "retry_failed", "retry_failed = true", errors)?;
                let value = value.map(|value| (value, key));
                set(&mut self.retry_failed, key, "retry_failed", value, errors);
            } else if lookahead.peek(kw::on_error) {
                let key = key::<kw::on_error>(input)?;
                let value = string(input, "on_error", "on_error = \"return\"", errors)?;
                set(&mut self.on_error, key, "on_error", value, errors);
            } else if lookahead.peek(Token![crate]) {
                let key = key::<Token![crate]>(input)?;
                let value = path(input, errors)?;
                set(&mut self.krate, key, "crate", value, errors);
            } else if input.peek(Ident::peek_any) {
                let unknown = input.call(Ident::parse_any)?;
                push(
                    errors,
                    syn::Error::new(
                        unknown.span(),
                        format!("unknown argument `{unknown}`; expected one of {KEYS}"),
                    ),
                );
                // Skip its value, to go on with the next argument.
                if input.peek(Token![=]) {
                    input.parse::<Token![=]>()?;
                    input.parse::<Expr>()?;
                }
            } else {
                return Err(lookahead.error());
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(())
    }
}

/// Record a wrong argument.
fn push(errors: &mut Option<syn::Error>, error: syn::Error) {
    match errors {
        Some(all) => all.combine(error),
        None => *errors = Some(error),
    }
}

/// `key =`; returns the key's span.
fn key<K: Parse + Spanned>(input: ParseStream<'_>) -> syn::Result<Span> {
    let key: K = input.parse()?;
    input.parse::<Token![=]>()?;
    Ok(key.span())
}

/// Store `value`, unless `key` was given already. `None` is a value that was
/// wrong, and recorded already.
fn set<T>(
    slot: &mut Option<T>,
    key: Span,
    name: &str,
    value: Option<T>,
    errors: &mut Option<syn::Error>,
) {
    if slot.is_some() {
        push(
            errors,
            syn::Error::new(
                key,
                format!("duplicate `{name}` argument; remove one of them"),
            ),
        );
    } else {
        *slot = value;
    }
}

/// What `name` accepts.
const NAME: &str = "a string: a literal such as `name = \"nightly-report\"`, \
                    or an expression that gives one, such as `name = format!(\"report-{tenant}\")`";

/// What a duration argument accepts.
fn duration(example: &str) -> String {
    format!(
        "a duration: a string literal such as `{example}`, \
         or a `std::time::Duration` expression"
    )
}

/// A string literal, or an expression that is not a literal of another kind
/// (`name = 42`, `ttl = 90` are recorded on the value as written, and give
/// `None`).
fn value(
    input: ParseStream<'_>,
    key: &str,
    what: &str,
    errors: &mut Option<syn::Error>,
) -> syn::Result<Option<Value>> {
    match input.parse::<Expr>()? {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(lit),
            attrs,
        }) if attrs.is_empty() => Ok(Some(Value::Lit(lit))),
        Expr::Lit(other) => {
            push(
                errors,
                syn::Error::new_spanned(other, format!("`{key}` must be {what}")),
            );
            Ok(None)
        }
        expr => Ok(Some(Value::Expr(expr))),
    }
}

/// A string literal; anything else is recorded on the value as written, and
/// gives `None`.
fn string(
    input: ParseStream<'_>,
    key: &str,
    example: &str,
    errors: &mut Option<syn::Error>,
) -> syn::Result<Option<LitStr>> {
    if input.peek(LitStr) {
        return input.parse().map(Some);
    }
    let value: Expr = input.parse()?;
    push(
        errors,
        syn::Error::new_spanned(
            value,
            format!("`{key}` must be a string literal, e.g. `{example}`"),
        ),
    );
    Ok(None)
}

/// A bool literal; anything else is recorded on the value as written, and
/// gives `None`.
fn boolean(
    input: ParseStream<'_>,
    key: &str,
    example: &str,
    errors: &mut Option<syn::Error>,
) -> syn::Result<Option<LitBool>> {
    if input.peek(LitBool) {
        return input.parse().map(Some);
    }
    let value: Expr = input.parse()?;
    push(
        errors,
        syn::Error::new_spanned(
            value,
            format!("`{key}` must be `true` or `false` (a literal), e.g. `{example}`"),
        ),
    );
    Ok(None)
}

/// A plain identifier (not a keyword, not a path, not a string); anything
/// else is recorded on the value as written, and gives `None`.
fn ident(
    input: ParseStream<'_>,
    key: &str,
    what: &str,
    errors: &mut Option<syn::Error>,
) -> syn::Result<Option<Ident>> {
    let fork = input.fork();
    if let Ok(ident) = fork.parse::<Ident>()
        && (fork.is_empty() || fork.peek(Token![,]))
    {
        input.parse::<Ident>()?;
        return Ok(Some(ident));
    }
    let value: Expr = input.parse()?;
    push(
        errors,
        syn::Error::new_spanned(value, format!("`{key}` must be an identifier: {what}")),
    );
    Ok(None)
}

/// `crate = "path::to::leasehold"`.
fn path(input: ParseStream<'_>, errors: &mut Option<syn::Error>) -> syn::Result<Option<Path>> {
    let Some(lit) = string(input, "crate", "crate = \"my_lib::leasehold\"", errors)? else {
        return Ok(None);
    };
    match lit.parse::<Path>() {
        Ok(path) => Ok(Some(path)),
        Err(_) => {
            push(
                errors,
                syn::Error::new(
                    lit.span(),
                    format!(
                        "`crate` must be the path of the `leasehold` crate, e.g. `crate = \"my_lib::leasehold\"`, not {:?}",
                        lit.value()
                    ),
                ),
            );
            Ok(None)
        }
    }
}
