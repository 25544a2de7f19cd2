use agentloop_macros::tool;

/// A typo in the function's options.
#[tool(nmae = "x")]
async fn first(a: i64) -> i64 {
    a
}

/// A typo in a parameter's options.
#[tool]
async fn second(#[tool(defualt = 1)] a: i64) -> i64 {
    a
}

/// A bad mode.
#[tool(mode = "serial")]
async fn third(a: i64) -> i64 {
    a
}

/// A repeated option.
#[tool(sequential, mode = "parallel")]
async fn fourth(a: i64) -> i64 {
    a
}

/// A zero timeout.
#[tool(timeout_secs = 0)]
async fn fifth(a: i64) -> i64 {
    a
}

fn main() {}
