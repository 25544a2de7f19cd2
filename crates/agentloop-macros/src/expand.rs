//! The expansion of `#[tool]`: reads the function's signature, checks it, and writes the original
//! function back (minus the parameter attributes only the macro understands) beside a constructor
//! `<name>_tool() -> agentloop::Tool` whose handler deserializes a hidden argument struct and calls
//! the function.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{
    Attribute, Expr, ExprLit, FnArg, Ident, Item, ItemFn, Lit, LitStr, Meta, Pat, PatType, Path,
    ReturnType, Type,
};

use crate::options::{FnOptions, Mode, ParamDefault, ParamOptions, Timeout};

/// Expands `#[tool(attr)] item`. Never panics: every problem becomes a `compile_error!` with a span.
pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let mut options = FnOptions::default();
    if let Err(e) = syn::meta::parser(|meta| options.parse_meta(meta)).parse2(attr) {
        errors.push(e);
    }
    let mut func = match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Fn(func)) => func,
        Ok(other) => {
            errors.push(syn::Error::new(
                item_span(&other),
                "#[tool] goes on a free `async fn`; use `Tool::builder` or `Tool::dynamic` for other tools",
            ));
            return errors.with(item);
        }
        Err(e) => {
            errors.push(e);
            return errors.with(item);
        }
    };
    let signature = read_signature(&mut func, &mut errors);
    if !errors.is_empty() {
        return errors.with(func.into_token_stream());
    }
    let constructor = constructor(&func, &options, &signature, &mut errors);
    if !errors.is_empty() {
        return errors.with(func.into_token_stream());
    }
    quote! {
        #func
        #constructor
    }
}

/// Errors gathered while reading the function, so that one expansion reports all of them.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(first) => first.combine(error),
            None => self.0 = Some(error),
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The errors followed by `tokens` (the user's item), so that other code that names the item
    /// does not pile up unrelated errors.
    fn with(self, tokens: TokenStream) -> TokenStream {
        let errors = self.0.map(|e| e.to_compile_error());
        quote!(#errors #tokens)
    }
}

fn item_span(item: &Item) -> Span {
    match item {
        Item::Struct(s) => s.struct_token.span,
        Item::Enum(e) => e.enum_token.span,
        Item::Impl(i) => i.impl_token.span,
        Item::Trait(t) => t.trait_token.span,
        Item::Mod(m) => m.mod_token.span,
        other => other.span(),
    }
}

/// How a `ToolContext` parameter receives the context.
#[derive(Clone, Copy)]
enum ContextKind {
    Owned,
    Ref,
    RefMut,
}

/// One parameter of the function.
enum Param {
    /// An argument the model supplies: a field of the argument struct.
    Json(Box<JsonParam>),
    /// The injected context.
    Context(ContextKind),
}

struct JsonParam {
    ident: Ident,
    ty: Type,
    docs: Vec<Attribute>,
    passthrough: Vec<Attribute>,
    default: Option<ParamDefault>,
}

/// What the macro learned from the signature.
struct Signature {
    params: Vec<Param>,
    returns_result: bool,
}

/// Reads and checks the signature, and strips from the parameters the attributes only the macro
/// understands (docs, `#[tool]`, `#[serde]`, `#[schemars]`): they move to the argument struct.
fn read_signature(func: &mut ItemFn, errors: &mut Errors) -> Signature {
    let sig = &mut func.sig;
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "#[tool] needs an `async fn`",
        ));
    }
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span,
            "#[tool] cannot be used on a `const fn`",
        ));
    }
    if let Some(unsafety) = &sig.unsafety {
        errors.push(syn::Error::new(
            unsafety.span,
            "#[tool] cannot be used on an `unsafe fn`",
        ));
    }
    if let Some(abi) = &sig.abi {
        errors.push(syn::Error::new(
            abi.extern_token.span,
            "#[tool] cannot be used on an `extern` fn",
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.push(syn::Error::new_spanned(
            &sig.generics,
            "#[tool] functions cannot be generic: the input schema is made from concrete parameter types",
        ));
    }
    if let Some(variadic) = &sig.variadic {
        errors.push(syn::Error::new(
            variadic.dots.spans[0],
            "#[tool] functions cannot be variadic",
        ));
    }
    let mut params = Vec::new();
    let mut context_seen = false;
    for input in &mut sig.inputs {
        match input {
            FnArg::Receiver(receiver) => errors.push(syn::Error::new_spanned(
                &*receiver,
                "#[tool] goes on a free function: a `self` parameter is not allowed",
            )),
            FnArg::Typed(pat_type) => {
                if let Some(param) = read_param(pat_type, &mut context_seen, errors) {
                    params.push(param);
                }
            }
        }
    }
    let returns_result = match &sig.output {
        ReturnType::Default => false,
        ReturnType::Type(_, ty) => is_result(ty),
    };
    Signature {
        params,
        returns_result,
    }
}

fn read_param(
    pat_type: &mut PatType,
    context_seen: &mut bool,
    errors: &mut Errors,
) -> Option<Param> {
    let mut docs = Vec::new();
    let mut passthrough = Vec::new();
    let mut options = ParamOptions::default();
    let mut context_attr = None;
    let mut kept = Vec::new();
    for attr in std::mem::take(&mut pat_type.attrs) {
        let path = attr.path();
        if path.is_ident("doc") {
            docs.push(attr);
        } else if path.is_ident("tool") {
            context_attr = Some(attr.to_token_stream());
            if let Err(e) = attr.parse_nested_meta(|meta| options.parse_meta(meta)) {
                errors.push(e);
            }
        } else if path.is_ident("serde") || path.is_ident("schemars") {
            passthrough.push(attr);
        } else {
            kept.push(attr);
        }
    }
    pat_type.attrs = kept;

    let ident = match &*pat_type.pat {
        Pat::Ident(pat) if pat.by_ref.is_none() && pat.subpat.is_none() => Some(pat.ident.clone()),
        other => {
            errors.push(syn::Error::new_spanned(
                other,
                "#[tool] parameters must be plain names (`city: String`): the name becomes the argument's name",
            ));
            None
        }
    };

    if let Some(kind) = context_kind(&pat_type.ty) {
        if *context_seen {
            errors.push(syn::Error::new_spanned(
                &pat_type.ty,
                "#[tool] functions take at most one `ToolContext`",
            ));
        }
        *context_seen = true;
        if let Some(tokens) =
            context_attr.or_else(|| passthrough.first().map(ToTokens::to_token_stream))
        {
            errors.push(syn::Error::new_spanned(
                tokens,
                "the `ToolContext` parameter is injected: it takes no attributes",
            ));
        }
        return Some(Param::Context(kind));
    }

    match &*pat_type.ty {
        Type::Reference(r) => errors.push(syn::Error::new_spanned(
            r,
            "#[tool] parameters are deserialized from JSON and must be owned types (`String`, not `&str`)",
        )),
        Type::ImplTrait(t) => errors.push(syn::Error::new_spanned(
            t,
            "#[tool] parameters need concrete types: the input schema is made from them",
        )),
        _ => {}
    }
    let ident = ident?;
    Some(Param::Json(Box::new(JsonParam {
        ident,
        ty: (*pat_type.ty).clone(),
        docs,
        passthrough,
        default: options.default,
    })))
}

/// `ToolContext`, `agentloop::ToolContext`, `&ToolContext`, `&mut ToolContext`.
fn context_kind(ty: &Type) -> Option<ContextKind> {
    match ty {
        Type::Group(g) => context_kind(&g.elem),
        Type::Paren(p) => context_kind(&p.elem),
        Type::Reference(r) => match context_kind(&r.elem) {
            Some(ContextKind::Owned) if r.mutability.is_some() => Some(ContextKind::RefMut),
            Some(ContextKind::Owned) => Some(ContextKind::Ref),
            _ => None,
        },
        Type::Path(p) if p.qself.is_none() => p
            .path
            .segments
            .last()
            .filter(|s| s.ident == "ToolContext" && s.arguments.is_none())
            .map(|_| ContextKind::Owned),
        _ => None,
    }
}

/// A return type whose last path segment is `Result` (`Result<T, E>`, `std::io::Result<T>`, an
/// alias named `Result`) is passed through; anything else is wrapped in `Ok`.
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Group(g) => is_result(&g.elem),
        Type::Paren(p) => is_result(&p.elem),
        Type::Path(p) if p.qself.is_none() => {
            p.path.segments.last().is_some_and(|s| s.ident == "Result")
        }
        _ => false,
    }
}

/// The description: the override, else the doc comment (each line without the one space after
/// `///`, joined with newlines, the whole trimmed).
fn description(func: &ItemFn, options: &FnOptions) -> TokenStream {
    if let Some(lit) = &options.description {
        let text = lit.value();
        let text = text.trim();
        return quote_spanned!(lit.span()=> #text);
    }
    let mut lines: Vec<&Expr> = Vec::new();
    for attr in &func.attrs {
        if let Meta::NameValue(nv) = &attr.meta
            && nv.path.is_ident("doc")
        {
            lines.push(&nv.value);
        }
    }
    let literal: Option<Vec<String>> = lines
        .iter()
        .map(|e| match e {
            Expr::Lit(ExprLit {
                lit: Lit::Str(s), ..
            }) => Some(s.value()),
            _ => None,
        })
        .collect();
    match literal {
        Some(lines) => {
            let text = lines
                .iter()
                .map(|l| doc_line(l))
                .collect::<Vec<_>>()
                .join("\n");
            let text = text.trim();
            quote!(#text)
        }
        // `#[doc = include_str!(..)]` and the like: joined by `concat!`, trimmed when the tool is
        // built.
        None => {
            let mut parts = Vec::new();
            for (i, line) in lines.iter().enumerate() {
                if i > 0 {
                    parts.push(quote!("\n"));
                }
                match line {
                    Expr::Lit(ExprLit {
                        lit: Lit::Str(s), ..
                    }) => {
                        let text = s.value();
                        let text = doc_line(&text);
                        parts.push(quote!(#text));
                    }
                    other => parts.push(other.to_token_stream()),
                }
            }
            quote!(::core::concat!(#(#parts),*).trim())
        }
    }
}

/// One line of a doc comment: without the space after `///`, nor trailing spaces.
fn doc_line(line: &str) -> &str {
    line.strip_prefix(' ').unwrap_or(line).trim_end()
}

/// The naming rule of `agentloop::tool::check_tool_name`, checked at compile time.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the tool name is empty".into());
    }
    if name.chars().count() > 128 {
        return Err("the tool name is longer than 128 characters".into());
    }
    if !name.chars().next().is_some_and(|c| c.is_ascii_alphabetic()) {
        return Err(format!("the tool name {name:?} must start with a letter"));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(format!(
            "the tool name {name:?} holds {bad:?}; only letters, digits, '_' and '-' are allowed"
        ));
    }
    Ok(())
}

/// The generated `<name>_tool()` function.
fn constructor(
    func: &ItemFn,
    options: &FnOptions,
    signature: &Signature,
    errors: &mut Errors,
) -> TokenStream {
    let fn_ident = &func.sig.ident;
    let name = tool_name(func, options, errors);
    let krate: Path = options
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(::agentloop));
    let serde_path = LitStr::new(
        &format!("{}::__private::serde", krate.to_token_stream()),
        Span::call_site(),
    );
    let schemars_path = LitStr::new(
        &format!("{}::__private::schemars", krate.to_token_stream()),
        Span::call_site(),
    );

    let args_struct = Ident::new("__AgentloopToolArgs", Span::call_site());
    let args_var = Ident::new("__agentloop_args", Span::mixed_site());
    let ctx_var = Ident::new("__agentloop_ctx", Span::mixed_site());
    let Arguments {
        fields,
        default_fns,
        bindings,
        call_args,
        ctx_mut,
    } = arguments(signature, &ctx_var);

    let call = quote!(#fn_ident(#(#call_args),*).await);
    // Spanned at the return type, so that an output or error type that does not convert points
    // there rather than at the attribute.
    let handler = match &func.sig.output {
        ReturnType::Type(_, ty) => Ident::new("handler", ty.span()),
        ReturnType::Default => Ident::new("handler", fn_ident.span()),
    };
    let body = if signature.returns_result {
        call
    } else {
        quote!(::core::result::Result::Ok::<_, #krate::ToolError>(#call))
    };

    let description = description(func, options);
    let settings = builder_settings(options, &krate);

    let vis = &func.vis;
    let ctor = Ident::new(&format!("{}_tool", fn_ident.unraw()), fn_ident.span());
    let cfgs = func.attrs.iter().filter(|a| a.path().is_ident("cfg"));
    // A raw identifier (`r#type`) cannot be an intra-doc link.
    let function = if fn_ident.to_string().starts_with("r#") {
        format!("`{fn_ident}`")
    } else {
        format!("[`{fn_ident}`]")
    };
    let doc = format!(
        "Builds the `{}` tool from {function} (generated by `#[tool]`): its spec and a handler \
         that deserializes the arguments and calls the function.",
        name.value(),
    );

    quote! {
        #(#cfgs)*
        #[doc = #doc]
        #[must_use]
        #vis fn #ctor() -> #krate::Tool {
            #[derive(#krate::__private::serde::Deserialize, #krate::__private::schemars::JsonSchema)]
            #[serde(crate = #serde_path)]
            #[schemars(crate = #schemars_path)]
            struct #args_struct {
                #(#fields,)*
            }
            #(#default_fns)*
            #krate::Tool::builder(#name)
                .description(#description)
                #settings
                .#handler(|#args_var: #args_struct, #ctx_mut #ctx_var: #krate::ToolContext| async move {
                    let #args_struct { #(#bindings),* } = #args_var;
                    #body
                })
        }
    }
}

/// The tool's name: `#[tool(name = "...")]` or the function's own, checked (a bad one is
/// reported at its span and still used, so that one expansion reports every error).
fn tool_name(func: &ItemFn, options: &FnOptions, errors: &mut Errors) -> LitStr {
    let fn_ident = &func.sig.ident;
    let (name, name_span) = match &options.name {
        Some(lit) => (lit.value(), lit.span()),
        None => (fn_ident.unraw().to_string(), fn_ident.span()),
    };
    if let Err(reason) = check_name(&name) {
        let hint = if options.name.is_none() {
            " (set one with #[tool(name = \"...\")])"
        } else {
            ""
        };
        errors.push(syn::Error::new(name_span, format!("{reason}{hint}")));
    }
    LitStr::new(&name, name_span)
}

/// What the function's parameters become in the generated code.
struct Arguments {
    /// The fields of the arguments struct, one per JSON parameter.
    fields: Vec<TokenStream>,
    /// Functions that give the parameters' `default = expr` values.
    default_fns: Vec<TokenStream>,
    /// `field: local` patterns that take the struct apart.
    bindings: Vec<TokenStream>,
    /// The function's arguments, in order: the locals and the context.
    call_args: Vec<TokenStream>,
    /// `mut` when the function takes `&mut ToolContext`.
    ctx_mut: Option<TokenStream>,
}

fn arguments(signature: &Signature, ctx_var: &Ident) -> Arguments {
    let mut out = Arguments {
        fields: Vec::new(),
        default_fns: Vec::new(),
        bindings: Vec::new(),
        call_args: Vec::new(),
        ctx_mut: None,
    };
    for (i, param) in signature.params.iter().enumerate() {
        match param {
            Param::Json(json) => {
                let JsonParam {
                    ident,
                    ty,
                    docs,
                    passthrough,
                    default,
                } = &**json;
                let default_attr = match default {
                    None => None,
                    Some(ParamDefault::Trait) => Some(quote!(#[serde(default)])),
                    Some(ParamDefault::Expr(expr)) => {
                        let default_fn = Ident::new(
                            &format!("__agentloop_default_{}", ident.unraw()),
                            ident.span(),
                        );
                        let default_path = LitStr::new(&default_fn.to_string(), ident.span());
                        out.default_fns.push(quote_spanned! {expr.span()=>
                            #[allow(non_snake_case)]
                            fn #default_fn() -> #ty {
                                #expr
                            }
                        });
                        Some(quote!(#[serde(default = #default_path)]))
                    }
                };
                out.fields.push(quote! {
                    #(#docs)*
                    #default_attr
                    #(#passthrough)*
                    #ident: #ty
                });
                let local = Ident::new(&format!("__agentloop_arg{i}"), Span::mixed_site());
                out.bindings.push(quote!(#ident: #local));
                out.call_args.push(quote!(#local));
            }
            Param::Context(ContextKind::Owned) => out.call_args.push(quote!(#ctx_var)),
            Param::Context(ContextKind::Ref) => out.call_args.push(quote!(&#ctx_var)),
            Param::Context(ContextKind::RefMut) => {
                out.ctx_mut = Some(quote!(mut));
                out.call_args.push(quote!(&mut #ctx_var));
            }
        }
    }
    out
}

/// The builder calls of the attribute's settings: mode, timeout and flags.
fn builder_settings(options: &FnOptions, krate: &Path) -> TokenStream {
    let mode = options.mode.map(|(mode, span)| match mode {
        Mode::Sequential => quote_spanned!(span=> .mode(#krate::tool::ExecutionMode::Sequential)),
        Mode::Parallel => quote_spanned!(span=> .mode(#krate::tool::ExecutionMode::Parallel)),
    });
    let timeout = options.timeout.as_ref().map(|t| match t {
        Timeout::Secs(n) => quote!(.timeout(::core::time::Duration::from_secs(#n))),
        Timeout::Millis(n) => quote!(.timeout(::core::time::Duration::from_millis(#n))),
    });
    let idempotent = options.idempotent.map(|yes| quote!(.idempotent(#yes)));
    let mutating = options.mutating.map(|yes| quote!(.mutating(#yes)));
    let poller = options.poller.map(|yes| quote!(.poller(#yes)));
    quote!(#mode #timeout #idempotent #mutating #poller)
}
