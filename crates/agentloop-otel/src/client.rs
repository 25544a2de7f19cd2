//! The OTLP/HTTP exporter's client: the workspace's own `reqwest` (rustls), so that the exporter
//! brings no second HTTP stack of its own.

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// A `reqwest` client as the exporter's [`HttpClient`].
#[derive(Debug, Clone)]
pub(crate) struct Client(pub(crate) reqwest::Client);

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let response = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body)
            .send()
            .await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await?;
        let mut out = Response::builder().status(status).body(body)?;
        *out.headers_mut() = headers;
        Ok(out)
    }
}
