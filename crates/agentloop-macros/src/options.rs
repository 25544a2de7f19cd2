//! The options of `#[tool(...)]`, on the function and on its parameters, parsed with spans so that
//! every mistake becomes a compile error that points at the offending token.

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::{Expr, LitBool, LitInt, LitStr, Path};

/// How the tool runs beside the other calls of its batch.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Parallel,
    Sequential,
}

/// A per-call timeout, as written.
pub(crate) enum Timeout {
    Secs(u64),
    Millis(u64),
}

/// The options of `#[tool(...)]` on the function.
#[derive(Default)]
pub(crate) struct FnOptions {
    /// `name = "..."`.
    pub(crate) name: Option<LitStr>,
    /// `description = "..."`.
    pub(crate) description: Option<LitStr>,
    /// `sequential`, `parallel` or `mode = "..."`, with the span of what set it.
    pub(crate) mode: Option<(Mode, Span)>,
    /// `timeout_secs = N` or `timeout_ms = N`.
    pub(crate) timeout: Option<Timeout>,
    /// `idempotent` or `idempotent = bool`.
    pub(crate) idempotent: Option<bool>,
    /// `mutating` or `mutating = bool`.
    pub(crate) mutating: Option<bool>,
    /// `poller` or `poller = bool`.
    pub(crate) poller: Option<bool>,
    /// `crate = path`: where `agentloop` lives, for crates that rename or re-export it.
    pub(crate) krate: Option<Path>,
}

/// The keys `#[tool(...)]` takes on a function, for error messages.
const FN_KEYS: &str = "name, description, sequential, parallel, mode, timeout_secs, timeout_ms, idempotent, mutating, poller, crate";

/// The keys `#[tool(...)]` takes on a parameter, for error messages.
const PARAM_KEYS: &str = "default";

impl FnOptions {
    /// Parses one `key` or `key = value` of the function's attribute.
    pub(crate) fn parse_meta(&mut self, meta: ParseNestedMeta<'_>) -> syn::Result<()> {
        let span = meta
            .path
            .get_ident()
            .map_or_else(Span::call_site, proc_macro2::Ident::span);
        let key = meta
            .path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        match key.as_str() {
            "name" => {
                let lit: LitStr = meta.value()?.parse()?;
                set_once(&mut self.name, lit, span, "name")
            }
            "description" => {
                let lit: LitStr = meta.value()?.parse()?;
                set_once(&mut self.description, lit, span, "description")
            }
            "sequential" => self.set_mode(Mode::Sequential, span),
            "parallel" => self.set_mode(Mode::Parallel, span),
            "mode" => {
                let lit: LitStr = meta.value()?.parse()?;
                let mode = match lit.value().as_str() {
                    "sequential" => Mode::Sequential,
                    "parallel" => Mode::Parallel,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "unknown mode {other:?}: expected \"parallel\" or \"sequential\""
                            ),
                        ));
                    }
                };
                self.set_mode(mode, lit.span())
            }
            "timeout_secs" | "timeout_ms" => {
                let lit: LitInt = meta.value()?.parse()?;
                let n: u64 = lit.base10_parse()?;
                if n == 0 {
                    return Err(syn::Error::new(
                        lit.span(),
                        "a timeout must be greater than zero",
                    ));
                }
                let timeout = if key == "timeout_secs" {
                    Timeout::Secs(n)
                } else {
                    Timeout::Millis(n)
                };
                set_once(
                    &mut self.timeout,
                    timeout,
                    span,
                    "timeout_secs or timeout_ms",
                )
            }
            "idempotent" => {
                let yes = flag_value(&meta)?;
                set_once(&mut self.idempotent, yes, span, "idempotent")
            }
            "mutating" => {
                let yes = flag_value(&meta)?;
                set_once(&mut self.mutating, yes, span, "mutating")
            }
            "poller" => {
                let yes = flag_value(&meta)?;
                set_once(&mut self.poller, yes, span, "poller")
            }
            "crate" => {
                let value = meta.value()?;
                let path = if value.peek(LitStr) {
                    value.parse::<LitStr>()?.parse::<Path>()?
                } else {
                    value.parse()?
                };
                set_once(&mut self.krate, path, span, "crate")
            }
            _ => Err(meta.error(format!(
                "unknown #[tool] option; expected one of: {FN_KEYS}"
            ))),
        }
    }

    fn set_mode(&mut self, mode: Mode, span: Span) -> syn::Result<()> {
        set_once(
            &mut self.mode,
            (mode, span),
            span,
            "the mode (sequential, parallel or mode = ...)",
        )
    }
}

/// The options of `#[tool(...)]` on a parameter.
#[derive(Default)]
pub(crate) struct ParamOptions {
    /// `default` (`Default::default()`) or `default = EXPR`.
    pub(crate) default: Option<ParamDefault>,
}

/// How a missing argument gets its value.
pub(crate) enum ParamDefault {
    /// `#[tool(default)]`: the type's `Default`.
    Trait,
    /// `#[tool(default = EXPR)]`.
    Expr(Box<Expr>),
}

impl ParamOptions {
    /// Parses one `key` or `key = value` of a parameter's attribute.
    pub(crate) fn parse_meta(&mut self, meta: ParseNestedMeta<'_>) -> syn::Result<()> {
        let span = meta
            .path
            .get_ident()
            .map_or_else(Span::call_site, proc_macro2::Ident::span);
        if meta.path.is_ident("default") {
            let default = if meta.input.peek(syn::Token![=]) {
                ParamDefault::Expr(Box::new(meta.value()?.parse()?))
            } else {
                ParamDefault::Trait
            };
            return set_once(&mut self.default, default, span, "default");
        }
        Err(meta.error(format!(
            "unknown #[tool] option on a parameter; expected: {PARAM_KEYS}"
        )))
    }
}

/// `key` alone means true; `key = bool` says which.
fn flag_value(meta: &ParseNestedMeta<'_>) -> syn::Result<bool> {
    if meta.input.peek(syn::Token![=]) {
        Ok(meta.value()?.parse::<LitBool>()?.value)
    } else {
        Ok(true)
    }
}

fn set_once<T>(slot: &mut Option<T>, value: T, span: Span, what: &str) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            span,
            format!("{what} is given more than once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}
