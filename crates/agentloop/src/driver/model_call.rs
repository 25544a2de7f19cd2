//! One model call: the request sent, its events streamed out as the run's events (deltas and
//! abandoned attempts), and the response or failure handed back as an input. Apart from the
//! loop, which only asks for it.

use std::sync::Arc;

use futures::StreamExt;
use futures::future::Either;

use crate::event::EventKind;
use crate::machine::{Input, RunMachine};
use crate::model::{Model, ModelEvent, ModelRequest, ResponseAccumulator};

use super::Driver;
use super::seams;

impl<'a> Driver<'a> {
    /// One model call. `stream` sends its deltas to the sinks (a summary call's are not the
    /// run's output). The call is made as the run's numbered call, so that a response cache
    /// knows the answer it keeps for it again when a resumed run makes it again.
    ///
    /// A plain function returning a future rather than an `async fn`: as one, it kept its
    /// arguments beside the call's future, which holds them too, and every running run's future
    /// was 32 bytes larger.
    pub(super) fn call_model<'s>(
        &'s self,
        m: &'s RunMachine,
        request: ModelRequest<'s>,
        stream: bool,
    ) -> impl Future<Output = Input> + 's {
        if !self.inner.model.keeps_answers() {
            // A model that keeps no answer needs no name for the call: no allocation for it.
            return Either::Left(self.make_model_call(m, request, stream));
        }
        let call: Arc<str> = format!("{}#{}", m.run_id(), m.model_calls_asked()).into();
        // Boxed: the call's scope kept inline made every running run's future 300 bytes larger,
        // where one allocation a model call costs nothing beside the call.
        Either::Right(Box::pin(crate::model::cache::as_call(
            call,
            self.make_model_call(m, request, stream),
        )))
    }

    async fn make_model_call(
        &self,
        m: &RunMachine,
        request: ModelRequest<'_>,
        stream: bool,
    ) -> Input {
        let observed = !self.sinks.is_empty() && stream;
        let model = &self.inner.model;
        if observed {
            self.emit(
                m,
                EventKind::ModelRequestStarted {
                    model: model.id().to_owned(),
                    provider: model.provider().to_owned(),
                    messages: request.messages.len(),
                },
            );
        }
        let mut stream = model.stream(request);
        let mut acc = ResponseAccumulator::new();
        let mut names: Vec<(u32, Arc<str>, crate::message::SmolStr)> = Vec::new();
        loop {
            if observed && self.sinks.full() {
                // The model's stream is not read while its reader lags (the call is raced with
                // the run's interrupts). Here, where no event is held: waiting with one held
                // made every running run's future larger.
                Box::pin(self.sinks.room()).await;
            }
            let Some(event) = stream.next().await else {
                break;
            };
            let event = match event {
                Ok(e) => e,
                Err(error) => return self.failed(error, &acc),
            };
            if observed {
                if let ModelEvent::Retrying(retry) = &event {
                    names.clear();
                    self.emit(m, retrying(retry, acc.streamed()));
                } else {
                    self.stream_event(m, &event, &mut names);
                }
            }
            if let Err(error) = acc.push(event) {
                return self.failed(error, &acc);
            }
        }
        // After a retry, each abandoned attempt is priced at its own model's rate (a fallback's
        // primary is not the model that answers), before finishing sums their tokens.
        let retried = acc.retried().map(|(abandoned, own)| {
            let priced = abandoned
                .iter()
                .map(|(model, usage)| self.price_quietly(model.as_deref(), usage));
            (priced.fold(Some(0.0), seams::add_cost), own)
        });
        match acc.finish_or_keep() {
            Ok(response) => {
                let (cost, failures) = match retried {
                    None => self.price(response.model.as_deref(), &response.usage),
                    Some((abandoned, own)) => {
                        let (cost, failures) = self.price(response.model.as_deref(), &own);
                        (seams::add_cost(cost, abandoned), failures)
                    }
                };
                Input::ModelResponded {
                    response,
                    cost,
                    failures,
                }
            }
            Err((error, acc)) => self.failed(error, &acc),
        }
    }

    /// A failed call, with what its attempts reported spending, each priced at the rate of the
    /// model that spent it.
    fn failed(&self, error: crate::model::ModelError, acc: &ResponseAccumulator) -> Input {
        let spent = acc.spent();
        let spent = (!spent.is_zero()).then(|| {
            let priced = acc
                .spent_by_model()
                .map(|(model, usage)| self.price_quietly(model, usage));
            Box::new(crate::machine::Spent {
                usage: spent,
                cost: priced.fold(Some(0.0), seams::add_cost),
            })
        });
        Input::ModelFailed { error, spent }
    }

    fn stream_event(
        &self,
        m: &RunMachine,
        event: &ModelEvent,
        names: &mut Vec<(u32, Arc<str>, crate::message::SmolStr)>,
    ) {
        match event {
            ModelEvent::TextDelta(t) => self.emit(m, EventKind::TextDelta { text: t.clone() }),
            ModelEvent::ReasoningDelta(t) => {
                self.emit(m, EventKind::ReasoningDelta { text: t.clone() })
            }
            ModelEvent::ToolCallStart { index, id, name } => {
                names.push((*index, Arc::clone(id), name.clone()))
            }
            ModelEvent::ToolCallDelta { index, arguments } => {
                let known = names.iter().find(|(i, _, _)| i == index);
                self.emit(
                    m,
                    EventKind::ToolCallDelta {
                        index: *index,
                        call_id: known.map(|k| k.1.to_string()).filter(|s| !s.is_empty()),
                        name: known.map(|k| k.2.to_string()),
                        arguments: arguments.clone(),
                    },
                );
            }
            _ => {}
        }
    }
}

/// The event of an abandoned attempt: what it streamed is discarded.
fn retrying(retry: &crate::model::ModelRetry, discarded: crate::model::Discarded) -> EventKind {
    EventKind::ModelRetrying {
        retry: retry.retry,
        model: retry.model.clone(),
        code: retry.error.code().to_owned(),
        message: retry.error.message.clone(),
        delay: retry.delay,
        discarded,
        usage: retry.usage,
    }
}
