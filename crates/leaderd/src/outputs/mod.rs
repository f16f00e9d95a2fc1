//! What the elections tell the world besides HTTP: the flag file
//! (`flag_file`), Prometheus metrics (`metrics`), the logs (`logging`), and
//! a command run only while leading (`exec`). Nothing on a safety path
//! waits on any of them.

pub mod exec;
pub mod flag_file;
pub mod logging;
pub mod metrics;
