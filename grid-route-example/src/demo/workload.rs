//! The demo's workload: what the simulated users ask, generated deterministically so that
//! both runs replay exactly the same requests.
//!
//! Three kinds of session, each a sequence of turns sent in order:
//!
//! - **Chat conversations** (`POST /v1/chat/completions`, streamed). Two in three open
//!   with one of a few long *shared* system prompts (several conversations use each, as
//!   an app's users share its prompt); the others with a shorter *private* one. Each turn
//!   resends the whole history, so turn k's prompt extends turn k-1's: the prefix an
//!   engine that served the previous turn already holds.
//! - **Responses chains** (`POST /v1/responses`): a first request with private
//!   `instructions`, then follow-ups naming the previous answer's (gateway-tagged) id in
//!   `previous_response_id`: pinned to the cluster that stored it.
//! - **A Conversation** (`POST /v1/conversations`, then responses with `conversation`):
//!   pinned to the cluster that created it.

use std::fmt::Write as _;
use std::sync::Arc;

/// The workload's size and prompt lengths.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// Chat conversations.
    pub(crate) conversations: usize,
    /// Turns of each session (chat, chain and conversation alike).
    pub(crate) turns: usize,
    /// Responses chains.
    pub(crate) chains: usize,
    /// Stored conversations (`POST /v1/conversations`).
    pub(crate) stored_conversations: usize,
    /// Distinct shared system prompts.
    pub(crate) shared_prompts: usize,
    /// Bytes of a shared system prompt.
    pub(crate) shared_prompt_bytes: usize,
    /// Bytes of a private system prompt (and of a chain's instructions).
    pub(crate) private_prompt_bytes: usize,
    /// Bytes of a user turn.
    pub(crate) question_bytes: usize,
    /// Bytes of the private document the first turn of each chat conversation attaches.
    pub(crate) document_bytes: usize,
}

/// One simulated user's session; its turns go out in order, one after the other.
#[derive(Debug, Clone)]
pub(crate) enum Session {
    /// A streamed Chat Completions conversation.
    Chat {
        /// The system prompt (shared with other sessions or not).
        system: Arc<str>,
        /// Whether `system` is one of the shared prompts.
        shared: bool,
        /// The user turns.
        questions: Vec<String>,
    },
    /// A Responses chain through `previous_response_id`.
    ResponsesChain {
        /// The chain's `instructions`, sent with every request.
        instructions: Arc<str>,
        /// The inputs, one a request.
        inputs: Vec<String>,
    },
    /// A stored Conversation and responses in it.
    Conversation {
        /// The `instructions` sent with every response.
        instructions: Arc<str>,
        /// The inputs, one a response.
        inputs: Vec<String>,
    },
}

/// Every session of a run, in the order they start.
#[derive(Debug, Clone)]
pub(crate) struct Workload {
    pub(crate) shape: Shape,
    pub(crate) sessions: Vec<Session>,
}

impl Workload {
    /// The workload of `shape`; the same shape always gives the same text.
    pub(crate) fn generate(shape: Shape) -> Self {
        let mut text = TextSource::new(0x6772_6964_2d72_6f75);
        let shared: Vec<Arc<str>> = (0..shape.shared_prompts)
            .map(|i| Arc::from(text.system_prompt(&format!("app {i}"), shape.shared_prompt_bytes)))
            .collect();
        let mut chats = Vec::with_capacity(shape.conversations);
        let mut shared_turn = 0;
        for i in 0..shape.conversations {
            // Every third conversation has a prompt of its own; the others take the shared
            // prompts in turn.
            let private = shared.is_empty() || i % 3 == 2;
            let (system, is_shared) = if private {
                let prompt = text.system_prompt(&format!("user {i}"), shape.private_prompt_bytes);
                (Arc::from(prompt), false)
            } else {
                let prompt = Arc::clone(&shared[shared_turn % shared.len()]);
                shared_turn += 1;
                (prompt, true)
            };
            let mut questions = text.questions(shape.turns, shape.question_bytes);
            if let Some(first) = questions.first_mut()
                && shape.document_bytes > 0
            {
                let document = text.system_prompt(&format!("document {i}"), shape.document_bytes);
                *first = format!("{first}\n\nThe document:\n{document}");
            }
            chats.push(Session::Chat {
                system,
                shared: is_shared,
                questions,
            });
        }
        let mut stored = Vec::new();
        for i in 0..shape.chains {
            stored.push(Session::ResponsesChain {
                instructions: Arc::from(
                    text.system_prompt(&format!("agent {i}"), shape.private_prompt_bytes),
                ),
                inputs: text.questions(shape.turns, shape.question_bytes),
            });
        }
        for i in 0..shape.stored_conversations {
            stored.push(Session::Conversation {
                instructions: Arc::from(
                    text.system_prompt(&format!("thread {i}"), shape.private_prompt_bytes),
                ),
                inputs: text.questions(shape.turns, shape.question_bytes),
            });
        }
        // Spread the stored-state sessions through the chat ones, so they meet the same
        // queues.
        let mut sessions = Vec::with_capacity(chats.len() + stored.len());
        let every = chats.len() / (stored.len() + 1);
        let mut stored = stored.into_iter();
        for (i, chat) in chats.into_iter().enumerate() {
            if every > 0 && i > 0 && i % every == 0 {
                sessions.extend(stored.next());
            }
            sessions.push(chat);
        }
        sessions.extend(stored);
        Self { shape, sessions }
    }

    /// Requests the workload sends: one a turn, plus one `POST /v1/conversations` per
    /// stored conversation.
    pub(crate) fn requests(&self) -> usize {
        self.sessions
            .iter()
            .map(|session| match session {
                Session::Chat { questions, .. } => questions.len(),
                Session::ResponsesChain { inputs, .. } => inputs.len(),
                Session::Conversation { inputs, .. } => inputs.len() + 1,
            })
            .sum()
    }

    /// Chat conversations on a shared system prompt.
    pub(crate) fn shared_conversations(&self) -> usize {
        self.sessions
            .iter()
            .filter(|session| matches!(session, Session::Chat { shared: true, .. }))
            .count()
    }
}

/// Words the generated text is made of.
const WORDS: [&str; 64] = [
    "account",
    "billing",
    "invoice",
    "refund",
    "order",
    "shipping",
    "delivery",
    "address",
    "password",
    "login",
    "profile",
    "settings",
    "policy",
    "warranty",
    "return",
    "exchange",
    "discount",
    "coupon",
    "payment",
    "card",
    "balance",
    "statement",
    "subscription",
    "plan",
    "upgrade",
    "cancel",
    "renewal",
    "trial",
    "support",
    "ticket",
    "escalate",
    "manager",
    "customer",
    "product",
    "device",
    "battery",
    "screen",
    "update",
    "install",
    "error",
    "network",
    "router",
    "signal",
    "backup",
    "restore",
    "storage",
    "photo",
    "contact",
    "schedule",
    "meeting",
    "calendar",
    "reminder",
    "travel",
    "booking",
    "flight",
    "hotel",
    "seat",
    "baggage",
    "delay",
    "voucher",
    "loyalty",
    "points",
    "tier",
    "status",
];

const OPENERS: [&str; 8] = [
    "How do I",
    "Why can I not",
    "Can you help me",
    "What happens if I",
    "Is it possible to",
    "Please explain how to",
    "I tried to",
    "When should I",
];

/// Deterministic text from a seeded generator: varied enough that distinct prompts never
/// share a cache block by accident, and the same on every run.
struct TextSource {
    draws: fastrand::Rng,
}

impl TextSource {
    fn new(seed: u64) -> Self {
        Self {
            draws: fastrand::Rng::with_seed(seed),
        }
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.draws.usize(..from.len())]
    }

    /// Appends a sentence of `words` words.
    fn sentence(&mut self, out: &mut String, words: usize) {
        for i in 0..words {
            let word = self.pick(&WORDS);
            if i == 0 {
                let mut chars = word.chars();
                if let Some(first) = chars.next() {
                    out.extend(first.to_uppercase());
                    out.push_str(chars.as_str());
                }
            } else {
                out.push(' ');
                out.push_str(word);
            }
        }
        out.push_str(". ");
    }

    /// A system prompt of about `bytes` bytes: a header naming `owner`, then numbered
    /// rules.
    fn system_prompt(&mut self, owner: &str, bytes: usize) -> String {
        let mut prompt = format!("You are the assistant of {owner}. Follow these rules. ");
        let mut rule = 1;
        while prompt.len() < bytes {
            let _ = write!(prompt, "Rule {rule}: ");
            let words = self.draws.usize(6..16);
            self.sentence(&mut prompt, words);
            rule += 1;
        }
        prompt.truncate(bytes);
        prompt
    }

    /// `count` user turns of about `bytes` bytes each.
    fn questions(&mut self, count: usize, bytes: usize) -> Vec<String> {
        (0..count)
            .map(|_| {
                let opener = self.pick(&OPENERS);
                let mut question =
                    format!("{opener} {} my {}? ", self.pick(&WORDS), self.pick(&WORDS));
                while question.len() < bytes {
                    let words = self.draws.usize(5..13);
                    self.sentence(&mut question, words);
                }
                question.truncate(bytes);
                question
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            conversations: 9,
            turns: 3,
            chains: 2,
            stored_conversations: 1,
            shared_prompts: 2,
            shared_prompt_bytes: 4000,
            private_prompt_bytes: 2000,
            question_bytes: 300,
            document_bytes: 1000,
        }
    }

    #[test]
    fn the_same_shape_gives_the_same_workload() {
        let a = Workload::generate(shape());
        let b = Workload::generate(shape());
        assert_eq!(format!("{:?}", a.sessions), format!("{:?}", b.sessions));
    }

    #[test]
    fn every_session_is_there_with_its_turns() {
        let workload = Workload::generate(shape());
        assert_eq!(workload.sessions.len(), 9 + 2 + 1);
        assert_eq!(workload.requests(), 12 * 3 + 1);
        assert_eq!(workload.shared_conversations(), 6);
        let chains = workload
            .sessions
            .iter()
            .filter(|s| matches!(s, Session::ResponsesChain { .. }))
            .count();
        assert_eq!(chains, 2);
    }

    #[test]
    fn prompts_have_the_asked_sizes_and_differ() {
        let workload = Workload::generate(shape());
        let systems: Vec<&str> = workload
            .sessions
            .iter()
            .filter_map(|s| match s {
                Session::Chat { system, .. } => Some(&**system),
                _ => None,
            })
            .collect();
        assert_eq!(systems[0].len(), 4000);
        assert_eq!(systems[2].len(), 2000);
        assert_eq!(
            systems[0], systems[3],
            "conversations 0 and 3 share prompt 0"
        );
        assert_ne!(systems[0], systems[1]);
        assert_ne!(systems[2], systems[5], "private prompts are private");
    }
}
