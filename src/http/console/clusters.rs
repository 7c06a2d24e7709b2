//! The declared clusters and their rolling Talos upgrades (issue #20): the list
//! (`/console/clusters`: version, node count, rollout state), one cluster's page with its newest
//! rollout (target, state, phase, why it stopped, each node in rollout order with its step and
//! what Plinth saw last), and the rollout's actions: pause (operators), resume and abort
//! (admins; an abort needs the cluster's name typed), the same roles as the API's, each an event
//! naming the signed-in token (the upgrade use cases write it).
//!
//! The page follows the rollout without a reload: its script re-fetches the fragment routes
//! (`.../rollout`, `.../actions`, `/console/clusters?part=table`) when the event stream
//! (`/console/stream?cluster=NAME`) brings one of the cluster's events, and every 5 s while a
//! rollout is active (steps that write no event, and a stream that broke). Without the script the
//! pages are complete; a reload shows the same.
//!
//! Imports `service` (clusters, upgrades and their port types) and the console's shared parts.

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{html, Markup};
use serde::Deserialize;

use super::layout::{self, csrf, state, when};
use super::pages::{event_item, of_cluster};
use super::session::{Action, ConsoleError, Signed};
use crate::domain::Role;
use crate::http::AppState;
use crate::service::ports::upgrades::{NodeStep, RolloutState};
use crate::service::upgrade::{RolloutStatus, UpgradeError};
use crate::service::{ApiRole, EventFilter};

/// Events of the cluster shown on its page at most (newest first).
const EVENTS_SHOWN: usize = 50;
/// `upgrade.` events read to find them (events carry the cluster in their detail only).
const EVENTS_READ: u32 = 1000;

impl From<UpgradeError> for ConsoleError {
    fn from(e: UpgradeError) -> Self {
        match e {
            UpgradeError::Service(e) => ConsoleError::from(e),
            other => ConsoleError::new(StatusCode::CONFLICT, other.to_string()),
        }
    }
}

/// A rollout's or a node's state as a badge: a colour and the state in words.
fn badge(word: &str) -> Markup {
    html! { span class={ "state st-" (word) } { (word.replace('_', " ")) } }
}

/// Nodes done (or skipped) of all.
fn progress(r: &RolloutStatus) -> (usize, usize) {
    let done = r.nodes.iter().filter(|n| n.step.succeeded()).count();
    (done, r.nodes.len())
}

/// Where the rollout stands, in a sentence: the batch in flight or next, or how it ended.
fn phase(r: &RolloutStatus) -> String {
    let batches = r.nodes.iter().map(|n| n.batch).max().map_or(0, |b| b + 1);
    let names = |step: fn(NodeStep) -> bool| -> Vec<String> {
        r.nodes
            .iter()
            .filter(|n| step(n.step))
            .map(|n| format!("{} ({})", n.name, n.step.as_str().replace('_', " ")))
            .collect()
    };
    let part = |batch: u32| -> &str {
        let cp = r
            .nodes
            .iter()
            .any(|n| n.batch == batch && n.role == Role::ControlPlane);
        if cp {
            "control plane"
        } else {
            "workers"
        }
    };
    match r.rollout.state {
        RolloutState::Done => format!("finished: every node runs {}", r.rollout.to_version),
        RolloutState::Failed | RolloutState::Aborted => {
            let stopped = names(|s| {
                matches!(
                    s,
                    NodeStep::Failed | NodeStep::RolledBack | NodeStep::Aborted
                )
            });
            if stopped.is_empty() {
                format!("stopped ({})", r.rollout.state)
            } else {
                format!("stopped at {}", stopped.join(", "))
            }
        }
        RolloutState::Running | RolloutState::Paused => {
            let flying: Vec<&_> = r.nodes.iter().filter(|n| n.step.in_flight()).collect();
            let paused = r.rollout.state == RolloutState::Paused;
            if let Some(first) = flying.first() {
                format!(
                    "{}, batch {} of {batches}: {} in flight{}",
                    part(first.batch),
                    first.batch + 1,
                    names(NodeStep::in_flight).join(", "),
                    if paused {
                        " (it finishes; no further node starts)"
                    } else {
                        ""
                    }
                )
            } else if let Some(next) = r.nodes.iter().find(|n| n.step == NodeStep::Pending) {
                format!(
                    "next {}, batch {} of {batches} ({}) {}",
                    part(next.batch),
                    next.batch + 1,
                    next.name,
                    if paused {
                        "waits for resume"
                    } else {
                        "about to start"
                    }
                )
            } else {
                "every node finished; the rollout ends".to_string()
            }
        }
    }
}

/// The rollout in one line (the overview, the list, the page's live status).
fn summary(r: &RolloutStatus) -> String {
    let (done, all) = progress(r);
    format!(
        "Rollout to {} {}: {done} of {all} nodes done; {}",
        r.rollout.to_version,
        r.rollout.state,
        phase(r)
    )
}

/// One row per declared cluster: name, Talos version, node count and its newest rollout.
struct ClusterRow {
    name: String,
    version: String,
    nodes: usize,
    rollout: Option<RolloutStatus>,
}

async fn rows(s: &AppState) -> Result<Vec<ClusterRow>, ConsoleError> {
    let clusters = s.workflows.clusters();
    let mut out = Vec::new();
    for name in clusters.names().await? {
        let spec = clusters.spec(&name).await?;
        let nodes = clusters.cluster_nodes(&name).await?.len();
        let rollout = s.upgrades.latest(&name).await?;
        out.push(ClusterRow {
            name,
            version: spec.talos_version,
            nodes,
            rollout,
        });
    }
    Ok(out)
}

/// The cluster table (the list page and the overview's section); `data-active` while a rollout
/// is running or paused, so the script polls.
fn table(rows: &[ClusterRow]) -> Markup {
    let active = rows.iter().any(|c| {
        c.rollout
            .as_ref()
            .is_some_and(|r| r.rollout.state.is_active())
    });
    html! {
        div.fragment data-active=[active.then_some("1")] {
            @if rows.is_empty() {
                p { "No cluster is declared (" code { "plinth apply" } ")." }
            } @else {
                div.scroll { table #clusters {
                    thead { tr { th { "Cluster" } th { "Talos" } th { "Nodes" } th { "Rolling upgrade" } } }
                    tbody {
                        @for c in rows {
                            tr data-cluster=(c.name) {
                                td { a href={ "/console/clusters/" (urlpath(&c.name)) } { (c.name) } }
                                td { (c.version) }
                                td { (c.nodes) }
                                td {
                                    @match &c.rollout {
                                        Some(r) => {
                                            @let (done, all) = progress(r);
                                            (badge(r.rollout.state.as_str()))
                                            " to " (r.rollout.to_version) ", " (done) " of " (all) " nodes done"
                                            br; small { (phase(r)) }
                                        }
                                        None => { "none yet" }
                                    }
                                }
                            }
                        }
                    }
                } }
            }
        }
    }
}

/// Which part of the list page (`part=table`: the table alone, for the script).
#[derive(Debug, Default, Deserialize)]
pub struct ListParams {
    part: Option<String>,
}

/// A fragment answer: HTML, never cached.
fn fragment(m: Markup) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        m.into_string(),
    )
        .into_response()
}

/// The cluster table as the overview and the list page show it, followed live.
pub async fn live_table(s: &AppState) -> Result<Markup, ConsoleError> {
    let rows = rows(s).await?;
    Ok(html! {
        p.live aria-live="polite" { span.status data-status-for="clusters-live" { "Connecting to the live stream…" } }
        div #clusters-live data-fragment="/console/clusters?part=table" data-stream="/console/stream?kind=upgrade." {
            (table(&rows))
        }
    })
}

/// The declared clusters.
pub async fn list(
    State(s): State<AppState>,
    who: Signed,
    Query(p): Query<ListParams>,
) -> Result<Response, ConsoleError> {
    if p.part.as_deref() == Some("table") {
        return Ok(fragment(table(&rows(&s).await?)));
    }
    let body = html! {
        h1 { "Clusters" }
        (live_table(&s).await?)
        p.hint { "Start a rolling upgrade with " code { "plinth cluster upgrade NAME --to VERSION" } " (admins); its progress shows here." }
    };
    Ok(layout::page(&who, "/console/clusters", "Clusters", body).into_response())
}

/// The rollout part of a cluster's page: `data-state` (for the actions part) and `data-active`
/// (the script polls while it is set) on its root.
fn rollout_part(name: &str, latest: Option<&RolloutStatus>) -> Markup {
    let Some(r) = latest else {
        return html! {
            div.fragment data-state="none" data-summary={ "No rolling upgrade of " (name) " yet." } {
                p { "No rolling upgrade has run on this cluster. An admin starts one with "
                    code { "plinth cluster upgrade " (name) " --to VERSION" } "." }
            }
        };
    };
    let ro = &r.rollout;
    let (done, all) = progress(r);
    let stopped = r.nodes.iter().find(|n| {
        matches!(
            n.step,
            NodeStep::Failed | NodeStep::RolledBack | NodeStep::Aborted
        )
    });
    html! {
        div.fragment data-state=(ro.state.as_str()) data-active=[ro.state.is_active().then_some("1")] data-summary=(summary(r)) {
            dl.facts #rollout-facts {
                dt { "Target" } dd #rollout-target { "Talos " (ro.to_version) br; small { "installer " code { (ro.installer) } } }
                dt { "State" } dd #rollout-state {
                    (badge(ro.state.as_str()))
                    @match ro.state {
                        RolloutState::Paused => { " — the node in flight finishes, no further node starts until an admin resumes" }
                        RolloutState::Aborted => { " — no further upgrade call is made" }
                        _ => {}
                    }
                }
                dt { "Progress" } dd #rollout-progress { (done) " of " (all) " nodes done" }
                dt { "Phase" } dd #rollout-phase { (phase(r)) }
                @if let Some(e) = &ro.error {
                    dt { "Why it stopped" } dd #rollout-error.error { (e) }
                }
                @if let Some(n) = stopped {
                    dt { "Stopped at" } dd #rollout-stopped {
                        strong { (n.name) } " (" (n.step.as_str().replace('_', " ")) ")"
                        @if let Some(seen) = &n.seen { ": " span.reason { (seen) } }
                    }
                }
                dt { "Started" } dd { (when(ro.created_at)) " by " (ro.requested_by) }
                dt { "Last change" } dd { (when(ro.updated_at)) }
                @if let Some(t) = ro.finished_at { dt { "Ended" } dd { (when(t)) } }
                dt { "Driven by" } dd {
                    @match (&ro.owner, ro.lease_until) {
                        (Some(o), Some(t)) => { "instance " code { (o) } " (lease until " (when(t)) ")" }
                        (Some(o), None) => { "instance " code { (o) } }
                        _ => { "no instance right now" }
                    }
                }
                @if let Some(snap) = ro.snapshot.as_ref().and_then(|v| v.get("id")).and_then(|v| v.as_str()) {
                    dt { "etcd snapshot" } dd { code { (snap) } }
                }
            }
            h3 { "Nodes in rollout order" }
            div.scroll { table #rollout-nodes {
                thead { tr {
                    th { "#" } th { "Node" } th { "Role" } th { "Batch" } th { "From" }
                    th { "Step" } th { "Started" } th { "Deadline" } th { "Finished" } th { "Last seen" }
                } }
                tbody {
                    @for n in &r.nodes {
                        tr data-node=(n.name) data-step=(n.step.as_str()) {
                            td { (n.position + 1) }
                            td { a href={ "/console/machines/" (n.machine_id) } { (n.name) }
                                 br; small { (n.rack.as_deref().map(|x| format!("rack {x}")).unwrap_or_else(|| "no rack".into())) ", " code { (n.address) } } }
                            td { (n.role.to_string()) }
                            td { (n.batch + 1) }
                            td { (n.from_version) br; small { (n.method.as_str()) " call" } }
                            td.step { (badge(n.step.as_str())) }
                            td { (n.started_at.map(when).unwrap_or_else(|| "–".into())) }
                            td { (n.deadline.map(when).unwrap_or_else(|| "–".into())) }
                            td { (n.finished_at.map(when).unwrap_or_else(|| "–".into())) }
                            td.reason.seen { (n.seen.as_deref().unwrap_or("–")) }
                        }
                    }
                }
            } }
        }
    }
}

/// The actions part: what the signed-in role may do to the rollout as it stands.
fn actions_part(who: &Signed, name: &str, latest: Option<&RolloutStatus>) -> Markup {
    let st = latest.map(|r| r.rollout.state);
    let base = format!("/console/clusters/{}/upgrade", urlpath(name));
    let can_pause = st == Some(RolloutState::Running) && who.can(ApiRole::Operator);
    let can_resume = st == Some(RolloutState::Paused) && who.can(ApiRole::Admin);
    let can_abort = st.is_some_and(RolloutState::is_active) && who.can(ApiRole::Admin);
    html! {
        div.fragment data-state=(st.map_or("none", RolloutState::as_str)) {
            @if can_pause || can_resume || can_abort {
                h2 #h-actions { "Actions" }
                @if can_pause {
                    form.inline #pause-upgrade method="post" action={ (base) "/pause" } {
                        (csrf(who))
                        button type="submit" { "Pause the rollout" }
                        span.hint { "the node in flight finishes; no further node starts" }
                    }
                }
                @if can_resume {
                    form.inline #resume-upgrade method="post" action={ (base) "/resume" } {
                        (csrf(who))
                        button type="submit" { "Resume the rollout" }
                    }
                }
                @if can_abort {
                    form #abort-upgrade method="post" action={ (base) "/abort" } {
                        (csrf(who))
                        fieldset {
                            legend { "Abort the rollout" }
                            label { "No further upgrade call is made; nodes in flight are marked aborted. Type the cluster's name (" code { (name) } "): "
                                input name="confirm" autocomplete="off"; }
                            button.danger type="submit" { "Abort the rollout" }
                        }
                    }
                }
            }
        }
    }
}

/// A cluster's page.
pub async fn page(
    State(s): State<AppState>,
    who: Signed,
    Path(name): Path<String>,
) -> Result<Markup, ConsoleError> {
    let clusters = s.workflows.clusters();
    let spec = clusters.spec(&name).await?;
    let nodes = clusters.cluster_nodes(&name).await?;
    let latest = s.upgrades.latest(&name).await?;
    let mut events = s
        .inventory
        .events(&EventFilter {
            machine_id: None,
            kind_prefix: Some("upgrade.".into()),
            after_id: None,
            limit: EVENTS_READ,
        })
        .await?;
    events.retain(|e| of_cluster(e, &name));
    events.reverse();
    events.truncate(EVENTS_SHOWN);
    let q = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("cluster", &name)
        .finish();
    let base = format!("/console/clusters/{}", urlpath(&name));
    let body = html! {
        h1 { "Cluster " (name) }
        section aria-labelledby="h-cluster" {
            h2 #h-cluster { "Declared" }
            dl.facts {
                dt { "Talos" } dd #cluster-version { (spec.talos_version) }
                dt { "Kubernetes" } dd { (spec.kubernetes_version.as_deref().unwrap_or("Talos' default")) }
                dt { "Schematic" } dd { code.digest { (spec.schematic_id) } }
                dt { "Endpoint" } dd { code { (spec.endpoint) } }
                dt { "Nodes" } dd { (nodes.len()) }
            }
        }
        section aria-labelledby="h-rollout" {
            h2 #h-rollout { "Rolling upgrade" }
            p.live aria-live="polite" { span #rollout-live { (latest.as_ref().map(summary).unwrap_or_else(|| format!("No rolling upgrade of {name} yet."))) } }
            div #rollout data-fragment={ (base) "/rollout" } data-summary-to="rollout-live" {
                (rollout_part(&name, latest.as_ref()))
            }
            div #rollout-actions data-fragment={ (base) "/actions" } data-follows="rollout" {
                (actions_part(&who, &name, latest.as_ref()))
            }
        }
        section aria-labelledby="h-nodes" {
            h2 #h-nodes { "Nodes (" (nodes.len()) ")" }
            @if nodes.is_empty() { p { "No machine belongs to this cluster." } }
            @else {
                div.scroll { table #cluster-nodes {
                    thead { tr { th { "Machine" } th { "Role" } th { "Rack" } th { "State" } th { "Talos API" } } }
                    tbody {
                        @for (m, addr) in &nodes {
                            tr {
                                td { (layout::machine_link(m)) }
                                td { (m.role.map(|r| r.to_string()).unwrap_or_else(|| "–".into())) }
                                td { (m.rack.as_deref().unwrap_or("–")) }
                                td { (state(m.state)) }
                                td { @if let Some(a) = addr { code { (a) } } @else { "not known yet" } }
                            }
                        }
                    }
                } }
            }
        }
        section aria-labelledby="h-upgrade-events" {
            h2 #h-upgrade-events { "Upgrade events" }
            p.live { span.status data-status-for="cluster-events" { "Connecting to the live stream…" } }
            ol #cluster-events.events data-live={ "/console/stream?" (q) } data-order="newest-first" {
                @for e in &events { (event_item(e)) }
            }
            p { a href={ "/console/events?kind=upgrade." } { "Every upgrade event" } }
        }
    };
    Ok(layout::page(
        &who,
        "/console/clusters",
        &format!("Cluster {name}"),
        body,
    ))
}

/// A cluster name as a path segment.
fn urlpath(name: &str) -> String {
    url::form_urlencoded::byte_serialize(name.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// The declared cluster's newest rollout (404 for a cluster that is not declared).
async fn latest_of(s: &AppState, name: &str) -> Result<Option<RolloutStatus>, ConsoleError> {
    s.workflows.clusters().spec(name).await?;
    Ok(s.upgrades.latest(name).await?)
}

/// The rollout part of the page alone (the script re-fetches it).
pub async fn rollout_fragment(
    State(s): State<AppState>,
    _who: Signed,
    Path(name): Path<String>,
) -> Result<Response, ConsoleError> {
    let latest = latest_of(&s, &name).await?;
    Ok(fragment(rollout_part(&name, latest.as_ref())))
}

/// The actions part of the page alone (the script re-fetches it when the rollout's state
/// changed).
pub async fn actions_fragment(
    State(s): State<AppState>,
    who: Signed,
    Path(name): Path<String>,
) -> Result<Response, ConsoleError> {
    let latest = latest_of(&s, &name).await?;
    Ok(fragment(actions_part(&who, &name, latest.as_ref())))
}

/// Pause (operators), resume or abort (admins; the cluster's name typed) the cluster's rollout;
/// back to the cluster's page.
pub async fn action(
    State(s): State<AppState>,
    Path((name, what)): Path<(String, String)>,
    a: Action,
) -> Result<Redirect, ConsoleError> {
    let actor = a.who.actor();
    match what.as_str() {
        "pause" => {
            a.who.require(ApiRole::Operator)?;
            s.upgrades.pause(&name, &actor).await?;
        }
        "resume" => {
            a.who.require(ApiRole::Admin)?;
            s.upgrades.resume(&name, &actor).await?;
        }
        "abort" => {
            a.who.require(ApiRole::Admin)?;
            if a.field("confirm") != Some(name.as_str()) {
                return Err(ConsoleError::bad(format!(
                    "aborting the rollout needs confirmation: type `{name}` in the confirmation field"
                )));
            }
            s.upgrades.abort(&name, &actor).await?;
        }
        other => {
            return Err(ConsoleError::new(
                StatusCode::NOT_FOUND,
                format!("`{other}` is not an upgrade action: pause, resume or abort"),
            ))
        }
    }
    tracing::info!(cluster = %name, action = %what, actor = %actor, "console: upgrade rollout changed");
    Ok(Redirect::to(&format!(
        "/console/clusters/{}",
        urlpath(&name)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::MachineId;
    use crate::service::ports::upgrades::{Rollout, RolloutNode, UpgradeMethod};

    fn node(name: &str, position: u32, batch: u32, role: Role, step: NodeStep) -> RolloutNode {
        RolloutNode {
            machine_id: MachineId::new(),
            position,
            batch,
            name: name.into(),
            role,
            rack: Some("r1".into()),
            address: "127.0.0.1".into(),
            from_version: "v1.12.11".into(),
            method: UpgradeMethod::Machine,
            installer: "installer".into(),
            step,
            boot_id: None,
            started_at: None,
            deadline: None,
            finished_at: None,
            seen: None,
        }
    }

    fn rollout(state: RolloutState, steps: [NodeStep; 3]) -> RolloutStatus {
        let now = chrono::Utc::now();
        RolloutStatus {
            rollout: Rollout {
                id: uuid::Uuid::new_v4(),
                cluster: "lab".into(),
                to_version: "v1.13.9".into(),
                schematic_id: None,
                installer: "installer".into(),
                state,
                requested_by: "token:alice".into(),
                owner: None,
                lease_until: None,
                node_timeout_seconds: 1800,
                max_workers_per_rack: 1,
                snapshot: None,
                created_at: now,
                updated_at: now,
                finished_at: None,
                error: None,
            },
            nodes: vec![
                node("cp-1", 0, 0, Role::ControlPlane, steps[0]),
                node("w-1", 1, 1, Role::Worker, steps[1]),
                node("w-2", 2, 1, Role::Worker, steps[2]),
            ],
        }
    }

    #[test]
    fn the_phase_says_where_the_rollout_stands_in_words() {
        use NodeStep::{Done, Pending, Rebooting, RolledBack, Skipped, Upgrading, Verifying};
        use RolloutState as R;
        let cases = [
            (R::Running,
                [Rebooting, Pending, Pending],
                "control plane, batch 1 of 2: cp-1 (rebooting) in flight",
            ),
            (R::Paused,
                [Done, Upgrading, Verifying],
                "workers, batch 2 of 2: w-1 (upgrading), w-2 (verifying) in flight (it finishes; no further node starts)",
            ),
            (R::Running,
                [Done, Pending, Pending],
                "next workers, batch 2 of 2 (w-1) about to start",
            ),
            (R::Paused,
                [Done, Pending, Pending],
                "next workers, batch 2 of 2 (w-1) waits for resume",
            ),
            (R::Failed,
                [Done, RolledBack, Done],
                "stopped at w-1 (rolled back)",
            ),
            (R::Aborted, [Done, Pending, Pending], "stopped (aborted)"),
            (R::Done, [Done, Skipped, Done], "finished: every node runs v1.13.9"),
        ];
        for (state, steps, want) in cases {
            let r = rollout(state, steps);
            assert_eq!(phase(&r), want, "{state} {steps:?}");
        }
        let r = rollout(R::Done, [Done, Skipped, Done]);
        assert_eq!(
            summary(&r),
            "Rollout to v1.13.9 done: 3 of 3 nodes done; finished: every node runs v1.13.9"
        );
    }

    #[test]
    fn a_step_badge_says_the_step_in_words() {
        let html = badge("rolled_back").into_string();
        assert_eq!(
            html,
            r#"<span class="state st-rolled_back">rolled back</span>"#
        );
    }
}
