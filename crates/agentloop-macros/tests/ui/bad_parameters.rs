use agentloop_macros::tool;

struct ToolContext;

/// Borrowed, generic and twice the context.
#[tool]
async fn lookup<T>(key: &str, ctx: ToolContext, again: &ToolContext, value: T) -> String {
    let _ = (ctx, again, value);
    key.to_owned()
}

/// The context takes no options.
#[tool]
async fn other(#[tool(default)] ctx: ToolContext) {
    let _ = ctx;
}

fn main() {}
