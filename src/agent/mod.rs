//! The agent runtime (stub, being written).
