//! The one place where errors become HTTP answers. Internal error text is logged, never sent.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::domain::Conflict;
use crate::domain::{FieldError, ValidationErrors};
use crate::service::bmc::BmcError;
use crate::service::{RowError, ServiceError, StoreError};

/// An error answer: `{"error": {...}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: Box<ErrorBody>,
}

/// The body of an error answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Machine-readable code, e.g. `conflict`.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
    /// Refused fields.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldError>,
    /// Unique values held by other machines.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<Conflict>,
    /// Bad rows of an import.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rows: Vec<RowError>,
    /// Current version (on 412).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_version: Option<i64>,
    /// What the BMC did instead (on `boot_not_applied`: `wanted` and `actual`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub bmc: Option<serde_json::Value>,
    /// The pre-checks of a refused upgrade (on `upgrade_refused`), each with its verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub checks: Option<serde_json::Value>,
}

/// Wrapper for the OpenAPI document.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorEnvelope {
    /// The error.
    pub error: ErrorBody,
}

impl ApiError {
    /// An error with a status, a code and a message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: Box::new(ErrorBody {
                code,
                message: message.into(),
                fields: Vec::new(),
                conflicts: Vec::new(),
                rows: Vec::new(),
                current_version: None,
                bmc: None,
                checks: None,
            }),
        }
    }

    /// With the pre-checks of a refused upgrade.
    pub fn with_checks(mut self, checks: serde_json::Value) -> Self {
        self.body.checks = Some(checks);
        self
    }

    /// 400 naming one field.
    pub fn bad_field(field: impl Into<String>, message: impl Into<String>) -> Self {
        let fe = FieldError::new(field, message);
        let mut e = Self::new(StatusCode::BAD_REQUEST, "bad_request", fe.to_string());
        e.body.fields.push(fe);
        e
    }

    /// 401.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send a valid token as `Authorization: Bearer <token>` (create one with `plinth token create`)",
        )
    }

    /// 403.
    pub fn forbidden(need: crate::service::ApiRole) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this needs a token with role {need} or higher"),
        )
    }

    /// 500 for a fault; the detail goes to the log only.
    pub fn internal(detail: &dyn std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "request failed");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; the server log has the detail",
        )
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    fn invalid(status: StatusCode, code: &'static str, v: ValidationErrors) -> Self {
        let mut e = Self::new(status, code, v.to_string());
        e.body.fields = v.0;
        e
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::Invalid(v) => {
                Self::invalid(StatusCode::UNPROCESSABLE_ENTITY, "invalid", v)
            }
            ServiceError::NotFound(what) => Self::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("{what} not found"),
            ),
            ServiceError::Conflict(c) => {
                let mut e = Self::new(
                    StatusCode::CONFLICT,
                    "conflict",
                    ServiceError::Conflict(c.clone()).to_string(),
                );
                e.body.conflicts = c;
                e
            }
            ServiceError::PreconditionFailed { expected, current } => {
                let mut e = Self::new(
                    StatusCode::PRECONDITION_FAILED,
                    "stale_version",
                    format!("you edited version {expected} but the machine is at version {current}: reload it and reapply your change"),
                );
                e.body.current_version = Some(current);
                e
            }
            ServiceError::PreconditionRequired => Self::new(
                StatusCode::PRECONDITION_REQUIRED,
                "version_required",
                ServiceError::PreconditionRequired.to_string(),
            ),
            ServiceError::ImportRejected(rows) => {
                let mut e = Self::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "import_rejected",
                    format!("{} problem(s) found; nothing was imported", rows.len()),
                );
                e.body.rows = rows;
                e
            }
            e @ ServiceError::InvalidTransition { .. } => {
                Self::new(StatusCode::CONFLICT, "invalid_transition", e.to_string())
            }
            ServiceError::Store(s) => Self::from(s),
            ServiceError::NoBmc(name) => Self::new(
                StatusCode::CONFLICT,
                "no_bmc",
                ServiceError::NoBmc(name).to_string(),
            ),
            ServiceError::Bmc(b) => Self::from(b),
            ServiceError::Busy(why) => Self::new(StatusCode::CONFLICT, "busy", why),
            ServiceError::Config(c) => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "config_invalid",
                c.to_string(),
            ),
        }
    }
}

impl From<BmcError> for ApiError {
    /// What the BMC said is the answer: it is about the operator's device, not Plinth's internals,
    /// and BMC errors never carry a password or a session token.
    fn from(e: BmcError) -> Self {
        tracing::warn!(error = %e, "BMC request failed");
        let message = e.to_string();
        let (status, code) = match &e {
            BmcError::Config(_) => (StatusCode::UNPROCESSABLE_ENTITY, "bmc_config"),
            BmcError::Transport { .. } => (StatusCode::BAD_GATEWAY, "bmc_unreachable"),
            BmcError::Timeout { .. } => (StatusCode::GATEWAY_TIMEOUT, "bmc_timeout"),
            BmcError::Http { .. } => (StatusCode::BAD_GATEWAY, "bmc_error"),
            BmcError::Unauthorized(_) => (StatusCode::BAD_GATEWAY, "bmc_unauthorized"),
            BmcError::Protocol { .. } => (StatusCode::BAD_GATEWAY, "bmc_protocol"),
            BmcError::NotSupported(_) => (StatusCode::UNPROCESSABLE_ENTITY, "bmc_not_supported"),
            BmcError::Deadline { .. } => (StatusCode::GATEWAY_TIMEOUT, "bmc_deadline"),
            BmcError::BootNotApplied { .. } => (StatusCode::CONFLICT, "boot_not_applied"),
            BmcError::MediaNotApplied { .. } => (StatusCode::CONFLICT, "media_not_applied"),
            BmcError::TaskFailed { .. } => (StatusCode::BAD_GATEWAY, "bmc_task_failed"),
        };
        let message = if code == "bmc_unauthorized" {
            format!("{message}; check bmc.username and bmc.password of the machine")
        } else {
            message
        };
        let mut out = Self::new(status, code, message);
        if let BmcError::BootNotApplied { wanted, actual } = &e {
            out.body.bmc = Some(serde_json::json!({"wanted": wanted, "actual": actual}));
        }
        out
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => Self::new(StatusCode::NOT_FOUND, "not_found", "not found"),
            other => Self::internal(&other),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(serde_json::json!({ "error": self.body }))).into_response()
    }
}
