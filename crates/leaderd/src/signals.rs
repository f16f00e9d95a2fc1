//! SIGTERM and SIGINT, turned into one cancellation.

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Cancels `token` at the first SIGTERM or SIGINT.
pub fn spawn_handler(token: CancellationToken) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        // Cancel first: nothing on the way out waits for a log line.
        token.cancel();
        info!(signal = name, "shutting down");
    });
    Ok(())
}
