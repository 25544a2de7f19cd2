use agentloop_macros::tool;

/// Destructures its argument.
#[tool]
async fn add((a, b): (i64, i64), _: String) -> i64 {
    a + b
}

fn main() {}
