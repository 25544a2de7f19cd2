//! Steering and follow-ups: a handle through which an application talks to a running agent.
//!
//! Steering messages are delivered at the next safe point (after the running batch, before the
//! next model call); follow-ups when the run would otherwise finish, continuing it. Either
//! delivers all waiting messages at once or one at a time. Neither bypasses a limit: a delivered
//! message leads to a model call that the limits still check.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::message::Message;

/// How waiting messages are delivered at a safe point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Delivery {
    /// Every waiting message at once.
    #[default]
    All,
    /// One message per safe point.
    OneAtATime,
}

#[derive(Debug, Default)]
struct Queues {
    steering: VecDeque<Message>,
    follow_ups: VecDeque<Message>,
}

/// A handle to send messages into a run. Clone it freely; pass one clone in
/// [`crate::RunOptions::steering`].
#[derive(Debug, Clone, Default)]
pub struct Steering {
    queues: Arc<Mutex<Queues>>,
    steering_delivery: Delivery,
    follow_up_delivery: Delivery,
}

impl Steering {
    /// A handle delivering all waiting messages at once.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets how steering messages are delivered.
    #[must_use]
    pub fn steering_delivery(mut self, d: Delivery) -> Self {
        self.steering_delivery = d;
        self
    }

    /// Sets how follow-ups are delivered.
    #[must_use]
    pub fn follow_up_delivery(mut self, d: Delivery) -> Self {
        self.follow_up_delivery = d;
        self
    }

    /// Queues a message for the next safe point.
    pub fn steer(&self, text: impl Into<String>) {
        self.push(Message::user(text), false);
    }

    /// Queues a message for when the run would otherwise finish.
    pub fn follow_up(&self, text: impl Into<String>) {
        self.push(Message::user(text), true);
    }

    fn push(&self, m: Message, follow_up: bool) {
        let mut q = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if follow_up {
            q.follow_ups.push_back(m);
        } else {
            q.steering.push_back(m);
        }
    }

    pub(crate) fn take_steering(&self) -> Vec<Message> {
        let mut q = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        take(&mut q.steering, self.steering_delivery)
    }

    pub(crate) fn take_follow_ups(&self) -> Vec<Message> {
        let mut q = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        take(&mut q.follow_ups, self.follow_up_delivery)
    }

    /// Messages still waiting (steering, follow-ups).
    pub fn pending(&self) -> (usize, usize) {
        let q = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        (q.steering.len(), q.follow_ups.len())
    }
}

fn take(q: &mut VecDeque<Message>, d: Delivery) -> Vec<Message> {
    match d {
        Delivery::All => q.drain(..).collect(),
        Delivery::OneAtATime => q.pop_front().into_iter().collect(),
    }
}
