//! Headless Chromium for the report tests: find it, open a page with a fresh profile
//! and no network, and read its console messages from the log.

use std::path::Path;
use std::process::{Command, Output};

pub struct Chromium {
    bin: &'static str,
    profile: tempfile::TempDir,
}

impl Chromium {
    pub fn find() -> Chromium {
        let bin = ["chromium", "chromium-browser"]
            .into_iter()
            .find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
            .expect("chromium is not installed: scripts/test installs Debian's `chromium`");
        Chromium { bin, profile: tempfile::tempdir().unwrap() }
    }

    /// Opens `page` with the given extra switches (a screenshot, a window size, …).
    pub fn open(&self, page: &Path, extra: &[&str]) -> Output {
        Command::new(self.bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--enable-logging=stderr",
                "--v=0",
            ])
            .arg(format!("--user-data-dir={}", self.profile.path().display()))
            .args(extra)
            .arg(format!("file://{}", page.display()))
            .output()
            .unwrap()
    }
}

/// The console messages and uncaught errors in a Chromium log.
pub fn console_errors(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .map(str::to_string)
        .collect()
}

/// A page in headless Chromium driven over the DevTools protocol (`--remote-debugging-pipe`:
/// JSON messages separated by NUL on fds 3 and 4): the page stays open while the test
/// reads its DOM again and again — what a live page needs, where `--dump-dom` and
/// `--screenshot` take one look right after load (and a virtual time budget never ends
/// while an event stream is open). Killed on drop.
pub struct Tab {
    child: std::process::Child,
    to: std::process::ChildStdin,
    from: std::sync::mpsc::Receiver<serde_json::Value>,
    session: String,
    next_id: u64,
    /// Console calls of level error or warning, uncaught exceptions and log entries of
    /// level error, as they came.
    errors: Vec<String>,
    _profile: tempfile::TempDir,
}

impl Chromium {
    /// Opens `url` in a fresh headless Chromium with a `width` × `height` viewport.
    pub fn tab(&self, url: &str, width: u32, height: u32) -> Tab {
        use std::io::BufRead;
        let profile = tempfile::tempdir().unwrap();
        // The shell puts the pipes where Chromium expects them: commands on fd 3, answers on 4.
        let mut child = Command::new("/bin/sh")
            .args(["-c", r#"exec "$@" 3<&0 4>&1 0</dev/null 1>/dev/null"#, "sh", self.bin])
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                &format!("--window-size={width},{height}"),
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let (tx, from) = std::sync::mpsc::channel();
        let mut reader = std::io::BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            let mut message = Vec::new();
            while reader.read_until(0, &mut message).is_ok_and(|n| n > 0) {
                if message.last() == Some(&0) {
                    message.pop();
                }
                if let Ok(value) = serde_json::from_slice(&message)
                    && tx.send(value).is_err()
                {
                    return;
                }
                message.clear();
            }
        });
        let to = child.stdin.take().unwrap();
        let mut tab =
            Tab { child, to, from, session: String::new(), next_id: 0, errors: Vec::new(), _profile: profile };
        let targets = tab.call("Target.getTargets", serde_json::json!({}));
        let target = targets["targetInfos"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .unwrap_or_else(|| panic!("no page target: {targets}"))["targetId"]
            .clone();
        let attached = tab.call("Target.attachToTarget", serde_json::json!({ "targetId": target, "flatten": true }));
        tab.session = attached["sessionId"].as_str().unwrap().to_string();
        for domain in ["Runtime.enable", "Log.enable", "Page.enable"] {
            tab.call(domain, serde_json::json!({}));
        }
        tab.call(
            "Emulation.setDeviceMetricsOverride",
            serde_json::json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        );
        tab.call("Page.navigate", serde_json::json!({ "url": url }));
        tab
    }
}

impl Tab {
    /// Sends a command (to the page once attached) and waits up to 60 s for its answer;
    /// events that come before it are kept where they tell of an error.
    pub fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        use std::io::Write;
        self.next_id += 1;
        let id = self.next_id;
        let mut message = serde_json::json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            message["sessionId"] = self.session.clone().into();
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        self.to.flush().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let reply = self.from.recv_timeout(left).unwrap_or_else(|e| panic!("no answer to {method}: {e}"));
            if reply["id"] == id {
                assert!(reply["error"].is_null(), "{method}: {reply}");
                return reply["result"].clone();
            }
            self.note(&reply);
        }
    }

    fn note(&mut self, event: &serde_json::Value) {
        let params = &event["params"];
        let error = match event["method"].as_str() {
            Some("Runtime.exceptionThrown") => Some(params["exceptionDetails"].to_string()),
            Some("Runtime.consoleAPICalled")
                if matches!(params["type"].as_str(), Some("error" | "warning" | "assert")) =>
            {
                Some(params["args"].to_string())
            }
            Some("Log.entryAdded") if params["entry"]["level"] == "error" => Some(params["entry"].to_string()),
            _ => None,
        };
        self.errors.extend(error);
    }

    /// The value of a JavaScript expression in the page (JSON-serialisable).
    pub fn eval(&mut self, expression: &str) -> serde_json::Value {
        let result =
            self.call("Runtime.evaluate", serde_json::json!({ "expression": expression, "returnByValue": true }));
        assert!(result["exceptionDetails"].is_null(), "{expression}: {result}");
        result["result"]["value"].clone()
    }

    /// The errors the page reported so far (console errors and warnings, uncaught
    /// exceptions, refused loads such as a CSP violation).
    pub fn errors(&mut self) -> Vec<String> {
        while let Ok(event) = self.from.try_recv() {
            self.note(&event);
        }
        self.errors.clone()
    }

    /// A PNG of the page's content (the viewport's width, down to the end of the body).
    pub fn screenshot(&mut self, to: &Path) {
        let size = self.eval("[window.innerWidth, Math.ceil(document.body.getBoundingClientRect().bottom) + 16]");
        let clip = serde_json::json!({ "x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1 });
        let params = serde_json::json!({ "format": "png", "clip": clip, "captureBeyondViewport": true });
        let shot = self.call("Page.captureScreenshot", params);
        let mut decode = Command::new("base64")
            .arg("-d")
            .stdin(std::process::Stdio::piped())
            .stdout(std::fs::File::create(to).unwrap())
            .spawn()
            .unwrap();
        use std::io::Write;
        decode.stdin.take().unwrap().write_all(shot["data"].as_str().unwrap().as_bytes()).unwrap();
        assert!(decode.wait().unwrap().success());
    }
}

impl Drop for Tab {
    /// Asks the browser to close (its helper processes go with it), kills it after 10 s.
    fn drop(&mut self) {
        use std::io::Write;
        let _ = self.to.write_all(b"{\"id\":0,\"method\":\"Browser.close\"}\0");
        let _ = self.to.flush();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if self.child.try_wait().is_ok_and(|s| s.is_some()) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
