use agentloop_macros::tool;

/// A struct.
#[tool]
struct Weather {
    city: String,
}

fn main() {}
