//! Parsing `#[singleton(key = value, ...)]`: syntax only. Each value is kept
//! with its span; what the values mean is checked in `valid.rs`.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitStr, Path, Token};

mod kw {
    syn::custom_keyword!(name);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(token);
    syn::custom_keyword!(fence);
    syn::custom_keyword!(min_hold);
}

/// Every argument, in the order of MACRO.md.
pub(crate) const KEYS: &str = "`name`, `ttl`, `lease`, `token`, `fence`, `min_hold`, `crate`";

/// The arguments as written, each at most once.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) name: Option<LitStr>,
    pub(crate) ttl: Option<LitStr>,
    pub(crate) lease: Option<Expr>,
    pub(crate) token: Option<Ident>,
    pub(crate) fence: Option<Ident>,
    pub(crate) min_hold: Option<LitStr>,
    pub(crate) krate: Option<Path>,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            if lookahead.peek(kw::name) {
                let key = key::<kw::name>(input)?;
                let value = string(input, "name", "name = \"nightly-report\"")?;
                set(&mut args.name, key, "name", value)?;
            } else if lookahead.peek(kw::ttl) {
                let key = key::<kw::ttl>(input)?;
                let value = string(input, "ttl", "ttl = \"90s\"")?;
                set(&mut args.ttl, key, "ttl", value)?;
            } else if lookahead.peek(kw::lease) {
                let key = key::<kw::lease>(input)?;
                let value = input.parse::<Expr>()?;
                set(&mut args.lease, key, "lease", value)?;
            } else if lookahead.peek(kw::token) {
                let key = key::<kw::token>(input)?;
                let value = ident(
                    input,
                    "token",
                    "the body's name for the `CancellationToken`, e.g. `token = cancel`",
                )?;
                set(&mut args.token, key, "token", value)?;
            } else if lookahead.peek(kw::fence) {
                let key = key::<kw::fence>(input)?;
                let value = ident(
                    input,
                    "fence",
                    "the body's name for the fencing token, e.g. `fence = fence`",
                )?;
                set(&mut args.fence, key, "fence", value)?;
            } else if lookahead.peek(kw::min_hold) {
                let key = key::<kw::min_hold>(input)?;
                let value = string(input, "min_hold", "min_hold = \"30s\"")?;
                set(&mut args.min_hold, key, "min_hold", value)?;
            } else if lookahead.peek(Token![crate]) {
                let key = key::<Token![crate]>(input)?;
                let value = path(input)?;
                set(&mut args.krate, key, "crate", value)?;
            } else if input.peek(Ident::peek_any) {
                let unknown = input.call(Ident::parse_any)?;
                return Err(syn::Error::new(
                    unknown.span(),
                    format!("unknown argument `{unknown}`; expected one of {KEYS}"),
                ));
            } else {
                return Err(lookahead.error());
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// `key =`; returns the key's span.
fn key<K: Parse + Spanned>(input: ParseStream<'_>) -> syn::Result<Span> {
    let key: K = input.parse()?;
    input.parse::<Token![=]>()?;
    Ok(key.span())
}

/// Store `value`, unless `key` was given already.
fn set<T>(slot: &mut Option<T>, key: Span, name: &str, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            key,
            format!("duplicate `{name}` argument; remove one of them"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

/// A string literal; anything else is reported on the value as written.
fn string(input: ParseStream<'_>, key: &str, example: &str) -> syn::Result<LitStr> {
    if input.peek(LitStr) {
        return input.parse();
    }
    let value: Expr = input.parse()?;
    Err(syn::Error::new_spanned(
        value,
        format!("`{key}` must be a string literal, e.g. `{example}`"),
    ))
}

/// A plain identifier (not a keyword, not a path, not a string).
fn ident(input: ParseStream<'_>, key: &str, what: &str) -> syn::Result<Ident> {
    let fork = input.fork();
    if let Ok(ident) = fork.parse::<Ident>()
        && (fork.is_empty() || fork.peek(Token![,]))
    {
        input.parse::<Ident>()?;
        return Ok(ident);
    }
    let value: Expr = input.parse()?;
    Err(syn::Error::new_spanned(
        value,
        format!("`{key}` must be an identifier: {what}"),
    ))
}

/// `crate = "path::to::lease"`.
fn path(input: ParseStream<'_>) -> syn::Result<Path> {
    let lit = string(input, "crate", "crate = \"my_lib::lease\"")?;
    lit.parse::<Path>().map_err(|_| {
        syn::Error::new(
            lit.span(),
            format!("`crate` must be the path of the `lease` crate, e.g. `crate = \"my_lib::lease\"`, not {:?}", lit.value()),
        )
    })
}
