//! The console's read-only pages: overview, racks, the machine table, the discovered queue, live
//! events, and the event stream (server-sent events) the pages' script follows.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;

use axum::extract::{Query, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use maud::{html, Markup};
use serde::Deserialize;

use super::layout::{self, machine_link, state, when};
use super::session::{ConsoleError, Signed};
use crate::domain::{LifecycleState, Machine, MachineId};
use crate::http::AppState;
use crate::service::{ApiRole, Event, EventFilter, Follow, MachineFilter, MachineSort, Reinstall};

/// Rows per page of the machine table.
const TABLE_PAGE: u32 = 50;
/// Machines drawn in the rack view at most (pages of 1000 read from the database).
const RACK_MAX: u32 = 5000;
/// Rack height drawn when no machine sits higher.
const RACK_UNITS: u16 = 42;

/// Active reinstalls by machine.
async fn reinstalls(s: &AppState) -> Result<HashMap<MachineId, Reinstall>, ConsoleError> {
    Ok(s.workflows
        .active()
        .await?
        .into_iter()
        .map(|r| (r.machine_id, r))
        .collect())
}

/// Time left until `t`, in words.
fn until(t: chrono::DateTime<chrono::Utc>) -> String {
    let secs = (t - chrono::Utc::now()).num_seconds();
    if secs <= 0 {
        "deadline passed".into()
    } else if secs < 120 {
        format!("{secs} s left")
    } else {
        format!("{} min left", secs / 60)
    }
}

/// The overview.
pub async fn overview(State(s): State<AppState>, who: Signed) -> Result<Markup, ConsoleError> {
    let mut counts = Vec::new();
    for st in LifecycleState::ALL {
        let page = s
            .inventory
            .list(&MachineFilter {
                state: Some(*st),
                limit: 1,
                ..Default::default()
            })
            .await?;
        counts.push((*st, page.total));
    }
    let failed = s
        .inventory
        .list(&MachineFilter {
            state: Some(LifecycleState::Failed),
            limit: 50,
            ..Default::default()
        })
        .await?;
    let active = s.workflows.active().await?;
    let mut running = Vec::new();
    for r in active.iter().take(100) {
        let m = s.inventory.get(r.machine_id).await?;
        running.push((m, r));
    }
    let pools = s.provisioning.pool_use().await?;
    let holds = s.provisioning.holds().await?;
    let images = s.provisioning.image_cache().await?;
    let upgrades = super::clusters::live_table(&s).await?;
    let discovered = counts
        .iter()
        .find(|(st, _)| *st == LifecycleState::Discovered)
        .map_or(0, |(_, n)| *n);
    let body = html! {
        h1 { "Overview" }
        section aria-labelledby="h-states" {
            h2 #h-states { "Machines per state" }
            ul.counts {
                @for (st, n) in &counts {
                    li { a href={ "/console/machines?state=" (st.as_str()) } { (state(*st)) " " strong { (n) } } }
                }
            }
        }
        section aria-labelledby="h-failed" {
            h2 #h-failed { "Failed machines (" (failed.total) ")" }
            @if failed.items.is_empty() { p { "None." } }
            @else {
                div.scroll { table {
                    thead { tr { th { "Machine" } th { "Reason" } th { "Since" } } }
                    tbody {
                        @for m in &failed.items {
                            tr {
                                td { (machine_link(m)) }
                                td.reason { (m.state_reason.as_deref().unwrap_or("no reason recorded")) }
                                td { (when(m.updated_at)) }
                            }
                        }
                    }
                } }
            }
        }
        section aria-labelledby="h-reinstalls" {
            h2 #h-reinstalls { "Reinstalls in progress (" (active.len()) ")" }
            @if running.is_empty() { p { "None." } }
            @else {
                div.scroll { table {
                    thead { tr { th { "Machine" } th { "Stage" } th { "Deadline" } th { "Asked by" } } }
                    tbody {
                        @for (m, r) in &running {
                            tr {
                                td { (machine_link(m)) }
                                td { (r.stage.as_str()) }
                                td { (when(r.stage_deadline)) " (" (until(r.stage_deadline)) ")" }
                                td { (r.requested_by) }
                            }
                        }
                    }
                } }
            }
        }
        section aria-labelledby="h-upgrades" {
            h2 #h-upgrades { "Rolling upgrades" }
            (upgrades)
        }
        section aria-labelledby="h-holds" {
            h2 #h-holds { "Holds (" (holds.held.len() as i64 + discovered) ")" }
            p {
                "Waiting for acceptance: "
                a href="/console/discovered" { (discovered) " discovered machine(s)" }
                @if discovered > 0 { " (unknown machines that network-booted; accept or reject them)" }
            }
            @if holds.held.is_empty() {
                p { "No machine in provisioning is held." }
            } @else {
                div.scroll { table #holds {
                    thead { tr { th { "Machine" } th { "Why it waits" } th { "Since" } } }
                    tbody {
                        @for h in &holds.held {
                            tr {
                                td { (machine_link(&h.machine)) }
                                td.reason { (h.reason) }
                                td { @if let Some(t) = h.since { "last boot poll " (when(t)) } @else { "–" } }
                            }
                        }
                    }
                } }
            }
            @if (holds.scanned as i64) < holds.provisioning {
                p.hint { "Only the first " (holds.scanned) " of " (holds.provisioning) " machines in provisioning were looked at." }
            }
        }
        section aria-labelledby="h-pools" {
            h2 #h-pools { "DHCP pool use" }
            @if pools.is_empty() { p { "DHCP is off on this server." } }
            @else {
                div.scroll { table {
                    thead { tr { th { "Subnet" } th { "Mode" } th { "In use" } th { "Pool size" } } }
                    tbody {
                        @for (subnet, size, used) in &pools {
                            tr {
                                td { (subnet.net) }
                                td { (format!("{:?}", subnet.mode).to_lowercase()) }
                                td { (used) @if *size > 0 { " (" (used * 100 / size) " %)" } }
                                td { (size) }
                            }
                        }
                    }
                } }
            }
        }
        section aria-labelledby="h-images" {
            h2 #h-images { "Image cache" }
            @if images.is_empty() { p { "No cluster is declared (" code { "plinth apply" } ")." } }
            @else {
                div.scroll { table #images {
                    thead { tr { th { "Cluster" } th { "Talos" } th { "Architecture" } th { "Cached" } } }
                    tbody {
                        @for c in &images {
                            @for a in &c.arches {
                                tr data-cluster=(c.cluster) data-arch=(a.arch) {
                                    td { (c.cluster) }
                                    td { (c.version) br; small { "schematic " code.digest { (c.schematic) } } }
                                    td { (a.arch) }
                                    td {
                                        @if a.cached { span.ok { "✓ cached" } }
                                        @else {
                                            span.error { "✗ not cached" }
                                            " (missing " (a.missing.join(", ")) "): run " code.pull { (a.pull_command) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                } }
                p.hint { "A machine of a cluster whose image is not cached waits at boot until it is (or until a configured Image Factory delivers it)." }
            }
        }
    };
    Ok(layout::page(&who, "/console", "Overview", body))
}

/// Rack view filters.
#[derive(Debug, Default, Deserialize)]
pub struct RackParams {
    site: Option<String>,
}

/// An elevation per rack: units top to bottom, each machine over its unit, empty units shown.
pub async fn racks(
    State(s): State<AppState>,
    who: Signed,
    Query(p): Query<RackParams>,
) -> Result<Markup, ConsoleError> {
    let site = p.site.filter(|x| !x.trim().is_empty());
    let mut machines: Vec<Machine> = Vec::new();
    let mut offset = 0;
    let mut truncated = false;
    loop {
        let page = s
            .inventory
            .table(
                &MachineFilter {
                    site: site.clone(),
                    limit: 1000,
                    ..Default::default()
                },
                MachineSort::Location,
                false,
                offset,
            )
            .await?;
        let more = page.next_cursor.is_some();
        machines.extend(page.items.into_iter().filter(|m| m.rack.is_some()));
        offset += 1000;
        if !more {
            break;
        }
        if offset >= RACK_MAX {
            truncated = true;
            break;
        }
    }
    let sites: Vec<String> = machines
        .iter()
        .filter_map(|m| m.site.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut by_rack: BTreeMap<(String, String), Vec<&Machine>> = BTreeMap::new();
    for m in &machines {
        if let Some(r) = &m.rack {
            by_rack
                .entry((m.site.clone().unwrap_or_default(), r.clone()))
                .or_default()
                .push(m);
        }
    }
    let body = html! {
        h1 { "Racks" }
        form.filters method="get" action="/console/racks" {
            label for="site" { "Site" }
            input #site name="site" list="sites" value=(site.clone().unwrap_or_default()) placeholder="all sites";
            datalist #sites { @for x in &sites { option value=(x) {} } }
            button type="submit" { "Filter" }
        }
        @if truncated { p.error { "Only the first " (RACK_MAX) " machines are drawn: pick a site." } }
        @if by_rack.is_empty() { p { "No machine has a rack yet." } }
        div.racks {
            @for ((site_name, rack), ms) in &by_rack {
                @let height = ms.iter().filter_map(|m| m.rack_unit).max().unwrap_or(0).max(RACK_UNITS);
                @let at: HashMap<u16, Vec<&&Machine>> = ms.iter().filter_map(|m| m.rack_unit.map(|u| (u, m))).fold(HashMap::new(), |mut acc, (u, m)| { acc.entry(u).or_default().push(m); acc });
                @let unplaced: Vec<&&Machine> = ms.iter().filter(|m| m.rack_unit.is_none()).collect();
                section.rack aria-label={ "Rack " (rack) } data-rack=(rack) {
                    h2 { "Rack " (rack) @if !site_name.is_empty() { small { " · site " (site_name) } } }
                    ol.units reversed {
                        @for u in (1..=height).rev() {
                            @if let Some(here) = at.get(&u) {
                                @for m in here {
                                    li class={ "unit used st-" (m.state.as_str()) } data-unit=(u) {
                                        span.u { "U" (u) }
                                        a.machine href={ "/console/machines/" (m.id) } {
                                            (m.display_name()) " — " (m.state.as_str())
                                        }
                                    }
                                }
                            } @else {
                                li.unit.empty data-unit=(u) { span.u { "U" (u) } span { "empty" } }
                            }
                        }
                    }
                    @if !unplaced.is_empty() {
                        p { "No unit set: "
                            @for m in &unplaced { (machine_link(m)) " (" (m.state.as_str()) ") " }
                        }
                    }
                }
            }
        }
    };
    Ok(layout::page(&who, "/console/racks", "Racks", body))
}

/// Machine table filters, sort and page.
#[derive(Debug, Default, Deserialize)]
pub struct TableParams {
    q: Option<String>,
    state: Option<String>,
    site: Option<String>,
    rack: Option<String>,
    sort: Option<String>,
    desc: Option<String>,
    page: Option<u32>,
}

fn nonempty(v: &Option<String>) -> Option<String> {
    v.as_ref()
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
}

/// The machine table: filtered, sorted and paged by the database.
pub async fn machines(
    State(s): State<AppState>,
    who: Signed,
    Query(p): Query<TableParams>,
) -> Result<Markup, ConsoleError> {
    let state_f = match nonempty(&p.state) {
        Some(x) => Some(
            x.parse::<LifecycleState>()
                .map_err(|e| ConsoleError::bad(format!("state: {e}")))?,
        ),
        None => None,
    };
    let sort = match nonempty(&p.sort) {
        Some(x) => x
            .parse::<MachineSort>()
            .map_err(|e| ConsoleError::bad(format!("sort: {e}")))?,
        None => MachineSort::Hostname,
    };
    let desc = p.desc.as_deref() == Some("1");
    let page_no = p.page.unwrap_or(1).clamp(1, 100_000);
    let filter = MachineFilter {
        state: state_f,
        site: nonempty(&p.site),
        rack: nonempty(&p.rack),
        q: nonempty(&p.q),
        limit: TABLE_PAGE,
        ..Default::default()
    };
    let offset = (page_no - 1).saturating_mul(TABLE_PAGE);
    let page = s.inventory.table(&filter, sort, desc, offset).await?;
    let stages = reinstalls(&s).await?;
    let pages = ((page.total.max(0) as u64).div_ceil(u64::from(TABLE_PAGE))).max(1);
    let link = |sort: MachineSort, desc: bool, page: u32| -> String {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("q", &p.q),
            ("state", &p.state),
            ("site", &p.site),
            ("rack", &p.rack),
        ] {
            if let Some(v) = v.as_ref().filter(|v| !v.is_empty()) {
                q.append_pair(k, v);
            }
        }
        q.append_pair("sort", sort.as_str());
        if desc {
            q.append_pair("desc", "1");
        }
        q.append_pair("page", &page.to_string());
        format!("/console/machines?{}", q.finish())
    };
    let header = |col: MachineSort, label: &str| -> Markup {
        let current = col == sort;
        let aria = match (current, desc) {
            (true, false) => "ascending",
            (true, true) => "descending",
            _ => "none",
        };
        html! {
            th aria-sort=(aria) {
                a href=(link(col, current && !desc, 1)) {
                    (label) @if current { @if desc { " ↓" } @else { " ↑" } }
                }
            }
        }
    };
    let body = html! {
        h1 { "Machines (" (page.total) ")" }
        form.filters method="get" action="/console/machines" {
            label for="q" { "Search" }
            input #q name="q" type="search" value=(p.q.clone().unwrap_or_default()) placeholder="host name, serial, MAC, IP…";
            label for="state" { "State" }
            select #state name="state" {
                option value="" { "any" }
                @for st in LifecycleState::ALL {
                    option value=(st.as_str()) selected[state_f == Some(*st)] { (st.as_str()) }
                }
            }
            label for="f-site" { "Site" }
            input #f-site name="site" value=(p.site.clone().unwrap_or_default());
            label for="f-rack" { "Rack" }
            input #f-rack name="rack" value=(p.rack.clone().unwrap_or_default());
            input type="hidden" name="sort" value=(sort.as_str());
            button type="submit" { "Filter" }
        }
        div.scroll {
            table #machines {
                thead {
                    tr {
                        (header(MachineSort::Hostname, "Host name"))
                        (header(MachineSort::Location, "Site / rack / unit"))
                        (header(MachineSort::State, "State"))
                        th { "Stage" }
                        (header(MachineSort::Updated, "Last change"))
                        th { "Boot MAC" }
                        th { "IPv4" }
                        (header(MachineSort::Serial, "Serial"))
                        (header(MachineSort::AssetTag, "Asset tag"))
                    }
                }
                tbody {
                    @for m in &page.items {
                        @let boot = m.interfaces.iter().find(|i| i.boot).or(m.interfaces.first());
                        tr {
                            td { (machine_link(m)) }
                            td { (m.site.as_deref().unwrap_or("–")) " / " (m.rack.as_deref().unwrap_or("–")) " / "
                                 @if let Some(u) = m.rack_unit { "U" (u) } @else { "–" } }
                            td { (state(m.state)) }
                            td { @if let Some(r) = stages.get(&m.id) { (r.stage.as_str()) } @else { "–" } }
                            td { (when(m.updated_at)) }
                            td { @if let Some(b) = boot { code { (b.mac) } } @else { "–" } }
                            td { @if let Some(ip) = boot.and_then(|b| b.ipv4) { (ip) } @else { "–" } }
                            td { (m.serial.as_deref().unwrap_or("–")) }
                            td { (m.asset_tag.as_deref().unwrap_or("–")) }
                        }
                    }
                }
            }
        }
        nav.pager aria-label="Pages" {
            @if page_no > 1 { a rel="prev" href=(link(sort, desc, page_no - 1)) { "← Previous" } }
            span { "Page " (page_no) " of " (pages) }
            @if page.next_cursor.is_some() { a rel="next" href=(link(sort, desc, page_no + 1)) { "Next →" } }
        }
    };
    Ok(layout::page(&who, "/console/machines", "Machines", body))
}

/// The accept form of a discovered machine (host name, site, rack, unit).
pub fn accept_form(who: &Signed, m: &Machine) -> Markup {
    html! {
        form.accept method="post" action={ "/console/machines/" (m.id) "/accept" } {
            (layout::csrf(who))
            input type="hidden" name="version" value=(m.version);
            label { "Host name " input name="hostname" required value=(m.hostname.clone().unwrap_or_default()); }
            label { "Site " input name="site" value=(m.site.clone().unwrap_or_default()); }
            label { "Rack " input name="rack" value=(m.rack.clone().unwrap_or_default()); }
            label { "Unit " input name="unit" type="number" min="1" max="60" value=(m.rack_unit.map(|u| u.to_string()).unwrap_or_default()); }
            button type="submit" { "Accept" }
        }
        form.reject method="post" action={ "/console/machines/" (m.id) "/reject" } {
            (layout::csrf(who))
            input type="hidden" name="version" value=(m.version);
            button.danger type="submit" { "Reject (remove the record)" }
        }
    }
}

/// The queue of machines that network-booted and are not accepted yet.
pub async fn discovered(State(s): State<AppState>, who: Signed) -> Result<Markup, ConsoleError> {
    let page = s
        .inventory
        .list(&MachineFilter {
            state: Some(LifecycleState::Discovered),
            limit: 200,
            ..Default::default()
        })
        .await?;
    let operator = who.can(ApiRole::Operator);
    let mut ports = HashMap::new();
    for m in &page.items {
        if let Some(p) = s.configs.switch_port(m).await? {
            ports.insert(m.id, p);
        }
    }
    let body = html! {
        h1 { "Discovered machines (" (page.total) ")" }
        @if page.items.is_empty() { p { "The queue is empty." } }
        @for m in &page.items {
            article.card data-machine=(m.id) {
                h2 { (machine_link(m)) " " (state(m.state)) }
                dl {
                    dt { "MAC" } dd { @for i in &m.interfaces { code { (i.mac) } " " } }
                    dt { "SMBIOS UUID" } dd { (m.smbios_uuid.map(|u| u.to_string()).unwrap_or_else(|| "–".into())) }
                    dt { "Serial" } dd { (m.serial.as_deref().unwrap_or("–")) }
                    dt { "Product" } dd { (layout::product(m)) }
                    dt { "Switch port" } dd.switch-port {
                        @match ports.get(&m.id) {
                            Some(p) => { (layout::switch_port(p)) }
                            None => { "– (its DHCP did not come through a relay)" }
                        }
                    }
                    dt { "First seen" } dd { (when(m.created_at)) }
                }
                @if operator { (accept_form(&who, m)) }
            }
        }
    };
    Ok(layout::page(
        &who,
        "/console/discovered",
        "Discovered",
        body,
    ))
}

/// Event filters.
#[derive(Debug, Default, Deserialize)]
pub struct EventParams {
    machine: Option<String>,
    kind: Option<String>,
    rack: Option<String>,
}

/// The machines of a rack, for filtering events by rack.
async fn rack_members(s: &AppState, rack: &str) -> Result<HashSet<MachineId>, ConsoleError> {
    let page = s
        .inventory
        .list(&MachineFilter {
            rack: Some(rack.to_string()),
            limit: 1000,
            ..Default::default()
        })
        .await?;
    Ok(page.items.iter().map(|m| m.id).collect())
}

/// One event as a list item (the script renders streamed ones the same way).
pub fn event_item(e: &Event) -> Markup {
    let detail = e.detail.to_string();
    let detail = if detail.len() > 300 {
        format!("{}…", detail.chars().take(300).collect::<String>())
    } else {
        detail
    };
    html! {
        li data-kind=(e.kind) {
            time datetime=(e.at.to_rfc3339()) { (when(e.at)) }
            " " code.kind { (e.kind) }
            " " span.actor { (e.actor) }
            @if let Some(m) = e.machine_id { " " a href={ "/console/machines/" (m) } { (e.machine.clone().unwrap_or_else(|| format!("machine {}", m.to_string().get(..8).unwrap_or("")))) } }
            " " span.detail { (detail) }
        }
    }
}

/// The event log, newest first, followed live.
pub async fn events(
    State(s): State<AppState>,
    who: Signed,
    Query(p): Query<EventParams>,
) -> Result<Markup, ConsoleError> {
    let machine = match nonempty(&p.machine) {
        Some(m) => Some(s.inventory.resolve(&m).await?),
        None => None,
    };
    let kind = nonempty(&p.kind);
    let rack = nonempty(&p.rack);
    let members = match &rack {
        Some(r) => Some(rack_members(&s, r).await?),
        None => None,
    };
    let mut list = s
        .inventory
        .events(&EventFilter {
            machine_id: machine.as_ref().map(|m| m.id),
            kind_prefix: kind.clone(),
            after_id: None,
            limit: if members.is_some() { 2000 } else { 100 },
        })
        .await?;
    if let Some(ids) = &members {
        list.retain(|e| e.machine_id.is_some_and(|m| ids.contains(&m)));
    }
    list.reverse();
    list.truncate(100);
    let mut stream = url::form_urlencoded::Serializer::new(String::new());
    if let Some(m) = &machine {
        stream.append_pair("machine", &m.id.to_string());
    }
    if let Some(k) = &kind {
        stream.append_pair("kind", k);
    }
    if let Some(r) = &rack {
        stream.append_pair("rack", r);
    }
    let stream = format!("/console/stream?{}", stream.finish());
    let body = html! {
        h1 { "Live events" }
        form.filters method="get" action="/console/events" {
            label for="e-machine" { "Machine" }
            input #e-machine name="machine" value=(p.machine.clone().unwrap_or_default()) placeholder="host name or id";
            label for="e-kind" { "Kind" }
            input #e-kind name="kind" value=(kind.clone().unwrap_or_default()) placeholder="e.g. dhcp. or machine.";
            label for="e-rack" { "Rack" }
            input #e-rack name="rack" value=(rack.clone().unwrap_or_default());
            button type="submit" { "Filter" }
        }
        p.live aria-live="polite" { span.status data-status-for="events" { "Connecting to the live stream…" } }
        ol #events.events data-live=(stream) data-order="newest-first" {
            @for e in &list { (event_item(e)) }
        }
    };
    Ok(layout::page(&who, "/console/events", "Events", body))
}

/// Is `e` about cluster `name` (its detail names the cluster, as every `upgrade.` event does)?
pub fn of_cluster(e: &Event, name: &str) -> bool {
    e.detail.get("cluster").and_then(|c| c.as_str()) == Some(name)
}

/// Stream filters.
#[derive(Debug, Default, Deserialize)]
pub struct StreamParams {
    machine: Option<String>,
    kind: Option<String>,
    rack: Option<String>,
    cluster: Option<String>,
}

/// The event log as server-sent events for the console's script: each event's `data` is the
/// event as JSON (filtered by machine, kind prefix, rack, or the cluster its detail names). Ends when the server stops, when the session signs out or expires, and when its
/// token stops being live (checked every few seconds).
pub async fn stream(
    State(s): State<AppState>,
    who: Signed,
    Query(p): Query<StreamParams>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ConsoleError> {
    let machine = match nonempty(&p.machine) {
        Some(m) => Some(s.inventory.resolve(&m).await?.id),
        None => None,
    };
    let members = match nonempty(&p.rack) {
        Some(r) => Some(rack_members(&s, &r).await?),
        None => None,
    };
    let cluster = nonempty(&p.cluster);
    let feed = s
        .events
        .follow(
            Follow {
                machine,
                kind_prefix: nonempty(&p.kind),
                after: None,
                token: Some(who.session.token.id),
                session: Some(who.session_hash()),
            },
            s.shutdown.clone(),
        )
        .await?;
    let events = feed
        .filter(move |e| {
            let keep = match &members {
                Some(ids) => e.machine_id.is_some_and(|m| ids.contains(&m)),
                None => true,
            } && cluster.as_deref().is_none_or(|c| of_cluster(e, c));
            async move { keep }
        })
        .map(|e| {
            let data = serde_json::to_string(&e).unwrap_or_default();
            Ok(SseEvent::default().id(e.id.to_string()).data(data))
        });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}
