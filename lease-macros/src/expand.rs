//! Code generation. The expansion only wires the fn's body to
//! `leasehold::__private::run`; every behaviour lives (and is tested) in `leasehold`.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, TokenStreamExt, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Block, Expr, Item, ItemFn, ReturnType, Stmt, Type};

use crate::attr::{Args, Value};
use crate::valid::{self, Dur, Singleton};

/// `#[singleton(args)] item`.
///
/// On error, the `compile_error!`s go next to the item as close to its
/// expansion as is known, so the rest of the crate (and rust-analyzer) sees
/// the fn and only the real errors are reported (tokio-macros expands with a
/// default config for the same reason): the fn as written, with the names
/// given by `token` and `fence` bound in its body ([`fallback`]), so that a
/// body that uses them type-checks instead of getting a "cannot find value"
/// error at each use. An item that is not a fn is emitted unchanged.
pub(crate) fn singleton(args: TokenStream, item: TokenStream) -> TokenStream {
    let item_fn = match parse_fn(item.clone()) {
        Ok(item_fn) => item_fn,
        Err(error) => return with_error(item, error),
    };
    let args = Args::parse(args);
    match valid::check(&args, &item_fn) {
        Ok(singleton) => expand(singleton, item_fn),
        Err(error) => with_error(fallback(&args, item_fn), error),
    }
}

fn with_error(mut tokens: TokenStream, error: syn::Error) -> TokenStream {
    tokens.extend(error.into_compile_error());
    tokens
}

/// The fn as written, its body starting with
///
/// ```text
/// let <token>: ::leasehold::CancellationToken = ::leasehold::CancellationToken::new();
/// let <fence>: ::core::option::Option<u64> = ::core::option::Option::None;
/// ```
///
/// for those of `token` and `fence` that were parsed (after broken syntax in
/// the arguments, a name is unknown and the body may report it missing): the
/// body type-checks as in the expansion, where they are the job closure's
/// parameters. The values are never used: the crate does not compile.
fn fallback(args: &Args, mut item: ItemFn) -> TokenStream {
    let krate = args
        .krate
        .as_ref()
        .map_or_else(|| quote!(::leasehold), ToTokens::to_token_stream);
    let mut bindings = TokenStream::new();
    if let Some(token) = &args.token {
        bindings.extend(quote! {
            #[allow(unused_variables)]
            let #token: #krate::CancellationToken = #krate::CancellationToken::new();
        });
    }
    // `token` and `fence` with the same name is an error of its own; the
    // body then sees the token, as it would after the fix.
    if let Some(fence) = args
        .fence
        .as_ref()
        .filter(|f| args.token.as_ref() != Some(*f))
    {
        bindings.extend(quote! {
            #[allow(unused_variables)]
            let #fence: ::core::option::Option<u64> = ::core::option::Option::None;
        });
    }
    if !bindings.is_empty() {
        item.block
            .stmts
            .insert(0, Stmt::Expr(Expr::Verbatim(bindings), None));
    }
    item.into_token_stream()
}

/// The annotated item, which must be a fn with a body.
fn parse_fn(item: TokenStream) -> syn::Result<ItemFn> {
    const MSG: &str = "`#[singleton]` goes on an `async fn` with a body; \
                       move it onto the fn that runs the job";
    let item: Item = syn::parse2(item)?;
    let at = match item {
        Item::Fn(item) => return Ok(item),
        Item::Struct(item) => item.struct_token.span,
        Item::Enum(item) => item.enum_token.span,
        Item::Union(item) => item.union_token.span,
        Item::Trait(item) => item.trait_token.span,
        Item::Impl(item) => item.impl_token.span,
        Item::Mod(item) => item.mod_token.span,
        Item::Const(item) => item.const_token.span,
        Item::Static(item) => item.static_token.span,
        Item::Type(item) => item.type_token.span,
        Item::Use(item) => item.use_token.span,
        other => other.span(),
    };
    Err(syn::Error::new(at, MSG))
}

/// Keep the fn's signature exactly as written; its body becomes
///
/// ```text
/// let __lease = <lease expr, or the global default>;
/// ::leasehold::__private::run(                       // `run_or_err` with `on_error = "return"`
///     __lease,
///     ::leasehold::__private::Settings {
///         name: "<name>",                        // or &AsName::as_name(&(<expr>))
///         ttl: ::core::time::Duration::from_millis(<ms>),  // or <expr>
///         min_hold: ::core::option::Option::None,          // or Some(..), as ttl
///         max_hold: ::core::option::Option::None,
///         grace: ::core::option::Option::None,
///         wait: ::core::option::Option::None,
///         once_per: ::core::option::Option::None,
///         retry_failed: false,                             // `retry_failed = true`
///     },
///     move |<token>, <fence>| async move {
///         <fake return edge>
///         <the original body, braces included>
///     },
/// )
/// .await
/// ```
///
/// The arguments are evaluated in this order, in the fn, before the closure
/// takes the body's captures (`self` among them).
///
/// except that a body that is a single expression, `{ <expr> }`, loses its
/// braces: the async block is then `async move { <fake return edge> <expr> }`,
/// in the body's braces.
fn expand(singleton: Singleton, mut item: ItemFn) -> TokenStream {
    let Singleton {
        name,
        ttl,
        min_hold,
        max_hold,
        grace,
        wait,
        once_per,
        retry_failed,
        return_errors,
        lease,
        token,
        fence,
        krate,
    } = singleton;
    // `::leasehold`, or the `crate = "..."` path, spanned where it is used so a
    // type error lands on the user's token rather than on the attribute.
    let krate_at = |span: Span| match &krate {
        Some(path) => path.to_token_stream(),
        None => quote_spanned!(span=> ::leasehold),
    };

    // Hygienic: invisible to the body, whatever it names its variables.
    let lease_var = syn::Ident::new("__lease", Span::mixed_site());
    let lease_init = match lease {
        // Spanned on the expression, so a value that is not a `Lease` is
        // reported there. Evaluated to an owned `Lease` before the closure
        // below takes `self`.
        Some(expr) => {
            let krate = krate_at(expr.span());
            quote_spanned! {expr.span()=>
                #krate::__private::AsLease::as_lease(&(#expr))
            }
        }
        None => {
            let krate = krate_at(Span::call_site());
            quote!(#krate::__private::global())
        }
    };
    let token = token.map_or_else(|| quote!(_), ToTokens::into_token_stream);
    let fence = fence.map_or_else(|| quote!(_), ToTokens::into_token_stream);
    let name = match name {
        Value::Lit(lit) => lit.into_token_stream(),
        // Spanned on the expression, so a value that is not a string is
        // reported there. Copied, so that the closure may take `self`.
        Value::Expr(expr) => {
            let krate = krate_at(expr.span());
            quote_spanned! {expr.span()=>
                &#krate::__private::AsName::as_name(&(#expr))
            }
        }
    };
    let ttl = duration(ttl);
    let [min_hold, max_hold, grace, wait, once_per] = [min_hold, max_hold, grace, wait, once_per]
        .map(|d| match d {
            Some(d) => {
                let d = duration(d);
                quote!(::core::option::Option::Some(#d))
            }
            None => quote!(::core::option::Option::None),
        });

    let (return_type, return_span) = match &item.sig.output {
        ReturnType::Type(_, ty) => (erase_impl_trait(ty), ty.span()),
        ReturnType::Default => (syn::parse_quote!(()), item.sig.ident.span()),
    };
    // As in tracing-attributes: an unreachable `return` of the declared type
    // first, so the async block's type is inferred from the signature and a
    // type error in the body is reported in the body, not in this expansion.
    let fake_return = syn::Ident::new("__fake_return", Span::mixed_site());
    let fake_return_edge = quote_spanned! {return_span=>
        #[allow(
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::let_with_type_underscore,
            clippy::needless_return,
        )]
        if false {
            let #fake_return: #return_type = loop {};
            return #fake_return;
        }
    };
    let block = &item.block;
    let job_body = if is_one_expression(block) {
        // `{ true }` kept as a block would be a lone expression in braces at
        // the end of the async block, which rustc lints on the user's code
        // (`unused_braces`, suggesting code that does not compile). So the
        // expression goes into the async block itself, whose braces are the
        // body's own.
        let mut tokens = TokenStream::new();
        block.brace_token.surround(&mut tokens, |tokens| {
            fake_return_edge.to_tokens(tokens);
            tokens.append_all(&block.stmts);
        });
        tokens
    } else {
        // Any other body keeps its block, as rustc does in an `async fn`:
        // its items stay out of the fake return edge's scope (a `use
        // std::io::Result;` in the body must not change the signature's
        // `Result` there), and clippy sees the same shape as in a plain
        // `async fn` (spliced in, a body's `for` loop then `None` got clippy's
        // `manual_find`, which the same plain `async fn` does not get).
        quote!({ #fake_return_edge #block })
    };
    let job = quote! {
        move |#token, #fence| async move #job_body
    };
    // The return type must be `Skippable`: the call is spanned on it, so that
    // is where an unsupported type is reported.
    // So is the one with `on_error = "return"`'s bound, for a return type
    // that cannot carry the error.
    let krate = krate_at(return_span);
    let run = if return_errors {
        quote_spanned!(return_span=> run_or_err)
    } else {
        quote_spanned!(return_span=> run)
    };
    let settings = {
        let krate = krate_at(Span::call_site());
        quote! {
            #krate::__private::Settings {
                name: #name,
                ttl: #ttl,
                min_hold: #min_hold,
                max_hold: #max_hold,
                grace: #grace,
                wait: #wait,
                once_per: #once_per,
                retry_failed: #retry_failed,
            }
        }
    };
    let body = quote_spanned! {return_span=>
        let #lease_var = #lease_init;
        #krate::__private::#run(#lease_var, #settings, #job).await
    };
    item.block = Box::new(Block {
        brace_token: item.block.brace_token,
        stmts: vec![Stmt::Expr(Expr::Verbatim(body), None)],
    });
    item.into_token_stream()
}

/// A `Duration`: a checked literal, spanned on it, or the expression as
/// written (a value of another type is reported on it).
fn duration(d: Dur) -> TokenStream {
    match d {
        Dur::Millis(ms, span) => quote_spanned!(span=> ::core::time::Duration::from_millis(#ms)),
        Dur::Expr(expr) => expr.into_token_stream(),
    }
}

/// Whether the body is a single expression, `{ expr }`: the braces rustc
/// lints as unnecessary when they are kept around it. A macro call without a
/// `;` counts (`{ println!("..") }` is linted too).
fn is_one_expression(block: &Block) -> bool {
    matches!(
        block.stmts.as_slice(),
        [Stmt::Expr(_, None)]
            | [Stmt::Macro(syn::StmtMacro {
                semi_token: None,
                ..
            })]
    )
}

/// `impl Trait` is not allowed in a `let`'s type: infer it instead.
fn erase_impl_trait(ty: &Type) -> Type {
    struct Erase;
    impl VisitMut for Erase {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if let Type::ImplTrait(impl_trait) = ty {
                *ty = Type::Infer(syn::TypeInfer {
                    underscore_token: syn::Token![_](impl_trait.impl_token.span),
                });
            } else {
                syn::visit_mut::visit_type_mut(self, ty);
            }
        }
    }
    let mut ty = ty.clone();
    Erase.visit_type_mut(&mut ty);
    ty
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole expansion of the documented example: one call, nothing else.
    #[test]
    fn expansion_of_the_contract_example() {
        let args = quote!(
            name = "digest",
            ttl = "2m",
            lease = self.lease,
            token = cancel,
            min_hold = "30s"
        );
        let item = quote! {
            async fn send_digest(&self) -> Result<Option<usize>, MyError> {
                while !cancel.is_cancelled() { step().await?; }
                Ok(None)
            }
        };
        let expected = quote! {
            async fn send_digest(&self) -> Result<Option<usize>, MyError> {
                let __lease = ::leasehold::__private::AsLease::as_lease(&(self.lease));
                ::leasehold::__private::run(
                    __lease,
                    ::leasehold::__private::Settings {
                        name: "digest",
                        ttl: ::core::time::Duration::from_millis(120000u64),
                        min_hold: ::core::option::Option::Some(::core::time::Duration::from_millis(30000u64)),
                        max_hold: ::core::option::Option::None,
                        grace: ::core::option::Option::None,
                        wait: ::core::option::Option::None,
                        once_per: ::core::option::Option::None,
                        retry_failed: false,
                    },
                    move |cancel, _| async move {
                        #[allow(
                            unreachable_code,
                            clippy::diverging_sub_expression,
                            clippy::empty_loop,
                            clippy::let_unit_value,
                            clippy::let_with_type_underscore,
                            clippy::needless_return,
                        )]
                        if false {
                            let __fake_return: Result<Option<usize>, MyError> = loop {};
                            return __fake_return;
                        }
                        {
                            while !cancel.is_cancelled() { step().await?; }
                            Ok(None)
                        }
                    }
                )
                .await
            }
        };
        assert_eq!(singleton(args, item).to_string(), expected.to_string());
    }

    #[test]
    fn defaults_and_crate_override() {
        let args = quote!(name = "n", ttl = "10ms", crate = "my_lib::leasehold");
        let item = quote!(
            pub async fn tick() {}
        );
        let expected = quote! {
            pub async fn tick() {
                let __lease = my_lib::leasehold::__private::global();
                my_lib::leasehold::__private::run(
                    __lease,
                    my_lib::leasehold::__private::Settings {
                        name: "n",
                        ttl: ::core::time::Duration::from_millis(10u64),
                        min_hold: ::core::option::Option::None,
                        max_hold: ::core::option::Option::None,
                        grace: ::core::option::Option::None,
                        wait: ::core::option::Option::None,
                        once_per: ::core::option::Option::None,
                        retry_failed: false,
                    },
                    move |_, _| async move {
                    #[allow(
                        unreachable_code,
                        clippy::diverging_sub_expression,
                        clippy::empty_loop,
                        clippy::let_unit_value,
                        clippy::let_with_type_underscore,
                        clippy::needless_return,
                    )]
                    if false {
                        let __fake_return: () = loop {};
                        return __fake_return;
                    }
                    {}
                })
                .await
            }
        };
        assert_eq!(singleton(args, item).to_string(), expected.to_string());
    }

    /// `{ expr }` goes into the async block as `expr`: kept, its braces get
    /// `unused_braces` on the user's code.
    #[test]
    fn one_expression_body_loses_its_braces() {
        let args = quote!(name = "n", ttl = "10ms", lease = self.lease);
        let item = quote!(
            async fn ready(&self) -> bool {
                self.ready
            }
        );
        let expected = quote! {
            async fn ready(&self) -> bool {
                let __lease = ::leasehold::__private::AsLease::as_lease(&(self.lease));
                ::leasehold::__private::run(
                    __lease,
                    ::leasehold::__private::Settings {
                        name: "n",
                        ttl: ::core::time::Duration::from_millis(10u64),
                        min_hold: ::core::option::Option::None,
                        max_hold: ::core::option::Option::None,
                        grace: ::core::option::Option::None,
                        wait: ::core::option::Option::None,
                        once_per: ::core::option::Option::None,
                        retry_failed: false,
                    },
                    move |_, _| async move {
                    #[allow(
                        unreachable_code,
                        clippy::diverging_sub_expression,
                        clippy::empty_loop,
                        clippy::let_unit_value,
                        clippy::let_with_type_underscore,
                        clippy::needless_return,
                    )]
                    if false {
                        let __fake_return: bool = loop {};
                        return __fake_return;
                    }
                    self.ready
                })
                .await
            }
        };
        assert_eq!(singleton(args, item).to_string(), expected.to_string());
    }

    /// Expressions go into the settings as written (`name` through `AsName`,
    /// copied), and `on_error = "return"` calls `run_or_err`.
    #[test]
    fn expressions_and_on_error() {
        let args = quote!(
            name = format!("report-{tenant}"),
            ttl = self.ttl,
            min_hold = MIN_HOLD,
            max_hold = "10m",
            wait = Duration::from_secs(5),
            lease = self.lease,
            on_error = "return"
        );
        let item = quote! {
            async fn report(&self, tenant: &str) -> anyhow::Result<()> {
                send(tenant).await?;
                Ok(())
            }
        };
        let expected = quote! {
            async fn report(&self, tenant: &str) -> anyhow::Result<()> {
                let __lease = ::leasehold::__private::AsLease::as_lease(&(self.lease));
                ::leasehold::__private::run_or_err(
                    __lease,
                    ::leasehold::__private::Settings {
                        name: &::leasehold::__private::AsName::as_name(&(format!("report-{tenant}"))),
                        ttl: self.ttl,
                        min_hold: ::core::option::Option::Some(MIN_HOLD),
                        max_hold: ::core::option::Option::Some(::core::time::Duration::from_millis(600000u64)),
                        grace: ::core::option::Option::None,
                        wait: ::core::option::Option::Some(Duration::from_secs(5)),
                        once_per: ::core::option::Option::None,
                        retry_failed: false,
                    },
                    move |_, _| async move {
                        #[allow(
                            unreachable_code,
                            clippy::diverging_sub_expression,
                            clippy::empty_loop,
                            clippy::let_unit_value,
                            clippy::let_with_type_underscore,
                            clippy::needless_return,
                        )]
                        if false {
                            let __fake_return: anyhow::Result<()> = loop {};
                            return __fake_return;
                        }
                        {
                            send(tenant).await?;
                            Ok(())
                        }
                    }
                )
                .await
            }
        };
        assert_eq!(singleton(args, item).to_string(), expected.to_string());

        let skip = singleton(
            quote!(name = "n", ttl = "1s", on_error = "skip"),
            quote!(
                async fn tick() {}
            ),
        )
        .to_string();
        assert!(skip.contains(":: __private :: run ("), "{skip}");
    }

    /// `once_per` goes into the settings as the other durations do, and
    /// `retry_failed = true` as `true`; `retry_failed = false` is the default.
    #[test]
    fn once_per_and_retry_failed() {
        let settings = |args: TokenStream| {
            let out = singleton(
                args,
                quote!(
                    async fn tick() {}
                ),
            )
            .to_string();
            assert!(!out.contains("compile_error"), "{out}");
            let (_, settings) = out.split_once("wait :").expect("settings");
            let (settings, _) = settings.split_once('}').expect("settings' end");
            settings.trim().to_owned()
        };
        let expected = |once_per: TokenStream, retry_failed: bool| {
            quote!(::core::option::Option::None, once_per: #once_per, retry_failed: #retry_failed,)
                .to_string()
        };
        let hour = quote!(::core::option::Option::Some(
            ::core::time::Duration::from_millis(3600000u64)
        ));
        assert_eq!(
            settings(quote!(name = "n", ttl = "1s", once_per = "1h")),
            expected(hour.clone(), false)
        );
        assert_eq!(
            settings(quote!(
                name = "n",
                ttl = "1s",
                once_per = "1h",
                retry_failed = true
            )),
            expected(hour.clone(), true)
        );
        assert_eq!(
            settings(quote!(
                name = "n",
                ttl = "1s",
                retry_failed = false,
                once_per = "1h"
            )),
            expected(hour, false)
        );
        assert_eq!(
            settings(quote!(
                name = "n",
                ttl = "1s",
                once_per = self.period,
                retry_failed = true
            )),
            expected(quote!(::core::option::Option::Some(self.period)), true)
        );
    }

    #[test]
    fn retry_failed_needs_once_per_and_a_bool() {
        let error = |args: TokenStream| {
            let out = singleton(
                args,
                quote!(
                    async fn tick() {}
                ),
            )
            .to_string();
            assert_eq!(out.matches("compile_error").count(), 1, "{out}");
            out
        };
        for value in [quote!(true), quote!(false)] {
            let out = error(quote!(name = "n", ttl = "1s", retry_failed = #value));
            assert!(out.contains("`retry_failed` needs `once_per`"), "{out}");
        }
        for value in [quote!("true"), quote!(1), quote!(yes)] {
            let out = error(quote!(name = "n", ttl = "1s", once_per = "1h", retry_failed = #value));
            assert!(
                out.contains("`retry_failed` must be `true` or `false`"),
                "{out}"
            );
        }
        let out = error(quote!(name = "n", ttl = "1s", once_per = "0s"));
        assert!(out.contains("`once_per` must not be zero"), "{out}");
    }

    #[test]
    fn only_a_lone_expression_is_one_expression() {
        let one = |block: TokenStream| -> bool {
            let block: Block = syn::parse2(block).expect("a block");
            is_one_expression(&block)
        };
        assert!(one(quote!({ true })));
        assert!(one(quote!({ Ok(()) })));
        assert!(one(quote!({ if ok { Some(1) } else { None } })));
        assert!(one(quote!({ ok!() })));
        assert!(!one(quote!({})));
        assert!(!one(quote!({
            step();
        })));
        assert!(!one(quote!({
            ok!();
        })));
        assert!(!one(quote!({
            let n = 1;
            Some(n)
        })));
        assert!(!one(quote!({
            fn helper() {}
            helper()
        })));
    }

    #[test]
    fn impl_trait_is_inferred_in_the_fake_return() {
        let ty: Type = syn::parse_quote!(Option<Box<impl Fn() -> u8>>);
        let erased = erase_impl_trait(&ty);
        assert_eq!(
            erased.to_token_stream().to_string().replace(' ', ""),
            "Option<Box<_>>"
        );
    }

    /// Without `token` or `fence`, the fallback is the item as written.
    #[test]
    fn on_error_the_item_is_kept_next_to_the_error() {
        let item = quote!(
            async fn tick() -> Option<u8> {
                Some(1)
            }
        );
        let out = singleton(quote!(name = "n"), item.clone()).to_string();
        assert!(out.starts_with(&item.to_string()), "{out}");
        assert!(out.contains("compile_error"), "{out}");
        assert!(out.contains("missing `ttl` argument"), "{out}");
    }

    /// The expansion of an error: what precedes its `compile_error!`s.
    fn fallback_of(args: TokenStream, item: TokenStream) -> String {
        let out = singleton(args, item).to_string();
        let (fallback, _errors) = out
            .split_once(":: core :: compile_error !")
            .unwrap_or_else(|| panic!("no compile_error in {out}"));
        fallback.trim_end().to_owned()
    }

    #[test]
    fn on_a_check_error_the_body_still_sees_token_and_fence() {
        let item = quote!(
            async fn send_digest(&self) -> Option<u64> {
                let _ = cancel.is_cancelled();
                fencing_token
            }
        );
        let expected = quote! {
            async fn send_digest(&self) -> Option<u64> {
                #[allow(unused_variables)]
                let cancel: ::leasehold::CancellationToken = ::leasehold::CancellationToken::new();
                #[allow(unused_variables)]
                let fencing_token: ::core::option::Option<u64> = ::core::option::Option::None;
                let _ = cancel.is_cancelled();
                fencing_token
            }
        };
        for args in [
            quote!(
                name = "n",
                ttl = "90x",
                token = cancel,
                fence = fencing_token
            ),
            quote!(ttl = "90s", token = cancel, fence = fencing_token),
            quote!(
                name = "n",
                ttl = "90s",
                min_hold = "2days",
                token = cancel,
                fence = fencing_token
            ),
            quote!(
                name = "n",
                ttl = "90s",
                wait = "5x",
                max_hold = "0s",
                on_error = "panic",
                token = cancel,
                fence = fencing_token
            ),
            quote!(token = cancel, fence = fencing_token),
        ] {
            assert_eq!(fallback_of(args, item.clone()), expected.to_string());
        }
    }

    /// A wrong argument does not stop parsing: the names after it are bound.
    #[test]
    fn on_a_wrong_argument_the_body_still_sees_token_and_fence() {
        let item = quote!(
            async fn tick() -> bool {
                !cancel.is_cancelled()
            }
        );
        let expected = quote! {
            async fn tick() -> bool {
                #[allow(unused_variables)]
                let cancel: ::leasehold::CancellationToken = ::leasehold::CancellationToken::new();
                !cancel.is_cancelled()
            }
        };
        for args in [
            quote!(name = "n", ttl = "90s", timeout = "10s", token = cancel),
            quote!(name = "n", ttl = "90s", retry, token = cancel),
            quote!(name = 42, ttl = "90s", token = cancel),
            quote!(name = "n", ttl = 90, token = cancel),
            quote!(name = "n", ttl = "90s", on_error = r#return, token = cancel),
            quote!(name = "n", ttl = "90s", ttl = "2m", token = cancel),
            quote!(name = "n", ttl = "90s", fence = "f", token = cancel),
            quote!(
                name = "n",
                ttl = "90s",
                crate = "not a path",
                token = cancel
            ),
        ] {
            assert_eq!(fallback_of(args, item.clone()), expected.to_string());
        }
    }

    #[test]
    fn every_wrong_argument_is_reported() {
        let args = quote!(timeout = "10s", name = 42, ttl = "90s", ttl = "2m");
        let out = singleton(
            args,
            quote!(
                async fn tick() {}
            ),
        )
        .to_string();
        assert_eq!(out.matches("compile_error").count(), 3, "{out}");
        assert!(out.contains("unknown argument `timeout`"), "{out}");
        assert!(
            out.contains("`name` must be a string: a literal such as"),
            "{out}"
        );
        assert!(out.contains("duplicate `ttl` argument"), "{out}");
    }

    /// Broken syntax stops parsing: the names before it are bound, those
    /// after it are unknown.
    #[test]
    fn on_broken_syntax_the_names_before_it_are_bound() {
        let item = quote!(
            async fn tick() -> bool {
                !cancel.is_cancelled()
            }
        );
        let with_cancel = quote! {
            async fn tick() -> bool {
                #[allow(unused_variables)]
                let cancel: ::leasehold::CancellationToken = ::leasehold::CancellationToken::new();
                !cancel.is_cancelled()
            }
        };
        for (args, expected) in [
            (
                quote!(name = "n", ttl = "90s", token = cancel, timeout "10s"),
                &with_cancel,
            ),
            (
                quote!(name = "n", ttl = "90s", token = cancel, fence f),
                &with_cancel,
            ),
            (
                quote!(name = "n", ttl = "90s", token = cancel, lease = ),
                &with_cancel,
            ),
            (quote!(name = "n" ttl = "90s", token = cancel), &item),
            (
                quote!(name = "n", ttl = "90s", lease = , token = cancel),
                &item,
            ),
        ] {
            assert_eq!(fallback_of(args, item.clone()), expected.to_string());
        }
    }

    #[test]
    fn the_fallback_uses_the_crate_override_and_skips_a_fence_named_like_the_token() {
        let args = quote!(
            name = "n",
            ttl = "0s",
            token = t,
            fence = t,
            crate = "my_lib::leasehold"
        );
        let item = quote!(
            async fn tick() {}
        );
        let expected = quote! {
            async fn tick() {
                #[allow(unused_variables)]
                let t: my_lib::leasehold::CancellationToken = my_lib::leasehold::CancellationToken::new();
            }
        };
        assert_eq!(fallback_of(args, item), expected.to_string());
    }
}
