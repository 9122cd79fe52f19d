//! The router (contract §4.1, §6): which host a client request goes to and
//! under which permission, the merged root and the merged session list.
//! Decisions here read the hosts' mirrors, the policy and the names; they
//! never touch a client session's state (the session applies them).

pub mod catalog;
pub mod root;
