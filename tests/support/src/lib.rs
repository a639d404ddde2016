//! The support of the end-to-end suites (`tests/api`, run as `spin-host`'s `api` test) and of
//! the host's own suites (`host/tests`): the app harness, the host as a process, shared
//! stores, the probe fixture, temporary directories and small HTTP helpers.

pub mod answers;
pub mod app;
pub mod clock;
pub mod concurrency;
pub mod contract;
pub mod fuzz;
pub mod host_process;
pub mod http;
pub mod latency;
pub mod link;
pub mod otlp;
pub mod paths;
pub mod positions;
pub mod probe;
pub mod random;
pub mod scenario;
pub mod stores;
pub mod temp;
pub mod vms;
pub mod workload;

pub use answers::{METHODS, asks_for_retry, assert_invalid_parameters, sorted, strings};
/// Every app suite's one HTTP client, checking responses against the OpenAPI document.
pub use api_client::{Client, Reply};
pub use app::{AUDIT_KEY, App, OPERATOR_TOKEN, ensure_components_built, key_id};
pub use clock::{rfc3339_from_now, until};
pub use concurrency::{SetOnDrop, at_once, machine_to_itself};
pub use host_process::{HostProcess, spawn_spin_host, spawn_spin_host_with_env};
pub use paths::workspace;
pub use scenario::{ReleaseSpec, ReservationSpec, Scenario, Scene};
pub use temp::TempDir;
pub use vms::{place_vm, placed_vm};
