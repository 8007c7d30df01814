//! The busy-unit guard: systemd units matching configured patterns on the user and
//! the system bus; any one in a busy state blocks. Asks `ListUnitsByPatterns` on every
//! sample (one call, no cached properties: a default `UnitProxy` caches ActiveState
//! and real systemd only signals changes to subscribed clients).
//!
//! A bus is connected on first use; a failed call drops the connection so the next
//! sample reconnects (a bus restart, a user manager re-login). A bus with no patterns
//! is never touched.

use std::fmt;
use std::time::Duration;

use zbus_systemd::systemd1::ManagerProxy;

use super::BusyUnit;
use pruefstand_core::settings::{Unavailable, UnitsConfig};

/// Connect + call must not hang a sample (or `check`) on a wedged bus.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// States in which a unit is (or is about to be, or still is) using the machine.
const BUSY_STATES: &[&str] = &["active", "activating", "deactivating", "reloading", "refreshing"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bus {
    /// The session bus: `DBUS_SESSION_BUS_ADDRESS`, else `$XDG_RUNTIME_DIR/bus`.
    User,
    /// `DBUS_SYSTEM_BUS_ADDRESS`, else `/run/dbus/system_bus_socket`.
    System,
}

impl fmt::Display for Bus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Bus::User => "user",
            Bus::System => "system",
        })
    }
}

/// One unit as `ListUnitsByPatterns` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnitState {
    pub(crate) name: String,
    pub(crate) active_state: String,
    pub(crate) sub_state: String,
}

impl UnitState {
    pub(crate) fn is_busy(&self) -> bool {
        BUSY_STATES.contains(&self.active_state.as_str())
    }
}

/// A connection to one bus, kept between samples.
pub(crate) struct BusClient {
    pub(crate) bus: Bus,
    /// An explicit address instead of the environment's (unit tests: setting
    /// environment variables is unsafe while other test threads run).
    address: Option<String>,
    connection: Option<zbus::Connection>,
}

impl BusClient {
    pub(crate) fn new(bus: Bus) -> BusClient {
        BusClient { bus, address: None, connection: None }
    }

    fn at_address(bus: Bus, address: Option<String>) -> BusClient {
        BusClient { bus, address, connection: None }
    }

    /// The loaded units matching `patterns` (any state). An error drops the
    /// connection, so the next call reconnects.
    pub(crate) async fn list(&mut self, patterns: &[String]) -> Result<Vec<UnitState>, String> {
        let result = tokio::time::timeout(CALL_TIMEOUT, self.list_inner(patterns))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} s", CALL_TIMEOUT.as_secs())));
        if result.is_err() {
            self.connection = None;
        }
        result.map_err(|e| format!("{} bus unreachable: {e}", self.bus))
    }

    async fn list_inner(&mut self, patterns: &[String]) -> Result<Vec<UnitState>, String> {
        if self.connection.is_none() {
            let connection = match (&self.address, self.bus) {
                (Some(address), _) => {
                    async { zbus::connection::Builder::address(address.as_str()).build().await }.await
                }
                (None, Bus::User) => zbus::Connection::session().await,
                (None, Bus::System) => zbus::Connection::system().await,
            };
            self.connection = Some(connection.map_err(|e| format!("cannot connect: {e}"))?);
        }
        let connection = self.connection.as_ref().expect("connected above");
        // No property cache: it would add a signal match, the one thing that could wake
        // an idle daemon.
        let manager = ManagerProxy::builder(connection)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(|e| e.to_string())?;
        let units = manager
            .list_units_by_patterns(Vec::new(), patterns.to_vec())
            .await
            .map_err(|e| format!("ListUnitsByPatterns failed: {e}"))?;
        Ok(units
            .into_iter()
            .map(|(name, _description, _load, active_state, sub_state, ..)| UnitState { name, active_state, sub_state })
            .collect())
    }
}

impl BusClient {
    pub(super) fn disconnect(&mut self) {
        self.connection = None;
    }
}

/// The outcome of one sample of both buses.
#[derive(Debug, Default)]
pub(crate) struct UnitsSample {
    pub(crate) blocking: Vec<String>,
    pub(crate) notes: Vec<String>,
    pub(crate) busy: Vec<BusyUnit>,
}

pub(super) struct UnitGuard {
    config: UnitsConfig,
    user: BusClient,
    system: BusClient,
}

impl UnitGuard {
    pub(crate) fn new(config: UnitsConfig) -> UnitGuard {
        UnitGuard::at_addresses(config, None, None)
    }

    /// With explicit bus addresses (None: from the environment).
    pub(super) fn at_addresses(config: UnitsConfig, user: Option<String>, system: Option<String>) -> UnitGuard {
        UnitGuard {
            config,
            user: BusClient::at_address(Bus::User, user),
            system: BusClient::at_address(Bus::System, system),
        }
    }

    pub(super) fn disconnect(&mut self) {
        self.user.disconnect();
        self.system.disconnect();
    }

    pub(crate) async fn sample(&mut self) -> UnitsSample {
        let mut out = UnitsSample::default();
        for (client, patterns) in [(&mut self.user, &self.config.user), (&mut self.system, &self.config.system)] {
            if patterns.is_empty() {
                continue;
            }
            match client.list(patterns).await {
                Ok(units) => {
                    for unit in units.into_iter().filter(UnitState::is_busy) {
                        let busy = BusyUnit { bus: client.bus, name: unit.name, active_state: unit.active_state };
                        out.blocking.push(busy.describe());
                        out.busy.push(busy);
                    }
                }
                Err(reason) => {
                    let reason = format!("{reason} (busy units {} cannot be checked)", patterns.join(", "));
                    match self.config.unreachable {
                        Unavailable::Block => out.blocking.push(reason),
                        Unavailable::Ignore => out.notes.push(format!("{reason}; ignored by config")),
                    }
                }
            }
        }
        out
    }
}
