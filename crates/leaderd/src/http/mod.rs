//! The HTTP edge (this folder: the router here, `watch` for the event
//! stream, `body` for the bodies, `server` for the connections' limits,
//! `control` for `POST /release` and `POST /resume`, `release` for their
//! command-line client). The HTTP surface: `/leader`, `/elections`, `/`,
//! `/healthz`, `/readyz`, `/metrics`, `POST /release`, `POST /resume`, and
//! `/leader/watch` (see `watch`).
//! `/leader`, `/leader/watch` and `/release` take `?election=NAME` (404
//! naming it when unknown); without it they answer for the first election
//! (`/release`: release all).
//!
//! `POST /release` steps the leader down (and `POST /resume` makes a held
//! replica compete), so it must come from this pod, and
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

pub mod body;
mod control;
pub mod release;
pub mod server;
pub mod watch;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use std::net::SocketAddr;

use axum::http::Uri;

use crate::http::body::{election, error, leader_fields, query, LeaderBody};
use crate::runtime::daemon::Daemon;
use crate::runtime::shared::Shared;

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
pub fn router(daemon: Arc<Daemon>, release_at: ReleaseAt) -> Router {
    let release_route = match release_at {
        ReleaseAt::Here => post(control::release),
        ReleaseAt::Elsewhere(addr) => post(move || async move {
            error(
                StatusCode::FORBIDDEN,
                &format!("POST /release is served on the loopback listener {addr} only"),
            )
        }),
    };
    Router::new()
        .route("/leader", get(leader))
        .route("/leader/watch", crate::http::watch::route(daemon.clone()))
        .route("/elections", get(elections))
        .route("/release", release_route)
        .route("/resume", resume_route(release_at))
        .route("/", get(compat))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(refuse_bodies))
        .with_state(daemon)
}

/// `POST /resume`, where `POST /release` is served (see [`ReleaseAt`]).
fn resume_route(release_at: ReleaseAt) -> axum::routing::MethodRouter<Arc<Daemon>> {
    match release_at {
        ReleaseAt::Here => post(control::resume),
        ReleaseAt::Elsewhere(addr) => post(move || async move {
            error(
                StatusCode::FORBIDDEN,
                &format!("POST /resume is served on the loopback listener {addr} only"),
            )
        }),
    }
}

/// The loopback listener's router when `listen` is not loopback: `/release`
/// and `/resume` alone.
pub fn release_router(daemon: Arc<Daemon>) -> Router {
    Router::new()
        .route("/release", post(control::release))
        .route("/resume", post(control::resume))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(refuse_bodies))
        .with_state(daemon)
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

async fn leader(State(daemon): State<Arc<Daemon>>, uri: Uri) -> Response {
    let shared = match query(&uri, &[]).and_then(|q| election(&daemon, &q)) {
        Ok(s) => s,
        Err(refusal) => return refusal.into_response(),
    };
    let view = shared.view();
    let status = if view.is_leader {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, leader_body(shared, view)).into_response()
}

/// Every election with its `/leader` body, in the configured order.
async fn elections(State(daemon): State<Arc<Daemon>>) -> Response {
    let list: Vec<_> = daemon
        .all()
        .iter()
        .map(|s| leader_fields(s, s.view()))
        .collect();
    Json(list).into_response()
}

/// The `/leader` body for a view.
fn leader_body(shared: &Shared, view: leaderd_core::View) -> Json<LeaderBody<'_>> {
    Json(leader_fields(shared, view))
}

/// The Kubernetes `election` sidecar's answer, for drop-in use.
async fn compat(State(daemon): State<Arc<Daemon>>) -> Json<serde_json::Value> {
    let name = daemon.first().view().leader.unwrap_or_default();
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

async fn healthz(State(daemon): State<Arc<Daemon>>) -> Response {
    status_json(daemon.healthy(), "election loop")
}

async fn readyz(State(daemon): State<Arc<Daemon>>) -> Response {
    // Not before the replica is a candidate to be named (see `Roster`).
    status_json(daemon.db_up() && daemon.roster().begun(), "database")
}

async fn metrics(State(daemon): State<Arc<Daemon>>) -> Response {
    let body = daemon.render_metrics();
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
    use crate::runtime::shared::Control;
    use axum::body::Body;
    use axum::http::{Method, Request};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn daemon_of(args: &[&str]) -> Arc<Daemon> {
        let argv = ["leaderd", "--id", "pod-a"].iter().chain(args);
        let cli = <crate::cli::Cli as clap::Parser>::try_parse_from(argv).unwrap();
        let settings =
            crate::settings::Settings::load(&cli.config(), &crate::settings::ProcessEnv).unwrap();
        Arc::new(Daemon::new(&settings.each_election()))
    }

    fn daemon() -> Arc<Daemon> {
        daemon_of(&[])
    }

    async fn call(method: Method, uri: &str) -> (StatusCode, String) {
        call_from(method, uri, SocketAddr::from(([127, 0, 0, 1], 50000))).await
    }

    async fn call_from(method: Method, uri: &str, peer: SocketAddr) -> (StatusCode, String) {
        let ok = [(RELEASE_HEADER, "1")];
        call_with(daemon(), method, uri, peer, &ok, ReleaseAt::Here).await
    }

    async fn call_with(
        daemon: Arc<Daemon>,
        method: Method,
        uri: &str,
        peer: SocketAddr,
        headers: &[(&str, &str)],
        release_at: ReleaseAt,
    ) -> (StatusCode, String) {
        // Stand-ins for the election loops: they answer release requests as
        // followers do. Ended with the call: an election's wake-up has one
        // waiter, its loop.
        let mut stand_ins = tokio::task::JoinSet::new();
        for shared in daemon.all() {
            let shared = shared.clone();
            stand_ins.spawn(async move {
                loop {
                    if let Control::Release { reply, .. } = shared.next_control().await {
                        let _ = reply.send(Err(leaderd_core::View {
                            is_leader: false,
                            leader: None,
                            leader_address: None,
                            token: None,
                            lease_remaining: None,
                            standing: leaderd_core::Standing {
                                not_competing: None,
                                hold_remaining: None,
                            },
                        }));
                    }
                }
            });
        }
        let mut req = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req.body(Body::empty()).unwrap();
        let app =
            router(daemon, release_at).layer(axum::extract::connect_info::MockConnectInfo(peer));
        let res = app.oneshot(req).await.unwrap();
        let status = res.status();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        stand_ins.shutdown().await;
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
    /// localhost: neither gets a release.
    #[tokio::test]
    async fn release_needs_its_header_no_origin_and_the_loopback_listener() {
        let local = SocketAddr::from(([127, 0, 0, 1], 50000));
        let here = ReleaseAt::Here;
        let (status, body) = call_with(daemon(), Method::POST, "/release", local, &[], here).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(body.contains("Leaderd-Release"), "{body}");
        for other in ["0", "", "true", "yes"] {
            let wrong = [(RELEASE_HEADER, other)];
            let (status, body) =
                call_with(daemon(), Method::POST, "/release", local, &wrong, here).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{other:?}: {body}");
        }
        let browser = [(RELEASE_HEADER, "1"), ("origin", "https://evil.example")];
        let (status, body) =
            call_with(daemon(), Method::POST, "/release", local, &browser, here).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        let ok = [(RELEASE_HEADER, "1")];
        let (status, body) = call_with(daemon(), Method::POST, "/release", local, &ok, here).await;
        assert_eq!(status, StatusCode::CONFLICT, "not leading: {body}");
        // The header from a mesh's loopback source (Istio forwards from
        // 127.0.0.6) is still refused: only 127.0.0.1 and ::1 are this pod.
        for mesh in ["127.0.0.6:50000", "127.1.2.3:50000"] {
            let peer: SocketAddr = mesh.parse().unwrap();
            let (status, body) =
                call_with(daemon(), Method::POST, "/release", peer, &ok, here).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{mesh}: {body}");
        }
        let v6: SocketAddr = "[::1]:50000".parse().unwrap();
        let (status, body) = call_with(daemon(), Method::POST, "/release", v6, &ok, here).await;
        assert_eq!(status, StatusCode::CONFLICT, "::1: {body}");
        let elsewhere = ReleaseAt::Elsewhere(SocketAddr::from(([127, 0, 0, 1], 4041)));
        let (status, body) =
            call_with(daemon(), Method::POST, "/release", local, &ok, elsewhere).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(body.contains("127.0.0.1:4041"), "{body}");
    }

    /// A replica held off its only election drains (nobody names it a
    /// successor); held off one election of several, it stays a candidate
    /// for the others.
    #[tokio::test]
    async fn a_hold_on_the_only_election_drains_the_replica() {
        let local = SocketAddr::from(([127, 0, 0, 1], 50000));
        let ok = [(RELEASE_HEADER, "1")];
        let now = || crate::clock::boot_now();
        let one = daemon_of(&["--election", "jobs"]);
        let uri = "/release?election=jobs&hold=30s";
        call_with(one.clone(), Method::POST, uri, local, &ok, ReleaseAt::Here).await;
        assert!(one.draining(now()), "held off its only election");
        let several = daemon_of(&["--election", "mailer", "--election", "reports"]);
        let uri = "/release?election=reports&hold=30s";
        call_with(
            several.clone(),
            Method::POST,
            uri,
            local,
            &ok,
            ReleaseAt::Here,
        )
        .await;
        assert!(!several.draining(now()), "one of two: still a candidate");
        call_with(
            several.clone(),
            Method::POST,
            "/release?hold=30s",
            local,
            &ok,
            ReleaseAt::Here,
        )
        .await;
        assert!(several.draining(now()), "all of them");
    }

    #[tokio::test]
    async fn request_bodies_are_refused() {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/release")
            .header("content-length", "5")
            .body(Body::from("hello"))
            .unwrap();
        let res = router(daemon(), ReleaseAt::Here)
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

    /// An election's series carry its name; the daemon's own (timings,
    /// its counters) carry none, once whatever the number of elections.
    #[tokio::test]
    async fn metrics_are_labelled_with_the_election_they_are_of() {
        let (status, body) = call(Method::GET, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        for name in [
            "leaderd_is_leader",
            "leaderd_fencing_token",
            "leaderd_transitions_total",
            "leaderd_heartbeat_duration_seconds",
            "leaderd_renewal_duration_seconds",
            "leaderd_renew_interval_seconds",
            "leaderd_heartbeat_errors_total",
            "leaderd_lease_remaining_seconds",
            "leaderd_db_up",
            "leaderd_duplicate_id_elections",
            "leaderd_log_lines_dropped_total",
        ] {
            assert!(body.contains(name), "{name} missing");
        }
        let daemons = crate::outputs::metrics::PER_DAEMON;
        for line in body.lines().filter(|l| !l.starts_with('#')) {
            let daemon = daemons.iter().any(|d| line.starts_with(d));
            assert_eq!(
                line.contains("election=\"default\""),
                !daemon,
                "labelled wrong: {line}"
            );
        }
    }

    /// Several elections: each answers by name, unknown names are 404
    /// naming them, and one scrape holds one family per metric with a
    /// series per election.
    #[tokio::test]
    async fn several_elections_answer_by_name() {
        let several = || daemon_of(&["--election", "mailer", "--election", "reports"]);
        let peer = SocketAddr::from(([127, 0, 0, 1], 50000));
        let ask =
            |uri: &'static str| call_with(several(), Method::GET, uri, peer, &[], ReleaseAt::Here);
        let (status, body) = ask("/leader").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("\"election\":\"mailer\""), "{body}");
        let (status, body) = ask("/leader?election=reports").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("\"election\":\"reports\""), "{body}");
        let (status, body) = ask("/leader?election=nope").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(
            body.contains("nope") && body.contains("mailer, reports"),
            "{body}"
        );
        assert_eq!(
            ask("/leader/watch?election=nope").await.0,
            StatusCode::NOT_FOUND
        );
        for bad in ["/leader?electoin=reports", "/leader?election=a&election=b"] {
            assert_eq!(ask(bad).await.0, StatusCode::BAD_REQUEST, "{bad}");
        }
        let (status, body) = ask("/elections").await;
        assert_eq!(status, StatusCode::OK);
        let list: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        let names: Vec<_> = list
            .iter()
            .map(|v| v["election"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["mailer", "reports"]);
        let (_, body) = ask("/metrics").await;
        assert_eq!(
            body.matches("# TYPE leaderd_is_leader ").count(),
            1,
            "{body}"
        );
        for election in ["mailer", "reports"] {
            let series = format!("leaderd_is_leader{{election=\"{election}\"}} 0");
            assert!(body.contains(&series), "{series} missing: {body}");
        }
        let release = |uri: &'static str| {
            let ok = [(RELEASE_HEADER, "1")];
            async move { call_with(several(), Method::POST, uri, peer, &ok, ReleaseAt::Here).await }
        };
        let (status, body) = release("/release").await;
        assert_eq!(status, StatusCode::CONFLICT, "nobody leads: {body}");
        assert_eq!(
            serde_json::from_str::<Vec<serde_json::Value>>(&body)
                .unwrap()
                .len(),
            2
        );
        let (status, body) = release("/release?election=reports&hold=1s").await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert!(body.contains("\"election\":\"reports\""), "{body}");
        assert_eq!(
            release("/release?election=nope").await.0,
            StatusCode::NOT_FOUND
        );
    }
}
