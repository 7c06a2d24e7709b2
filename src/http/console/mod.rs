//! The web console: server-rendered pages for the people on the datacenter floor (overview,
//! racks, machines, one machine, the discovered queue, clusters and their rolling upgrades, live
//! events) and the actions a tech needs,
//! signed in with an API token (a server-side session; see `session`). Pages are HTML from `maud`
//! templates; the stylesheet and the small script that follows the live event stream are
//! embedded in the binary (`assets/`), nothing is loaded from elsewhere.
//!
//! A front door like the API: it asks the use cases (`crate::service`) and never touches the
//! store or another front door. Imports `domain`, `service` and the HTTP front door's shared parts.

mod actions;
mod clusters;
mod layout;
mod machine;
mod pages;
mod session;

use axum::http::header;
use axum::response::{IntoResponse, Redirect};
use axum::routing::{get, post};
use axum::Router;

use super::AppState;

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// The console's routes: `/` sends a browser to `/console`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/console") }))
        .route("/console", get(pages::overview))
        .route("/console/", get(|| async { Redirect::to("/console") }))
        .route(
            "/console/sign-in",
            get(session::sign_in_page).post(session::sign_in),
        )
        .route("/console/sign-out", post(session::sign_out))
        .route("/console/racks", get(pages::racks))
        .route("/console/machines", get(pages::machines))
        .route("/console/machines/{id}", get(machine::page))
        .route(
            "/console/machines/{id}/power",
            get(machine::power_state).post(actions::power),
        )
        .route("/console/machines/{id}/accept", post(actions::accept))
        .route("/console/machines/{id}/reject", post(actions::reject))
        .route("/console/machines/{id}/boot-once", post(actions::boot_once))
        .route("/console/machines/{id}/reinstall", post(actions::reinstall))
        .route(
            "/console/machines/{id}/reinstall/cancel",
            post(actions::cancel_reinstall),
        )
        .route("/console/machines/{id}/state", post(actions::set_state))
        .route("/console/clusters", get(clusters::list))
        .route("/console/clusters/{name}", get(clusters::page))
        .route(
            "/console/clusters/{name}/rollout",
            get(clusters::rollout_fragment),
        )
        .route(
            "/console/clusters/{name}/actions",
            get(clusters::actions_fragment),
        )
        .route(
            "/console/clusters/{name}/upgrade/{action}",
            post(clusters::action),
        )
        .route("/console/discovered", get(pages::discovered))
        .route("/console/events", get(pages::events))
        .route("/console/stream", get(pages::stream))
        .route("/console/assets/console.css", get(css))
        .route("/console/assets/console.js", get(js))
}

async fn css() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        CSS,
    )
}

async fn js() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        JS,
    )
}
