//! A server's tool as an agentloop [`Tool`], and a `tools/call` result as agentloop's result: the
//! structured content when there is one (the core checks it against the tool's `outputSchema`),
//! the content blocks as text and images otherwise, and an `isError` result as a recoverable
//! error the model reads.

use std::fmt::Write as _;
use std::sync::Arc;

use agentloop::message::{ContentPart, ToolContent};
use agentloop::{Tool, ToolError, ToolOutput};
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use serde_json::Value;

use crate::McpServer;
use crate::config::ServerConfig;

/// The agentloop tool for one listed tool of `server`.
pub(crate) fn tool(server: &McpServer, config: &ServerConfig, listed: &rmcp::model::Tool) -> Tool {
    let remote: Arc<str> = Arc::from(listed.name.as_ref());
    let description = listed
        .description
        .as_deref()
        .or(listed.title.as_deref())
        .unwrap_or_default()
        .to_owned();
    // A tool that says nothing, or whose server is not trusted, is taken as changing the world
    // and as unsafe to repeat (the protocol's default): hints are the server's claims.
    let hints = listed
        .annotations
        .clone()
        .filter(|_| config.trust_hints)
        .unwrap_or_default();
    let mut builder = Tool::builder(config.tool_name(&remote))
        .description(description)
        .timeout(config.timeout)
        .mutating(hints.read_only_hint != Some(true))
        .idempotent(hints.idempotent_hint == Some(true) || hints.read_only_hint == Some(true));
    if let Some(schema) = &listed.output_schema {
        builder = builder.output_schema(Value::Object((**schema).clone()));
    }
    let server = server.clone();
    builder.dynamic(
        Value::Object((*listed.input_schema).clone()),
        move |args, ctx| {
            let server = server.clone();
            let remote = remote.clone();
            async move { server.call(&remote, args, ctx).await }
        },
    )
}

/// A `tools/call` result as agentloop's.
pub(crate) fn output(result: CallToolResult) -> Result<ToolOutput, ToolError> {
    if result.is_error == Some(true) {
        let mut text = String::new();
        for block in &result.content {
            push_text(&mut text, block);
        }
        if text.is_empty() {
            text = "the tool reported an error and said nothing more".into();
        }
        return Err(ToolError::new("mcp.tool_error", text));
    }
    if let Some(structured) = result.structured_content {
        return Ok(ToolOutput::json(structured));
    }
    let mut parts = Vec::new();
    let mut text = String::new();
    for block in &result.content {
        match block {
            ContentBlock::Image(image) => {
                if !text.is_empty() {
                    parts.push(ContentPart::Text {
                        text: std::mem::take(&mut text),
                    });
                }
                parts.push(ContentPart::Image {
                    url: format!("data:{};base64,{}", image.mime_type, image.data),
                    media_type: Some(image.mime_type.clone()),
                });
            }
            other => push_text(&mut text, other),
        }
    }
    if parts.is_empty() {
        return Ok(ToolOutput::text(text));
    }
    if !text.is_empty() {
        parts.push(ContentPart::Text { text });
    }
    Ok(agentloop::tool::IntoToolOutput::into_tool_output(
        ToolContent::Parts(parts),
    ))
}

/// Appends a block as text: what cannot be shown as text is named, not dropped unseen.
fn push_text(out: &mut String, block: &ContentBlock) {
    if !out.is_empty() {
        out.push('\n');
    }
    match block {
        ContentBlock::Text(t) => out.push_str(&t.text),
        ContentBlock::Image(i) => {
            let _ = write!(out, "[an image, {}]", i.mime_type);
        }
        ContentBlock::Audio(a) => {
            let _ = write!(out, "[audio, {}]", a.mime_type);
        }
        ContentBlock::Resource(r) => match &r.resource {
            ResourceContents::TextResourceContents { uri, text, .. } => {
                let _ = write!(out, "[resource {uri}]\n{text}");
            }
            ResourceContents::BlobResourceContents { uri, mime_type, .. } => {
                let kind = mime_type.as_deref().unwrap_or("binary");
                let _ = write!(out, "[resource {uri}, {kind}]");
            }
            #[allow(unreachable_patterns)]
            _ => out.push_str("[a resource]"),
        },
        ContentBlock::ResourceLink(link) => {
            let _ = write!(out, "[resource link {} ({})]", link.uri, link.name);
        }
        #[allow(unreachable_patterns)]
        _ => out.push_str("[content of a kind agentloop does not read]"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    fn result(value: Value) -> CallToolResult {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn an_is_error_result_is_a_recoverable_error_with_its_text() {
        let r =
            result(json!({"content": [{"type": "text", "text": "no such file"}], "isError": true}));
        match output(r).unwrap_err() {
            ToolError::Recoverable { code, message, .. } => {
                assert_eq!(code, "mcp.tool_error");
                assert_eq!(message, "no such file");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn structured_content_is_the_output_and_text_blocks_are_joined() {
        let r = result(
            json!({"content": [{"type": "text", "text": "{}"}], "structuredContent": {"a": 1}}),
        );
        assert_eq!(
            output(r).unwrap().content,
            ToolContent::Json(json!({"a": 1}))
        );
        let r = result(
            json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        );
        assert_eq!(output(r).unwrap().content, ToolContent::Text("a\nb".into()));
    }

    #[test]
    fn images_become_image_parts_beside_the_text() {
        let r = result(json!({"content": [
            {"type": "text", "text": "look"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"}
        ]}));
        let ToolContent::Parts(parts) = output(r).unwrap().content else {
            panic!("not parts")
        };
        assert_eq!(parts.len(), 2);
        assert!(
            matches!(&parts[1], ContentPart::Image { url, .. } if url == "data:image/png;base64,AAAA")
        );
    }
}
