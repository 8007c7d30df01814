//! What one ask of the attacker model came to (docs/attacks.md, "What the model did, and
//! what the bench failed to do"): a template, the model's own refusal, a reply our
//! checks refused with the rule it broke, or the endpoint's failure with its error —
//! and how each is recorded (`record::NotRun`). Not here: asking (`attacker`), the
//! checks themselves (`template`).

use super::template::{self, Refusal};
use pruefstand_core::record::NotRun;

/// What one ask of the attacker model came to. Only a template reaches the target; the
/// model's own refusal is its behaviour; the other two are the bench's failure to get a
/// template (retried, then a bench error: never a pair the target resisted).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    /// A template that passed our checks (`template::check`).
    Template(String),
    /// The model declined to write one: its reply, bounded for the log.
    Declined(String),
    /// A reply our checks refused: the rule it broke, and the reply bounded for the log.
    Rejected { rule: Refusal, reply: String },
    /// The endpoint gave no reply.
    Failed(EndpointFailure),
}

impl Answer {
    /// Why the attempt never reached the target (None: a template), as the log records it.
    pub(super) fn not_run(&self) -> Option<NotRun> {
        match self {
            Answer::Template(_) => None,
            Answer::Declined(reply) => Some(NotRun::Declined(reply.clone())),
            Answer::Rejected { rule, .. } => Some(NotRun::Rejected(rule.to_string())),
            Answer::Failed(failure) => Some(NotRun::Failed(failure.to_string())),
        }
    }

    /// The text an attempt records: the template, or the refused reply bounded (nothing
    /// for an endpoint that gave none).
    pub(crate) fn text(&self) -> &str {
        match self {
            Answer::Template(text) | Answer::Declined(text) | Answer::Rejected { reply: text, .. } => text,
            Answer::Failed(_) => "",
        }
    }
}

/// The attacker's endpoint and what went wrong there; shown with the URL redacted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EndpointFailure {
    /// The request's URL as shown (`SecretUrl::redacted`).
    pub(crate) url: String,
    pub(crate) error: EndpointError,
}

/// Why an attacker endpoint gave no reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EndpointError {
    /// No response: refused, reset, timed out.
    Unreachable(String),
    /// A response with a status other than success (a redirect is one: none is followed).
    Status(String),
    /// A body that was too large, broken off, or not JSON.
    Body(String),
    /// JSON with no message text where the OpenAI shape has it.
    NoText,
}

impl std::fmt::Display for EndpointFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = &self.url;
        match &self.error {
            EndpointError::Unreachable(e) | EndpointError::Body(e) => write!(f, "{url}: {e}"),
            EndpointError::Status(status) => write!(f, "{url} answered {status}"),
            EndpointError::NoText => write!(f, "{url}: a reply with no message text"),
        }
    }
}

/// What a reply comes to: its template, the model's own refusal (a reply without
/// `{goal}` in `DECLINES`' words), or the rule of our checks it broke.
pub(crate) fn of(reply: &str, goal: &str, earlier: &[&str]) -> Answer {
    match template::check(reply, goal, earlier) {
        Ok(text) => Answer::Template(text),
        Err(Refusal::NoGoal) if template::declines(reply) => Answer::Declined(template::kept(reply)),
        Err(rule) => Answer::Rejected { rule, reply: template::kept(reply) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_models_refusal_is_told_from_prose_our_checks_refuse() {
        let declined = "I\u{2019}m sorry, but I can't assist with that";
        assert_eq!(of(declined, "", &[]), Answer::Declined(declined.into()));
        assert!(!of(declined, "", &[]).not_run().unwrap().is_bench_error());
        let prose = "Here is an email that asks the assistant to send the money.";
        let rejected = of(prose, "", &[]);
        assert_eq!(rejected, Answer::Rejected { rule: Refusal::NoGoal, reply: prose.into() });
        assert_eq!(rejected.not_run(), Some(NotRun::Rejected("no {goal} in the reply".into())));
        assert!(rejected.not_run().unwrap().is_bench_error());
        // A refusal word in a reply too long to use is still our check's refusal.
        let long = format!("{declined} {{goal}}{}", "a".repeat(template::MAX_CHARS));
        assert!(matches!(of(&long, "", &[]), Answer::Rejected { rule: Refusal::TooLong(_), .. }));
        assert_eq!(of("<template>Hi {goal}</template>", "", &[]), Answer::Template("Hi {goal}".into()));
        assert_eq!(of("<template>Hi {goal}</template>", "", &[]).not_run(), None);
    }
}
