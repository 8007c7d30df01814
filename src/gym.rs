//! gym (stub, being written).
