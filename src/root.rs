//! root (stub, being written).
