//! The HTTP surface: `/leader`, `/`, `/healthz`, `/readyz`, `/metrics`,
//! `POST /release`, and `/leader/watch` (see `watch`).
//!
//! `POST /release` steps the leader down, so it must come from this pod, and
//! a loopback peer does not prove that: a service mesh forwards outside
//! traffic from loopback (Istio's inbound passthrough uses 127.0.0.6) and a
//! browser page can send a simple cross-origin POST to localhost. So it is
//! served on a loopback listener only (a second one, `release_listen`, when
//! `listen` is not loopback), and refused unless the request carries
//! [`RELEASE_HEADER`] and no `Origin` (a browser cannot add the one without
//! a preflight, which is refused, and always sends the other).
//!
//! Every answer is computed from the engine at the moment of the request, so a
//! process that was paused past its deadline answers 503 on its first request
//! after resuming.

use std::sync::Arc;

use axum::extract::ConnectInfo;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::Uri;

use crate::body::{error, leader_fields, LeaderBody};
use crate::election::{Control, Shared};

/// The request header `POST /release` needs (`leaderd release` sends it).
pub const RELEASE_HEADER: &str = "leaderd-release";

/// Where `POST /release` is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAt {
    /// On this router's listener (it is on loopback).
    Here,
    /// On a loopback listener of its own, at this address.
    Elsewhere(SocketAddr),
}

/// Builds the router; tests drive it with `oneshot`, no socket needed.
pub fn router(shared: Arc<Shared>, release_at: ReleaseAt) -> Router {
    let release_route = match release_at {
        ReleaseAt::Here => post(release),
        ReleaseAt::Elsewhere(addr) => post(move || async move {
            error(
                StatusCode::FORBIDDEN,
                &format!("POST /release is served on the loopback listener {addr} only"),
            )
        }),
    };
    Router::new()
        .route("/leader", get(leader))
        .route("/leader/watch", crate::watch::route(shared.clone()))
        .route("/release", release_route)
        .route("/", get(compat))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(refuse_bodies))
        .with_state(shared)
}

/// The loopback listener's router when `listen` is not loopback: `/release`
/// alone.
pub fn release_router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/release", post(release))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(refuse_bodies))
        .with_state(shared)
}

/// No endpoint takes a body (`/release` neither): refuse any, unread.
async fn refuse_bodies(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let headers = req.headers();
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    if has_body {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request bodies are not accepted",
        );
    }
    next.run(req).await
}

async fn leader(State(shared): State<Arc<Shared>>) -> Response {
    let view = shared.view();
    let status = if view.is_leader {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, leader_body(&shared, view)).into_response()
}

/// Largest `hold` a release may ask for.
const MAX_HOLD: Duration = Duration::from_secs(3600);

/// Steps down on request: 403 unless from this pod (see the module docs),
/// 400 for a bad `hold`, 409 when not leading, else 200 once the row is
/// released.
async fn release(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: axum::http::HeaderMap,
    uri: Uri,
) -> Response {
    if !peer.ip().to_canonical().is_loopback() {
        return error(
            StatusCode::FORBIDDEN,
            "release is only accepted from loopback",
        );
    }
    if headers.contains_key(header::ORIGIN) {
        return error(
            StatusCode::FORBIDDEN,
            "release is not accepted from a web page (the request has an Origin)",
        );
    }
    if !headers.contains_key(RELEASE_HEADER) {
        return error(
            StatusCode::FORBIDDEN,
            "release needs the request header `Leaderd-Release: 1` (`leaderd release` sends it)",
        );
    }
    let mut hold = shared.timing.heartbeat() * 2;
    for (key, value) in url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()) {
        match (key.as_ref(), humantime::parse_duration(&value)) {
            ("hold", Ok(d)) if d <= MAX_HOLD => hold = d,
            ("hold", _) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "hold must be a duration of at most 1h, e.g. 2s or 500ms",
                )
            }
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "unknown parameter (only hold=DURATION)",
                )
            }
        }
    }
    let (reply, answer) = tokio::sync::oneshot::channel();
    if !shared.control(Control::Release { hold, reply }).await {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the election has stopped");
    }
    match answer.await {
        Ok(Ok(view)) => (StatusCode::OK, leader_body(&shared, view)).into_response(),
        Ok(Err(view)) => (StatusCode::CONFLICT, leader_body(&shared, view)).into_response(),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "the election has stopped"),
    }
}

/// The `/leader` body for a view.
fn leader_body(shared: &Shared, view: leaderd_core::View) -> Json<LeaderBody<'_>> {
    Json(leader_fields(shared, view))
}

/// The Kubernetes `election` sidecar's answer, for drop-in use.
async fn compat(State(shared): State<Arc<Shared>>) -> Json<serde_json::Value> {
    let name = shared.view().leader.unwrap_or_default();
    Json(serde_json::json!({ "name": name }))
}

fn status_json(ok: bool, what: &str) -> Response {
    let (code, status) = if ok {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
    };
    (
        code,
        Json(serde_json::json!({ "status": status, "check": what })),
    )
        .into_response()
}

async fn healthz(State(shared): State<Arc<Shared>>) -> Response {
    status_json(shared.healthy(), "election loop")
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    status_json(shared.db_up(), "database")
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let body = shared.metrics.render(&shared.view(), shared.db_up());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not found")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Method, Request};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn shared() -> Arc<Shared> {
        let cli = <crate::cli::Cli as clap::Parser>::try_parse_from(["leaderd", "--id", "pod-a"])
            .unwrap();
        let settings =
            crate::settings::Settings::load(&cli.config, &crate::settings::ProcessEnv).unwrap();
        Arc::new(Shared::new(&settings))
    }

    async fn call(method: Method, uri: &str) -> (StatusCode, String) {
        call_from(method, uri, SocketAddr::from(([127, 0, 0, 1], 50000))).await
    }

    async fn call_from(method: Method, uri: &str, peer: SocketAddr) -> (StatusCode, String) {
        call_with(method, uri, peer, &[(RELEASE_HEADER, "1")], ReleaseAt::Here).await
    }

    async fn call_with(
        method: Method,
        uri: &str,
        peer: SocketAddr,
        headers: &[(&str, &str)],
        release_at: ReleaseAt,
    ) -> (StatusCode, String) {
        let shared = shared();
        // A stand-in for the election loop: it answers release requests as
        // a follower does.
        let rx = shared.take_control();
        tokio::spawn(async move {
            let mut rx = rx;
            while let Some(request) = rx.recv().await {
                if let Control::Release { reply, .. } = request {
                    let _ = reply.send(Err(leaderd_core::View {
                        is_leader: false,
                        leader: None,
                        token: None,
                        lease_remaining: None,
                    }));
                }
            }
        });
        let mut req = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req.body(Body::empty()).unwrap();
        let app =
            router(shared, release_at).layer(axum::extract::connect_info::MockConnectInfo(peer));
        let res = app.oneshot(req).await.unwrap();
        let status = res.status();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn follower_answers_503_with_the_full_body() {
        let (status, body) = call(Method::GET, "/leader").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["is_leader"], false);
        assert_eq!(v["id"], "pod-a");
        assert_eq!(v["election"], "default");
        assert_eq!(v["leader"], serde_json::Value::Null);
        assert_eq!(v["ttl_ms"], 1200);
        assert_eq!(v["heartbeat_ms"], 1000);
    }

    #[tokio::test]
    async fn compat_root_always_answers_200() {
        let (status, body) = call(Method::GET, "/").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, r#"{"name":""}"#);
    }

    #[tokio::test]
    async fn unknown_paths_and_methods() {
        assert_eq!(call(Method::GET, "/nope").await.0, StatusCode::NOT_FOUND);
        assert_eq!(
            call(Method::POST, "/leader").await.0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            call(Method::DELETE, "/metrics").await.0,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[tokio::test]
    async fn release_is_for_loopback_peers_and_leaders_only() {
        let outside = SocketAddr::from(([10, 0, 0, 7], 50000));
        assert_eq!(
            call_from(Method::POST, "/release", outside).await.0,
            StatusCode::FORBIDDEN
        );
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5000".parse().unwrap();
        let (status, body) = call_from(Method::POST, "/release", mapped).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(body.contains("\"is_leader\":false"), "{body}");
        for bad in ["/release?hold=2h", "/release?hold=soon", "/release?x=1"] {
            assert_eq!(
                call(Method::POST, bad).await.0,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
        assert_eq!(
            call(Method::POST, "/release?hold=30s").await.0,
            StatusCode::CONFLICT
        );
        assert_eq!(
            call(Method::GET, "/release").await.0,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    /// A mesh forwards from loopback and a browser page can POST to
    /// localhost: neither gets a release (spec, Handover).
    #[tokio::test]
    async fn release_needs_its_header_no_origin_and_the_loopback_listener() {
        let local = SocketAddr::from(([127, 0, 0, 6], 50000));
        let here = ReleaseAt::Here;
        let (status, body) = call_with(Method::POST, "/release", local, &[], here).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(body.contains("Leaderd-Release"), "{body}");
        let browser = [(RELEASE_HEADER, "1"), ("origin", "https://evil.example")];
        let (status, body) = call_with(Method::POST, "/release", local, &browser, here).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        let ok = [(RELEASE_HEADER, "1")];
        let (status, body) = call_with(Method::POST, "/release", local, &ok, here).await;
        assert_eq!(status, StatusCode::CONFLICT, "not leading: {body}");
        let elsewhere = ReleaseAt::Elsewhere(SocketAddr::from(([127, 0, 0, 1], 4041)));
        let (status, body) = call_with(Method::POST, "/release", local, &ok, elsewhere).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(body.contains("127.0.0.1:4041"), "{body}");
    }

    #[tokio::test]
    async fn request_bodies_are_refused() {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/release")
            .header("content-length", "5")
            .body(Body::from("hello"))
            .unwrap();
        let res = router(shared(), ReleaseAt::Here)
            .layer(axum::extract::connect_info::MockConnectInfo(
                SocketAddr::from(([127, 0, 0, 1], 1)),
            ))
            .oneshot(req)
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn readiness_needs_a_database_round_trip() {
        assert_eq!(
            call(Method::GET, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(call(Method::GET, "/healthz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn metrics_are_labelled_with_the_election() {
        let (status, body) = call(Method::GET, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        for name in [
            "leaderd_is_leader",
            "leaderd_fencing_token",
            "leaderd_transitions_total",
            "leaderd_heartbeat_duration_seconds",
            "leaderd_heartbeat_errors_total",
            "leaderd_lease_remaining_seconds",
            "leaderd_db_up",
            "leaderd_duplicate_id_total",
            "leaderd_log_lines_dropped_total",
        ] {
            assert!(body.contains(name), "{name} missing");
        }
        for line in body.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.contains("election=\"default\""), "unlabelled: {line}");
        }
    }
}
