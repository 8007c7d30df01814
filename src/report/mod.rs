//! Reports (stub, being written).
