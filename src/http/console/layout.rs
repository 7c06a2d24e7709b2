//! The page shell (header, navigation, who is signed in, sign-out) and small pieces every page
//! uses: a machine's state as a coloured badge that also says the state in words.

use maud::{html, Markup, DOCTYPE};

use super::session::Signed;
use crate::domain::{LifecycleState, Machine};
use crate::service::machine_config::SwitchPort;

/// The navigation: (path, label).
const NAV: &[(&str, &str)] = &[
    ("/console", "Overview"),
    ("/console/racks", "Racks"),
    ("/console/machines", "Machines"),
    ("/console/clusters", "Clusters"),
    ("/console/discovered", "Discovered"),
    ("/console/events", "Events"),
];

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · Plinth" }
            link rel="stylesheet" href="/console/assets/console.css";
            script src="/console/assets/console.js" defer {}
        }
    }
}

/// A page for a signed-in user; `here` is the navigation entry to mark as current.
pub fn page(who: &Signed, here: &str, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    nav aria-label="Console" {
                        a.brand href="/console" { "Plinth" }
                        ul {
                            @for (path, label) in NAV {
                                li {
                                    @if *path == here {
                                        a href=(path) aria-current="page" { (label) }
                                    } @else {
                                        a href=(path) { (label) }
                                    }
                                }
                            }
                        }
                    }
                    div.who {
                        span #signed-in-as { (who.session.token.name) " (" (who.session.token.role) ")" }
                        form method="post" action="/console/sign-out" {
                            input type="hidden" name="csrf" value=(who.csrf());
                            button #sign-out type="submit" { "Sign out" }
                        }
                    }
                }
                main #main { (body) }
            }
        }
    }
}

/// A page without the navigation (sign-in, errors).
pub fn bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body { main #main.narrow { (body) } }
        }
    }
}

/// A state badge: colour and the state's name in words.
pub fn state(s: LifecycleState) -> Markup {
    html! { span class={ "state st-" (s.as_str()) } { (s.as_str()) } }
}

/// A link to a machine's page, by its display name.
pub fn machine_link(m: &Machine) -> Markup {
    html! { a href={ "/console/machines/" (m.id) } { (m.display_name()) } }
}

/// Manufacturer and model, whichever are known; `–` when neither is.
pub fn product(m: &Machine) -> String {
    let known: Vec<&str> = [m.manufacturer.as_deref(), m.model.as_deref()]
        .into_iter()
        .flatten()
        .collect();
    if known.is_empty() {
        "–".into()
    } else {
        known.join(" ")
    }
}

/// A hidden CSRF field for a form of this session.
pub fn csrf(who: &Signed) -> Markup {
    html! { input type="hidden" name="csrf" value=(who.csrf()); }
}

/// A time as UTC text, to the second.
pub fn when(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// An option-82 value (hex) as a tech reads it: the text when it is printable ASCII (switches
/// mostly send a port name such as `Gi1/0/12`), always with the hex as sent.
pub fn option_82(hex_value: &str) -> Markup {
    let text = hex::decode(hex_value)
        .ok()
        .filter(|b| !b.is_empty() && b.iter().all(|c| (0x20..0x7f).contains(c)))
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    html! {
        @if let Some(t) = text { strong { (t) } " " }
        small { "(hex " code { (hex_value) } ")" }
    }
}

/// Where a machine's DHCP came relayed from: relay, circuit id (the port), remote id (the
/// switch), and how it is known.
pub fn switch_port(p: &SwitchPort) -> Markup {
    html! {
        span.circuit { "circuit id " @match &p.circuit_id { Some(c) => { (option_82(c)) } None => { "none sent" } } }
        ", " span.remote { "remote id " @match &p.remote_id { Some(r) => { (option_82(r)) } None => { "none sent" } } }
        ", via relay " code { (p.relay) }
        br; small { "(" (p.source) ", " (when(p.at)) ")" }
    }
}
