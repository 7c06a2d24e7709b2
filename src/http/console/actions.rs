//! The console's actions, each a POSTed form checked for the session's CSRF token (`Action`)
//! and its role (operator), run through the same use cases as the API and recorded as events
//! naming the signed-in token. Each answers with a redirect back to the machine's page (or the
//! discovered queue), or an error page saying why.

use axum::extract::{Path, State};
use axum::response::Redirect;

use super::session::{Action, ConsoleError};
use crate::domain::{LifecycleState, Machine};
use crate::http::AppState;
use crate::service::ports::bmc::{BootTarget, PowerAction};
use crate::service::ApiRole;

fn version(a: &Action) -> Result<Option<i64>, ConsoleError> {
    a.field("version")
        .map(|v| {
            v.parse::<i64>()
                .map_err(|_| ConsoleError::bad("version: not a machine version"))
        })
        .transpose()
}

fn back(id: impl std::fmt::Display) -> Redirect {
    Redirect::to(&format!("/console/machines/{id}"))
}

/// The machine `id` names, which must be waiting in `discovered`; otherwise 409, the machine's
/// name and state followed by `why`.
async fn discovered(s: &AppState, id: &str, why: &str) -> Result<Machine, ConsoleError> {
    let m = s.inventory.resolve(id).await?;
    if m.state != LifecycleState::Discovered {
        return Err(ConsoleError::new(
            axum::http::StatusCode::CONFLICT,
            format!("{} is {}{why}", m.display_name(), m.state),
        ));
    }
    Ok(m)
}

/// Accept a discovered machine: set its host name, site, rack and unit, then register it.
pub async fn accept(
    State(s): State<AppState>,
    Path(id): Path<String>,
    a: Action,
) -> Result<Redirect, ConsoleError> {
    a.who.require(ApiRole::Operator)?;
    let m = discovered(&s, &id, ", not discovered: nothing to accept").await?;
    let hostname = a
        .field("hostname")
        .ok_or_else(|| ConsoleError::bad("hostname: give the machine a host name"))?;
    let unit = a
        .field("unit")
        .map(|u| {
            u.parse::<u16>()
                .map_err(|_| ConsoleError::bad("unit: a rack unit is a number from 1 to 60"))
        })
        .transpose()?;
    let patch = serde_json::json!({
        "hostname": hostname.to_ascii_lowercase(),
        "site": a.field("site"),
        "rack": a.field("rack"),
        "rack_unit": unit,
    });
    let actor = a.who.actor();
    let edited = s
        .inventory
        .edit(m.id, version(&a)?.or(Some(m.version)), patch, &actor)
        .await?;
    let done = s
        .inventory
        .set_state(
            m.id,
            Some(edited.machine.version),
            LifecycleState::Registered,
            None,
            &actor,
        )
        .await?;
    tracing::info!(machine = %m.id, name = %m.display_name(), actor = %actor, "console: discovered machine accepted");
    Ok(back(done.id))
}

/// Reject a discovered machine: remove its record (it is discovered again if it boots again).
pub async fn reject(
    State(s): State<AppState>,
    Path(id): Path<String>,
    a: Action,
) -> Result<Redirect, ConsoleError> {
    a.who.require(ApiRole::Operator)?;
    let m = discovered(&s, &id, ": only a discovered machine is rejected here").await?;
    s.inventory
        .delete(m.id, version(&a)?.or(Some(m.version)), &a.who.actor())
        .await?;
    tracing::info!(machine = %m.id, name = %m.display_name(), actor = %a.who.actor(), "console: discovered machine rejected");
    Ok(Redirect::to("/console/discovered"))
}

/// Power on, off or cycle through the BMC.
pub async fn power(
    State(s): State<AppState>,
    Path(id): Path<String>,
    a: Action,
) -> Result<Redirect, ConsoleError> {
    a.who.require(ApiRole::Operator)?;
    let action: PowerAction = match a.field("action") {
        Some("on") => PowerAction::On,
        Some("off") => PowerAction::Off,
        Some("cycle") => PowerAction::Cycle,
        _ => return Err(ConsoleError::bad("action: on, off or cycle")),
    };
    let m = s.inventory.resolve(&id).await?;
    s.bmc
        .power(&m.id.to_string(), action, &a.who.actor())
        .await?;
    Ok(back(m.id))
}

/// A one-time boot override through the BMC.
pub async fn boot_once(
    State(s): State<AppState>,
    Path(id): Path<String>,
    a: Action,
) -> Result<Redirect, ConsoleError> {
    a.who.require(ApiRole::Operator)?;
    let target: BootTarget = a
        .field("target")
        .unwrap_or("")
        .parse()
        .map_err(|e: String| ConsoleError::bad(format!("target: {e}")))?;
    let m = s.inventory.resolve(&id).await?;
    s.bmc
        .boot_once(&m.id.to_string(), target, None, &a.who.actor())
        .await?;
    Ok(back(m.id))
}

/// Start a reinstall; wiping the system disk needs the machine's name typed as confirmation.
pub async fn reinstall(
    State(s): State<AppState>,
    Path(id): Path<String>,
    a: Action,
) -> Result<Redirect, ConsoleError> {
    a.who.require(ApiRole::Operator)?;
    let m = s.inventory.resolve(&id).await?;
    let wipe = a.field("wipe").is_some();
    if wipe && a.field("confirm") != Some(m.display_name().as_str()) {
        return Err(ConsoleError::bad(format!(
            "wiping the system disk needs confirmation: type `{}` in the confirmation field",
            m.display_name()
        )));
    }
    s.workflows.start(m.id, wipe, &a.who.actor()).await?;
    tracing::info!(machine = %m.id, name = %m.display_name(), wipe, actor = %a.who.actor(), "console: reinstall started");
    Ok(back(m.id))
}

/// Cancel the running reinstall (or a provisioning machine's window): the machine goes to
/// maintenance and the `reinstall.cancelled` event names the signed-in token.
pub async fn cancel_reinstall(
    State(s): State<AppState>,
    Path(id): Path<String>,
    a: Action,
) -> Result<Redirect, ConsoleError> {
    a.who.require(ApiRole::Operator)?;
    let m = s.inventory.resolve(&id).await?;
    s.workflows.cancel(m.id, &a.who.actor()).await?;
    tracing::info!(machine = %m.id, name = %m.display_name(), actor = %a.who.actor(), "console: reinstall cancelled");
    Ok(back(m.id))
}

/// Move the machine into or out of maintenance.
pub async fn set_state(
    State(s): State<AppState>,
    Path(id): Path<String>,
    a: Action,
) -> Result<Redirect, ConsoleError> {
    a.who.require(ApiRole::Operator)?;
    let to = match a.field("state") {
        Some("maintenance") => LifecycleState::Maintenance,
        Some("ready") => LifecycleState::Ready,
        _ => return Err(ConsoleError::bad("state: maintenance or ready")),
    };
    let m = s.inventory.resolve(&id).await?;
    s.inventory
        .set_state(m.id, version(&a)?, to, None, &a.who.actor())
        .await?;
    Ok(back(m.id))
}
