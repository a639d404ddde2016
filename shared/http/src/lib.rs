//! The thin shell every component shares: Spin store adapters, authentication, problem
//! JSON, strict request parsing, idempotency and the API's JSON representations.
//! Components parse with this, call the store (which asks the domain), and render.

pub mod auth;
pub mod call;
pub mod capacity;
pub mod incoming;
pub mod problem;
pub mod render;
pub mod spin_store;

pub use call::{Call, Endpoint, Reply, dispatch, endpoint, public_endpoint};
pub use incoming::ReadRequest;
pub use problem::Problem;
