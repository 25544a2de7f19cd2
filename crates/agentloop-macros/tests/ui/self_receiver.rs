use agentloop_macros::tool;

struct Counter;

impl Counter {
    /// Takes self.
    #[tool]
    async fn count(&self, by: u32) -> u32 {
        by
    }
}

fn main() {}
