//! The Rust code blocks of the repository's Markdown, compiled (and, unless marked `no_run`, run)
//! by `cargo test` as doc tests. Code blocks tagged `sh`, `toml`, `text` or `json` are not Rust and
//! are skipped; an untagged block is Rust and must compile.

/// The root README.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}

/// The architecture description.
#[cfg(doctest)]
#[doc = include_str!("architecture.md")]
mod architecture {}

/// The local model's guide.
#[cfg(doctest)]
#[doc = include_str!("local-model.md")]
mod local_model {}

/// The command tools' README.
#[cfg(doctest)]
#[doc = include_str!("../crates/agentloop-tools/README.md")]
mod tools_readme {}

/// The `#[tool]` macro's README.
#[cfg(doctest)]
#[doc = include_str!("../crates/agentloop-macros/README.md")]
mod macros_readme {}

/// The sandbox's README.
#[cfg(doctest)]
#[doc = include_str!("../crates/agentloop-sandbox/README.md")]
mod sandbox_readme {}
