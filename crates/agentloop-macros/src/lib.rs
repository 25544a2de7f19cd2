//! `#[tool]`: turns a plain async fn into an agentloop tool.
use proc_macro::TokenStream;

/// Turns an async fn into a tool.
#[proc_macro_attribute]
pub fn tool(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
