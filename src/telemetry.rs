//! telemetry (stub, being written).
