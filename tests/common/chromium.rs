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
