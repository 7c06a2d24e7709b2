//! Field-level validation errors: every refusal names the field (as a JSON path such as
//! `interfaces[1].mac`) and says what would be accepted.

use std::fmt;

use serde::Serialize;

/// One refused field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FieldError {
    /// JSON path of the field, e.g. `interfaces[0].mac`.
    pub field: String,
    /// What is wrong and what would be accepted.
    pub message: String,
}

impl FieldError {
    /// A refusal of `field` with `message`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// All refused fields of one input, in the order they were found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl ValidationErrors {
    /// Record one refusal.
    pub fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError::new(field, message));
    }

    /// `Ok(())` when nothing was refused.
    pub fn into_result(self) -> Result<(), ValidationErrors> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }

    /// Prefix every field path, e.g. with `rows[3].`.
    pub fn prefixed(mut self, prefix: &str) -> Self {
        for e in &mut self.0 {
            e.field = format!("{prefix}{}", e.field);
        }
        self
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

impl std::error::Error for ValidationErrors {}
