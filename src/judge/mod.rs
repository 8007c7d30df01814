//! Rules R1–R5 and the verdict (stub, being written).
