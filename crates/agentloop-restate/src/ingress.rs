//! A client of the Restate ingress for what the command line does from outside a worker: submit a
//! run, follow its news, wait for its outcome, answer its approvals. Workers use it too, to
//! publish a run's news (outside the journal: news is for watching, not for replaying).

use std::time::Duration;

use agentloop::permissions::{Answer, ApprovalRequest};
use reqwest::Url;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RestateError;
use crate::{RUNS_SERVICE, SESSION_SERVICE};

/// A run to start: which agent, on what input (what the ingress submits and the service runs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRequest {
    /// The agent's name.
    pub agent: String,
    /// The input text.
    pub input: String,
}

/// A call a run waits on, and the awakeable that answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingApproval {
    /// What the gate asked about.
    pub request: ApprovalRequest,
    /// The id of the awakeable the run waits on for this call.
    pub awakeable: String,
}

/// What resolves the awakeable of a call a run waits on: an approval's answer, or the reply to
/// the model's question (`ask_user`). An approval's awakeable takes the bare answer
/// (`"allow_once"`), as it always has; a question's takes `{"reply": VALUE}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Resolution {
    /// The reply to a question, checked against its schema before it was sent.
    Reply {
        /// The answer, as JSON.
        reply: Value,
    },
    /// An approval's answer.
    Answer(Answer),
}

/// What a worker publishes about a run: events in order, and the approvals it waits on now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NewsBatch {
    /// Events, as JSON ([`agentloop::Event`]).
    #[serde(default)]
    pub events: Vec<Value>,
    /// The approvals the run waits on now (replacing what was published before), when they
    /// changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<Vec<PendingApproval>>,
}

/// A run's news since a point.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct News {
    /// The events since the point asked for.
    pub events: Vec<Value>,
    /// Where the next read starts.
    pub next: u64,
    /// The approvals the run waits on.
    pub approvals: Vec<PendingApproval>,
}

/// A submitted run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submitted {
    /// The invocation's id: the run's id for `attach` and `approve`.
    #[serde(rename = "invocationId")]
    pub id: String,
    /// `Accepted`, or `PreviouslyAccepted` when the idempotency key was used before (no second
    /// run started).
    #[serde(default)]
    pub status: String,
}

/// The Restate ingress.
#[derive(Debug, Clone)]
pub struct Ingress {
    base: Url,
    http: reqwest::Client,
}

/// How often a submit is tried when the ingress cannot be reached (the idempotency key makes a
/// repeat harmless).
const SUBMIT_ATTEMPTS: u32 = 5;

impl Ingress {
    /// The ingress at `url` (`http://127.0.0.1:8080`).
    pub fn new(url: &str) -> Result<Self, RestateError> {
        let base = Url::parse(url).map_err(|e| RestateError::Ingress {
            url: shown(url),
            message: format!("not a URL: {e}"),
        })?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            return Err(RestateError::Ingress {
                url: shown(url),
                message: "not an http(s) URL".into(),
            });
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| RestateError::Ingress {
                url: shown(url),
                message: e.without_url().to_string(),
            })?;
        Ok(Ingress { base, http })
    }

    /// The ingress's URL.
    pub fn url(&self) -> &str {
        self.base.as_str()
    }

    fn at(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty();
            for s in segments {
                path.push(s);
            }
        }
        url
    }

    /// An ingress error; the ingress's answer may quote the request, so its URL's credentials
    /// are taken out of the message as well.
    fn failed(&self, message: impl std::fmt::Display) -> RestateError {
        let secrets = agentloop::url_secrets::secrets(self.base.as_str());
        RestateError::Ingress {
            url: shown(self.base.as_str()),
            message: agentloop::url_secrets::scrub(&message.to_string(), &secrets),
        }
    }

    /// A request that went wrong; reqwest's own text names the URL, credentials and all.
    fn unsent(&self, e: reqwest::Error) -> RestateError {
        self.failed(e.without_url())
    }

    async fn answer(&self, response: reqwest::Response) -> Result<bytes_of::Body, RestateError> {
        let status = response.status();
        let body = response.bytes().await.map_err(|e| self.unsent(e))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            return Err(self.failed(format!("{status}: {}", text.trim())));
        }
        Ok(bytes_of::Body(body.to_vec()))
    }

    /// Starts a run of `request` on the conversation `session`, once per `idempotency_key`: a
    /// repeat with the same key starts nothing and answers the first run's id.
    pub async fn submit(
        &self,
        session: &str,
        request: &RunRequest,
        idempotency_key: &str,
    ) -> Result<Submitted, RestateError> {
        let url = self.at(&[SESSION_SERVICE, session, "run", "send"]);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let sent = self
                .http
                .post(url.clone())
                .header("idempotency-key", idempotency_key)
                .json(request)
                .send()
                .await;
            match sent {
                Ok(response) => {
                    let body = self.answer(response).await?;
                    return body.json();
                }
                // Not reached at all: try again with the same key.
                Err(e) if attempt < SUBMIT_ATTEMPTS && (e.is_connect() || e.is_timeout()) => {
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                }
                Err(e) => return Err(self.unsent(e)),
            }
        }
    }

    /// Waits for a run to end and answers its output (what its worker reported).
    pub async fn attach(&self, id: &str) -> Result<Value, RestateError> {
        let url = self.at(&["restate", "invocation", id, "attach"]);
        let response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| self.unsent(e))?;
        self.answer(response).await?.json()
    }

    /// A run's news from `from` on.
    pub async fn news(&self, run: &str, from: u64) -> Result<News, RestateError> {
        let url = self.at(&[RUNS_SERVICE, run, "read"]);
        let response = self
            .http
            .post(url)
            .json(&from)
            .send()
            .await
            .map_err(|e| self.unsent(e))?;
        self.answer(response).await?.json()
    }

    /// Adds to a run's news, in order (the call returns once it is recorded).
    pub async fn publish(&self, run: &str, batch: &NewsBatch) -> Result<(), RestateError> {
        let url = self.at(&[RUNS_SERVICE, run, "publish"]);
        let response = self
            .http
            .post(url)
            .json(batch)
            .send()
            .await
            .map_err(|e| self.unsent(e))?;
        self.answer(response).await.map(drop)
    }

    /// The call `call` run `run` waits on now.
    async fn pending(&self, run: &str, call: &str) -> Result<PendingApproval, RestateError> {
        let news = self.news(run, u64::MAX).await?;
        news.approvals
            .into_iter()
            .find(|p| p.request.call_id == call)
            .ok_or_else(|| RestateError::NoSuchCall {
                run: run.to_owned(),
                call: call.to_owned(),
            })
    }

    async fn resolve(&self, awakeable: &str, with: &Resolution) -> Result<(), RestateError> {
        let url = self.at(&["restate", "awakeables", awakeable, "resolve"]);
        let response = self
            .http
            .post(url)
            .json(with)
            .send()
            .await
            .map_err(|e| self.unsent(e))?;
        self.answer(response).await.map(drop)
    }

    /// Answers the approval run `run` waits on for call `call` (a question is answered with
    /// [`Ingress::reply`]).
    pub async fn approve(&self, run: &str, call: &str, answer: Answer) -> Result<(), RestateError> {
        let pending = self.pending(run, call).await?;
        if pending.request.question.is_some() {
            return Err(RestateError::Question {
                run: run.to_owned(),
                call: call.to_owned(),
            });
        }
        self.resolve(&pending.awakeable, &Resolution::Answer(answer))
            .await
    }

    /// Answers the question run `run` waits on in call `call` with `reply`, once it matches the
    /// question's schema: a reply that does not is refused here and resolves nothing.
    pub async fn reply(&self, run: &str, call: &str, reply: &Value) -> Result<(), RestateError> {
        let pending = self.pending(run, call).await?;
        let Some(question) = &pending.request.question else {
            return Err(RestateError::NotAQuestion {
                run: run.to_owned(),
                call: call.to_owned(),
            });
        };
        agentloop::ask::check_answer(question, reply)?;
        let with = Resolution::Reply {
            reply: reply.clone(),
        };
        self.resolve(&pending.awakeable, &with).await
    }
}

/// A URL as errors and logs show it: its user info and every query value redacted, as the
/// core shows every configured URL ([`agentloop::url_secrets::shown`]): an ingress behind a
/// gateway may take its key in the query (`?token=...`) as well as in the user info.
pub fn shown(url: &str) -> String {
    match Url::parse(url) {
        Ok(u) => agentloop::url_secrets::shown(u.as_str()),
        // Not a URL at all: whatever it says, nothing of it is shown.
        Err(_) => "(not a URL)".into(),
    }
}

mod bytes_of {
    use crate::error::RestateError;

    /// A response body.
    pub(crate) struct Body(pub Vec<u8>);

    impl Body {
        pub(crate) fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, RestateError> {
            serde_json::from_slice(&self.0).map_err(|e| RestateError::Response {
                message: format!("{e}: {}", String::from_utf8_lossy(&self.0)),
            })
        }
    }
}
