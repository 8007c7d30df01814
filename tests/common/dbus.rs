//! A private `dbus-daemon` and a fake `org.freedesktop.systemd1` on it:
//! the used subset — `Manager.ListUnitsByPatterns`, `Manager.GetUnit`, and unit objects
//! with `Unit.ActiveState` — so zbus_systemd's proxies work unchanged. Point the binary
//! at it with `DBUS_SESSION_BUS_ADDRESS` / `DBUS_SYSTEM_BUS_ADDRESS`.
//!
//! Self-contained (no `super::`): unit tests in `src/guard` include it by `#[path]`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// No service directories (the stock session config would bus-activate
/// `org.freedesktop.systemd1` into a spawn error) and anyone may own any name.
const BUS_CONFIG: &str = r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>LISTEN</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"#;

/// A running `dbus-daemon` on a socket in its own temporary folder. Killed and reaped
/// on drop.
pub struct DbusDaemon {
    dir: Arc<tempfile::TempDir>,
    child: Option<Child>,
    pub address: String,
}

impl DbusDaemon {
    pub fn start() -> DbusDaemon {
        let dir = Arc::new(tempfile::Builder::new().prefix("pruefstand-dbus-").tempdir().expect("temp dir for dbus"));
        DbusDaemon::start_in(dir)
    }

    fn start_in(dir: Arc<tempfile::TempDir>) -> DbusDaemon {
        let config = dir.path().join("bus.conf");
        let socket = dir.path().join("bus");
        let _ = std::fs::remove_file(&socket); // a killed daemon leaves its socket behind
        let address = format!("unix:path={}", socket.display());
        std::fs::write(&config, BUS_CONFIG.replace("LISTEN", &address)).unwrap();
        // No --fork: the child is ours to reap. --print-address is written once the
        // socket listens, so reading it is the readiness wait.
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .args(["--nofork", "--nopidfile", "--print-address=1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // Its stderr goes to a file: as root it complains about the fd limit on
            // every start, which is noise unless it failed.
            .stderr(std::fs::File::create(dir.path().join("dbus-daemon.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start dbus-daemon ({e}): install Debian's `dbus` package"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("reading dbus-daemon's address");
        if !line.starts_with("unix:") {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(dir.path().join("dbus-daemon.log")).unwrap_or_default();
            panic!("dbus-daemon did not start (printed {line:?}):\n{log}");
        }
        DbusDaemon { dir, child: Some(child), address }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("bus")
    }

    /// Kills the daemon (every connection drops) and starts a new one at the same address.
    pub fn restart(&mut self) {
        self.stop();
        let mut next = DbusDaemon::start_in(self.dir.clone());
        self.child = next.child.take();
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for DbusDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Unit name → ActiveState, shared between the test and the fake service.
pub type Units = Arc<Mutex<BTreeMap<String, String>>>;

/// The fake systemd manager, served from its own thread and runtime (a zbus connection
/// dies with the runtime that built it).
pub struct FakeSystemd {
    units: Units,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeSystemd {
    pub fn serve(address: &str) -> FakeSystemd {
        let mut fake = FakeSystemd { units: Units::default(), stop: None, thread: None };
        fake.connect(address);
        fake
    }

    /// Serves again (after a bus restart), with the same units.
    pub fn connect(&mut self, address: &str) {
        self.disconnect();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let units = self.units.clone();
        let bus_address = address.to_string();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let built = async {
                    zbus::connection::Builder::address(bus_address.as_str())
                        .serve_at("/org/freedesktop/systemd1", Manager { units })
                        .name("org.freedesktop.systemd1")
                        // Never take the name over: a second fake on the bus must fail, not steal.
                        .replace_existing_names(false)
                        .build()
                        .await
                };
                match built.await {
                    Ok(connection) => {
                        let _ = ready_tx.send(Ok(()));
                        let _ = stop_rx.await;
                        drop(connection);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                    }
                }
            });
        });
        ready_rx
            .recv()
            .expect("fake systemd thread")
            .unwrap_or_else(|e| panic!("fake systemd cannot serve on {address}: {e}"));
        self.stop = Some(stop_tx);
        self.thread = Some(thread);
    }

    pub fn disconnect(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    /// Sets a unit's ActiveState ("active", "inactive", "activating", …); a new name
    /// becomes a loaded unit.
    pub fn set(&self, unit: &str, active_state: &str) {
        self.units.lock().unwrap().insert(unit.to_string(), active_state.to_string());
    }
}

impl Drop for FakeSystemd {
    fn drop(&mut self) {
        self.disconnect();
    }
}

struct Manager {
    units: Units,
}

/// systemd's object path escaping: every byte outside [A-Za-z0-9] becomes `_xx`.
fn unit_path(name: &str) -> String {
    let mut path = String::from("/org/freedesktop/systemd1/unit/");
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() {
            path.push(b as char);
        } else {
            path.push_str(&format!("_{b:02x}"));
        }
    }
    path
}

/// systemd's glob: `*`, `?` and `[…]` as fnmatch; enough here: `*` and `?`.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob(&pattern[1..], name) || (!name.is_empty() && glob(pattern, &name[1..])),
        (Some(b'?'), Some(_)) => glob(&pattern[1..], &name[1..]),
        (Some(p), Some(n)) if p == n => glob(&pattern[1..], &name[1..]),
        _ => false,
    }
}

type UnitRow =
    (String, String, String, String, String, String, zbus::OwnedObjectPath, u32, String, zbus::OwnedObjectPath);

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl Manager {
    async fn list_units_by_patterns(
        &self,
        states: Vec<String>,
        patterns: Vec<String>,
    ) -> zbus::fdo::Result<Vec<UnitRow>> {
        let units = self.units.lock().unwrap().clone();
        let mut rows = Vec::new();
        for (name, active) in units {
            let state_ok = states.is_empty() || states.contains(&active);
            let name_ok = patterns.is_empty() || patterns.iter().any(|p| glob(p.as_bytes(), name.as_bytes()));
            if !(state_ok && name_ok) {
                continue;
            }
            let sub = if active == "active" { "running" } else { "dead" };
            let path = zbus::OwnedObjectPath::try_from(unit_path(&name)).unwrap();
            let none = zbus::OwnedObjectPath::try_from("/").unwrap();
            rows.push((
                name.clone(),
                format!("fake {name}"),
                "loaded".into(),
                active,
                sub.into(),
                String::new(),
                path,
                0,
                String::new(),
                none,
            ));
        }
        Ok(rows)
    }

    async fn get_unit(
        &self,
        name: String,
        #[zbus(object_server)] server: &zbus::ObjectServer,
    ) -> zbus::fdo::Result<zbus::OwnedObjectPath> {
        if !self.units.lock().unwrap().contains_key(&name) {
            return Err(zbus::fdo::Error::Failed(format!("Unit {name} not loaded.")));
        }
        let path = unit_path(&name);
        // Unit objects appear on first request; `at` leaves an existing one alone.
        server.at(path.as_str(), Unit { name, units: self.units.clone() }).await?;
        Ok(zbus::OwnedObjectPath::try_from(path).unwrap())
    }
}

struct Unit {
    name: String,
    units: Units,
}

#[zbus::interface(name = "org.freedesktop.systemd1.Unit")]
impl Unit {
    #[zbus(property(emits_changed_signal = "false"))]
    async fn active_state(&self) -> String {
        self.units.lock().unwrap().get(&self.name).cloned().unwrap_or_else(|| "inactive".into())
    }

    #[zbus(property(emits_changed_signal = "const"))]
    async fn id(&self) -> String {
        self.name.clone()
    }
}
