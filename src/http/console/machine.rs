//! One machine's page: identity, NICs, disks with the install disk the rules pick and why, the
//! BMC's capabilities and (fetched after the page, so a slow BMC never holds it up) its power
//! state, the live boot timeline, its events, whether its config renders (digest and warnings,
//! never the config), and the actions its state allows for an operator's session.

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::IntoResponse;
use maud::{html, Markup};

use super::layout::{self, csrf, state, when};
use super::pages::{accept_form, event_item};
use super::session::{ConsoleError, Signed};
use crate::domain::lifecycle::allowed;
use crate::domain::{LifecycleState, Machine};
use crate::http::AppState;
use crate::service::{ApiRole, EventFilter};

/// Kind prefixes of the boot timeline (the same steps the API's timeline shows).
const STEPS: &str = "dhcp. tftp. http. boot. config. reinstall. machine.state";

/// A machine's page.
pub async fn page(
    State(s): State<AppState>,
    who: Signed,
    Path(id): Path<String>,
) -> Result<Markup, ConsoleError> {
    let m = s.inventory.resolve(&id).await?;
    let timeline = s.provisioning.timeline_of(m.id).await?;
    let mut events = s
        .inventory
        .events(&EventFilter {
            machine_id: Some(m.id),
            kind_prefix: None,
            after_id: None,
            limit: 50,
        })
        .await?;
    events.reverse();
    let config = s.configs.status(&m).await?;
    let caps = match &m.bmc {
        Some(_) => s.bmc.capabilities(&m.id.to_string()).await.ok(),
        None => None,
    };
    let reinstall = s.workflows.status(m.id).await?;
    let port = s.configs.switch_port(&m).await?;
    let operator = who.can(ApiRole::Operator);
    let name = m.display_name();
    let body = html! {
        h1 { (name) " " (state(m.state)) }
        @if let Some(r) = &m.state_reason { p.reason { "Reason: " (r) } }
        section aria-labelledby="h-identity" {
            h2 #h-identity { "Identity" }
            dl.facts {
                dt { "Inventory id" } dd { code { (m.id) } }
                dt { "Host name" } dd { (m.hostname.as_deref().unwrap_or("–")) }
                dt { "Serial" } dd { (m.serial.as_deref().unwrap_or("–")) }
                dt { "Asset tag" } dd { (m.asset_tag.as_deref().unwrap_or("–")) }
                dt { "SMBIOS UUID" } dd { (m.smbios_uuid.map(|u| u.to_string()).unwrap_or_else(|| "–".into())) }
                dt { "Product" } dd { (layout::product(&m)) }
                dt { "Location" } dd {
                    "site " (m.site.as_deref().unwrap_or("–")) ", rack " (m.rack.as_deref().unwrap_or("–"))
                    ", unit " @if let Some(u) = m.rack_unit { "U" (u) } @else { "–" }
                }
                dt { "Cluster / role" } dd {
                    (m.cluster.as_deref().unwrap_or("–")) " / " (m.role.map(|r| r.as_str()).unwrap_or("–"))
                }
                dt { "Last change" } dd { (when(m.updated_at)) " (version " (m.version) ")" }
            }
        }
        @if operator { (actions(&who, &m, reinstall.as_ref().is_some_and(|r| r.stage.is_active()))) }
        @if let Some(r) = &reinstall {
            section aria-labelledby="h-reinstall" {
                h2 #h-reinstall { "Reinstall" }
                p { "Stage " strong { (r.stage.as_str()) }
                    @if r.stage.is_active() { ", deadline " (when(r.stage_deadline)) }
                    ", asked by " (r.requested_by) " at " (when(r.started_at))
                    @if r.wipe { ", wiping the system disk" } }
                @if let Some(e) = &r.error { p.error { (e) } }
            }
        }
        section aria-labelledby="h-timeline" {
            h2 #h-timeline { "Boot timeline" }
            p.live aria-live="polite" { span.status data-status-for="timeline" { "Connecting to the live stream…" } }
            ol #timeline.events data-live={ "/console/stream?machine=" (m.id) } data-kinds=(STEPS) data-order="oldest-first" {
                @for e in &timeline { (event_item(e)) }
            }
        }
        section aria-labelledby="h-nics" {
            h2 #h-nics { "Network interfaces" }
            @if m.interfaces.is_empty() { p { "None recorded." } }
            ul.plain {
                @for i in &m.interfaces {
                    li { code { (i.mac) } " " (i.name.as_deref().unwrap_or(""))
                        @if let Some(ip) = i.ipv4 { " · " (ip) }
                        @if i.boot { " · boot interface" } }
                }
            }
            p.switch-port { "Switch port (DHCP option 82): "
                @match &port { Some(p) => { (layout::switch_port(p)) } None => { "– (its DHCP did not come through a relay)" } } }
        }
        section aria-labelledby="h-disks" {
            h2 #h-disks { "Disks" }
            p { "Install disk: " strong { (config.install_disk.as_deref().unwrap_or("not decided (see the config below)")) } }
            @if m.disks.is_empty() { p { "None recorded." } }
            ul.plain {
                @for d in &m.disks {
                    li {
                        (d.model.as_deref().unwrap_or("disk"))
                        @if let Some(t) = d.disk_type { " · " (t.as_str()) }
                        @if let Some(b) = d.size_bytes { " · " (b / 1_000_000_000) " GB" }
                        @if let Some(sr) = &d.serial { " · serial " (sr) }
                        @if let Some(p) = &d.bus_path { " · " code { (p) } }
                        @if d.data_disk { " · data disk (never installed to)" }
                    }
                }
            }
        }
        section aria-labelledby="h-bmc" {
            h2 #h-bmc { "BMC" }
            @match &m.bmc {
                None => { p { "No BMC in the inventory: power and boot actions need one." } }
                Some(b) => {
                    dl.facts {
                        dt { "URL" } dd { code { (b.url) } }
                        dt { "Power" } dd { span #power data-power={ "/console/machines/" (m.id) "/power" } { "asking the BMC…" } }
                        @match &caps {
                            Some(c) => {
                                dt { "Probed" } dd { (c.probed_at.map(when).unwrap_or_else(|| "never succeeded".into()))
                                    @if c.stale { " (the BMC URL changed since: probe again)" } }
                                @if let Some(e) = &c.last_error { dt { "Last probe error" } dd { (e) } }
                                @if let Some(k) = &c.capabilities {
                                    dt { "Vendor / model" } dd { (k.vendor.as_deref().unwrap_or("–")) " / " (k.model.as_deref().unwrap_or("–")) }
                                    dt { "Reset types" } dd { (k.reset_types.join(", ")) }
                                    dt { "Boot targets" } dd { (k.boot_targets.join(", ")) }
                                    dt { "Virtual media" } dd { (if k.virtual_media.is_some() { "yes" } else { "no" }) }
                                }
                            }
                            None => { dt { "Capabilities" } dd { "not probed yet" } }
                        }
                    }
                }
            }
        }
        section aria-labelledby="h-config" {
            h2 #h-config { "Machine config" }
            @if config.valid {
                p { "Renders and validates. " "SHA-256 " code.digest { (config.sha256.as_deref().unwrap_or("")) } }
                p { "Talos " (config.talos_version.as_deref().unwrap_or("–")) ", schematic " code.digest { (config.schematic_id.as_deref().unwrap_or("–")) } }
            } @else {
                p.error { "Does not render: " (config.error.as_deref().unwrap_or("unknown reason")) }
            }
            @if !config.warnings.is_empty() {
                ul { @for w in &config.warnings { li { "Warning: " (w) } } }
            }
            p { "Provisioning window " (if config.window_open { "open" } else { "closed" })
                @if let Some(at) = config.served_at { "; config last served " (when(at)) } }
        }
        section aria-labelledby="h-events" {
            h2 #h-events { "Events" }
            ol.events { @for e in &events { (event_item(e)) } }
            p { a href={ "/console/events?machine=" (m.id) } { "All events of this machine" } }
        }
    };
    Ok(layout::page(&who, "/console/machines", &name, body))
}

/// The action forms the machine's state allows.
fn actions(who: &Signed, m: &Machine, reinstalling: bool) -> Markup {
    let base = format!("/console/machines/{}", m.id);
    html! {
        section #actions aria-labelledby="h-actions" {
            h2 #h-actions { "Actions" }
            @if m.state == LifecycleState::Discovered {
                (accept_form(who, m))
            }
            @if m.bmc.is_some() {
                form.inline method="post" action={ (base) "/power" } {
                    (csrf(who))
                    span { "Power: " }
                    button name="action" value="on" { "On" }
                    button name="action" value="off" { "Off" }
                    button name="action" value="cycle" { "Cycle" }
                }
                form.inline method="post" action={ (base) "/boot-once" } {
                    (csrf(who))
                    label for="boot-target" { "Boot once from " }
                    select #boot-target name="target" {
                        option value="pxe" { "network (PXE)" }
                        option value="http" { "HTTP boot" }
                        option value="cd" { "virtual CD" }
                    }
                    button type="submit" { "Set" }
                }
            }
            @if allowed(m.state, LifecycleState::Provisioning) && m.state != LifecycleState::Provisioning && !reinstalling {
                form #reinstall method="post" action={ (base) "/reinstall" } {
                    (csrf(who))
                    fieldset {
                        legend { "Reinstall Talos" }
                        label { input type="checkbox" name="wipe" value="1"; " Wipe the system disk" }
                        label { "To wipe, type the machine's name (" code { (m.display_name()) } "): "
                            input name="confirm" autocomplete="off"; }
                        button type="submit" { "Reinstall" }
                    }
                }
            }
            @if reinstalling || m.state == LifecycleState::Provisioning {
                form.inline #cancel-reinstall method="post" action={ (base) "/reinstall/cancel" } {
                    (csrf(who))
                    button.danger type="submit" { "Cancel the reinstall (machine goes to maintenance)" }
                }
            }
            @if m.state != LifecycleState::Maintenance && allowed(m.state, LifecycleState::Maintenance) {
                form.inline method="post" action={ (base) "/state" } {
                    (csrf(who))
                    input type="hidden" name="version" value=(m.version);
                    input type="hidden" name="state" value="maintenance";
                    button type="submit" { "Put in maintenance" }
                }
            }
            @if m.state == LifecycleState::Maintenance {
                form.inline method="post" action={ (base) "/state" } {
                    (csrf(who))
                    input type="hidden" name="version" value=(m.version);
                    input type="hidden" name="state" value="ready";
                    button type="submit" { "End maintenance (ready)" }
                }
            }
        }
    }
}

/// The machine's power state as the BMC reports it now, as text (the page fetches it).
pub async fn power_state(
    State(s): State<AppState>,
    _who: Signed,
    Path(id): Path<String>,
) -> impl IntoResponse {
    let text = match tokio::time::timeout(
        std::time::Duration::from_secs(10),
        s.bmc.power_state(&id),
    )
    .await
    {
        Ok(Ok(r)) => r.power_state,
        Ok(Err(e)) => format!(
            "unknown: {}",
            super::session::ConsoleError::from(e).message()
        ),
        Err(_) => "unknown: the BMC did not answer within 10 s".into(),
    };
    (
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
}
