use agentloop_macros::tool;

/// The override breaks the naming rule.
#[tool(name = "get weather")]
async fn get_weather(city: String) -> String {
    city
}

/// The function's name breaks it.
#[tool]
async fn _private(city: String) -> String {
    city
}

fn main() {}
