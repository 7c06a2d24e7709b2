//! The machine lifecycle: which state changes are allowed. `discovered` (booted, unknown) ->
//! `registered` (accepted) -> `inspecting` -> `ready` -> `provisioning` -> `installed`, plus `failed`
//! (with a reason) and `maintenance` (Plinth keeps its hands off). A provisioning machine may be
//! put in `maintenance`: that is how a reinstall or an open provisioning window is cancelled.
//! Asking for the state a machine is already in is allowed and changes nothing (idempotent).

use super::LifecycleState::{self, *};

/// May a machine go from `from` to `to`?
pub fn allowed(from: LifecycleState, to: LifecycleState) -> bool {
    if from == to {
        return true;
    }
    matches!(
        (from, to),
        (Discovered, Registered | Maintenance)
            | (Registered, Inspecting | Ready | Maintenance)
            | (Inspecting, Ready | Registered | Failed)
            | (Ready, Inspecting | Provisioning | Registered | Maintenance)
            // Cancelling a reinstall (or closing a window) leaves the machine to a person.
            | (Provisioning, Installed | Failed | Maintenance)
            // Reinstalling an installed machine is an explicit step, never an accident of booting.
            | (Installed, Provisioning | Failed | Maintenance)
            | (Failed, Registered | Ready | Provisioning | Maintenance)
            | (Maintenance, Registered | Ready | Installed)
    )
}

/// The states reachable from `from`.
pub fn next_states(from: LifecycleState) -> Vec<LifecycleState> {
    LifecycleState::ALL
        .iter()
        .copied()
        .filter(|to| *to != from && allowed(from, *to))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_is_decided_as_the_table_says() {
        let expected: &[(LifecycleState, &[LifecycleState])] = &[
            (Discovered, &[Registered, Maintenance]),
            (Registered, &[Inspecting, Ready, Maintenance]),
            (Inspecting, &[Registered, Ready, Failed]),
            (Ready, &[Registered, Inspecting, Provisioning, Maintenance]),
            (Provisioning, &[Installed, Failed, Maintenance]),
            (Installed, &[Provisioning, Failed, Maintenance]),
            (Failed, &[Registered, Ready, Provisioning, Maintenance]),
            (Maintenance, &[Registered, Ready, Installed]),
        ];
        for (from, tos) in expected {
            assert_eq!(next_states(*from), tos.to_vec(), "from {from}");
            assert!(allowed(*from, *from), "{from} -> {from} is a no-op");
        }
        assert!(!allowed(Discovered, Installed));
        assert!(!allowed(Provisioning, Registered));
    }
}
