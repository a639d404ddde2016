//! The thin shell every component shares: the route table, serving a component's routes
//! from it, strict request parsing, authentication, idempotency, problem JSON and the API's
//! JSON representations. Components parse with this, call the store (which asks the
//! domain), and render.

pub mod auth;
pub mod bookmark;
pub mod capacity;
pub mod cell_health;
pub mod config;
pub mod dispatch;
mod execute;
pub mod forward;
pub mod head;
mod idempotency;
pub mod incoming;
pub mod input;
pub mod operation;
pub mod problem;
pub mod render;
pub mod request;
pub mod request_log;
pub mod response;
pub mod routes;
pub mod spin_store;

pub use dispatch::serve;
pub use incoming::Incoming;
pub use operation::Operation;
pub use problem::Problem;
pub use request::{Answer, Call};
pub use response::Reply;
