//! The gym's contract on the Rust side: the embedded Python gym and the managed venv it
//! runs in (`pyenv`, with AgentDojo's inventory), the events the gym writes (`events`)
//! and what it is asked (`request`). Not here: driving a gym process (the binary's
//! `gym`), what a run's files are (`pruefstand_store`).

pub mod pyenv;
pub mod events;
pub mod request;
