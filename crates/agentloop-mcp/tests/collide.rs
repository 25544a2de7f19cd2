#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
//! Tools whose names collide, with the project's own stdio server whose tools are named on its
//! command line (`scripts/mcp/named_server.py`): of two tools of a server that its naming gives
//! one name, the first listed is the tool; across servers, the collision is named for the run
//! (which keeps the first listed of a name).

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentloop::{Tool, ToolContext};
use agentloop_mcp::{McpServers, ServerConfig, Transport};
use serde_json::json;

/// A server named `name` listing `tools`, run in `dir`; tools keep their own names with
/// `prefix`.
fn named(name: &str, tools: &[&str], dir: &Path, prefix: Option<&str>) -> ServerConfig {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mcp/named_server.py");
    let mut command = vec![
        "python3".to_owned(),
        script.display().to_string(),
        name.to_owned(),
    ];
    command.extend(tools.iter().map(|t| (*t).to_owned()));
    let mut c = ServerConfig::stdio(name, command);
    c.timeout = Duration::from_secs(60);
    c.prefix = prefix.map(str::to_owned);
    if let Transport::Stdio { cwd, .. } = &mut c.transport {
        *cwd = Some(dir.to_path_buf());
    }
    c
}

fn dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agentloop-mcp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.canonicalize().unwrap()
}

async fn call(tool: &Tool) -> String {
    tool.call(json!({}), ToolContext::detached("c1", tool.name()))
        .await
        .unwrap()
        .content
        .to_text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collide_of_a_servers_tools_named_alike_the_first_listed_is_its_tool() {
    let dir = dir("collide-one");
    let servers =
        McpServers::connect([named("srv", &["get.user", "list", "get_user"], &dir, None)])
            .await
            .unwrap();
    let tools = servers.tools();
    let names: Vec<&str> = tools.iter().map(Tool::name).collect();
    assert_eq!(names, ["srv__get_user", "srv__list"]);
    assert_eq!(tools[0].spec().description, "srv's get.user.");
    assert_eq!(call(&tools[0]).await, "srv ran get.user");
    let collisions = servers.collisions();
    assert_eq!(collisions.len(), 1, "{collisions:?}");
    assert_eq!(
        (
            collisions[0].kept_tool.as_str(),
            collisions[0].dropped_tool.as_str()
        ),
        ("get.user", "get_user")
    );
    servers.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collide_a_later_servers_tool_of_a_taken_name_is_named_with_the_one_that_keeps_it() {
    let dir = dir("collide-two");
    let servers = McpServers::connect([
        named("trusted", &["lookup"], &dir, Some("")),
        named("other", &["lookup", "more"], &dir, Some("")),
    ])
    .await
    .unwrap();
    let collisions = servers.collisions();
    assert_eq!(collisions.len(), 1, "{collisions:?}");
    let c = &collisions[0];
    assert_eq!(
        (
            c.name.as_str(),
            c.kept_server.as_str(),
            c.dropped_server.as_str()
        ),
        ("lookup", "trusted", "other")
    );
    servers.shutdown().await;
}
