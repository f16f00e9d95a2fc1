//! Requests on purpose, from this pod only: `POST /release` steps the
//! leader down (and holds or drains the replica), `POST /resume` ends a
//! hold or a drain. Both behind one set of guards (see `http`'s module
//! docs for why a loopback peer alone does not prove it is this pod).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::clock::boot_now;
use crate::http::body::{election, error, leader_fields, query, LeaderBody, Query, Refusal};
use crate::http::RELEASE_HEADER;
use crate::runtime::daemon::Daemon;
use crate::runtime::shared::Shared;

/// The guards of a request on purpose (see the module docs of `http`):
/// from 127.0.0.1 or ::1, no `Origin`, and `Leaderd-Release: 1`; else why
/// not (a 403).
fn from_this_pod(what: &str, peer: SocketAddr, headers: &HeaderMap) -> Result<(), String> {
    if !from_this_host(peer.ip()) {
        return Err(format!("{what} is only accepted from 127.0.0.1 or ::1"));
    }
    if headers.contains_key(header::ORIGIN) {
        return Err(format!(
            "{what} is not accepted from a web page (the request has an Origin)"
        ));
    }
    // The value too, as documented: a header some proxy or client adds
    // for its own reasons, with another value, asks for nothing.
    if headers
        .get(RELEASE_HEADER)
        .map(axum::http::HeaderValue::as_bytes)
        != Some(b"1")
    {
        return Err(format!(
            "{what} needs the request header `Leaderd-Release: 1` (`leaderd {what}` sends it)"
        ));
    }
    Ok(())
}

/// Whether a release's peer is this pod's own loopback address: 127.0.0.1
/// or ::1 only. The rest of 127.0.0.0/8 is loopback too, but a mesh
/// forwards outside traffic from there (Istio: 127.0.0.6).
fn from_this_host(ip: std::net::IpAddr) -> bool {
    match ip.to_canonical() {
        std::net::IpAddr::V4(v4) => v4 == std::net::Ipv4Addr::LOCALHOST,
        std::net::IpAddr::V6(v6) => v6 == std::net::Ipv6Addr::LOCALHOST,
    }
}

/// Largest `hold` a release may ask for.
const MAX_HOLD: Duration = Duration::from_secs(3600);

/// Steps down on request: 403 unless from this pod (see the module docs),
/// 400 for a bad `hold`, 409 when not leading, else 200 once the row is
/// released.
pub(super) async fn release(
    State(daemon): State<Arc<Daemon>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    if let Err(why) = from_this_pod("release", peer, &headers) {
        return error(StatusCode::FORBIDDEN, &why);
    }
    let q = match query(&uri, &["hold"]) {
        Ok(q) => q,
        Err(refusal) => return refusal.into_response(),
    };
    let mut hold = daemon.first().timing().heartbeat() * 2;
    if let Some(value) = q.value("hold") {
        match humantime::parse_duration(value) {
            Ok(d) if d <= MAX_HOLD => hold = d,
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "hold must be a duration of at most 1h, e.g. 2s or 500ms",
                )
            }
        }
    }
    let chosen = match chosen(&daemon, &q) {
        Ok(c) => c,
        Err(refusal) => return refusal.into_response(),
    };
    // The whole replica: drained for the hold, led elections or not. So is
    // a replica whose only election is named: held off it, it must be
    // nobody's successor (a release naming it would cost a window).
    let drain = q.election.is_none() || daemon.all().len() == 1;
    if drain {
        daemon.drain(hold);
    }
    // Each election's loop releases its own row, all at once.
    let answers =
        futures_util::future::join_all(chosen.iter().map(|s| s.release(hold, drain))).await;
    let mut released = false;
    let mut bodies = Vec::new();
    for (shared, answer) in chosen.iter().zip(answers) {
        match answer {
            Some(Ok(view)) => {
                released = true;
                bodies.push(leader_fields(shared, view));
            }
            Some(Err(view)) => bodies.push(leader_fields(shared, view)),
            None => return error(StatusCode::SERVICE_UNAVAILABLE, "the election has stopped"),
        }
    }
    let status = if released {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    let mut response = answer(status, bodies);
    // This replica steps aside, and the rows say nobody else competes.
    if (released || drain) && daemon.roster().others_competing(boot_now()) == Some(0) {
        response.headers_mut().insert(
            crate::http_client::WARNING_HEADER,
            axum::http::HeaderValue::from_static(
                "no other replica competes: nobody leads until one does, or until this \
                 replica's hold ends; end it now with `leaderd resume`",
            ),
        );
    }
    response
}

/// Ends a hold or a drain on request (`leaderd resume`), behind the same
/// guards as a release: 200 with the `/leader` body (a list for several
/// elections) once any election competes again, 409 when none was held or
/// draining. The replica asks at its next turn.
pub(super) async fn resume(
    State(daemon): State<Arc<Daemon>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    if let Err(why) = from_this_pod("resume", peer, &headers) {
        return error(StatusCode::FORBIDDEN, &why);
    }
    let q = match query(&uri, &[]) {
        Ok(q) => q,
        Err(refusal) => return refusal.into_response(),
    };
    let chosen = match chosen(&daemon, &q) {
        Ok(c) => c,
        Err(refusal) => return refusal.into_response(),
    };
    // The whole replica's drain ends too: it counts as present again for
    // the spread.
    let drained = daemon.resume();
    let answers = futures_util::future::join_all(chosen.iter().map(|s| s.resume())).await;
    let mut resumed = drained;
    for answer in answers {
        match answer {
            Some(ended) => resumed |= ended,
            None => return error(StatusCode::SERVICE_UNAVAILABLE, "the election has stopped"),
        }
    }
    let status = if resumed {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    answer(
        status,
        chosen.iter().map(|s| leader_fields(s, s.view())).collect(),
    )
}

/// The elections a request on purpose names (`?election`), or all of them.
fn chosen<'d>(daemon: &'d Daemon, q: &Query) -> Result<Vec<&'d Arc<Shared>>, Refusal> {
    match q.election {
        Some(_) => election(daemon, q).map(|s| vec![s]),
        None => Ok(daemon.all().iter().collect()),
    }
}

/// One election: its `/leader` body, as always; several: the list.
fn answer(status: StatusCode, mut bodies: Vec<LeaderBody<'_>>) -> Response {
    if bodies.len() == 1 {
        (status, Json(bodies.remove(0))).into_response()
    } else {
        (status, Json(bodies)).into_response()
    }
}
