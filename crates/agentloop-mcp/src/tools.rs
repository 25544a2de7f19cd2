//! A `tools/call` result as agentloop's result: the
//! structured content when there is one (the core checks it against the tool's `outputSchema`),
//! the content blocks as text and images otherwise, and an `isError` result as a recoverable
//! error the model reads; each within the server's `max_output_bytes`.

use agentloop::message::{ContentPart, ToolContent};
use agentloop::tool::bounded_text;
use agentloop::{ToolError, ToolOutput};
use rmcp::model::{CallToolResult, ContentBlock, ImageContent, ResourceContents};
use serde_json::Value;

/// A `tools/call` result as agentloop's, within `max` bytes (the server's `max_output_bytes`):
/// what a server answers is another program's output, kept in the run's record and journal and
/// sent to the model, so it is bounded here, before any of that.
pub(crate) fn output(result: CallToolResult, max: usize) -> Result<ToolOutput, ToolError> {
    if result.is_error == Some(true) {
        let mut text = joined_text(result.content);
        if text.is_empty() {
            text = "the tool reported an error and said nothing more".into();
        }
        return Err(ToolError::new("mcp.tool_error", bounded_text(text, max)));
    }
    if let Some(structured) = result.structured_content {
        return Ok(structured_output(structured, max));
    }
    Ok(content_output(result.content, max))
}

/// Structured content as it is, or, past the bound, the head and tail of its JSON text with a
/// note saying so: the model reads what it can of it. (For a tool that declared an output schema,
/// that text then fails the core's check, `invalid_output`, as any output that is not its JSON.)
fn structured_output(value: Value, max: usize) -> ToolOutput {
    let json = value.to_string();
    if json.len() <= max {
        return ToolOutput::json(value);
    }
    let note = format!(
        "[structured content of {} bytes of JSON, over the output bound of {max} bytes: its text, cut]\n",
        json.len()
    );
    let cut = bounded_text(json, max.saturating_sub(note.len()));
    ToolOutput::text(note + &cut)
}

/// One block of a result as the model reads it: text, or an image sent as one.
enum Piece {
    Text(String),
    Image(ImageContent),
}

/// The most bytes of base64 a result's images may take together, whatever a smaller text bound
/// says: a screenshot is usually past 64 KiB, and its cost to the model is its resolution, not its
/// bytes. 5 MiB is the largest image the providers take (Anthropic's limit for one).
pub(crate) const IMAGE_BYTES: usize = 5 * 1024 * 1024;

/// The content blocks as text and image parts: the text (every block that is not an image, joined)
/// is held to the bound; the images, in order, to [`IMAGE_BYTES`] together (or the bound, when it
/// is larger), and one past that is named instead (its type and size), so that the model knows
/// what it did not see.
fn content_output(blocks: Vec<ContentBlock>, max: usize) -> ToolOutput {
    let mut pieces = Vec::with_capacity(blocks.len());
    let mut text_len = 0;
    for block in blocks {
        match block {
            ContentBlock::Image(image) => pieces.push(Piece::Image(image)),
            other => {
                let text = block_text(other);
                text_len += text.len() + 1;
                pieces.push(Piece::Text(text));
            }
        }
    }
    let images = max.max(IMAGE_BYTES);
    let mut left = images;
    for piece in &mut pieces {
        let Piece::Image(image) = piece else { continue };
        let size = image.data.len() + image.mime_type.len();
        if size <= left {
            left -= size;
            continue;
        }
        let note = format!(
            "[an image ({}, {} bytes of base64) left out: over the bound of {images} bytes of images]",
            image.mime_type,
            image.data.len()
        );
        text_len += note.len() + 1;
        *piece = Piece::Text(note);
    }
    let kept_image = pieces.iter().any(|p| matches!(p, Piece::Image(_)));
    // Text alone, or text that the notes took past the bound: one text, its head and tail kept.
    if !kept_image || text_len > max {
        let mut text = String::new();
        for piece in pieces {
            match piece {
                Piece::Text(t) => push_line(&mut text, &t),
                Piece::Image(image) => push_line(&mut text, &image_name(&image)),
            }
        }
        return ToolOutput::text(bounded_text(text, max));
    }
    let mut parts = Vec::new();
    let mut text = String::new();
    for piece in pieces {
        match piece {
            Piece::Image(image) => {
                if !text.is_empty() {
                    parts.push(ContentPart::Text {
                        text: std::mem::take(&mut text),
                    });
                }
                parts.push(ContentPart::Image {
                    url: format!("data:{};base64,{}", image.mime_type, image.data),
                    media_type: Some(image.mime_type),
                });
            }
            Piece::Text(t) => push_line(&mut text, &t),
        }
    }
    if !text.is_empty() {
        parts.push(ContentPart::Text { text });
    }
    agentloop::tool::IntoToolOutput::into_tool_output(ToolContent::Parts(parts))
}

/// Every block as text, one a line.
fn joined_text(blocks: Vec<ContentBlock>) -> String {
    let mut text = String::new();
    for block in blocks {
        push_line(&mut text, &block_text(block));
    }
    text
}

/// Appends a block's text on a line of its own; empty leading blocks leave no blank line.
fn push_line(out: &mut String, line: &str) {
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(line);
}

/// How an image reads in a text.
fn image_name(image: &ImageContent) -> String {
    format!("[an image, {}]", image.mime_type)
}

/// A block as text: what cannot be shown as text is named, not dropped unseen.
fn block_text(block: ContentBlock) -> String {
    match block {
        ContentBlock::Text(t) => t.text,
        ContentBlock::Image(i) => image_name(&i),
        ContentBlock::Audio(a) => format!("[audio, {}]", a.mime_type),
        ContentBlock::Resource(r) => match r.resource {
            ResourceContents::TextResourceContents { uri, text, .. } => {
                format!("[resource {uri}]\n{text}")
            }
            ResourceContents::BlobResourceContents { uri, mime_type, .. } => {
                let kind = mime_type.as_deref().unwrap_or("binary");
                format!("[resource {uri}, {kind}]")
            }
            #[allow(unreachable_patterns)]
            _ => "[a resource]".to_owned(),
        },
        ContentBlock::ResourceLink(link) => {
            format!("[resource link {} ({})]", link.uri, link.name)
        }
        #[allow(unreachable_patterns)]
        _ => "[content of a kind agentloop does not read]".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    const DEFAULT: usize = crate::DEFAULT_MAX_OUTPUT_BYTES;

    fn result(value: Value) -> CallToolResult {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn an_is_error_result_is_a_recoverable_error_with_its_text() {
        let r =
            result(json!({"content": [{"type": "text", "text": "no such file"}], "isError": true}));
        match output(r, DEFAULT).unwrap_err() {
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
            output(r, DEFAULT).unwrap().content,
            ToolContent::Json(json!({"a": 1}))
        );
        let r = result(
            json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        );
        assert_eq!(
            output(r, DEFAULT).unwrap().content,
            ToolContent::Text("a\nb".into())
        );
    }

    #[test]
    fn images_become_image_parts_beside_the_text() {
        let r = result(json!({"content": [
            {"type": "text", "text": "look"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"}
        ]}));
        let ToolContent::Parts(parts) = output(r, DEFAULT).unwrap().content else {
            panic!("not parts")
        };
        assert_eq!(parts.len(), 2);
        assert!(
            matches!(&parts[1], ContentPart::Image { url, .. } if url == "data:image/png;base64,AAAA")
        );
    }

    /// A text of `len` bytes that starts with `head`, ends with `tail`, and has two-byte
    /// characters everywhere a cut could fall.
    fn long(head: &str, len: usize, tail: &str) -> String {
        let middle = "é".repeat((len - head.len() - tail.len()) / 2);
        format!("{head}{middle}{tail}")
    }

    /// The text output of `r` under the bound `max`, checked to be one text within it.
    fn text_within(r: CallToolResult, max: usize) -> String {
        let ToolContent::Text(shown) = output(r, max).unwrap().content else {
            panic!("not one text")
        };
        assert!(
            shown.len() <= max,
            "{} bytes over a bound of {max}",
            shown.len()
        );
        shown.to_string()
    }

    fn marker(total: usize) -> String {
        format!("bytes cut from the middle ({total} bytes in all) ...]")
    }

    #[test]
    fn long_text_blocks_are_joined_then_cut_to_the_bound_keeping_head_and_tail() {
        let first = long("FIRST BLOCK", 100_000, "end of first");
        let second = long("second block", 100_000, "LAST WORDS");
        let joined = format!("{first}\n{second}");
        let r = result(json!({"content": [
            {"type": "text", "text": first},
            {"type": "text", "text": second}
        ]}));
        let shown = text_within(r, DEFAULT);
        assert!(
            shown.len() > DEFAULT - 64,
            "the bound is used: {}",
            shown.len()
        );
        assert!(shown.starts_with("FIRST BLOCK"), "{}", &shown[..40]);
        assert!(shown.ends_with("LAST WORDS"));
        assert!(shown.contains(&marker(joined.len())), "no marker");

        // A server's own bound, smaller than the default.
        let r = result(json!({"content": [{"type": "text", "text": joined}]}));
        let shown = text_within(r, 1000);
        assert!(shown.starts_with("FIRST BLOCK") && shown.ends_with("LAST WORDS"));
        assert!(shown.contains(&marker(joined.len())), "{shown}");

        // Within the bound, nothing changes.
        let r = result(json!({"content": [{"type": "text", "text": "a".repeat(1000)}]}));
        assert_eq!(output(r, 1000).unwrap().content.to_text(), "a".repeat(1000));
    }

    #[test]
    fn structured_content_past_the_bound_is_its_json_text_cut_and_says_so() {
        let rows: Vec<Value> = (0..20_000)
            .map(|i| json!({"row": i, "name": "é"}))
            .collect();
        let value = json!({"first": "HEAD", "rows": rows, "zlast": "TAIL"});
        let json_len = value.to_string().len();
        assert!(json_len > DEFAULT);
        let r = result(json!({"content": [], "structuredContent": value}));
        let shown = text_within(r, DEFAULT);
        assert!(
            shown.starts_with(&format!(
                "[structured content of {json_len} bytes of JSON, over the output bound of {DEFAULT} bytes: its text, cut]\n{{\"first\":\"HEAD\""
            )),
            "{}",
            &shown[..200]
        );
        assert!(
            shown.ends_with(r#""zlast":"TAIL"}"#),
            "{}",
            &shown[shown.len() - 50..]
        );
        assert!(shown.contains(&marker(json_len)));

        // At the bound exactly, it stays structured.
        let small = json!({"a": "b"});
        let r = result(json!({"content": [], "structuredContent": small}));
        let len = small.to_string().len();
        assert_eq!(output(r, len).unwrap().content, ToolContent::Json(small));
    }

    #[test]
    fn an_image_past_the_images_bound_is_named_not_sent() {
        let big = "A".repeat(IMAGE_BYTES);
        let r = result(json!({"content": [
            {"type": "text", "text": "look"},
            {"type": "image", "data": "BBBB", "mimeType": "image/png"},
            {"type": "image", "data": big, "mimeType": "image/jpeg"}
        ]}));
        let ToolContent::Parts(parts) = output(r, DEFAULT).unwrap().content else {
            panic!("not parts")
        };
        assert_eq!(parts.len(), 3, "{parts:?}");
        assert!(
            matches!(&parts[1], ContentPart::Image { url, .. } if url == "data:image/png;base64,BBBB")
        );
        let ContentPart::Text { text } = &parts[2] else {
            panic!("{:?}", parts[2])
        };
        assert_eq!(
            text,
            &format!(
                "[an image (image/jpeg, {IMAGE_BYTES} bytes of base64) left out: over the bound of {IMAGE_BYTES} bytes of images]"
            )
        );

        // A screenshot past the text's bound is still sent: images have their own.
        let shot = "S".repeat(DEFAULT * 4);
        let r = result(json!({"content": [
            {"type": "text", "text": "the page"},
            {"type": "image", "data": shot, "mimeType": "image/png"}
        ]}));
        let ToolContent::Parts(parts) = output(r, DEFAULT).unwrap().content else {
            panic!("not parts")
        };
        assert!(matches!(&parts[1], ContentPart::Image { url, .. } if url.len() > DEFAULT * 4));
    }

    #[test]
    fn many_images_left_out_still_make_a_text_within_the_bound() {
        let image = json!({"type": "image", "data": "C".repeat(5000), "mimeType": "image/gif"});
        let r = result(json!({"content": vec![image; 2_000]}));
        let shown = text_within(r, 4096);
        assert!(
            shown.starts_with("[an image, image/gif]\n"),
            "{}",
            &shown[..100]
        );
        assert!(shown.ends_with(&format!(
            "(image/gif, 5000 bytes of base64) left out: over the bound of {IMAGE_BYTES} bytes of images]"
        )));
        assert!(shown.contains("bytes cut from the middle"));
    }

    #[test]
    fn a_long_error_result_is_cut_to_the_bound_keeping_head_and_tail() {
        let text = long(
            "Traceback (most recent call last):",
            300_000,
            "ValueError: bad input",
        );
        let r = result(json!({"content": [{"type": "text", "text": text}], "isError": true}));
        let ToolError::Recoverable { code, message, .. } = output(r, DEFAULT).unwrap_err() else {
            panic!("not recoverable")
        };
        assert_eq!(code, "mcp.tool_error");
        assert!(message.len() <= DEFAULT, "{}", message.len());
        assert!(message.starts_with("Traceback (most recent call last):"));
        assert!(message.ends_with("ValueError: bad input"));
        assert!(message.contains(&marker(text.len())));
    }
}
