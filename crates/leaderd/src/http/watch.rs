//! `GET /leader/watch`: Server-Sent Events, one `leader` event with the
//! `/leader` body at connect and at every change of `is_leader`, `leader` or
//! `token` (a local deadline passing included), and a comment line every
//! 15 s so that proxies keep an idle stream open.
//!
//! Watchers sleep on one watch channel that the election loop updates
//! ([`Shared::publish`]); while nothing changes they cost no work. Each
//! event is computed afresh when sent, so it is never older than the change
//! that woke it. Watchers are capped below the server's connection limit so
//! that probes of `/leader` always find a free slot.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::Extension;
use futures_util::stream::{self, Stream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::http::body::{election, error, leader_fields, query};
use crate::http::server::{ProbeSlot, MAX_CONNECTIONS};
use crate::runtime::daemon::Daemon;
use crate::runtime::shared::{Leadership, Shared};

/// Most streams open at once: the server's connection limit less a few
/// slots for `/leader`, `/metrics` and the kubelet's probes.
pub const MAX_WATCHERS: usize = MAX_CONNECTIONS - 24;

/// How often an idle stream gets a comment line.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

#[derive(Clone)]
struct Watchers {
    daemon: Arc<Daemon>,
    permits: Arc<Semaphore>,
}

/// The `/leader/watch` route (`?election=NAME`, else the first), with its
/// own cap on open streams, whatever election they watch.
pub fn route<S>(daemon: Arc<Daemon>) -> MethodRouter<S> {
    get(watch).with_state(Watchers {
        daemon,
        permits: Arc::new(Semaphore::new(MAX_WATCHERS)),
    })
}

async fn watch(
    State(w): State<Watchers>,
    probe: Option<Extension<ProbeSlot>>,
    uri: Uri,
) -> Response {
    let shared = match query(&uri, &[]).and_then(|q| election(&w.daemon, &q)) {
        Ok(s) => s.clone(),
        Err(refusal) => return refusal.into_response(),
    };
    if probe.is_some() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "every connection slot is taken; poll /leader instead",
        );
    }
    let Ok(permit) = w.permits.clone().try_acquire_owned() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many watchers; poll /leader instead",
        );
    };
    Sse::new(events(shared, permit))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

/// The first event at once, then one per change; the permit lives as long
/// as the stream.
fn events(
    shared: Arc<Shared>,
    permit: OwnedSemaphorePermit,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let changes = shared.subscribe();
    stream::unfold(
        (shared, changes, None::<Leadership>, permit),
        |(shared, mut changes, last, permit)| async move {
            loop {
                if last.is_some() && changes.changed().await.is_err() {
                    return None;
                }
                changes.mark_unchanged();
                let view = shared.view();
                let now = Leadership::from(view.clone());
                if last.as_ref() == Some(&now) {
                    continue;
                }
                let body = serde_json::to_string(&leader_fields(&shared, view))
                    .expect("the /leader body always serialises");
                let event = Event::default().event("leader").data(body);
                return Some((Ok(event), (shared, changes, Some(now), permit)));
            }
        },
    )
}
