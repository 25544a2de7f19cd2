//! One tool call on a server: its progress routed, its stderr captured, cancelled at the server
//! when the call is abandoned, and a message past the bound told apart from a dead connection.

use std::sync::atomic::Ordering;

use agentloop::{ToolContext, ToolError, ToolOutput};
use rmcp::Peer;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientRequest, RequestId,
    ServerResult,
};
use rmcp::service::{PeerRequestOptions, RoleClient, ServiceError};
use serde_json::Value;

use crate::config::Restart;
use crate::{McpError, tools};

use super::progress::ProgressRoute;
use super::stderr::{Capture, with_stderr};
use super::{McpServer, scrubbed, scrubbed_result};

impl McpServer {
    /// Calls a tool by the server's name for it: the result as the model reads it, a server's
    /// `isError` result as a recoverable error. Cancelling the call's token (or dropping the
    /// future, as a timeout does) sends the server `notifications/cancelled`.
    pub(crate) async fn call(
        &self,
        remote: &str,
        args: Value,
        ctx: ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let name = self.name().to_owned();
        let (peer, generation, progress) = self.peer().await.map_err(|e| {
            // The operator's diagnostic (a start's stderr, say) goes to the log; the model reads
            // what it can act on.
            tracing::warn!(target: "agentloop_mcp", server = %name, error = %e, "a call found the MCP server unavailable");
            let why = match &e {
                McpError::Down { reason, .. } => format!("it is not running: {reason}"),
                _ => "it exited and could not be started again".to_owned(),
            };
            ToolError::new(e.code(), format!("the MCP server {name} is not available: {why}"))
        })?;
        let mut params = CallToolRequestParams::new(remote.to_owned());
        params.arguments = match args {
            Value::Object(map) => Some(map),
            Value::Null => None,
            _ => {
                return Err(
                    ToolError::new("invalid_arguments", "the arguments must be an object")
                        .permanent(),
                );
            }
        };
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let capture = Capture::start(&self.inner.stderr);
        let sent = peer
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await;
        let result = match sent {
            Ok(handle) => {
                // Until the answer: progress reaches the call's events, and a call that is
                // cancelled, or dropped (its timeout), tells the server to stop.
                let _progress = ProgressRoute::new(
                    &progress,
                    handle.progress_token.clone(),
                    ctx.progress.clone(),
                );
                let mut abandon = Abandon {
                    peer: peer.clone(),
                    id: Some(handle.id.clone()),
                };
                let result = tokio::select! {
                    r = handle.await_response() => r,
                    () = ctx.cancel.cancelled() => {
                        return Err(ToolError::new("cancelled", "the call was cancelled"));
                    }
                };
                abandon.id = None;
                result
            }
            Err(e) => Err(e),
        };
        let result = match result {
            Ok(ServerResult::CallToolResult(r)) => Ok(r),
            // A result with no field at all reads as an empty one.
            Ok(ServerResult::EmptyResult(_)) => Ok(rmcp::model::CallToolResult::default()),
            // At 2026-07-28 a tool may answer that it needs its client's input (an elicitation,
            // sampling, roots) and wait for a retry holding it: this client has nobody to ask.
            Ok(ServerResult::InputRequiredResult(_)) => {
                return Err(ToolError::new(
                    "mcp.input_required",
                    format!(
                        "the tool asked agentloop for input (a form, a model's answer or roots) \
                         before it answers; agentloop gives MCP servers none, so the MCP server \
                         {name} cannot complete this call"
                    ),
                ));
            }
            Ok(_) => Err(ServiceError::UnexpectedResponse),
            Err(e) => Err(e),
        };
        let max = self.inner.config.max_output_bytes;
        // An error's text is the client's error, which names no credential of the server's
        // declaration (a gateway may echo the token it refused); bounded like a result.
        let error_text =
            |text: &str| agentloop::tool::bounded_text(scrubbed(&self.inner.config, text), max);
        match result {
            Ok(result) => match tools::output(scrubbed_result(&self.inner.config, result), max) {
                Ok(out) => Ok(with_stderr(out, capture.take())),
                Err(ToolError::Recoverable {
                    code,
                    message,
                    permanent,
                }) => Err(ToolError::Recoverable {
                    code,
                    message: error_text(&message),
                    permanent,
                }),
                Err(e) => Err(e),
            },
            Err(ServiceError::McpError(e)) => {
                Err(ToolError::new("mcp.error", error_text(&e.message)))
            }
            Err(e) if is_too_large(&e) => Err(self.too_large(false)),
            Err(e @ (ServiceError::TransportClosed | ServiceError::TransportSend(_)))
                if !self.connection_ended(&peer).await =>
            {
                // One request failed (a proxy's 502, a reset connection, a response stream cut
                // short) on a connection that lives: this call's error, which its tool's retries
                // may try again; the calls beside it go on.
                Err(ToolError::new(
                    "mcp.request",
                    format!(
                        "the request to the MCP server {name} failed: {}",
                        scrubbed(&self.inner.config, &e.to_string())
                    ),
                ))
            }
            Err(ServiceError::TransportClosed | ServiceError::TransportSend(_)) => {
                let oversized = self.inner.oversized.load(Ordering::Acquire);
                if !oversized {
                    self.report_exit("during a call");
                }
                self.forget(generation).await;
                if oversized {
                    return Err(self.too_large(true));
                }
                Err(ToolError::new(
                    "mcp.server_exited",
                    format!(
                        "the MCP server {name} exited during the call; {}",
                        self.then()
                    ),
                ))
            }
            Err(ServiceError::Timeout { timeout }) => Err(ToolError::new(
                "timeout",
                format!(
                    "the MCP server {name} did not answer within {:.1} s",
                    timeout.as_secs_f64()
                ),
            )),
            Err(e) => Err(ToolError::new(
                "mcp.request",
                scrubbed(&self.inner.config, &e.to_string()),
            )),
        }
    }

    /// What becomes of the server's tools after its connection ended, by its policy.
    fn then(&self) -> &'static str {
        match self.inner.config.restart {
            Restart::OnFailure => "it is started again on the next call",
            Restart::Never => "its tools are no longer available",
        }
    }

    /// The error of a call that met a message past the bound: the call's own over HTTP, where
    /// the answer is refused and the session lives; over stdio the connection ended with it.
    fn too_large(&self, ended: bool) -> ToolError {
        let config = &self.inner.config;
        let bound = config.max_message_bytes();
        let name = &config.name;
        tracing::warn!(target: "agentloop_mcp", server = %name, bound, ended, "the MCP server sent a message past the bound");
        let message = if ended {
            format!(
                "the MCP server {name} wrote a message of more than {bound} bytes (this call's \
                 answer, or one beside it), so its connection was closed; {}",
                self.then()
            )
        } else {
            format!("the MCP server {name} answered with more than {bound} bytes; refused")
        };
        ToolError::new("mcp.message_too_large", message)
    }
}

/// True when `e` is rmcp's refusal of an HTTP answer past the bound on a message. (An event of
/// a stream past it reaches the call as the stream's end alone, a failed request.)
fn is_too_large(e: &ServiceError) -> bool {
    type HttpError = rmcp::transport::streamable_http_client::StreamableHttpError<reqwest::Error>;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if let Some(HttpError::ResponseBodyTooLarge { .. }) = error.downcast_ref::<HttpError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// Sends `notifications/cancelled` for a request abandoned before its answer (a cancelled or
/// timed-out call), so that the server stops working on it.
struct Abandon {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        let (Some(id), Ok(runtime)) = (self.id.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let peer = self.peer.clone();
        runtime.spawn(async move {
            let reason = Some("the call was cancelled or timed out".to_owned());
            let _ = peer
                .notify_cancelled(CancelledNotificationParam::new(Some(id), reason))
                .await;
        });
    }
}
