//! What `/leader` and `/leader/watch` both send: the `/leader` body, and
//! the JSON error answer. Its own module so that `http` (the routes) and
//! `watch` (one of them) depend on it, not on each other.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::election::Shared;

/// The `/leader` body (spec, HTTP).
#[derive(Serialize)]
pub struct LeaderBody<'a> {
    election: &'a str,
    id: &'a str,
    is_leader: bool,
    leader: Option<String>,
    token: Option<i64>,
    lease_remaining_ms: Option<u64>,
    ttl_ms: u64,
    heartbeat_ms: u64,
    /// False while the app fails its health check (`app_health`).
    app_healthy: bool,
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The fields of the `/leader` body for a view.
pub fn leader_fields(shared: &Shared, view: leaderd_core::View) -> LeaderBody<'_> {
    let timing = shared.timing;
    LeaderBody {
        election: &shared.election,
        id: &shared.id,
        is_leader: view.is_leader,
        leader: view.leader,
        token: view.token,
        lease_remaining_ms: view.lease_remaining.map(millis),
        ttl_ms: millis(timing.ttl()),
        heartbeat_ms: millis(timing.heartbeat()),
        app_healthy: shared.app_healthy(),
    }
}

/// A JSON error answer: `{"error": message}`.
pub fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}
