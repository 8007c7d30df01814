//! Who writes an attacker campaign's attempts, resolved once with the run's request
//! (`run::RunRequest`, docs/attacks.md, "The attacker model"): the family grammars; the
//! simulated attacker (a simulated version whose plan names no attacker URL); or an
//! attacker model — at the plan's URL, parsed once with the plan into a `SecretUrl`,
//! with the key that `PRUEFSTAND_ATTACKER_API_KEY` held when the request was resolved;
//! or at the version's own server, whose URL and key are known once it is up. The
//! executor only connects ([`Attacker::proposer`]): it parses no URL and reads no
//! environment. Not here: the search (`super`), the endpoint's client (`attacker`).

use super::{Proposer, attacker};
use pruefstand_core::plan::{Adaptive, Proposer as PlanWord};
use pruefstand_core::settings::Secret;
use pruefstand_core::settings::url::SecretUrl;
use pruefstand_core::spec::{Backend, Version};

/// The variable holding the key of an attacker endpoint a plan names.
const KEY_VAR: &str = "PRUEFSTAND_ATTACKER_API_KEY";

/// A campaign's attacker as the request resolved it.
#[derive(Clone, Debug)]
pub(crate) enum Attacker {
    Grammar,
    /// The simulated version's attacker.
    Simulated {
        feedback: bool,
    },
    Model {
        endpoint: Endpoint,
        /// The name the attacker model is served under.
        model: String,
        feedback: bool,
    },
}

/// Where an attacker model is asked.
#[derive(Clone, Debug)]
pub(crate) enum Endpoint {
    /// The version's own server, as it comes up for the run.
    Own,
    /// The plan's URL and the key read with the request (none when the variable was
    /// unset or empty).
    Named { url: SecretUrl, key: Option<Secret> },
}

/// Which proposer a search has: the plan's word, with the simulated attacker kept
/// apart from a real model (the plan says `model` for both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Grammar,
    Simulated,
    Model,
}

impl Kind {
    /// The plan's word for it, as the search log records it (`proposer`); which model
    /// wrote the templates is the log's `attacker`.
    pub(super) fn plan_word(self) -> PlanWord {
        match self {
            Kind::Grammar => PlanWord::Grammar,
            Kind::Simulated | Kind::Model => PlanWord::Model,
        }
    }
}

impl Attacker {
    /// The plan's attacker against `version`, the key read from the environment now.
    pub(crate) fn resolve(adaptive: &Adaptive, version: &Version) -> Attacker {
        let key = std::env::var(KEY_VAR).ok().filter(|k| !k.is_empty()).map(Secret::new);
        let sim = *version.spec.model.backend.get_ref() == Backend::Sim;
        Attacker::of(adaptive, sim, &version.spec.model.served_name, key)
    }

    /// The same plan's attacker against another version (the reference's run), with
    /// the key this one was resolved with.
    pub(crate) fn for_version(&self, adaptive: &Adaptive, version: &Version) -> Attacker {
        let key = match self {
            Attacker::Model { endpoint: Endpoint::Named { key, .. }, .. } => key.clone(),
            _ => None,
        };
        let sim = *version.spec.model.backend.get_ref() == Backend::Sim;
        Attacker::of(adaptive, sim, &version.spec.model.served_name, key)
    }

    /// `sim`: the version is simulated; `served_name`: its base model's name (the
    /// attacker model's by default); `key`: the named endpoint's key.
    fn of(adaptive: &Adaptive, sim: bool, served_name: &str, key: Option<Secret>) -> Attacker {
        let settings = adaptive.settings();
        let feedback = settings.feedback;
        match (settings.proposer, settings.url) {
            (PlanWord::Grammar, _) => Attacker::Grammar,
            (PlanWord::Model, None) if sim => Attacker::Simulated { feedback },
            (PlanWord::Model, url) => Attacker::Model {
                endpoint: url.map_or(Endpoint::Own, |url| Endpoint::Named { url, key }),
                model: settings.model.unwrap_or_else(|| served_name.to_string()),
                feedback,
            },
        }
    }

    /// The proposer that asks: `own` is the version's server (its base URL and key), for
    /// an attacker at [`Endpoint::Own`]. Also the endpoint as shown in the log.
    pub(crate) fn proposer(&self, own: (&SecretUrl, Option<&str>)) -> anyhow::Result<(Proposer, Option<String>)> {
        match self {
            Attacker::Grammar => Ok((Proposer::Grammar, None)),
            Attacker::Simulated { feedback } => Ok((Proposer::Simulated { feedback: *feedback }, None)),
            Attacker::Model { endpoint, model, feedback } => {
                let (url, key) = match endpoint {
                    Endpoint::Own => (own.0.clone(), own.1.map(|k| Secret::new(k.to_string()))),
                    Endpoint::Named { url, key } => (url.clone(), key.clone()),
                };
                let shown = url.redacted();
                let client = attacker::Client::new(url, key, model.clone())?;
                Ok((Proposer::Model { client, feedback: *feedback }, Some(shown)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_core::plan::AttackerSettings;

    fn adaptive(proposer: PlanWord, url: Option<&str>) -> Adaptive {
        Adaptive {
            attempts: 1,
            families: vec!["roleplay".into()],
            pairs: vec![("banking".into(), "user_task_0".into(), "injection_task_0".into())],
            attacker: Some(AttackerSettings {
                proposer,
                url: url.map(|u| SecretUrl::parse(u).unwrap()),
                model: None,
                feedback: true,
                frozen: 1,
            }),
        }
    }

    #[test]
    fn the_kind_keeps_the_simulated_attacker_apart_and_the_log_keeps_the_plans_word() {
        let model = adaptive(PlanWord::Model, None);
        let kind =
            |a: &Attacker| a.proposer((&SecretUrl::parse("http://127.0.0.1:1/v1").unwrap(), None)).unwrap().0.kind();
        assert_eq!(kind(&Attacker::of(&model, true, "sim/m", None)), Kind::Simulated);
        assert_eq!(kind(&Attacker::of(&model, false, "m", None)), Kind::Model);
        let named = adaptive(PlanWord::Model, Some("http://127.0.0.1:9/v1"));
        assert_eq!(kind(&Attacker::of(&named, true, "sim/m", None)), Kind::Model, "a URL names a real model");
        assert_eq!(kind(&Attacker::of(&adaptive(PlanWord::Grammar, None), true, "m", None)), Kind::Grammar);
        assert_eq!(Kind::Simulated.plan_word(), PlanWord::Model);
        assert_eq!(Kind::Grammar.plan_word(), PlanWord::Grammar);
        let Attacker::Model { model, endpoint: Endpoint::Own, .. } = Attacker::of(&model, false, "base", None) else {
            panic!("the version's own server by default")
        };
        assert_eq!(model, "base", "under the version's base model's name");
    }

    /// The key travels with the request: the executor's step sends the key the request
    /// was resolved with (the variable is not set in the test's environment, so an
    /// executor reading it would send none), at the URL the plan parsed; the version's
    /// own server gets its own key.
    #[tokio::test]
    async fn the_executor_asks_with_the_url_and_key_the_request_resolved() {
        assert!(std::env::var_os(KEY_VAR).is_none(), "the test needs {KEY_VAR} unset");
        let (url, head) =
            attacker::tests::serve_once("200 OK", &attacker::tests::chat("<template>Hi {goal}</template>"));
        let named = adaptive(PlanWord::Model, Some(&url));
        let resolved = Attacker::of(&named, false, "m", Some(Secret::new("from-the-request".into())));
        let own = SecretUrl::parse("http://127.0.0.1:1/v1").unwrap();
        let (proposer, shown) = resolved.proposer((&own, Some("own-key"))).unwrap();
        assert_eq!(shown.as_deref(), Some(url.as_str()));
        let Proposer::Model { client, .. } = proposer else { panic!("a model proposer") };
        let brief = attacker::PairBrief { goal: "g", lands: "x".into(), earlier: &[], feedback: true };
        let (answer, _) = client.ask(&brief, 1).await;
        assert_eq!(answer, crate::adaptive::answer::Answer::Template("Hi {goal}".into()));
        let head = head.join().unwrap().to_lowercase();
        assert!(head.contains("authorization: bearer from-the-request"), "{head}");
        // The reference's run keeps the key read once.
        let Attacker::Model { endpoint: Endpoint::Named { key: Some(key), .. }, .. } =
            resolved.for_version(&named, &test_version())
        else {
            panic!("the named endpoint and its key")
        };
        assert_eq!(key.expose(), "from-the-request");

        let (url, head) = attacker::tests::serve_once("200 OK", &attacker::tests::chat("<template>{goal}</template>"));
        let own = SecretUrl::parse(&url).unwrap();
        let (proposer, _) =
            Attacker::of(&adaptive(PlanWord::Model, None), false, "m", None).proposer((&own, Some("own-key"))).unwrap();
        let Proposer::Model { client, .. } = proposer else { panic!("a model proposer") };
        let _ = client.ask(&brief, 1).await;
        assert!(head.join().unwrap().to_lowercase().contains("authorization: bearer own-key"));
    }

    fn test_version() -> Version {
        Version::of_agent_command("other", vec!["agent".into()], "m").unwrap()
    }
}
