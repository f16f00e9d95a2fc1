//! What `/leader` and `/leader/watch` both send and read: the `/leader`
//! body, the JSON error answer, and the query (`?election=NAME`). Its own
//! module so that `http` (the routes) and `watch` (one of them) depend on
//! it, not on each other.

use std::sync::Arc;

use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::runtime::daemon::Daemon;
use crate::runtime::shared::Shared;

/// The `/leader` body.
#[derive(Serialize)]
pub struct LeaderBody<'a> {
    election: &'a str,
    id: &'a str,
    is_leader: bool,
    leader: Option<String>,
    /// Where the leader's app can be reached, as it advertised it.
    leader_address: Option<String>,
    token: Option<i64>,
    lease_remaining_ms: Option<u64>,
    ttl_ms: u64,
    heartbeat_ms: u64,
    /// False while the app fails its health check (`app_health`).
    app_healthy: bool,
    /// Whether this replica asks for the row; else why not, and what is
    /// left of its hold or drain.
    competing: bool,
    not_competing: Option<&'static str>,
    hold_remaining_ms: Option<u64>,
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The fields of the `/leader` body for a view.
pub fn leader_fields(shared: &Shared, view: leaderd_core::View) -> LeaderBody<'_> {
    let timing = shared.timing();
    LeaderBody {
        election: &shared.election,
        id: &shared.id,
        is_leader: view.is_leader,
        leader: view.leader,
        leader_address: view.leader_address,
        token: view.token,
        lease_remaining_ms: view.lease_remaining.map(millis),
        ttl_ms: millis(timing.ttl()),
        heartbeat_ms: millis(timing.heartbeat()),
        app_healthy: shared.app_healthy(),
        competing: view.standing.competing(),
        not_competing: view
            .standing
            .not_competing
            .map(leaderd_core::NotCompeting::as_str),
        hold_remaining_ms: view.standing.hold_remaining.map(millis),
    }
}

/// A JSON error answer: `{"error": message}`.
pub fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

/// A request refused for what it asked: its status and why.
#[derive(Debug)]
pub struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        error(self.0, &self.1)
    }
}

/// A request's query: `election`, and the other parameters a route allows.
#[derive(Debug, Default)]
pub struct Query {
    pub election: Option<String>,
    others: Vec<(String, String)>,
}

impl Query {
    /// The value of an allowed parameter, if given.
    pub fn value(&self, key: &str) -> Option<&str> {
        self.others
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads the query: `election` and the parameters in `allowed`, each at
/// most once; anything else is a 400 naming it (a typo must not silently
/// answer for another election).
pub fn query(uri: &Uri, allowed: &[&str]) -> Result<Query, Refusal> {
    let mut q = Query::default();
    let raw = uri.query().unwrap_or_default().as_bytes();
    for (key, value) in url::form_urlencoded::parse(raw) {
        let key = key.into_owned();
        let repeated = if key == "election" {
            q.election.replace(value.into_owned()).is_some()
        } else if allowed.contains(&key.as_ref()) {
            let repeated = q.value(&key).is_some();
            q.others.push((key.clone(), value.into_owned()));
            repeated
        } else {
            let known: Vec<&str> = std::iter::once("election")
                .chain(allowed.iter().copied())
                .collect();
            return Err(Refusal(
                StatusCode::BAD_REQUEST,
                format!("unknown parameter {key:?} (known: {})", known.join(", ")),
            ));
        };
        if repeated {
            return Err(Refusal(
                StatusCode::BAD_REQUEST,
                format!("parameter {key:?} given twice"),
            ));
        }
    }
    Ok(q)
}

/// The election a query names (the first when it names none), or a 404
/// naming it.
pub fn election<'d>(daemon: &'d Daemon, q: &Query) -> Result<&'d Arc<Shared>, Refusal> {
    daemon
        .find(q.election.as_deref())
        .map_err(|e| Refusal(StatusCode::NOT_FOUND, e.to_string()))
}
