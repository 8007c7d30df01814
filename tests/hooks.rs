//! Completion hooks, fired by the real daemon at a local HTTP server: every webhook
//! format, a 500 retried, a dead endpoint that delays nothing, an exec hook's
//! variables, and no webhook secret in logs, reports or the queue.

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use crate::common::*;

#[derive(Clone, Debug)]
struct Request {
    method: String,
    path: String,
    headers: BTreeMap<String, String>,
    body: String,
}

/// A one-request-per-connection HTTP/1.1 server recording every request; paths ending
/// in `/flaky` answer 500 to their first request.
fn serve() -> (u16, Arc<Mutex<Vec<Request>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::<Request>::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let Some((line, headers, body)) = read_request(&mut reader) else { continue };
            let mut parts = line.split_whitespace();
            let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
            let request =
                Request { method, path: path.clone(), headers, body: String::from_utf8_lossy(&body).into_owned() };
            let first_of_path = {
                let mut seen = record.lock().unwrap();
                let first = !seen.iter().any(|r| r.path == path);
                seen.push(request);
                first
            };
            let status = if path.ends_with("/flaky") && first_of_path { "500 Internal Server Error" } else { "200 OK" };
            let mut stream = stream;
            let _ = write!(stream, "HTTP/1.1 {status}\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
        }
    });
    (port, seen)
}

#[test]
fn hooks_fire_in_every_format_retry_and_never_delay_or_leak() {
    let bench = Bench::new();
    bench.write("profiles/mini.toml", MINI_PLAN);
    let (port, seen) = serve();
    // Accepts connections (the kernel's backlog) but never answers: every attempt times out.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_port = dead.local_addr().unwrap().port();
    let env_out = bench.path().join("exec-env.txt");
    let base = format!("http://127.0.0.1:{port}/SECRET-TOKEN-");
    let mut config = std::fs::read_to_string(bench.path().join("pruefstand.toml")).unwrap();
    for kind in ["slack", "mattermost", "discord", "ntfy", "json"] {
        config += &format!(
            "\n[[hooks]]\nname = \"{kind}\"\nkind = \"{kind}\"\nurl = \"{base}{kind}/{kind}\"\nretries = 1\nbackoff_s = 0.1\n"
        );
    }
    config += &format!(
        r#"
[[hooks]]
name = "room"
kind = "matrix"
url = "{base}matrix/_matrix/client/v3/rooms/!r:hs/send/m.room.message"
token = "SECRET-TOKEN-access"

[[hooks]]
name = "flaky"
kind = "json"
url = "{base}flaky/flaky"
retries = 3
backoff_s = 0.1

[[hooks]]
name = "refused"
kind = "slack"
url = "http://127.0.0.1:1/SECRET-TOKEN-refused"
retries = 1
backoff_s = 0.1

[[hooks]]
name = "dead"
kind = "discord"
url = "http://127.0.0.1:{dead_port}/SECRET-TOKEN-dead"
timeout_s = 60
retries = 0

[[hooks]]
name = "script"
kind = "exec"
argv = ["/bin/sh", "-c", "env | grep ^PRUEFSTAND_ | sort >> \"$0\"; echo --- >> \"$0\"", "{}"]
"#,
        env_out.display()
    );
    bench.write("pruefstand.toml", &config);

    let mut daemon = bench.daemon();
    let first = bench.start(&["demo-baseline", "--plan", "mini"]);
    // A job whose snapshot disappears after `start`: it fails, and that fires too.
    let second = failing_job(&bench);
    let job1 = bench.wait_job(first, "done", 120);
    let job2 = bench.wait_job(second, "failed", 60);
    assert!(job2["error"].as_str().unwrap().contains("its spec snapshot"), "{job2}");
    // The dead endpoint (60 s per attempt) is still hanging for job 1, yet job 2 ran.
    assert!(!daemon.log().contains("\"dead\" (discord): gave up"), "{}", daemon.log());
    let verdict = job1["verdict"].as_str().unwrap().to_string();

    wait_until("every live hook delivered for both jobs", 30, || {
        let log = daemon.log();
        let delivered = |name: &str| {
            log.lines().filter(|l| l.contains(&format!("hook \"{name}\" (")) && l.contains("delivered")).count()
        };
        ["slack", "mattermost", "discord", "ntfy", "json", "room", "flaky", "script"]
            .iter()
            .all(|name| delivered(name) == 2)
            && log.matches("\"refused\" (slack): gave up").count() == 2
            && std::fs::read_to_string(&env_out).is_ok_and(|t| t.matches("---").count() == 2)
    });
    let requests = seen.lock().unwrap().clone();
    let of = |kind: &str, job: u64| -> Request {
        requests
            .iter()
            .find(|r| {
                r.path.contains(&format!("SECRET-TOKEN-{kind}"))
                    && (r.body.contains(&format!("\"job\":{job}")) || r.path.contains(&format!("pruefstand-{job}-")))
            })
            .unwrap_or_else(|| panic!("no {kind} request for job {job}: {requests:#?}"))
            .clone()
    };
    let body = |r: &Request| -> serde_json::Value { serde_json::from_str(&r.body).unwrap() };
    let headline = format!("demo-baseline on mini — {}", verdict.to_uppercase());

    let slack =
        requests.iter().find(|r| r.path.ends_with("/slack") && r.body.contains(&headline)).expect("slack for job 1");
    assert_eq!(slack.method, "POST");
    // The chat text names the figure R2 judged (mini holds no family out: the ASR of all
    // attacks) and the others by their names (judge::words).
    let text = body(slack)["text"].as_str().unwrap().to_string();
    assert!(text.contains("\nR2 judged: ASR (all attacks) ") && text.contains(" bound "), "{text}");
    assert!(text.contains("limit 10 %"), "{text}");
    assert!(text.contains("\nASR (all attacks) ") && text.contains(" · utility (clean) "), "{text}");
    let mattermost =
        requests.iter().find(|r| r.path.ends_with("/mattermost") && r.body.contains(&headline)).expect("mattermost");
    assert_eq!(body(mattermost)["username"], "pruefstand");
    let discord =
        requests.iter().find(|r| r.path.ends_with("/discord") && r.body.contains(&headline)).expect("discord");
    assert!(body(discord)["content"].as_str().unwrap().contains("report:"));
    let ntfy = requests.iter().find(|r| r.path.ends_with("/ntfy") && r.body.contains(&headline)).expect("ntfy");
    assert_eq!(ntfy.headers["title"], format!("pruefstand: demo-baseline {verdict}"));
    assert!(ntfy.headers.contains_key("tags") && ntfy.headers.contains_key("priority"));
    let matrix = of("matrix", first);
    assert_eq!(matrix.method, "PUT");
    assert!(matrix.path.contains("/send/m.room.message/pruefstand-1-"), "{}", matrix.path);
    assert_eq!(matrix.headers["authorization"], "Bearer SECRET-TOKEN-access");
    assert_eq!(body(&matrix)["msgtype"], "m.text");
    let facts = body(&of("json", first));
    assert_eq!(
        (facts["outcome"].as_str(), facts["verdict"].as_str(), facts["plan"].as_str()),
        (Some(verdict.as_str()), Some(verdict.as_str()), Some("mini"))
    );
    assert!(facts["utility"].is_number() && facts["asr"].is_number());
    assert_eq!(facts["decisive"]["name"], "ASR (all attacks)", "{facts}");
    assert!(std::path::Path::new(facts["report"].as_str().unwrap()).is_file());
    let failed = body(&of("json", second));
    assert_eq!((failed["outcome"].as_str(), failed["verdict"].is_null()), (Some("failed"), true));

    // 500, then 200: retried once for job 1.
    let flaky: Vec<_> =
        requests.iter().filter(|r| r.path.ends_with("/flaky") && r.body.contains("\"job\":1")).collect();
    assert_eq!(flaky.len(), 2, "one 500, one retry");
    assert!(daemon.log().contains("hook \"flaky\" (json): attempt 1/4 failed: HTTP 500"));

    let env = std::fs::read_to_string(&env_out).unwrap();
    for line in [
        "PRUEFSTAND_JOB=1",
        "PRUEFSTAND_VERSION=demo-baseline",
        "PRUEFSTAND_PLAN=mini",
        &format!("PRUEFSTAND_VERDICT={verdict}"),
        "PRUEFSTAND_OUTCOME=failed",
        "PRUEFSTAND_DECISIVE_NAME=ASR (all attacks)",
        "PRUEFSTAND_JOB=2",
    ] {
        assert!(env.lines().any(|l| l == line), "{line} missing from\n{env}");
    }
    assert!(
        env.contains("PRUEFSTAND_ASR=0.")
            && env.contains("PRUEFSTAND_REPORT=/")
            && env.contains("PRUEFSTAND_ERROR=job 2")
    );

    // Secrets: warned about (the config is 0644), never written anywhere — also not by
    // the stop, which writes down the dead hook's notification as owed. Stopped first,
    // the daemon writes no ledger while the files are read (one renamed into place
    // between listing and reading was gone).
    assert!(daemon.signal_and_wait("TERM").success());
    let log = daemon.log();
    assert!(log.contains("job 1: the notification to hook \"dead\" is still owed"), "{log}");
    assert!(log.contains("readable by group or others (mode 644)"), "{log}");
    assert!(!log.contains("SECRET-TOKEN"), "a webhook secret in the log:\n{log}");
    for dir in ["reports", ".pruefstand"] {
        for file in walk(&bench.path().join(dir)) {
            let text = String::from_utf8_lossy(&std::fs::read(&file).unwrap()).into_owned();
            assert!(!text.contains("SECRET-TOKEN"), "a webhook secret in {}", file.display());
        }
    }
    drop(dead);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() { out.extend(walk(&path)) } else { out.push(path) }
    }
    out
}

/// `check` refuses the hooks the daemon would refuse or never deliver: an outcome that
/// does not exist, an exec program that is not there, a `url_env` not set — each a
/// FAIL naming pruefstand.toml, the line and the field; a hook URL that is not
/// http(s) is refused when the file is read.
#[test]
fn check_refuses_hooks_the_daemon_would_not_deliver() {
    let bench = Bench::new();
    let shipped = std::fs::read_to_string(bench.path().join("pruefstand.toml")).unwrap();
    let first = shipped.lines().count() + 2;
    let config = format!(
        "{shipped}\n[[hooks]]\nname = \"team\"\nkind = \"slack\"\nurl_env = \"PRUEFSTAND_TEST_UNSET_HOOK_URL\"\non = [\"reject\"]\n\
         \n[[hooks]]\nname = \"notify\"\nkind = \"exec\"\nargv = [\"/nonexistent/bench-notify\", \"--x\"]\n\
         \n[[hooks]]\nname = \"team\"\nkind = \"exec\"\nargv = [\"true\"]\n"
    );
    bench.write("pruefstand.toml", &config);
    let check = bench.run(&["check"]).code(2);
    let file = bench.path().join("pruefstand.toml");
    for (line, what) in [
        (first + 3, "hook \"team\": url_env names PRUEFSTAND_TEST_UNSET_HOOK_URL, which is not set"),
        (first + 4, "hook \"team\": on = \"reject\" is not one of approved, rejected"),
        (first + 9, "hook \"notify\": argv: program \"/nonexistent/bench-notify\" is not found"),
        (first + 12, "hook \"team\": another hook above has this name"),
    ] {
        let want = format!("FAIL  {}:{line}: {what}", file.display());
        assert!(check.stdout.contains(&want), "{want}\n{}", check.stdout);
    }
    assert!(check.stdout.contains("4 FAIL"), "{}", check.stdout);

    bench.write(
        "pruefstand.toml",
        &format!("{shipped}\n[[hooks]]\nname = \"x\"\nkind = \"json\"\nurl = \"file:///etc/passwd\"\n"),
    );
    let check = bench.run(&["check"]).code(2);
    let want = format!("{}:{}:7: url: only http:// and https:// URLs", file.display(), first + 3);
    assert!(check.stdout.contains(&want), "{want}\n{}", check.stdout);
    assert!(!check.stdout.contains("passwd"), "{}", check.stdout);
}

/// A queued job whose spec snapshot is removed right after `start` (the queue paused
/// meanwhile, so the daemon cannot take it first): it fails at once, and its `failed`
/// notification fires. The job id.
fn failing_job(bench: &Bench) -> u64 {
    bench.run(&["pause"]).ok();
    let id = bench.start(&["demo-kandidat", "--plan", "mini"]);
    std::fs::remove_file(bench.path().join(format!(".pruefstand/jobs/{id}/snapshot/version/demo-kandidat.toml")))
        .unwrap();
    bench.run(&["resume"]).ok();
    id
}

/// Whether a process still runs (a zombie waiting for its reaper has ended).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

#[test]
fn a_timed_out_exec_hook_is_killed_with_everything_it_started() {
    let bench = Bench::new();
    bench.write("profiles/mini.toml", MINI_PLAN);
    let pids = bench.path().join("hook-pids.txt");
    let mut config = std::fs::read_to_string(bench.path().join("pruefstand.toml")).unwrap();
    // Two `sleep` children in the background, its own pid, then it hangs on them.
    config += &format!(
        r#"
[[hooks]]
name = "hang"
kind = "exec"
argv = ["/bin/sh", "-c", "sleep 300 & echo $! >> \"$0\"; sleep 300 & echo $! >> \"$0\"; echo $$ >> \"$0\"; wait", "{}"]
timeout_s = 1
retries = 1
backoff_s = 0.1
"#,
        pids.display()
    );
    bench.write("pruefstand.toml", &config);
    let daemon = bench.daemon();
    let id = failing_job(&bench);
    bench.wait_job(id, "failed", 60);
    wait_until("the hook to give up", 30, || daemon.log().contains("hook \"hang\" (exec): gave up after 2 attempts"));
    let recorded: Vec<u32> =
        std::fs::read_to_string(&pids).unwrap().lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(recorded.len(), 6, "two attempts, three processes each: {recorded:?}");
    // The kill is synchronous with the timeout; a moment for the kernel to deliver it.
    wait_until("every process of the hook's groups to end", 10, || recorded.iter().all(|pid| !alive(*pid)));
}

/// Every request a receiver got, and whether it answered 200.
type Received = Arc<Mutex<Vec<(Request, bool)>>>;

/// A receiver that answers 500 until `accept` is set, then 200; every request recorded.
fn receiver() -> (u16, Arc<std::sync::atomic::AtomicBool>, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accept = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (accepting, record) = (accept.clone(), seen.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let Some((line, headers, body)) = read_request(&mut reader) else { continue };
            let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
            let ok = accepting.load(std::sync::atomic::Ordering::SeqCst);
            let request = Request { method: "POST".into(), path, headers, body: String::from_utf8_lossy(&body).into() };
            record.lock().unwrap().push((request, ok));
            let status = if ok { "200 OK" } else { "500 Internal Server Error" };
            let mut stream = stream;
            let _ = write!(stream, "HTTP/1.1 {status}\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
        }
    });
    (port, accept, seen)
}

#[test]
fn a_notification_owed_at_a_stop_is_sent_after_the_restart_with_the_same_key() {
    let bench = Bench::new();
    bench.write("profiles/mini.toml", MINI_PLAN);
    let (port, accept, seen) = receiver();
    let mut config = std::fs::read_to_string(bench.path().join("pruefstand.toml")).unwrap();
    config += &format!(
        "\n[[hooks]]\nname = \"team\"\nkind = \"json\"\nurl = \"http://127.0.0.1:{port}/hook\"\nretries = 20\nbackoff_s = 0.2\n"
    );
    bench.write("pruefstand.toml", &config);
    let mut daemon = bench.daemon();
    let id = failing_job(&bench);
    bench.wait_job(id, "failed", 60);
    wait_until("two failed attempts", 30, || seen.lock().unwrap().len() >= 2);
    // A stop mid-retry: the daemon says what is still owed.
    daemon.signal_and_wait("TERM");
    let log = daemon.log();
    assert!(log.contains(&format!("job {id}: the notification to hook \"team\" is still owed")), "{log}");
    let ledger = json(&bench.path().join(format!(".pruefstand/jobs/{id}/notifications.json")));
    assert_eq!(ledger["hooks"][0]["state"], "owed", "{ledger}");
    let before = seen.lock().unwrap().len();

    accept.store(true, std::sync::atomic::Ordering::SeqCst);
    let daemon = bench.daemon();
    wait_until("the owed notification delivered", 30, || seen.lock().unwrap().iter().any(|(_, ok)| *ok));
    let requests = seen.lock().unwrap().clone();
    let keys: Vec<&str> = requests.iter().map(|(r, _)| r.headers["idempotency-key"].as_str()).collect();
    assert!(keys.iter().all(|k| *k == format!("{id}-1-failed")), "one key for every attempt: {keys:?}");
    let (delivered, _) = requests.iter().find(|(_, ok)| *ok).unwrap();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&delivered.body).unwrap()["job"], id);
    assert!(requests.len() > before);
    wait_until("the ledger to say delivered", 10, || {
        json(&bench.path().join(format!(".pruefstand/jobs/{id}/notifications.json")))["hooks"][0]["state"]
            == "delivered"
    });
    assert!(daemon.log().contains(&format!("job {id}: notifications still owed, sent again: \"team\"")));

    // `log JOB` shows each attempt: the failed ones before the stop, the delivery after.
    let shown = bench.run(&["log", &id.to_string()]).ok().stdout;
    let attempts = shown.lines().filter(|l| l.contains("hook \"team\" (json): attempt ")).count();
    assert!(attempts >= 2, "{shown}");
    assert!(shown.contains("failed: HTTP 500 Internal Server Error; retrying in"), "{shown}");
    assert!(shown.contains("is still owed"), "{shown}");
    assert!(shown.lines().any(|l| l.contains("hook \"team\" (json): delivered (attempt ")), "{shown}");
}

/// The hook `team` of kind json at `port`, retried often, quickly.
fn retried_hook(bench: &Bench, port: u16) {
    let mut config = std::fs::read_to_string(bench.path().join("pruefstand.toml")).unwrap();
    config += &format!(
        "\n[[hooks]]\nname = \"team\"\nkind = \"json\"\nurl = \"http://127.0.0.1:{port}/hook\"\nretries = 20\nbackoff_s = 0.2\n"
    );
    bench.write("pruefstand.toml", &config);
}

/// `clean` keeps an ended job whose notification is still owed, naming it; `--force`
/// removes it, and the daemon retrying it stops and never makes its folder again.
#[test]
fn clean_keeps_a_job_whose_notification_is_owed_and_a_forced_clean_stays_clean() {
    let bench = Bench::new();
    bench.write("profiles/mini.toml", MINI_PLAN);
    let (port, _accept, seen) = receiver();
    retried_hook(&bench, port);
    let daemon = bench.daemon();
    let id = failing_job(&bench);
    bench.wait_job(id, "failed", 60);
    wait_until("two failed attempts", 30, || seen.lock().unwrap().len() >= 2);
    let folder = bench.path().join(format!(".pruefstand/jobs/{id}"));

    let kept = bench.run(&["clean"]).ok();
    assert!(folder.join("job.json").is_file(), "the job is kept");
    let said = format!("kept job {id}: its notification to hook \"team\" is still owed");
    assert!(kept.stderr.contains(&said), "{}\n{}", kept.stdout, kept.stderr);
    assert!(kept.stdout.contains("nothing to clean"), "{}", kept.stdout);

    let forced = bench.run(&["clean", "--force"]).ok();
    assert!(forced.stdout.contains(&format!("removed 1 ended job: {id}")), "{}", forced.stdout);
    wait_until("the retries to stop", 30, || daemon.log().contains("not sent any more: superseded"));
    let after = seen.lock().unwrap().len();
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(!folder.exists(), "the daemon made the cleaned job's folder again");
    assert_eq!(seen.lock().unwrap().len(), after, "no attempt after the stop");
    let queue = bench.run(&["queue"]).ok();
    assert!(!queue.stderr.contains("skipping job"), "{}", queue.stderr);
}

/// `restart` is a new try with a new result: its notification comes under a new key
/// (`<job>-<try>-<outcome>`), and the last try's, still retried, is dropped — one retry
/// loop, whose attempts the ledger counts.
#[test]
fn a_restarted_job_notifies_under_a_new_key_and_the_old_retries_stop() {
    let bench = Bench::new();
    bench.write("profiles/mini.toml", MINI_PLAN);
    let (port, accept, seen) = receiver();
    retried_hook(&bench, port);
    let daemon = bench.daemon();
    let id = failing_job(&bench);
    bench.wait_job(id, "failed", 60);
    wait_until("two failed attempts", 30, || seen.lock().unwrap().len() >= 2);
    let ledger_file = bench.path().join(format!(".pruefstand/jobs/{id}/notifications.json"));
    assert_eq!(json(&ledger_file)["key"], format!("{id}-1-failed"));

    let restart = bench.run(&["restart", &id.to_string()]).ok();
    assert!(restart.stdout.contains("notification to hook \"team\" is dropped unsent"), "{}", restart.stdout);
    bench.wait_job(id, "failed", 60);
    wait_until("the new try's ledger", 30, || {
        std::fs::read(&ledger_file).is_ok_and(|b| {
            serde_json::from_slice::<serde_json::Value>(&b).is_ok_and(|v| v["key"] == format!("{id}-2-failed"))
        })
    });
    wait_until("the old retries to stop", 30, || daemon.log().contains("not sent any more: superseded"));
    accept.store(true, std::sync::atomic::Ordering::SeqCst);
    wait_until("the new notification delivered", 30, || json(&ledger_file)["hooks"][0]["state"] == "delivered");

    let requests = seen.lock().unwrap().clone();
    let keys: Vec<&str> = requests.iter().map(|(r, _)| r.headers["idempotency-key"].as_str()).collect();
    let new: Vec<&&str> = keys.iter().filter(|k| **k == format!("{id}-2-failed")).collect();
    assert!(keys.iter().all(|k| *k == format!("{id}-1-failed") || *k == format!("{id}-2-failed")), "{keys:?}");
    assert!(requests.iter().any(|(r, ok)| *ok && r.headers["idempotency-key"] == format!("{id}-2-failed")), "{keys:?}");
    assert!(
        !requests.iter().any(|(r, ok)| *ok && r.headers["idempotency-key"] == format!("{id}-1-failed")),
        "{keys:?}"
    );
    let ledger = json(&ledger_file);
    assert_eq!(ledger["hooks"][0]["attempts"], new.len(), "the ledger counts the new try's attempts only: {ledger}");
}
