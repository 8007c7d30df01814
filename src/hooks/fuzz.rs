//! Fuzzing what the hooks read and meet: `pruefstand.toml` with its hooks (arbitrary,
//! mutated and hostile texts are accepted or refused naming the file), and webhook
//! endpoints that answer garbage, odd statuses and broken headers (delivery ends
//! without a panic). The harness: `pruefstand_core::fuzzing`.

use std::path::PathBuf;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::hooks;
use pruefstand_core::fuzzing::{Shape, any_text, check, fuzz, loaded_text, mutated, names_file, structured};
use pruefstand_core::root::{CONFIG_FILE, Root};
use pruefstand_core::settings::{HookConfig, Kind};

const CONFIG_SHAPE: Shape = &[
    ("[paths]", &[("reports", &["\"reports\""])]),
    (
        "[guard.gpu]",
        &[
            ("nvml", &["\"ignore\"", "\"block\""]),
            ("utilization_max", &["10"]),
            ("samples", &["3"]),
            ("interval_s", &["5.0"]),
        ],
    ),
    ("[guard.units]", &[("user", &["[\"training@*.service\"]"]), ("system", &["[]"])]),
    (
        "[[hooks]]",
        &[
            ("name", &["\"team\""]),
            ("kind", &["\"slack\"", "\"matrix\"", "\"ntfy\"", "\"json\""]),
            ("url", &["\"https://hooks.example/T0/SECRET\""]),
            ("url_env", &["\"PRUEFSTAND_SLACK\""]),
            ("token", &["\"tok\""]),
            ("on", &["[\"rejected\", \"failed\"]"]),
            ("timeout_s", &["10"]),
            ("retries", &["3"]),
            ("backoff_s", &["1.0"]),
        ],
    ),
    ("[[hooks]]", &[("name", &["\"log\""]), ("kind", &["\"exec\""]), ("argv", &["[\"/bin/true\", \"--x\"]"])]),
];

/// Writes `pruefstand.toml` into a fresh root, reads it as every command does and
/// checks its hooks.
fn config_property(text: &[u8]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let file = dir.path().canonicalize().expect("canonical").join(CONFIG_FILE);
    std::fs::write(&file, text).expect("writing the config");
    let shown = String::from_utf8_lossy(text);
    match Root::find(Some(dir.path().to_path_buf())).and_then(|root| hooks::validate(&root)) {
        Ok(()) => Ok(()),
        Err(err) => names_file(&err, &file, &shown),
    }
}

#[test]
fn config_parser_never_panics_on_arbitrary_text() {
    let shipped = include_str!("../../pruefstand.toml");
    let input = prop_oneof![any_text().prop_map(String::into_bytes), mutated(shipped)];
    fuzz("config/text", 800, input, |text| config_property(&text));
}

#[test]
fn config_parser_refuses_hostile_values_with_file() {
    fuzz("config/hostile", 800, structured(CONFIG_SHAPE), |text| config_property(text.as_bytes()));
}

/// What a hostile or broken webhook endpoint sends back.
fn hook_response() -> impl Strategy<Value = Vec<u8>> {
    let status = prop_oneof![100u16..1000, prop::sample::select(vec![200u16, 204, 301, 401, 404, 429, 500, 503])];
    let headers = prop::collection::vec(
        prop_oneof![
            Just("Content-Length: 99999999999999999999".to_string()),
            Just("Content-Length: -1".to_string()),
            Just("Transfer-Encoding: chunked".to_string()),
            Just("Location: http://127.0.0.1:1/".to_string()),
            "[ -~]{0,40}",
        ],
        0..4,
    );
    prop_oneof![
        (status, headers, any::<String>()).prop_map(|(status, headers, body)| {
            let mut text = format!("HTTP/1.1 {status} X\r\n");
            for h in headers {
                text += &format!("{h}\r\n");
            }
            format!("{text}\r\n{body}").into_bytes()
        }),
        prop::collection::vec(any::<u8>(), 0..200),
        Just(Vec::new()),
    ]
}

/// Facts with hostile strings (the message is built from them).
fn facts() -> impl Strategy<Value = hooks::Facts> {
    (loaded_text(), loaded_text(), any::<u64>(), prop::option::of(any::<f64>())).prop_map(
        |(version, summary, job, asr)| hooks::Facts {
            outcome: "rejected".into(),
            job,
            try_number: 1,
            version: version.clone(),
            plan: version,
            verdict: Some("rejected".into()),
            summary,
            utility: asr,
            utility_under_attack: None,
            asr,
            decisive: None,
            run_dir: Some(PathBuf::from("/tmp/run")),
            report: None,
            error: None,
        },
    )
}

/// Whatever a webhook endpoint answers, delivery ends (its attempts have time limits)
/// without a panic.
#[test]
fn webhook_responses_never_panic_and_end_in_time() {
    let rt = crate::runtime::current_thread().expect("a tokio runtime");
    let kinds = vec![Kind::Slack, Kind::Mattermost, Kind::Discord, Kind::Matrix, Kind::Ntfy, Kind::Json];
    let input = (hook_response(), prop::sample::select(kinds), 0u32..3, facts());
    fuzz("hooks/response", 300, input, |(response, kind, retries, facts)| {
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
            let port = listener.local_addr().expect("its address").port();
            let endpoint = tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                while let Ok((mut stream, _)) = listener.accept().await {
                    let mut buf = vec![0; 65536];
                    let _ = stream.read(&mut buf).await;
                    let _ = stream.write_all(&response).await;
                }
            });
            let hook: HookConfig = toml::from_str(&format!(
                "name = \"h\"\nkind = \"{}\"\nurl = \"http://127.0.0.1:{port}/hook/SECRET\"\ntoken = \"t\"\ntimeout_s = 0.3\nretries = {retries}\nbackoff_s = 0.0",
                kind.as_str()
            ))
            .expect("a hook");
            // A hang guard, not a timing: delivery may take 0.3 s per attempt.
            let ledger = hooks::Ledger::new(None, std::slice::from_ref(&hook), facts).expect("a hook without `on`");
            let ended = tokio::time::timeout(Duration::from_secs(60), hooks::fire(hook, ledger)).await;
            endpoint.abort();
            check(ended.is_ok(), || "delivery never ended".into())
        })
    });
}
