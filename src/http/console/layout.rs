//! The page shell (header, navigation, who is signed in, sign-out) and small pieces every page
//! uses: a machine's state as a coloured badge that also says the state in words.

use maud::{html, Markup, DOCTYPE};

use super::session::Signed;
use crate::domain::{LifecycleState, Machine};

/// The navigation: (path, label).
const NAV: &[(&str, &str)] = &[
    ("/console", "Overview"),
    ("/console/racks", "Racks"),
    ("/console/machines", "Machines"),
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

/// A hidden CSRF field for a form of this session.
pub fn csrf(who: &Signed) -> Markup {
    html! { input type="hidden" name="csrf" value=(who.csrf()); }
}

/// A time as UTC text, to the second.
pub fn when(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}
