//! One error shape everywhere: RFC 9457 `application/problem+json` with a stable `code`.

use reservations_domain::{DomainError, Refusal};
use reservations_store::{StorageError, StoreError};
use serde_json::{Map, Value, json};

pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";
const TYPE_BASE: &str = "https://api.openrelay.inc/problems/";

/// A refusal on its way to the caller.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub status: u16,
    pub code: &'static str,
    pub title: &'static str,
    pub detail: String,
    /// Machine-readable specifics, such as the offending unit ids.
    pub extra: Map<String, Value>,
    /// Extra response headers (e.g. `WWW-Authenticate`, `Retry-After`).
    pub headers: Vec<(&'static str, String)>,
}

impl Problem {
    pub fn new(
        status: u16,
        code: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Problem {
        Problem {
            status,
            code,
            title,
            detail: detail.into(),
            extra: Map::new(),
            headers: Vec::new(),
        }
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Problem {
        self.extra.insert(key.to_owned(), value.into());
        self
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Problem {
        self.headers.push((name, value.into()));
        self
    }

    pub fn unauthorized(detail: impl Into<String>) -> Problem {
        Problem::new(401, "unauthorized", "Authentication required", detail)
            .with_header("www-authenticate", "Bearer realm=\"gpu-reservations\"")
    }

    pub fn bad_request(code: &'static str, detail: impl Into<String>) -> Problem {
        Problem::new(400, code, "Malformed request", detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Problem {
        Problem::new(404, "not-found", "Not found", detail)
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Problem {
        Problem::new(
            405,
            "method-not-allowed",
            "Method not allowed",
            format!("{method} is not supported on {path}"),
        )
    }

    pub fn invalid(field: &str, detail: impl Into<String>) -> Problem {
        Problem::new(422, "invalid-field", "Invalid request", detail).with("field", field)
    }

    /// A body over `limit` bytes; `declared` when the client's Content-Length said so before
    /// anything was read.
    pub fn payload_too_large(limit: usize, declared: Option<u64>) -> Problem {
        let detail = match declared {
            Some(length) => format!("the body has {length} bytes; the limit is {limit}"),
            None => format!("the body is longer than the limit of {limit} bytes"),
        };
        Problem::new(413, "payload-too-large", "Payload too large", detail).with("limit", limit)
    }

    pub fn internal(detail: impl Into<String>) -> Problem {
        Problem::new(500, "internal-error", "Internal error", detail)
    }

    /// The problem document, with the request id the response also carries in a header.
    pub fn body(&self, request_id: &str, instance: &str) -> Value {
        let mut body = Map::new();
        body.insert("type".into(), json!(format!("{TYPE_BASE}{}", self.code)));
        body.insert("title".into(), json!(self.title));
        body.insert("status".into(), json!(self.status));
        body.insert("detail".into(), json!(self.detail));
        body.insert("code".into(), json!(self.code));
        body.insert("instance".into(), json!(instance));
        body.insert("requestId".into(), json!(request_id));
        for (key, value) in &self.extra {
            body.entry(key.clone()).or_insert_with(|| value.clone());
        }
        Value::Object(body)
    }
}

/// The status and title of each kind of refusal: 404 hides, 403 refuses, 422 is invalid
/// input, 409 a conflict with the current state.
pub fn status_and_title(refusal: Refusal) -> (u16, &'static str) {
    match refusal {
        Refusal::Hidden => (404, "Not found"),
        Refusal::Forbidden => (403, "Forbidden"),
        Refusal::InvalidInput => (422, "Invalid request"),
        Refusal::Conflict => (409, "Conflict with the current state"),
    }
}

impl From<DomainError> for Problem {
    fn from(error: DomainError) -> Problem {
        let (status, title) = status_and_title(error.refusal());
        let problem = Problem::new(status, error.code(), title, error.to_string());
        match error {
            DomainError::NotFound { .. } | DomainError::Forbidden(_) => problem,
            DomainError::VmAlreadyTerminated => problem,
            DomainError::Invalid { field, .. } => problem.with("field", field),
            DomainError::DuplicateIds { field, ids } => {
                problem.with("field", field).with("ids", ids)
            }
            DomainError::NotInReservation { unit_ids }
            | DomainError::UnknownUnits { unit_ids }
            | DomainError::UnitsInUse { unit_ids } => problem.with("unitIds", unit_ids),
            DomainError::UnknownOrgs { org_ids } => problem.with("orgIds", org_ids),
            DomainError::NotActive { status }
            | DomainError::NotNeedsReview { status }
            | DomainError::AlreadyFinal { status } => {
                problem.with("reservationStatus", status.as_str())
            }
            DomainError::ReservationOverlap {
                unit_ids,
                reservation_ids,
            } => problem
                .with("unitIds", unit_ids)
                .with("reservationIds", reservation_ids),
            DomainError::UnitsNotIdle { unit_ids, vm_ids } => {
                problem.with("unitIds", unit_ids).with("vmIds", vm_ids)
            }
            DomainError::PlacementRefused { refusals } => problem.with(
                "refusals",
                serde_json::to_value(refusals).expect("refusals serialize"),
            ),
            DomainError::AlreadyExists { id, .. } => problem.with("id", id),
            DomainError::TooManyKeys { limit } => problem.with("limit", limit),
        }
    }
}

impl From<StorageError> for Problem {
    fn from(error: StorageError) -> Problem {
        match error {
            StorageError::Busy(message) => {
                eprintln!("database busy: {message}");
                Problem::new(
                    503,
                    "database-busy",
                    "Service busy",
                    "the database stayed busy; retry the request (with the same Idempotency-Key)",
                )
                .with_header("retry-after", "1")
            }
            StorageError::Unavailable(message) => {
                eprintln!("storage unavailable: {message}");
                Problem::new(
                    503,
                    "storage-unavailable",
                    "Service unavailable",
                    "the database could not be reached; nothing was changed; retry the request (with the same Idempotency-Key)",
                )
                .with_header("retry-after", "2")
            }
            StorageError::Unanswered(message) => {
                eprintln!("storage did not answer: {message}");
                Problem::new(
                    503,
                    "storage-unresponsive",
                    "Service unavailable",
                    "the database did not answer in time; a write may still take effect: retry the request with the same Idempotency-Key",
                )
                .with_header("retry-after", "5")
            }
            other => {
                eprintln!("storage error: {other}");
                Problem::internal("the database failed; nothing was changed")
            }
        }
    }
}

/// The code of a keyed request whose key another request recorded meanwhile: the request
/// layer looks the key up again and replays that answer (see `crate::idempotency`).
pub(crate) const ALREADY_RECORDED: &str = "idempotency-key-in-use";

impl From<StoreError> for Problem {
    fn from(error: StoreError) -> Problem {
        match error {
            StoreError::Domain(e) => e.into(),
            StoreError::Storage(e) => e.into(),
            StoreError::Contention { attempts } => Problem::new(
                503,
                "write-contention",
                "Write contention",
                format!(
                    "other writes kept changing what this one depends on ({attempts} attempts); nothing was changed; retry the request (with the same Idempotency-Key)"
                ),
            )
            .with_header("retry-after", "1"),
            StoreError::ShareExhausted { share, waited } => Problem::new(
                503,
                "write-contention",
                "Write contention",
                format!(
                    "this org already had {share} writes running, its share, for the {} s this one waited for a turn; nothing was changed; retry the request (with the same Idempotency-Key)",
                    waited.as_secs()
                ),
            )
            .with_header("retry-after", "1"),
            StoreError::KeyRevoked => Problem::unauthorized("the token is unknown or revoked"),
            StoreError::AlreadyRecorded => Problem::new(
                409,
                ALREADY_RECORDED,
                "Idempotency-Key in use",
                "a request with this Idempotency-Key was carried out meanwhile; retry it to get its answer",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use reservations_domain::reservation::Status;

    use super::*;

    #[test]
    fn refusals_render_as_the_design_says() {
        #[rustfmt::skip]
        let rows: Vec<(DomainError, u16, &str)> = vec![
            (DomainError::NotFound { what: "reservation" },             404, "not-found"),
            (DomainError::Forbidden("no".into()),                        403, "forbidden"),
            (DomainError::invalid("unitIds", "empty"),                   422, "invalid-field"),
            (DomainError::DuplicateIds { field: "unitIds", ids: vec![] }, 422, "duplicate-ids"),
            (DomainError::NotInReservation { unit_ids: vec![] },         422, "units-not-in-reservation"),
            (DomainError::UnknownUnits { unit_ids: vec![] },             422, "unknown-units"),
            (DomainError::UnknownOrgs { org_ids: vec![] },               422, "unknown-orgs"),
            (DomainError::NotActive { status: Status::Expired },         409, "reservation-not-active"),
            (DomainError::ReservationOverlap { unit_ids: vec![], reservation_ids: vec![] }, 409, "reservation-overlap"),
            (DomainError::UnitsNotIdle { unit_ids: vec![], vm_ids: vec![] }, 409, "units-not-idle"),
            (DomainError::UnitsInUse { unit_ids: vec![] },               409, "units-in-use"),
            (DomainError::PlacementRefused { refusals: vec![] },         409, "placement-refused"),
            (DomainError::VmAlreadyTerminated,                           409, "vm-terminated"),
            (DomainError::TooManyKeys { limit: 50 },                     409, "too-many-keys"),
        ];
        for (err, status, code) in rows {
            let problem = Problem::from(err.clone());
            assert_eq!(problem.status, status, "{err:?}");
            assert_eq!(problem.code, code, "{err:?}");
            assert!(!problem.title.is_empty());
        }
    }

    #[test]
    fn a_write_out_of_attempts_is_a_503_to_retry_that_changed_nothing() {
        let problem = Problem::from(StoreError::Contention { attempts: 48 });
        assert_eq!((problem.status, problem.code), (503, "write-contention"));
        assert_eq!(problem.headers, [("retry-after", "1".to_owned())]);
        assert!(
            problem.detail.contains("nothing was changed"),
            "{}",
            problem.detail
        );
        assert!(problem.detail.contains("48 attempts"), "{}", problem.detail);
    }

    #[test]
    fn a_write_that_got_no_turn_in_its_org_s_share_is_a_503_to_retry_that_changed_nothing() {
        let problem = Problem::from(StoreError::ShareExhausted {
            share: 8,
            waited: std::time::Duration::from_secs(10),
        });
        assert_eq!((problem.status, problem.code), (503, "write-contention"));
        assert_eq!(problem.headers, [("retry-after", "1".to_owned())]);
        assert!(
            problem.detail.contains("nothing was changed") && problem.detail.contains("8 writes"),
            "{}",
            problem.detail
        );
    }
}
